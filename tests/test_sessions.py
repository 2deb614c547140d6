"""Sessions across traces and requests, in any order, across a crash; reopened, merged, bounded, visible while open."""

from __future__ import annotations

import json
import os
import random
import time
import urllib.request

import pytest

from conftest import sql
from otlp_build import trace_request

CONV = "conv-shuffle"


def _turns() -> list[list[dict]]:
    """Three turns of one conversation; only each turn's root carries the conversation id."""
    turns = []
    plan = [
        [("search_products", {"q": "shoe"}, {"products": [{"id": "p1"}]}),
         ("get_product_details", {"id": "p1"}, {"id": "p1", "variants": [{"id": "v1"}]})],
        [("add_to_cart", {"variant": "v1"}, {"cart_id": "c1", "checkout_url": "https://s.example/c/c1"})],
        [("complete_checkout", {"cart": "c1"}, {"order": {"id": "o9", "status": "confirmed"}})],
    ]
    t0 = 1_700_000_000_000_000_000
    for n, calls in enumerate(plan):
        tid, root = os.urandom(16), os.urandom(8)
        base = t0 + n * 60_000_000_000
        spans = [{"trace_id": tid, "span_id": root, "name": "invoke_agent shop", "start": base, "end": base + 9_000_000,
                  "attributes": {"gen_ai.operation.name": "invoke_agent", "gen_ai.agent.name": "shop",
                                 "gen_ai.conversation.id": CONV,
                                 **({"gen_ai.output.messages": json.dumps([{"role": "assistant", "parts": [
                                     {"type": "text", "content": "Order o9 is confirmed."}]}])} if n == 2 else {})}}]
        for i, (tool, args, result) in enumerate(calls):
            s = base + (i + 1) * 1_000_000
            spans.append({"trace_id": tid, "span_id": os.urandom(8), "parent_span_id": root, "name": "chat m",
                          "start": s, "end": s + 100_000,
                          "attributes": {"gen_ai.operation.name": "chat", "gen_ai.request.model": "m",
                                         "gen_ai.usage.input_tokens": 100, "gen_ai.usage.output_tokens": 10}})
            spans.append({"trace_id": tid, "span_id": os.urandom(8), "parent_span_id": root, "name": f"execute_tool {tool}",
                          "start": s + 200_000, "end": s + 300_000,
                          "attributes": {"gen_ai.operation.name": "execute_tool", "gen_ai.tool.name": tool,
                                         "gen_ai.tool.call.arguments": json.dumps(args),
                                         "gen_ai.tool.call.result": json.dumps(result)}})
        turns.append(spans)
    return turns


def _post(srv, spans: list[dict]) -> None:
    req = urllib.request.Request(srv.http_url + "/v1/traces", data=trace_request(spans).SerializeToString(),
                                 headers={"Content-Type": "application/x-protobuf"})
    assert urllib.request.urlopen(req).status == 200


def _flush(srv) -> None:
    srv.admin_post("/flush")


def _session(db, session_id: str) -> dict | None:
    rows = sql(db, f"SELECT * FROM sessions WHERE session_id = '{session_id}'")
    return rows[0] if rows else None


def _wait(predicate, timeout: float = 30.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.25)
    raise AssertionError("condition not reached in time")


@pytest.fixture
def fast_config(tmp_path):
    cfg = tmp_path / "fast.toml"
    cfg.write_text("[sessions]\nidle_timeout_seconds = 1.0\ncheck_interval_seconds = 0.2\nopen_refresh_seconds = 0\n")
    return cfg


COMPARE = ("variant", "steps", "completion_rate", "outcome", "trace_count", "span_count", "tool_call_count",
           "llm_calls", "input_tokens", "final_answer", "agent_name", "first_seen", "last_seen", "status")


