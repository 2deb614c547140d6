"""Open traces held in memory give exactly what reading them back from the store gives.

Every recorded fixture (spans and log records, as the frameworks sent them) is assembled twice:
from the records the prepare worker made once (``held``), and from the store, as an evicted or
reopened trace is (``sessions.max_held_bytes`` too small to hold anything). Both databases must
hold the same tool calls, span stamps and sessions; the counters say which path ran.
"""

from __future__ import annotations

import gc
import json
import sys
import tracemalloc
import urllib.request
from collections.abc import Callable
from typing import Any

from agentfunnel.collector.decode import decode_logs_protobuf, decode_traces_protobuf
from agentfunnel.collector.session.held import HeldTraces, assemble_held, log_events, prepare
from agentfunnel.collector.session.assembly import assemble, assemble_records
from agentfunnel.collector.telemetry import Metrics
from conftest import FIXTURES, read_db, run_cli
from test_dialects import views_of

OTLP = FIXTURES / "otlp"
COMPARED = {
    "tool_calls": "SELECT session_id, trace_id, span_id, tool_name, call_id, arguments, result, error, step, args_valid "
                  "FROM tool_calls ORDER BY trace_id, span_id",
    "spans": "SELECT trace_id, span_id, session_id, dialect FROM spans ORDER BY trace_id, span_id",
    "sessions": "SELECT * EXCLUDE (updated_at) FROM sessions ORDER BY session_id",
    "trace_index": "SELECT trace_id, span_count, session_ids FROM trace_index ORDER BY trace_id",
}


def test_a_held_trace_finds_its_agent_version_parsing_only_the_spans_that_name_it():
    import os

    from otlp_build import trace_request

    trace, root = os.urandom(16), os.urandom(8)
    spans = [{"trace_id": trace, "span_id": root, "name": "invoke_agent shop", "start_time_unix_nano": 1,
              "attributes": {"gen_ai.operation.name": "invoke_agent", "gen_ai.conversation.id": "c-1"}}]
    spans += [{"trace_id": trace, "parent_span_id": root, "name": f"execute_tool t{i}", "start_time_unix_nano": 2 + i,
               "attributes": {"gen_ai.operation.name": "execute_tool", "gen_ai.tool.name": f"t{i}",
                              **({"gen_ai.agent.version": "2.1.0"} if i == 2 else {})}} for i in range(4)]

    def taken(resource: dict):
        held = HeldTraces(1 << 30, Metrics())
        held.add(prepare(decode_traces_protobuf(trace_request(spans, resource).SerializeToString())), trace_ids=())
        found = held.take(trace.hex())
        assert found is not None
        return found

    views, records = taken({"service.name": "shop", "service.version": "9.9"})
    assert assemble_records(records, views).agent_version == "2.1.0"  # the span's own attribute wins
    # only spans some rule reads are parsed (the trace rules read a few): not all of them
    parsed = views._made.keys()
    assert len(parsed) < len(views) and any("gen_ai.agent.version" in views[i].attributes for i in parsed)
    del spans[3]["attributes"]["gen_ai.agent.version"]
    views, records = taken({"service.name": "shop", "service.version": "9.9"})
    assert assemble_records(records, views).agent_version == "9.9"  # else the resource's, parsing no span
    assert not any("gen_ai.agent.version" in v.attributes for v in views._made.values())
    assert len(views._made) < len(parsed)
    # the same answers as from views read whole
    assert assemble_records(records, list(views)).agent_version == "9.9"


def test_held_records_assemble_like_the_views_they_came_from():
    """In process, no store: the prepare worker's records, held and taken, against normalizing the views."""
    for path in sorted(OTLP.glob("*/*.traces.binpb")):
        batch = decode_traces_protobuf(path.read_bytes())
        held = HeldTraces(1 << 30, Metrics())
        logs = path.with_name(path.name.replace(".traces.", ".logs."))
        if logs.exists():  # views_of joins them too
            held.add_logs(log_events(decode_logs_protobuf(logs.read_bytes())), already_open=())
        held.add(prepare(batch), trace_ids=())
        by_trace: dict[str, list] = {}
        for v in views_of(path):
            by_trace.setdefault(v.trace_id, []).append(v)
        for tid, views in by_trace.items():
            taken = held.take(tid)
            assert taken is not None, path
            from_memory = assemble_records(taken[1], taken[0])
            expected = assemble(sorted(views, key=lambda v: (v.start_ns, v.span_id)))
            assert from_memory == expected, f"{path}: {tid}"
        assert held.take(next(iter(by_trace))) is None  # taken once


