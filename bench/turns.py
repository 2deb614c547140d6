"""Scoring a session again as its turns arrive: turn 2 against turn 50, incrementally and in full.

A session of ``--turns`` turns, each its own trace as ``sessions_payloads`` builds it (an
``invoke_agent`` span over four ``chat`` and four ``execute_tool`` spans with JSON arguments and
results), optionally with the tool definitions on every chat span (``--no-definitions`` leaves them
out). The spans go through the real decode, prepare and assembly, so the records are what the
collector would score. Timed, averaged over ``--reps`` repetitions:

- turn n incrementally: summarize the new trace, combine the n summaries;
- turn n in full: ``score`` over every record of the first n turns (what scoring cost before summaries).

It also prints how many bytes the summaries hold per turn (deep size, each object counted once),
and for comparison the size of one turn's records.
This is a by-hand benchmark, never part of the test suite. Run it from the repository root:

    python bench/turns.py
    python bench/turns.py --turns 200 --reps 500
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
if str(HERE) not in sys.path:
    sys.path.insert(0, str(HERE))

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest  # noqa: E402

from agentfunnel.collector.session.assembly import assemble_records  # noqa: E402
from agentfunnel.collector.decode import decode_traces_protobuf  # noqa: E402
from agentfunnel.collector.session.held import prepare  # noqa: E402
from agentfunnel.scoring import SessionScorer  # noqa: E402
from payloads import _kv  # noqa: E402
from sessions_payloads import AGENT, MIDDLE_TURN, _plans, _Session, _turn_spans  # noqa: E402

DEFINITIONS = json.dumps([
    {"type": "function", "name": "search_products", "parameters": {
        "type": "object", "required": ["query"], "properties": {
            "query": {"type": "string"}, "limit": {"type": "integer"}, "sort": {"type": "string"},
            "locale": {"type": "string"}, "filters": {"type": "object", "properties": {
                "category": {"type": "string"}, "max_price": {"type": "number"}, "in_stock": {"type": "boolean"}}}}}},
    {"type": "function", "name": "get_product_details", "parameters": {
        "type": "object", "required": ["product_id"], "properties": {
            "product_id": {"type": "string"}, "include": {"type": "array", "items": {"type": "string"}}}}},
    {"type": "function", "name": "add_to_cart", "parameters": {
        "type": "object", "required": ["cart_id", "variant_id", "quantity"], "properties": {
            "cart_id": {"type": "string"}, "variant_id": {"type": "string"},
            "quantity": {"type": "integer", "minimum": 1}}}},
    {"type": "function", "name": "checkout", "parameters": {
        "type": "object", "required": ["cart_id", "payment_method_id"], "properties": {
            "cart_id": {"type": "string"}, "payment_method_id": {"type": "string"},
            "shipping_address_id": {"type": "string"}, "shipping_speed": {"type": "string"}}}},
])


def session_turns(turns: int, definitions: bool, seed: int = 7) -> list[list]:
    """Each turn's records, as the collector assembles them (one trace per turn)."""
    rnd = random.Random(seed)
    s = _Session("bench-turns-000001", turns, _plans(rnd, turns), rnd, "user_000042", 1_700_000_000_000_000_000)
    s.plans = [MIDDLE_TURN] * turns  # every turn browses and fills the cart: no turn ends the funnel
    out = []
    for turn in range(turns):
        s.turn = turn
        spans = list(_turn_spans(s))
        if definitions:
            for span in spans:
                if span.name.startswith("chat "):
                    span.attributes.append(_kv("gen_ai.tool.definitions", DEFINITIONS))
        req = ExportTraceServiceRequest()
        rs = req.resource_spans.add()
        rs.resource.attributes.extend([_kv("service.name", AGENT), _kv("service.instance.id", f"{AGENT}-0")])
        rs.scope_spans.add().spans.extend(spans)
        prepared = prepare(decode_traces_protobuf(req.SerializeToString()))
        trace = assemble_records(prepared.records, prepared.views)
        out.append([r for r in trace.records if trace.sessions.get(r.span_id)])
    return out


