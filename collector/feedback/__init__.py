"""User feedback: thumbs, scores and comments, over OTLP and ``POST /v1/feedback``, beside the proven outcome."""