def _bytes_kept(build: Callable[[], Any]) -> tuple[Any, int]:
    """What ``build`` returns, and the bytes still allocated once it has run (tracemalloc, after a collection)."""
    gc.collect()
    tracemalloc.start()
    try:
        kept = build()
        gc.collect()
        return kept, tracemalloc.get_traced_memory()[0]
    finally:
        tracemalloc.stop()


def _payloads(*extra: tuple[str, list[bytes]]) -> dict[str, list[bytes]]:
    """Agent traffic (bench/payloads.py) and every recorded framework's requests together."""
    sys.path.insert(0, str(FIXTURES.parents[1] / "bench"))
    from payloads import genai_request

    return {"agent traffic": [genai_request(2000, seed=7).SerializeToString()],
            "recorded frameworks": [p.read_bytes() for p in sorted(OTLP.glob("*/*.traces.binpb"))], **dict(extra)}


def _hold(payloads: list[bytes], metrics: Metrics) -> HeldTraces:
    held = HeldTraces(1 << 40, metrics)
    for body in payloads:
        held.add(prepare(decode_traces_protobuf(body)), trace_ids=())
    return held


def test_the_held_bytes_estimate_is_close_to_what_holding_costs():
    """``sessions.max_held_bytes`` bounds real memory only if the estimate tracks it: measured with tracemalloc,
    for agent traffic, every recorded framework together, and large and dense tool results (rows of small numbers
    parse to several times their text, which twice the text counted at a third of what they held)."""
    for label, payloads in _payloads(*_large_results()).items():
        metrics = Metrics()
        held, real = _bytes_kept(lambda: _hold(payloads, metrics))  # noqa: B023 -- called at once
        estimated = metrics.snapshot()["held_bytes"]
        assert 0.8 * real <= estimated <= 1.4 * real, f"{label}: estimated {estimated:,} for {real:,} bytes held"
        taken = held.take(decode_traces_protobuf(payloads[0]).trace_id[0])
        assert taken is not None and taken[0][0].attributes  # a view parses its attributes when read