def test_three_traces_shuffled_across_a_restart_equal_the_in_order_run(server_factory, tmp_path, fast_config):
    turns = _turns()
    in_order = server_factory(["--config", str(fast_config)], db=tmp_path / "ordered.duckdb")
    for spans in turns:
        _post(in_order, spans)
    # every turn: on a loaded machine the first ones may go idle, and close, before the last is posted (it reopens)
    expected = _wait(lambda: (s := _session(in_order.db, CONV)) and s["status"] == "closed" and s["trace_count"] == 3
                     and s)
    assert expected["outcome"] == "purchase_completed" and expected["trace_count"] == 3
    assert expected["steps"] == ["search", "details", "cart", "checkout"]

    # the same spans, cut into single-span requests, shuffled across traces, with a kill -9 in the middle
    pieces = [[s] for spans in turns for s in spans]
    random.Random(3).shuffle(pieces)
    db = tmp_path / "shuffled.duckdb"
    first = server_factory(["--config", str(fast_config)], db=db)
    half = len(pieces) // 2
    for p in pieces[:half]:
        _post(first, p)
    first.kill()
    second = server_factory(["--config", str(fast_config)], db=db)
    for p in pieces[half:]:
        _post(second, p)
    got = _wait(lambda: (s := _session(db, CONV)) and s["status"] == "closed" and s["trace_count"] == 3
                and s["span_count"] == expected["span_count"] and s)
    _wait(lambda: sql(db, "SELECT count(*) AS n FROM spans WHERE dialect IS NULL")[0]["n"] == 0)
    got = _session(db, CONV)
    assert {k: got[k] for k in COMPARE} == {k: expected[k] for k in COMPARE}
    assert sql(db, "SELECT count(*) AS n FROM sessions")[0]["n"] == 1  # no provisional leftovers


def test_a_late_span_reopens_and_rescores_a_closed_session(server_factory, fast_config):
    srv = server_factory(["--config", str(fast_config)])
    turns = _turns()
    for spans in turns[:2]:
        _post(srv, spans)
    # under load the first turn may close before the second arrives: wait for both
    before = _wait(lambda: (s := _session(srv.db, CONV)) and s["status"] == "closed" and s["trace_count"] == 2 and s)
    assert before["outcome"] == "checkout_reached"
    _post(srv, turns[2])
    after = _wait(lambda: (s := _session(srv.db, CONV)) and s["outcome"] == "purchase_completed" and s)
    assert after["version"] > before["version"] and after["trace_count"] == 3


def test_a_provisional_session_merges_when_its_key_arrives(server_factory, fast_config):
    srv = server_factory(["--config", str(fast_config)])
    tid, root = os.urandom(16), os.urandom(8)
    tool = {"trace_id": tid, "span_id": os.urandom(8), "parent_span_id": root, "name": "execute_tool search_products",
            "attributes": {"gen_ai.operation.name": "execute_tool", "gen_ai.tool.name": "search_products",
                           "gen_ai.tool.call.result": json.dumps({"products": [{"id": "p"}]})}}
    _post(srv, [tool])
    _flush(srv)
    assert _session(srv.db, tid.hex())["outcome"] == "search_only"  # keyed by trace id for now
    _post(srv, [{"trace_id": tid, "span_id": root, "name": "invoke_agent shop",
                 "attributes": {"gen_ai.operation.name": "invoke_agent", "gen_ai.conversation.id": "conv-late-key"}}])
    _flush(srv)
    assert _session(srv.db, tid.hex()) is None
    merged = _session(srv.db, "conv-late-key")
    assert merged["span_count"] == 2 and merged["steps"] == ["search"]
    assert sql(srv.db, "SELECT DISTINCT session_id FROM tool_calls")[0]["session_id"] == "conv-late-key"


def test_open_sessions_are_visible_before_the_idle_timeout(server_factory, tmp_path):
    cfg = tmp_path / "open.toml"
    cfg.write_text("[sessions]\nidle_timeout_seconds = 600\ncheck_interval_seconds = 0.2\nopen_refresh_seconds = 0.3\n")
    srv = server_factory(["--config", str(cfg)])
    _post(srv, _turns()[0])
    row = _wait(lambda: _session(srv.db, CONV))
    assert row["status"] == "open" and row["steps"] == ["search", "details"]


