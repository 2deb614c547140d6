"""The session stage with its compiled path equals the stage without it (the records path, the reference).

The same requests (every recorded fixture, agent traffic of many turns, split across requests in any
order, some traces shown open before they close, log records tied to spans, spans resent, a trace
reopened after it closed, a case run judged) go through two stages on files of their own, one with
``sessions.compiled_path`` on and one with it off; every row the session stage writes is the same.
Each runs the real pipeline, store and jobs in process: the process tests prove the server's wiring.
"""

from __future__ import annotations

import json
import random
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from agentfunnel.collector.config import Settings
from otlp_build import split_request, trace_request
from stage_support import commit, session_stage

ROOT = Path(__file__).parents[1]
OTLP = ROOT / "tests" / "fixtures" / "otlp"

QUERIES = {
    "sessions": "SELECT * EXCLUDE (updated_at, version) FROM sessions ORDER BY session_id",
    "tool_calls": "SELECT * EXCLUDE (first_received) FROM tool_calls ORDER BY trace_id, span_id",
    "index": "SELECT * EXCLUDE (first_received, assembled_at), assembled_at IS NULL FROM trace_index ORDER BY trace_id",
    "spans": "SELECT trace_id, span_id, session_id, dialect FROM spans ORDER BY trace_id, span_id",
}


def agent_traffic(sessions: int, turns: int, seed: int) -> list[bytes]:
    sys.path.insert(0, str(ROOT / "bench"))
    from sessions_payloads import session_streams

    streams = session_streams(sessions, turns, 2, 64, active=8, seed=seed, prefix=f"stage{seed}")
    return [body for stream in streams.bodies for body in stream]


def fixture_requests(rnd: random.Random) -> list[bytes]:
    """Every recorded framework's trace requests, each split across one to three requests, all interleaved."""
    parts = [part for path in sorted(OTLP.glob("*/*.traces.binpb"))
             for part in split_request(path.read_bytes(), rnd.choice((1, 2, 3)), rnd)]
    rnd.shuffle(parts)
    return parts


def run(tmp_path: Path, name: str, compiled: bool, steps: list[tuple[str, Any]],
        extra: dict[str, Any] | None = None) -> tuple[dict[str, list], dict[str, Any]]:
    """The steps through a stage of its own: ("traces" | "logs", body), ("preview", None), ("flush", None)."""
    extra = dict(extra or {})
    sessions = {"idle_timeout_seconds": 3600, **extra.pop("sessions", {}), "compiled_path": compiled}
    settings = Settings.model_validate({
        "store": {"path": str(tmp_path / f"{name}-{'c' if compiled else 'p'}.duckdb")}, "sessions": sessions, **extra})
    with session_stage(settings) as (store, service, metrics):
        assert (service.compiled is not None) == compiled
        for kind, body in steps:
            if kind in ("traces", "logs"):
                commit(store, service, body, kind)
            elif kind == "preview":
                service.preparer.drain(None)
                if (fut := service.preview_open()) is not None:
                    fut.result()
            else:
                service.preparer.drain(None)
                service.flush()
        service.preparer.drain(None)
        service.flush()
        rows = {k: store.submit_job(lambda con, q=q: con.execute(q).fetchall()).result() for k, q in QUERIES.items()}
        counts = {k: metrics.get(k) for k in ("spans_compiled", "spans_handed_back", "traces_read_back")}
        # nothing left held or kept, not even that a trace was handed back
        assert service.held.bytes == 0 and (service.compiled is None or len(service.compiled) == 0)
    return rows, counts


def assert_equal(tmp_path: Path, name: str, steps: list[tuple[str, Any]], extra: dict[str, Any] | None = None,
                 ) -> tuple[dict[str, Any], dict[str, Any]]:
    want, plain = run(tmp_path, name, False, steps, extra)
    got, compiled = run(tmp_path, name, True, steps, extra)
    for table in QUERIES:
        assert got[table] == want[table], (name, table)
    assert not plain["spans_compiled"]
    assert want["sessions"]  # the traffic makes sessions
    return compiled, plain


