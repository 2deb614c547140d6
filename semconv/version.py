"""The semantic-conventions versions this package reads, pinned.

GenAI conventions left the main semantic-conventions repository after v1.41.0; their registry
now lives in open-telemetry/semantic-conventions-genai. Both the last main-repo names and the
older generations still emitted in the wild are understood (see ``attributes.py``).
"""

SEMCONV_VERSION = "1.41.0"
SEMCONV_GENAI_VERSION = "1.42.0-dev"
SCHEMA_URL = "https://opentelemetry.io/schemas/1.41.0"
OPENINFERENCE_SEMCONV_VERSION = "0.1.42"
OPENLLMETRY_SEMCONV_VERSION = "0.5.1"