def test_open_traces_are_bounded_and_early_closes_are_counted(server_factory, tmp_path):
    cfg = tmp_path / "bound.toml"
    cfg.write_text("[sessions]\nidle_timeout_seconds = 600\nmax_open_traces = 2\nopen_refresh_seconds = 0\n")
    srv = server_factory(["--config", str(cfg)])
    for n in range(5):
        _post(srv, [{"name": "invoke_agent a", "attributes": {"gen_ai.operation.name": "invoke_agent",
                                                               "gen_ai.conversation.id": f"conv-{n}"}}])
    metrics = _wait(lambda: (m := json.loads(urllib.request.urlopen(srv.http_url + "/metrics?format=json").read()))
                    and m.get("sessions_finalized_early", 0) >= 3 and m)
    assert metrics["open_traces"] <= 2
    closed = _wait(lambda: len(sql(srv.db, "SELECT * FROM sessions WHERE status = 'closed'")) >= 3 and True)
    assert closed


def test_rescore_rederives_sessions_after_a_config_change(tmp_path):
    from conftest import FIXTURES, run_cli

    db = tmp_path / "rescore.duckdb"
    run_cli("ingest", "--db", str(db), *map(str, sorted((FIXTURES / "otlp" / "pydantic-ai").glob("shop_*.binpb"))))
    before = {r["session_id"]: r for r in sql(db, "SELECT * FROM sessions")}
    assert {r["variant"] for r in before.values()} == {"shopping"}
    cfg = tmp_path / "pin.yaml"
    cfg.write_text("scoring:\n  funnel:\n    agents:\n      shopping_agent: lodging\n"
                   "    extra_patterns:\n      checkout: [complete_checkout]\n")
    out = run_cli("rescore", "--db", str(db), "--config", str(cfg), "--stale")
    assert "rescored the sessions of 3 trace(s)" in out.stdout
    after = {r["session_id"]: r for r in sql(db, "SELECT * FROM sessions")}
    assert set(after) == set(before)
    for sid, row in after.items():
        assert row["variant"] == "lodging" and row["variant_source"] == "config"
        assert row["config_hash"] != before[sid]["config_hash"] and row["version"] == before[sid]["version"] + 1
    # nothing is stale any more
    again = run_cli("rescore", "--db", str(db), "--config", str(cfg), "--stale")
    assert "rescored the sessions of 0 trace(s)" in again.stdout


def test_a_stop_that_runs_out_of_assembly_time_leaves_the_rest_for_the_next_start(server_factory, tmp_path, fast_config):
    """A prompt stop under load: traces not assembled within the shutdown budget are finished on restart."""
    cfg = tmp_path / "stop.toml"
    cfg.write_text("[sessions]\nidle_timeout_seconds = 600\nopen_refresh_seconds = 0\n"
                   "shutdown_assembly_seconds = 0\nmax_traces_per_job = 1\n")
    db = tmp_path / "stop.duckdb"
    srv = server_factory(["--config", str(cfg)], db=db)
    for spans in _turns():
        _post(srv, spans)
    assert srv.stop() == 0
    assert "not yet assembled" in srv.logs()
    assert sql(db, "SELECT count(*) AS n FROM sessions")[0]["n"] == 0
    assert sql(db, "SELECT count(DISTINCT trace_id) AS n FROM spans WHERE dialect IS NULL")[0]["n"] == 3

    again = server_factory(["--config", str(fast_config)], db=db)
    row = _wait(lambda: (s := _session(again.db, CONV)) and s["status"] == "closed" and s)
    assert row["trace_count"] == 3 and row["outcome"] == "purchase_completed"


