"""Redaction's CPU cost per span, on ``bench/payloads.py``-shaped requests (agent, chat and tool spans).

Each request is decoded as the server decodes it (the compiled decoder when built), then redacted in
place; only ``Redactor.redact`` is timed. Compare with the end-to-end server CPU per span of
``python bench/ingest.py --sessions`` (about 120 us/span). Configurations: every built-in detector;
the same plus content capture off and a hashed ``user.id``; one user pattern (which parses every
text: patterns have no prefilter); and requests whose tool payloads all hold an email and a card
number (every tool span is rewritten).

    python bench/redaction.py [--requests 40] [--spans 512]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from payloads import genai_request  # noqa: E402

from agentfunnel.collector.config import PrivacySettings  # noqa: E402
from agentfunnel.collector.decode import decode_traces_protobuf  # noqa: E402
from agentfunnel.collector.privacy import DETECTORS, Redactor  # noqa: E402

ALL = sorted(DETECTORS)
CONFIGS = {
    "all detectors": PrivacySettings(detectors=ALL),
    "all detectors, content off, hashed user.id": PrivacySettings(
        detectors=ALL, capture_content=False, hash_keys=["user.id", "enduser.id"], hash_key="bench-key"),
    "all detectors + one user pattern": PrivacySettings(
        detectors=ALL, patterns=[{"name": "order", "regex": r"ORD-[0-9]{6}"}]),
}


def bodies(n: int, spans: int, pii: bool) -> list[bytes]:
    out = []
    for seed in range(n):
        req = genai_request(spans, seed)
        if pii:
            for span in req.resource_spans[0].scope_spans[0].spans:
                for kv in span.attributes:
                    if kv.key == "gen_ai.tool.call.arguments":
                        kv.value.string_value = json.dumps({"query": "trail shoes", "email": "jane.doe@example.com",
                                                            "card": "4111 1111 1111 1111"})
        out.append(req.SerializeToString())
    return out


def measure(settings: PrivacySettings, data: list[bytes], rounds: int = 3) -> tuple[float, float]:
    """(us per span redacting, us per span decoding) of CPU time (not wall time: other processes do not count), best
    of ``rounds``."""
    redactor = Redactor(settings)
    best_redact = best_decode = float("inf")
    for _ in range(rounds):
        t0 = time.process_time()
        batches = [decode_traces_protobuf(b) for b in data]
        t1 = time.process_time()
        for batch in batches:
            redactor.redact(batch)
        t2 = time.process_time()
        spans = sum(len(b) for b in batches)
        best_decode = min(best_decode, (t1 - t0) / spans * 1e6)
        best_redact = min(best_redact, (t2 - t1) / spans * 1e6)
    return best_redact, best_decode


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--requests", type=int, default=40)
    parser.add_argument("--spans", type=int, default=512, help="spans per request")
    args = parser.parse_args()
    clean = bodies(args.requests, args.spans, pii=False)
    dirty = bodies(args.requests, args.spans, pii=True)
    print(f"{args.requests} requests x {args.spans} spans (bench/payloads.py), redaction CPU per span, best of 3")
    for label, data in (("no personal data", clean), ("an email and a card in every tool call", dirty)):
        for name, settings in CONFIGS.items():
            redact, decode = measure(settings, data)
            print(f"  {label:40s} {name:44s} {redact:6.2f} us/span  (decode {decode:5.2f} us/span)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