def test_agent_traffic_of_many_turns_gives_the_same_rows_and_is_read_in_c(tmp_path):
    bodies = agent_traffic(12, 4, seed=3)
    compiled, _ = assert_equal(tmp_path, "turns", [("traces", b) for b in bodies])
    assert compiled["spans_compiled"] and not compiled["traces_read_back"]


def test_every_recorded_fixture_split_and_interleaved_gives_the_same_rows(tmp_path):
    steps = [("traces", b) for b in fixture_requests(random.Random(5))]
    compiled, _ = assert_equal(tmp_path, "fixtures", steps)
    assert compiled["spans_compiled"] >= 100 and compiled["spans_handed_back"]


def test_previews_flushes_and_resends_between_requests_give_the_same_rows(tmp_path):
    rnd = random.Random(8)
    bodies = agent_traffic(6, 3, seed=9) + fixture_requests(rnd)
    steps: list[tuple[str, Any]] = []
    for i, body in enumerate(bodies):
        steps.append(("traces", body))
        if i % 7 == 3:
            steps.append(("preview", None))
        if i % 11 == 5:
            steps.append(("traces", body))  # resent: its spans are duplicates the store drops
        if i % 17 == 9:
            steps.append(("flush", None))  # closes what is open: later requests of its traces reopen them
    compiled, _ = assert_equal(tmp_path, "mixed", steps)
    assert compiled["spans_compiled"] and compiled["traces_read_back"]


def test_log_records_tied_to_kept_spans_give_the_same_rows(tmp_path):
    from opentelemetry.proto.collector.logs.v1.logs_service_pb2 import ExportLogsServiceRequest

    bodies = agent_traffic(3, 2, seed=4)
    first = trace_request([])  # the shape of a request, to read the bodies' ids
    first.ParseFromString(bodies[0])
    spans = [s for rs in first.resource_spans for ss in rs.scope_spans for s in ss.spans][:3]
    logs = ExportLogsServiceRequest()
    records = logs.resource_logs.add().scope_logs.add()
    for s in spans:
        record = records.log_records.add(trace_id=s.trace_id, span_id=s.span_id, time_unix_nano=s.start_time_unix_nano)
        record.body.string_value = "tool output was cut"
        record.attributes.add(key="event.name", value={"string_value": "gen_ai.tool.message"})
    steps = [("traces", bodies[0]), ("logs", logs.SerializeToString()), *(("traces", b) for b in bodies[1:])]
    compiled, _ = assert_equal(tmp_path, "logs", steps)
    assert compiled["traces_read_back"]  # a trace a log record joins is read by the records path


@pytest.mark.parametrize("limit", [64, 1 << 20])
def test_the_pipelines_value_cut_gives_the_same_rows(tmp_path, limit):
    bodies = agent_traffic(4, 2, seed=6)
    assert_equal(tmp_path, f"cut{limit}", [("traces", b) for b in bodies],
                 {"receivers": {"max_attribute_value_bytes": limit}})


def test_a_small_held_bound_evicts_kept_traces_and_gives_the_same_rows(tmp_path):
    bodies = agent_traffic(8, 3, seed=12)
    compiled, _ = assert_equal(tmp_path, "evicted", [("traces", b) for b in bodies],
                               {"sessions": {"max_held_bytes": 40_000, "push_back_when_held_full": False}})
    assert compiled["traces_read_back"]


def shared_trace(conversations: tuple[str, ...], seed: int) -> bytes:
    """One trace that two conversations share: an agent span per conversation under a root without a key."""
    rnd = random.Random(seed)
    tid, root, base = rnd.randbytes(16), rnd.randbytes(8), 1_700_000_000_000_000_000 + seed * 1_000_000_000
    spans = [{"trace_id": tid, "span_id": root, "name": "invoke_agent router", "start": base, "end": base + 9_000_000,
              "attributes": {"gen_ai.operation.name": "invoke_agent", "gen_ai.agent.name": "router"}}]
    for n, conversation in enumerate(conversations):
        agent = rnd.randbytes(8)
        spans += [
            {"trace_id": tid, "span_id": agent, "parent_span_id": root, "name": "invoke_agent shop",
             "start": base + n * 3_000_000 + 1, "end": base + n * 3_000_000 + 2_000_000,
             "attributes": {"gen_ai.operation.name": "invoke_agent", "gen_ai.agent.name": "shop",
                            "gen_ai.conversation.id": conversation}},
            {"trace_id": tid, "span_id": rnd.randbytes(8), "parent_span_id": agent, "name": "execute_tool search_products",
             "start": base + n * 3_000_000 + 10, "end": base + n * 3_000_000 + 1_000_000,
             "attributes": {"gen_ai.operation.name": "execute_tool", "gen_ai.tool.name": "search_products",
                            "gen_ai.tool.call.arguments": '{"q": "%s"}' % conversation,
                            "gen_ai.tool.call.result": '{"products": [{"id": "p%d"}]}' % n}}]
    return trace_request(spans).SerializeToString()