def _two_turns(conversation: str) -> list[list[dict]]:
    """Two turns of a conversation, a trace each: an agent span (which alone names the conversation) over a tool call."""
    turns = []
    for n in range(2):
        tid, root, base = os.urandom(16), os.urandom(8), 1_700_000_000_000_000_000 + n * 60_000_000_000
        turns.append([
            {"trace_id": tid, "span_id": root, "name": "invoke_agent shop", "start": base, "end": base + 9_000_000,
             "attributes": {"gen_ai.operation.name": "invoke_agent", "gen_ai.agent.name": "shop",
                            "gen_ai.conversation.id": conversation}},
            {"trace_id": tid, "span_id": os.urandom(8), "parent_span_id": root, "name": "execute_tool search_products",
             "start": base + 1_000_000, "end": base + 2_000_000,
             "attributes": {"gen_ai.operation.name": "execute_tool", "gen_ai.tool.name": "search_products",
                            "gen_ai.tool.call.arguments": json.dumps({"q": conversation}),
                            "gen_ai.tool.call.result": json.dumps({"products": [{"id": "p1"}]})}}])
    return turns


def test_job_chunks_keep_the_traces_of_a_session_together_where_they_fit():
    from datetime import datetime

    from agentfunnel.collector.session.service import job_chunks

    at = datetime(2026, 1, 1)
    traces = {t: at for t in ("a1", "b1", "c1", "a2", "b2", "c2", "x")}  # in order of idleness; x names no session
    hints = {"a1": "a", "a2": "a", "b1": "b", "b2": "b", "c1": "c", "c2": "c"}
    assert job_chunks(traces, 2, lambda ids: {t: hints[t] for t in ids if t in hints}) == [
        {"a1": at, "a2": at}, {"b1": at, "b2": at}, {"c1": at, "c2": at}, {"x": at}]
    assert job_chunks(traces, 7, lambda ids: hints) == [traces]  # one job: left in order of idleness
    assert list(job_chunks(traces, 7, lambda ids: hints)[0]) == list(traces)


def test_a_burst_split_over_several_jobs_scores_each_session_once(tmp_path):
    """Turns of a session that go idle together land in one job, even when the tick's traces need several: every
    session is written once, with both turns, never first as closed with the one turn its first job held."""
    from agentfunnel.collector.config import Settings
    from stage_support import commit, session_stage

    settings = Settings.model_validate({"store": {"path": str(tmp_path / "s.duckdb")},
                                        "sessions": {"idle_timeout_seconds": 3600, "max_traces_per_job": 2}})
    with session_stage(settings) as (store, service, metrics):
        by_conversation = {c: _two_turns(c) for c in ("conv-a", "conv-b", "conv-c")}
        for n in range(2):  # every first turn, then every second: in order of idleness, sessions interleave
            for turns in by_conversation.values():
                commit(store, service, trace_request(turns[n]).SerializeToString())
        service.preparer.drain(None)
        service.flush()
        rows = store.submit_job(lambda con: con.execute(
            "SELECT session_id, version, trace_count, status FROM sessions ORDER BY session_id").fetchall()).result()
    assert rows == [(c, 1, 2, "closed") for c in by_conversation]
    assert metrics.get("traces_assembled") == 6