def deep_size(obj, seen: set | None = None) -> int:
    """Bytes an object holds, counting each object it reaches once (shared interned strings too)."""
    seen = set() if seen is None else seen
    if id(obj) in seen or obj is None or isinstance(obj, (bool, type)):
        return 0
    seen.add(id(obj))
    size = sys.getsizeof(obj)
    if isinstance(obj, dict):
        size += sum(deep_size(k, seen) + deep_size(v, seen) for k, v in obj.items())
    elif isinstance(obj, (list, tuple, set, frozenset)):
        size += sum(deep_size(v, seen) for v in obj)
    elif hasattr(obj, "__slots__"):
        size += sum(deep_size(getattr(obj, name, None), seen) for cls in type(obj).__mro__
                    for name in getattr(cls, "__slots__", ()))
    return size


def per_call(fns: dict, reps: int | dict, rounds: int) -> dict:
    """Seconds per call of each function: the least disturbed of ``rounds`` rounds of ``reps`` calls,
    the functions taking turns within each round so that a busy moment slows them all."""
    best = dict.fromkeys(fns, float("inf"))
    for fn in fns.values():
        fn()  # warm: memoized step lookups, validators, caches
    for _ in range(rounds):
        for name, fn in fns.items():
            n = reps[name] if isinstance(reps, dict) else reps
            t0 = time.perf_counter()
            for _ in range(n):
                fn()
            best[name] = min(best[name], (time.perf_counter() - t0) / n)
    return best


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--turns", type=int, default=50)
    ap.add_argument("--reps", type=int, default=200, help="calls per round")
    ap.add_argument("--rounds", type=int, default=15)
    ap.add_argument("--no-definitions", action="store_true", help="no tool definitions on the chat spans")
    args = ap.parse_args()
    scorer = SessionScorer()
    turns = session_turns(args.turns, not args.no_definitions)
    summaries = [scorer.summarize(t) for t in turns]
    sid = "bench-turns-000001"

    def incremental(n: int):
        earlier, new = summaries[:n - 1], turns[n - 1]
        # the new trace is summarized each time, so combining it costs what a new turn costs (its
        # arguments validated, its steps looked up); the earlier summaries are the ones kept
        return lambda: scorer.combine(sid, [*earlier, scorer.summarize(new)])

    def full(n: int):
        records = [r for t in turns[:n] for r in t]
        return lambda: scorer.score(sid, records)

    last = args.turns
    full_score = scorer.score(sid, [r for t in turns for r in t])
    assert scorer.combine(sid, summaries) == full_score
    times = per_call({"t2": incremental(2), "tn": incremental(last)}, args.reps, args.rounds)
    t2, tn = times["t2"], times["tn"]
    full_times = per_call({"f2": full(2), "fn": full(last)}, {"f2": args.reps, "fn": max(1, args.reps // last)}, 5)
    f2, fn = full_times["f2"], full_times["fn"]
    held = deep_size(summaries) / len(summaries)  # all of them, each object counted once: per turn
    alone = deep_size(summaries[1])  # one, counting what it shares with the others (names, schemas)
    print(f"session: {last} turns, {sum(len(t) for t in turns)} spans, {full_score.tool_call_count} tool calls, "
          f"tool definitions {'off' if args.no_definitions else 'on'}; {full_score.outcome}")
    print(f"turn 2  incremental (summarize new + combine 2):       {t2 * 1e6:8.1f} µs")
    print(f"turn {last:<2} incremental (summarize new + combine {last}):     {tn * 1e6:8.1f} µs")
    print(f"ratio turn {last} / turn 2:                               {tn / t2:8.2f}")
    print(f"turn 2  full score of every record:                    {f2 * 1e6:8.1f} µs")
    print(f"turn {last:<2} full score of every record:                    {fn * 1e6:8.1f} µs  "
          f"({fn / tn:.1f}x the incremental)")
    print(f"summaries held: {held:.0f} bytes per turn ({alone} for one alone; "
          f"its records: {deep_size(turns[1])} bytes)")


if __name__ == "__main__":
    main()