def test_a_trace_two_sessions_share_gives_the_same_rows(tmp_path):
    steps = [("traces", shared_trace(("conv-a", "conv-b"), 1)), ("traces", shared_trace(("conv-b",), 2)),
             ("traces", shared_trace(("conv-c", "conv-a", "conv-d"), 3))]
    compiled, _ = assert_equal(tmp_path, "shared", steps)
    assert compiled["spans_compiled"] and compiled["traces_read_back"] == 2  # a summary is a whole trace's


def test_a_production_session_the_compiled_path_read_is_judged_from_its_full_records(tmp_path):
    """The production judge reads a sampled session's records (its request, answer and tool calls): a session the
    compiled path read has none in memory, so they are read from the store; the judge is asked the same."""
    import yaml

    from conftest import run_cli
    from test_compiled_summaries import COMPILED
    from test_judge import FakeMessagesAPI, verdict_reply

    kept = [p for p in sorted(OTLP.glob("*/*.traces.binpb")) if COMPILED.compiled(p.read_bytes())[0]]
    assert kept
    asked: dict[bool, list[str]] = {}
    api = FakeMessagesAPI(route=lambda body: verdict_reply({
        "status": "complete", "score": 0.5, "explanation": "ok", "missing_requirements": [],
        "unsupported_claims": [], "criteria": []}))
    try:
        for compiled in (False, True):
            where = tmp_path / str(compiled)
            where.mkdir()
            (where / "rubric.txt").write_text("1.0: the user got what they asked for.\n0.0: they did not.")
            config = {"judge": {"api_key": "test-key", "base_url": api.url, "max_retries": 0, "requests_per_minute": 60_000,
                                "production": {"sample_rate": 1.0, "rubric_file": str(where / "rubric.txt")}},
                      "sessions": {"compiled_path": compiled}}
            (where / "agentfunnel.yaml").write_text(yaml.safe_dump(config))
            before = len(api.requests)
            run_cli("ingest", "--db", str(where / "p.duckdb"), "--config", str(where / "agentfunnel.yaml"),
                    *map(str, kept))
            asked[compiled] = sorted(json.dumps(r["body"]["messages"], sort_keys=True) for r in api.requests[before:])
    finally:
        api.close()
    # as sets: two sessions asking the same at once may each send it (the judge's cache answers the later ones)
    assert set(asked[True]) == set(asked[False]) and len(set(asked[True])) >= 3


T0 = 1_700_000_000_000_000_000


def test_a_traces_agent_version_is_its_first_spans_by_start_whatever_arrives_first(tmp_path):
    """Assembly reads the resource's ``service.version`` of the first span by start (the store's order)."""
    tid, root, child = b"\x01" * 16, b"\x02" * 8, b"\x03" * 8
    keyed = {"gen_ai.conversation.id": "conv-versions"}
    child_first = trace_request([{"trace_id": tid, "span_id": child, "parent_span_id": root, "name": "chat m",
                                  "start": T0 + 5_000_000, "end": T0 + 6_000_000,
                                  "attributes": {"gen_ai.operation.name": "chat", "gen_ai.request.model": "m", **keyed}}],
                                resource={"service.name": "llm", "service.version": "2.0"}).SerializeToString()
    root_last = trace_request([{"trace_id": tid, "span_id": root, "name": "invoke_agent a", "start": T0,
                                "end": T0 + 9_000_000,
                                "attributes": {"gen_ai.operation.name": "invoke_agent", "gen_ai.agent.name": "a", **keyed}}],
                              resource={"service.name": "agent", "service.version": "1.0"}).SerializeToString()
    compiled, _ = assert_equal(tmp_path, "versions", [("traces", child_first), ("traces", root_last)])
    assert compiled["spans_compiled"] == 2