def test_a_preview_leaves_the_records_held_and_a_reopened_trace_is_still_read_back(tmp_path):
    """Showing a session while its trace is open must not cost reading the trace back when it closes (with the
    default 30 s idle timeout and 5 s refresh, every trace is shown before it closes); a trace reopened after it
    closed holds only its late spans, and is read back whole."""
    from agentfunnel.collector.config import Settings
    from stage_support import commit, session_stage

    turn = _two_turns("conv-shown")[0]
    root = turn[0]
    late = [{"trace_id": root["trace_id"], "span_id": os.urandom(8), "parent_span_id": root["span_id"],
             "name": "execute_tool get_product_details", "start": root["start"] + 3_000_000,
             "end": root["start"] + 4_000_000,
             "attributes": {"gen_ai.operation.name": "execute_tool", "gen_ai.tool.name": "get_product_details",
                            "gen_ai.tool.call.arguments": json.dumps({"id": "p1"}),
                            "gen_ai.tool.call.result": json.dumps({"id": "p1"})}}]
    query = ("SELECT * EXCLUDE (updated_at, version) FROM sessions", "SELECT * EXCLUDE (first_received) FROM tool_calls ORDER BY span_id",
             "SELECT span_id, session_id, dialect FROM spans ORDER BY span_id")

    def run(name: str, shown: bool) -> tuple[list, int, list]:
        settings = Settings.model_validate({"store": {"path": str(tmp_path / f"{name}.duckdb")},
                                            "sessions": {"idle_timeout_seconds": 3600}})
        with session_stage(settings) as (store, service, metrics):
            commit(store, service, trace_request(turn[:1]).SerializeToString())
            service.preparer.drain(None)
            if shown:
                service.preview_open().result()  # the trace is open: its session is written as open
                assert store.submit_job(lambda con: con.execute(
                    "SELECT status FROM sessions").fetchall()).result() == [("open",)]
            commit(store, service, trace_request(turn[1:]).SerializeToString())  # more of it, after the preview
            service.preparer.drain(None)
            service.flush()
            closed = [store.submit_job(lambda con, q=q: con.execute(q).fetchall()).result() for q in query]
            read_back = metrics.get("traces_read_back")
            commit(store, service, trace_request(late).SerializeToString())  # reopened after it closed
            service.preparer.drain(None)
            service.flush()
            reopened = store.submit_job(lambda con: con.execute(
                "SELECT status, span_count, tool_call_count FROM sessions").fetchall()).result()
            assert metrics.get("traces_read_back") == read_back + 1  # the late span alone is not the trace
        return closed, read_back, reopened

    shown, shown_read_back, shown_reopened = run("shown", True)
    plain, plain_read_back, plain_reopened = run("plain", False)
    assert shown_read_back == plain_read_back == 0
    assert shown == plain and shown[0][0][0] == "conv-shown"
    assert shown_reopened == plain_reopened == [("closed", 3, 2)]


def test_a_trace_shown_open_is_finished_after_a_restart(tmp_path):
    """A preview stamps the trace's spans and writes its index row, as an assembly does; a process that ends before
    the trace closes (killed) must still leave it to be finished by the next start, not open for good."""
    from agentfunnel.collector.config import Settings
    from stage_support import commit, session_stage

    settings = Settings.model_validate({"store": {"path": str(tmp_path / "r.duckdb")},
                                        "sessions": {"idle_timeout_seconds": 3600}})
    status = "SELECT status, trace_count, tool_call_count FROM sessions"
    with session_stage(settings) as (store, service, _):
        commit(store, service, trace_request(_two_turns("conv-restart")[0]).SerializeToString())
        service.preparer.drain(None)
        service.preview_open().result()
        assert store.submit_job(lambda con: con.execute(status).fetchall()).result() == [("open", 1, 1)]
    with session_stage(settings) as (store, service, _):  # the store closed with the trace still open
        assert len(service.tracker) == 1
        service.flush()
        assert store.submit_job(lambda con: con.execute(status).fetchall()).result() == [("closed", 1, 1)]