def _documents_request(traces: int, result_bytes: int, dense: bool = False) -> bytes:
    """Agent turns whose four tool calls each return documents of about ``result_bytes`` (a retrieval agent's), or
    ``dense``: rows of small numbers (a query tool's), which parse to many times their text."""
    import random

    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

    sys.path.insert(0, str(FIXTURES.parents[1] / "bench"))
    from payloads import _kv

    rnd = random.Random(3)
    req = ExportTraceServiceRequest()
    rs = req.resource_spans.add()
    rs.resource.attributes.extend([_kv("service.name", "research-agent")])
    spans = rs.scope_spans.add().spans
    for t in range(traces):
        trace_id, root = rnd.randbytes(16), rnd.randbytes(8)
        agent = spans.add(trace_id=trace_id, span_id=root, name="invoke_agent research", start_time_unix_nano=1,
                          end_time_unix_nano=9)
        agent.attributes.extend([_kv("gen_ai.operation.name", "invoke_agent"), _kv("gen_ai.conversation.id", f"c{t}")])
        for call in range(4):
            docs = ([{"row": i, "a": rnd.randrange(100), "b": i % 7} for i in range(result_bytes // 25)] if dense
                    else [{"id": f"doc-{t}-{call}-{i}", "title": f"Result {i}",
                           "text": " ".join(f"w{rnd.randrange(10**6)}" for _ in range(100))}
                          for i in range(max(1, result_bytes // 800))])
            tool = spans.add(trace_id=trace_id, span_id=rnd.randbytes(8), parent_span_id=root,
                             name="execute_tool search", start_time_unix_nano=2 + call, end_time_unix_nano=3 + call)
            tool.attributes.extend([_kv("gen_ai.operation.name", "execute_tool"), _kv("gen_ai.tool.name", "search"),
                                    _kv("gen_ai.tool.call.id", f"call-{t}-{call}"),
                                    _kv("gen_ai.tool.call.arguments", json.dumps({"query": f"topic {call}"})),
                                    _kv("gen_ai.tool.call.result", json.dumps({"documents": docs}))])
    return req.SerializeToString()


def _large_results() -> tuple[tuple[str, list[bytes]], ...]:
    return (("large tool results", [_documents_request(30, 100_000)]),
            ("dense tool results", [_documents_request(10, 50_000, dense=True)]))


def test_the_assembled_cache_counts_what_its_traces_hold():
    """``sessions.max_assembled_cache_bytes`` bounds real memory only if a kept trace counts at what it holds:
    measured with tracemalloc (records and the scoring summaries kept with them) for agent traffic, every recorded
    framework, and turns whose tool results are 100 KB of documents or 50 KB of rows of numbers, which a flat rate
    per record counted at a thirtieth of their size. Traces come both from held spans and read back."""
    from agentfunnel.collector.session.assembly import sessions_of
    from agentfunnel.collector.session.held import AssembledTraces
    from agentfunnel.scoring import SessionScorer

    def kept(payloads: list[bytes], held_path: bool, metrics: Metrics) -> tuple[AssembledTraces, SessionScorer]:
        """The cache and scorer, holding the traces and their summaries (the spans held on the way are let go)."""
        held = _hold(payloads, Metrics())
        taken = [held.take(tid) for tid in sorted({tid for body in payloads
                                                   for tid in decode_traces_protobuf(body).trace_id})]
        traces = [assemble_held(views, records) if held_path else assemble(list(views)) for views, records in taken]
        cache, scorer = AssembledTraces(1 << 40, metrics), SessionScorer()
        cache.put(traces)
        for session in sessions_of(traces, {s for t in traces for s in t.session_ids}, ()).values():
            scorer.score_session(session)
        return cache, scorer

    for label, payloads in _payloads(*_large_results()).items():
        for held_path in (True, False):
            metrics = Metrics()
            _, real = _bytes_kept(lambda: kept(payloads, held_path, metrics))  # noqa: B023 -- called at once
            counted = metrics.snapshot()["assembled_cache_bytes"]
            assert 0.8 * real <= counted <= 1.6 * real, (
                f"{label}, {'held' if held_path else 'read back'}: counted {counted:,} for {real:,} bytes kept")


def test_a_log_record_for_a_held_span_is_read_with_it():
    logs_path = next(OTLP.glob("google-adk/*.logs.binpb"))
    spans = decode_traces_protobuf(logs_path.with_name(logs_path.name.replace(".logs.", ".traces.")).read_bytes())
    logs = decode_logs_protobuf(logs_path.read_bytes())
    held = HeldTraces(1 << 30, Metrics())
    held.add_logs(log_events(logs), already_open=())  # logs may come first
    held.add(prepare(spans), trace_ids=())
    answers = [r.final_answer for tid in set(spans.trace_id) for r in held.take(tid)[1] if r.final_answer]
    assert answers  # the model's text is in the log records, not on the spans


def test_evicted_traces_are_read_back_and_give_the_same_rows(tmp_path, server_factory):
    files = sorted(str(p) for p in OTLP.glob("*/*.binpb"))
    held_db, read_db_path = tmp_path / "held.duckdb", tmp_path / "read.duckdb"
    tiny = tmp_path / "tiny.yaml"
    tiny.write_text("sessions:\n  max_held_bytes: 1\n  push_back_when_held_full: false\n")  # evicted, not pushed back
    run_cli("ingest", "--db", str(held_db), *files)
    run_cli("ingest", "--db", str(read_db_path), "--config", str(tiny), *files)
    for name, query in COMPARED.items():
        assert read_db(held_db, query) == read_db(read_db_path, query), name
    # the counters show which path each took, on a live server
    srv = server_factory(db=tmp_path / "live.duckdb")
    run_cli("ingest", "--db", str(srv.db), *files[:6])
    srv.admin_post("/flush")
    metrics = json.loads(urllib.request.urlopen(srv.admin + "/metrics").read())
    assert metrics["traces_assembled"] > 0 and "traces_read_back" not in metrics
    assert metrics["held_bytes"] == 0 and metrics["held_traces"] == 0
    assert {"commit", "sessions"} <= set(metrics["writer_cpu_microseconds"])  # where the writer's time went
    srv.stop()
    small = server_factory(["--config", str(tiny)], db=tmp_path / "small.duckdb")
    run_cli("ingest", "--db", str(small.db), *files[:6])
    small.admin_post("/flush")
    metrics = json.loads(urllib.request.urlopen(small.admin + "/metrics").read())
    assert metrics["held_traces_evicted"] > 0 and metrics["traces_read_back"] == metrics["traces_assembled"]


def test_immediate_forwarding_labels_from_the_held_records_without_normalizing_again(monkeypatch):
    from agentfunnel.collector.session import assembly
    from agentfunnel.collector.forward.enrich import immediate_labels
    from agentfunnel.scoring.config import ScoringConfig
    from agentfunnel.scoring.funnel import StepMatcher

    matcher = StepMatcher(ScoringConfig().funnel)
    for path in sorted(OTLP.glob("*/shop_purchase.traces.binpb")):
        batch = decode_traces_protobuf(path.read_bytes())
        prepared = prepare(batch)
        expected = immediate_labels(prepared.views, matcher, (), {})

        def normalize_again(*args, **kwargs):
            raise AssertionError("normalized a second time")

        with monkeypatch.context() as m:
            m.setattr(assembly, "normalize", normalize_again)
            assert immediate_labels(prepared.views, matcher, (), {}, prepared.records) == expected, path


def test_sessions_from_held_records_score_as_the_scenarios_say_without_a_store():
    """The middle of the stage as pure functions on recorded fixtures: prepare, hold, assemble, score."""
    import pytest

    from agentfunnel.scoring import SessionScorer
    from test_dialects import FRAMEWORK_EXCEPTIONS, SCENARIOS, SESSION_EXPECTATIONS, _expected

    scorer = SessionScorer()
    for expected_file in SCENARIOS:
        exp = _expected(expected_file)
        traces_path = expected_file.with_name(exp["scenario"] + ".traces.binpb")
        held = HeldTraces(1 << 30, Metrics())
        logs_path = traces_path.with_name(exp["scenario"] + ".logs.binpb")
        if logs_path.exists():
            held.add_logs(log_events(decode_logs_protobuf(logs_path.read_bytes())), already_open=())
        batch = decode_traces_protobuf(traces_path.read_bytes())
        held.add(prepare(batch), trace_ids=())
        by_session: dict[str, list] = {}
        for tid in sorted(set(batch.trace_id)):
            views, records = held.take(tid)
            trace = assemble_records(records, views)
            for r in trace.records:
                if (sid := trace.sessions.get(r.span_id)) is not None:
                    by_session.setdefault(sid, []).append(r)
        assert len(by_session) == exp["sessions"], expected_file
        variant, steps, completion, outcome, hit_cap = SESSION_EXPECTATIONS[exp["scenario"]]
        want = {"variant": variant, "steps": tuple(steps), "completion_rate": completion, "outcome": outcome,
                "hit_cap": hit_cap}
        want.update({k: tuple(v) if k == "steps" else v
                     for k, v in FRAMEWORK_EXCEPTIONS.get((exp["framework"], exp["scenario"]), {}).items()})
        sid, records = next(iter(by_session.items()))
        score = scorer.score(sid, records)
        got = {k: getattr(score, k) for k in want}
        assert got.pop("completion_rate") == pytest.approx(want.pop("completion_rate"), abs=1e-5), expected_file
        assert got == want, expected_file


def test_a_held_record_the_trace_rules_or_a_log_record_changed_is_measured():
    """A short span text says little of a record the trace rules gave arguments to (recovered from its parent's
    call list) or that was read again with a log record: those are measured, the others charged the flat rate."""
    from dataclasses import replace

    from agentfunnel.collector.session.held import RECORD_COST_BYTES, LazyViews, value_bytes

    sys.path.insert(0, str(FIXTURES.parents[1] / "bench"))
    from payloads import genai_request

    prepared = prepare(decode_traces_protobuf(genai_request(9, seed=1).SerializeToString()))
    records = prepared.records
    flat = RECORD_COST_BYTES * len(records)
    assert LazyViews(prepared.rows, {}, prepared.record_costs).records_bytes(records, records) == flat  # agent spans' texts are short
    recovered = {"rows": [{"sku": f"sku-{i}", "quantity": i} for i in range(2000)]}
    ruled = [replace(r, arguments=recovered) if i == 2 else r for i, r in enumerate(records)]
    grown = value_bytes(recovered)
    assert LazyViews(prepared.rows, {}, prepared.record_costs).records_bytes(ruled, records) >= flat + grown
    joined = LazyViews(prepared.rows, {2: prepared.views[2]}, prepared.record_costs)  # as ``take`` gives a span read with a log record
    assert joined.records_bytes(ruled, ruled) >= flat + grown


def test_a_trace_larger_than_the_whole_cache_is_not_kept_and_pushes_nothing_out():
    from agentfunnel.collector.session.assembly import AssembledTrace
    from agentfunnel.collector.session.held import AssembledTraces

    metrics = Metrics()
    cache = AssembledTraces(100_000, metrics)
    small = [AssembledTrace(f"t{i}", [], {"span": f"s{i}"}, records_bytes=1_500) for i in range(3)]
    cache.put(small)
    cache.put([AssembledTrace("huge", [], {"span": "s9"}, records_bytes=500_000)])
    assert cache.get("huge") is None and all(cache.get(t.trace_id) is t for t in small)
    assert metrics.get("assembled_cache_evicted") == 1


def test_the_prepare_queue_counts_batches_at_what_they_hold_decoded():
    """``sessions.max_prepare_queue_bytes`` bounds real memory only if a queued batch counts at what it holds:
    measured with tracemalloc while the worker gives way to ingest; request bytes alone were half of it."""
    from agentfunnel.collector.session.held import Preparer

    for label, payloads in _payloads().items():
        metrics = Metrics()
        preparer = Preparer(HeldTraces(1 << 40, Metrics()), (), max_queue_bytes=1 << 40, metrics=metrics,
                            ingest_waiting=lambda: True)  # requests always waiting: the batches stay queued
        try:
            def queue() -> None:
                for body in payloads:  # noqa: B023 -- queue is called at once
                    preparer.submit(decode_traces_protobuf(body), [])  # noqa: B023
            _, real = _bytes_kept(queue)
            counted = metrics.snapshot()["prepare_queue_bytes"]
            assert 0.8 * real <= counted <= 1.6 * real, f"{label}: counted {counted:,} for {real:,} bytes queued"
        finally:
            preparer.stop(1)


def test_a_full_prepare_queue_never_holds_up_ingest_and_its_traces_are_read_back():
    import threading

    from agentfunnel.collector.session.held import Preparer

    path = next(OTLP.glob("pydantic-ai/shop_purchase.traces.binpb"))
    batches = [decode_traces_protobuf(path.read_bytes()) for _ in range(3)]
    metrics = Metrics()
    held = HeldTraces(1 << 30, metrics)
    release, told = threading.Event(), []
    preparer = Preparer(held, (), max_queue_bytes=1, metrics=metrics,
                        listeners=[lambda c: (told.append(c), c.batch is batches[0] and release.wait(10))])
    preparer.submit(batches[0], [])  # taken by the worker, which then waits in the listener
    while not told:
        release.wait(0.01)
    preparer.submit(batches[1], [])  # queued (the queue was empty)
    preparer.submit(batches[2], [])  # does not fit: told at once, unprepared, and its traces marked
    assert told[-1].batch is batches[2] and told[-1].prepared is None
    assert metrics.get("prepare_skipped") == len(batches[2])
    release.set()
    assert preparer.drain(10)
    assert [c.batch for c in told] == [batches[0], batches[2], batches[1]]  # commit order, the skipped one at once
    assert told[2].prepared is not None
    assert held.take(batches[0].trace_id[0]) is None  # a batch of the trace was not held: read it back
    preparer.stop(1)