def test_sessions_whose_traces_tie_read_the_same_slices_with_every_request_resent(tmp_path):
    """Resent spans send a trace to the records path (its span ids twice); a session's provider, where its traces
    name two as often, is then still read in one order (first received, then trace id)."""
    bodies = agent_traffic(3, 2, seed=21)
    compiled, _ = assert_equal(tmp_path, "resent", [step for b in bodies for step in (("traces", b), ("traces", b))])
    assert compiled["traces_read_back"]


def tool_spans(trace_id: bytes, count: int, result_bytes: int, failing: bool = False) -> list[dict[str, Any]]:
    rnd = random.Random(trace_id + bytes([count]))
    return [{"trace_id": trace_id, "span_id": rnd.randbytes(8), "name": "execute_tool search", "start": T0 + i,
             "end": T0 + i + 10, "events": [{"name": "exception"}] if failing else [],
             "attributes": {"gen_ai.operation.name": "execute_tool", "gen_ai.tool.name": "search",
                            "gen_ai.conversation.id": trace_id.hex(),
                            "gen_ai.tool.call.result": '{"x": "%s"}' % ("y" * result_bytes)}} for i in range(count)]


@contextmanager
def compiled_stage(path: Path) -> Iterator[tuple[Any, Any, Any]]:
    """A stage with the compiled path on its own store file, traces open until flushed."""
    settings = Settings.model_validate({"store": {"path": str(path)}, "sessions": {"idle_timeout_seconds": 3600}})
    with session_stage(settings) as (store, service, metrics):
        assert service.compiled is not None
        yield store, service, metrics


def prepared(store: Any, service: Any, spans: list[dict[str, Any]]) -> None:
    """The spans sent in one request, committed and prepared."""
    commit(store, service, trace_request(spans).SerializeToString())
    service.preparer.drain(None)


def test_what_the_compiled_path_keeps_counts_in_held_bytes_trace_by_trace(tmp_path):
    """A request that hands back one trace kept before (freeing its bytes) and keeps another charges the other
    what it keeps: the session stage's bound sees it."""
    a, b = b"\xaa" * 16, b"\xbb" * 16
    with compiled_stage(tmp_path / "bytes.duckdb") as (store, service, _):
        prepared(store, service, tool_spans(a, 10, 50_000))
        assert service.held.bytes >= service.compiled.counts()["bytes"] > 500_000
        prepared(store, service, tool_spans(a, 1, 10, failing=True) + tool_spans(b, 10, 40_000))
        kept = service.compiled.counts()["bytes"]
        assert 400_000 < kept <= service.held.bytes < kept + 10_000  # b's, and what a's records hold
        service.flush()
        assert service.held.bytes == 0 and len(service.compiled) == 0


def test_a_trace_assembled_while_a_batch_of_it_waits_leaves_nothing_kept(tmp_path):
    """The trace's job finds a batch of it not yet prepared: it is read back whole, and when the worker reaches the
    batch (which the walk hands back) nothing of the trace stays in the compiled path."""
    import threading

    tid = b"\x42" * 16
    with compiled_stage(tmp_path / "pending.duckdb") as (store, service, metrics):
        prepared(store, service, tool_spans(tid, 1, 10))
        gate, keep = threading.Event(), service.compiled.keep
        service.compiled.keep = lambda batch: gate.wait() and keep(batch)  # type: ignore[method-assign]
        commit(store, service, trace_request(tool_spans(tid, 2, 10, failing=True)[1:]).SerializeToString())
        service._assemble(service.tracker.take()).result()  # its job, with the batch still waiting
        gate.set()
        service.preparer.drain(None)
        service.flush()
        assert metrics.get("traces_read_back") == 1
        assert len(service.compiled) == 0 and service.compiled.counts()["bytes"] == 0 and service.held.bytes == 0