def test_a_trace_closes_as_its_last_committed_preview_showed_it_when_nothing_arrived_since(tmp_path, monkeypatch):
    """Closing a trace a preview showed, with no span since, assembles nothing again (the preview's rows are the
    trace's); one whose preview failed after more spans arrived is assembled again, with them."""
    import agentfunnel.collector.session.jobs as sessions_module
    from agentfunnel.collector.config import Settings
    from agentfunnel.collector.store.local import LocalSessionTables
    from stage_support import commit, session_stage

    assembled: list[str] = []
    real, real_kept = sessions_module.assemble_held, sessions_module.assemble_kept
    monkeypatch.setattr(sessions_module, "assemble_held",  # the records path's held traces
                        lambda views, records: assembled.append(records[0].trace_id) or real(views, records))
    monkeypatch.setattr(sessions_module, "assemble_kept",  # and the compiled path's
                        lambda trace_id, *rest: assembled.append(trace_id) or real_kept(trace_id, *rest))
    turn = _two_turns("conv-as-shown")[0]
    rows = ("SELECT * EXCLUDE (updated_at, version) FROM sessions", "SELECT * EXCLUDE (first_received) FROM tool_calls ORDER BY span_id",
            "SELECT span_id, session_id, dialect FROM spans ORDER BY span_id",
            "SELECT trace_id, span_count, session_ids, assembled_at IS NOT NULL FROM trace_index")

    def closed(name: str, shown: bool) -> list:
        settings = Settings.model_validate({"store": {"path": str(tmp_path / f"{name}.duckdb")},
                                            "sessions": {"idle_timeout_seconds": 3600}})
        with session_stage(settings) as (store, service, _):
            commit(store, service, trace_request(turn).SerializeToString())
            service.preparer.drain(None)
            if shown:
                service.preview_open().result()
            assembled.clear()
            service.flush()
            assert assembled == ([] if shown else [turn[0]["trace_id"].hex()])
            return [store.submit_job(lambda con, q=q: con.execute(q).fetchall()).result() for q in rows]

    assert closed("shown", True) == closed("plain", False)

    # a preview that fails after more spans arrived leaves the earlier one's assembly stale: not used
    settings = Settings.model_validate({"store": {"path": str(tmp_path / "failed.duckdb")},
                                        "sessions": {"idle_timeout_seconds": 3600}})
    with session_stage(settings) as (store, service, _):
        commit(store, service, trace_request(turn[:1]).SerializeToString())
        service.preparer.drain(None)
        service.preview_open().result()
        commit(store, service, trace_request(turn[1:]).SerializeToString())
        service.preparer.drain(None)
        with monkeypatch.context() as failing:
            failing.setattr(LocalSessionTables, "replace_sessions", lambda *a, **k: (_ for _ in ()).throw(OSError("disk")))
            with pytest.raises(OSError):
                service.preview_open().result()
        service.flush()
        counts = store.submit_job(lambda con: con.execute(
            "SELECT status, span_count, tool_call_count FROM sessions").fetchall()).result()
    assert counts == [("closed", 2, 1)]


def test_a_trace_reopened_before_its_job_is_left_open_and_a_session_left_open_is_closed_on_start(tmp_path):
    """A span committed after its trace was picked and before the trace's job ran: the job assembles it with the span,
    the session is written open, and the trace is not marked assembled (a stop now leaves it to the next start). A
    database an earlier version left that way, marked assembled, has its open sessions re-scored on start."""
    from agentfunnel.collector.config import Settings
    from stage_support import commit, session_stage

    settings = Settings.model_validate({"store": {"path": str(tmp_path / "p.duckdb")},
                                        "sessions": {"idle_timeout_seconds": 3600}})
    turn = _two_turns("conv-picked")[0]
    status = "SELECT status, span_count, tool_call_count FROM sessions"
    with session_stage(settings) as (store, service, metrics):
        commit(store, service, trace_request(turn[:1]).SerializeToString())
        service.preparer.drain(None)
        picked = service.tracker.take()  # as the loop takes an idle trace for its job
        commit(store, service, trace_request(turn[1:]).SerializeToString())  # lands before the job runs
        service.preparer.drain(None)
        service._assemble(picked).result()
        assert store.submit_job(lambda con: con.execute(status).fetchall()).result() == [("open", 2, 1)]
        assert store.submit_job(lambda con: con.execute(
            "SELECT assembled_at FROM trace_index").fetchall()).result() == [(None,)]
        assert metrics.get("traces_reopened_before_assembly") == 1
        store.submit_job(lambda con: con.execute("UPDATE trace_index SET assembled_at = now()")).result()
    with session_stage(settings) as (store, service, metrics):  # as an earlier version left it
        assert len(service.tracker) == 0
        service.flush()
        assert store.submit_job(lambda con: con.execute(status).fetchall()).result() == [("closed", 2, 1)]
        assert metrics.get("sessions_revisited_on_start") == 1

