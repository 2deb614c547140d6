"""What looking for user feedback costs ingest: the scan of a committed batch's span events.

A batch of spans that each carry an event (an exception), decoded as the server decodes it, then
scanned by ``feedback_in``; with ``--every N`` one span in N also carries a user's
``gen_ai.evaluation.result``. Prints the best of ``--repeat`` runs of the decode and of the scan.

    python bench/feedback.py [--spans 10000] [--every 0] [--repeat 5]
"""

from __future__ import annotations

import argparse
import os
import time

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue

from agentfunnel.collector.config import FeedbackSettings
from agentfunnel.collector.decode import decode_traces_protobuf
from agentfunnel.collector.feedback.otlp import feedback_in


def _kv(key: str, value: str | float) -> KeyValue:
    v = AnyValue(double_value=value) if isinstance(value, float) else AnyValue(string_value=value)
    return KeyValue(key=key, value=v)


def request(spans: int, every: int) -> bytes:
    req = ExportTraceServiceRequest()
    ss = req.resource_spans.add().scope_spans.add()
    tid = os.urandom(16)
    for i in range(spans):
        span = ss.spans.add(trace_id=tid, span_id=os.urandom(8), name="chat m", start_time_unix_nano=1,
                            end_time_unix_nano=2, attributes=[_kv("gen_ai.operation.name", "chat")])
        span.events.add(name="exception", time_unix_nano=1, attributes=[_kv("exception.message", "boom")])
        if every and i % every == 0:
            span.events.add(name="gen_ai.evaluation.result", time_unix_nano=2, attributes=[
                _kv("gen_ai.evaluation.name", "user_feedback"), _kv("gen_ai.evaluation.score.value", 1.0)])
    return req.SerializeToString()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--spans", type=int, default=10_000)
    ap.add_argument("--every", type=int, default=0, help="one span in N carries user feedback (0: none)")
    ap.add_argument("--repeat", type=int, default=5)
    args = ap.parse_args()
    body, settings = request(args.spans, args.every), FeedbackSettings()
    decode = scan = float("inf")
    found = 0
    for _ in range(args.repeat):
        t = time.perf_counter()
        batch = decode_traces_protobuf(body)
        decode = min(decode, time.perf_counter() - t)
        t = time.perf_counter()
        found = len(feedback_in(batch, settings).items)
        scan = min(scan, time.perf_counter() - t)
    print(f"{args.spans} spans: decode {decode * 1000:.1f} ms, feedback scan {scan * 1000:.2f} ms "
          f"({scan / decode:.1%} of the decode), {found} feedback items")


if __name__ == "__main__":
    main()
