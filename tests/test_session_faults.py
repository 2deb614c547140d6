"""Nothing stays open or unassembled by accident: a span between a trace's pick and its job, a kill -9 or a stop out
of time with sessions open, a full disk during assembly; each against a real ``agentfunnel serve``."""

from __future__ import annotations

import json
import os
import threading
import time
import urllib.request
from pathlib import Path

from conftest import ServerProcess, read_db, sql, started_after_kill
from otlp_build import trace_request
from test_store_faults import _fill, small_disk  # noqa: F401 - the small file system fixture

FILLERS = 60  # traces whose jobs run before the late trace's: a window of seconds between its pick and its job
LATE = "zz-late"  # sorts after the fillers' keys: its job is the last of the flush


def _turn(conversation: str, n: int = 0, tools: int = 1, pad: int = 0) -> list[dict]:
    """A turn: an agent span naming the conversation over ``tools`` tool calls (each with ``pad`` bytes of result)."""
    tid, root, base = os.urandom(16), os.urandom(8), 1_700_000_000_000_000_000 + n * 60_000_000_000
    spans = [{"trace_id": tid, "span_id": root, "name": "invoke_agent shop", "start": base, "end": base + 9_000_000,
              "attributes": {"gen_ai.operation.name": "invoke_agent", "gen_ai.agent.name": "shop",
                             "gen_ai.conversation.id": conversation}}]
    for i in range(tools):
        spans.append(_tool(spans[0], i, pad))
    return spans


def _tool(root: dict, i: int, pad: int = 0, name: str = "search_products") -> dict:
    start = root["start"] + (i + 1) * 1_000_000
    return {"trace_id": root["trace_id"], "span_id": os.urandom(8), "parent_span_id": root["span_id"],
            "name": f"execute_tool {name}", "start": start, "end": start + 500_000,
            "attributes": {"gen_ai.operation.name": "execute_tool", "gen_ai.tool.name": name,
                           "gen_ai.tool.call.arguments": json.dumps({"q": f"q{i}"}),
                           "gen_ai.tool.call.result": json.dumps({"products": [{"id": "p1"}], "pad": "x" * pad})}}


def _post(srv: ServerProcess, spans: list[dict]) -> None:
    req = urllib.request.Request(srv.http_url + "/v1/traces", data=trace_request(spans).SerializeToString(),
                                 headers={"Content-Type": "application/x-protobuf"})
    with urllib.request.urlopen(req, timeout=60) as resp:
        assert resp.status == 200


def _metrics(srv: ServerProcess) -> dict:
    with urllib.request.urlopen(srv.http_url + "/metrics?format=json", timeout=30) as resp:
        return json.loads(resp.read())


def _wait(predicate, timeout: float = 60.0, every: float = 0.2):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(every)
    raise AssertionError("condition not reached in time")


def _config(tmp_path: Path, name: str, **extra: object) -> Path:
    """Traces assembled only when flushed (no idle close, no preview during the test), one trace per job."""
    settings = {"idle_timeout_seconds": 600, "check_interval_seconds": 0.2, "open_refresh_seconds": 0,
                "max_traces_per_job": 1, **extra}
    path = tmp_path / f"{name}.toml"
    path.write_text("[sessions]\n" + "".join(f"{k} = {v}\n" for k, v in settings.items()))
    return path


def _inputs() -> tuple[list[list[dict]], list[dict], list[dict]]:
    """The fillers' turns, the late conversation's turn, and the span of it that arrives late."""
    fillers = [_turn(f"conv-{i:03d}") for i in range(FILLERS)]
    late_turn = _turn(LATE)
    return fillers, late_turn, [_tool(late_turn[0], 5, name="get_product_details")]


def _late_span_between_pick_and_job(srv: ServerProcess, late_span: list[dict]) -> None:
    """Flush (every trace picked at once, assembled one job after another, the late conversation's last), and post
    the late span once the traces are picked; checked: it was committed before the late trace's job ran."""
    flushed: dict = {}
    flush = threading.Thread(target=lambda: flushed.update(srv.admin_post("/flush")))
    flush.start()
    _wait(lambda: _metrics(srv)["open_traces"] == 0, every=0.005)
    _post(srv, late_span)
    at_ack = _metrics(srv).get("traces_assembled", 0)  # the late trace's job counts as it ends, before any later commit
    flush.join(120)
    assert at_ack < FILLERS + 1, "the late trace's job ran before its late span: no window between pick and job"
    assert flushed["traces"] == FILLERS + 1


def _sessions(db: Path) -> list[dict]:
    return read_db(db, "SELECT * EXCLUDE (updated_at, version) FROM sessions ORDER BY session_id")


def _stored(db: Path) -> dict[str, list[dict]]:
    """What the session stage leaves in a file: its sessions and their tool calls, without when they were written
    (a session's ``updated_at`` and ``version``, a call's ``first_received``: a re-score moves them, rightly), and
    its case runs (none from these inputs: compared all the same)."""
    return {"sessions": _sessions(db),
            "tool_calls": read_db(db, "SELECT * EXCLUDE (first_received) FROM tool_calls ORDER BY trace_id, span_id"),
            "case_runs": read_db(db, "SELECT * EXCLUDE (updated_at) FROM case_runs ORDER BY session_id")}


def _uninterrupted(tmp_path: Path, server_factory, batches: list[list[dict]]) -> dict[str, list[dict]]:
    """What the same input leaves (``_stored``), posted and flushed by one process that nobody stops."""
    db = tmp_path / "uninterrupted.duckdb"
    srv = server_factory(["--config", str(_config(tmp_path, "plain"))], db=db)
    for spans in batches:
        _post(srv, spans)
    srv.admin_post("/flush")
    assert srv.stop() == 0
    return _stored(db)


def test_a_span_between_a_traces_pick_and_its_job_leaves_its_session_to_close_after_a_kill(server_factory, tmp_path):
    fillers, late_turn, late_span = _inputs()
    db = tmp_path / "late.duckdb"
    cfg = _config(tmp_path, "late")
    srv = server_factory(["--config", str(cfg)], db=db)
    for spans in [*fillers, late_turn]:
        _post(srv, spans)
    _late_span_between_pick_and_job(srv, late_span)
    shown = sql(db, f"SELECT status, span_count FROM sessions WHERE session_id = '{LATE}'")
    assert shown == [{"status": "open", "span_count": 3}]  # the late span is in, and its trace is open again
    reopened = _metrics(srv).get("traces_reopened_before_assembly", 0)
    srv.kill()  # before the trace goes idle again

    again = started_after_kill(server_factory, ["--config", str(cfg)], db)
    assert again.admin_post("/flush")["traces"] == 1
    assert again.stop() == 0
    rows = read_db(db, "SELECT session_id, status, span_count, tool_call_count FROM sessions "
                       f"WHERE session_id = '{LATE}' OR status = 'open'")
    assert rows == [{"session_id": LATE, "status": "closed", "span_count": 3, "tool_call_count": 2}]
    assert reopened == 1  # and counted


def test_a_kill_with_sessions_open_ends_every_session_closed_and_as_an_uninterrupted_run(server_factory, tmp_path):
    fillers, late_turn, late_span = _inputs()
    # next turns of some conversations: open, not yet assembled, when killed (no preview: one would show the late
    # trace too, and a preview's rows are left for the next start already)
    second_turns = [_turn(f"conv-{i:03d}", n=1) for i in range(0, FILLERS, 10)]
    db = tmp_path / "killed.duckdb"
    cfg = _config(tmp_path, "killed")
    srv = server_factory(["--config", str(cfg)], db=db)
    for spans in [*fillers, late_turn]:
        _post(srv, spans)
    _late_span_between_pick_and_job(srv, late_span)
    for spans in second_turns:
        _post(srv, spans)
    assert sql(db, "SELECT session_id FROM sessions WHERE status = 'open'") == [{"session_id": LATE}]
    assert _metrics(srv)["open_traces"] == 1 + len(second_turns)
    srv.kill()

    again = started_after_kill(server_factory, ["--config", str(cfg)], db)
    again.admin_post("/flush")
    assert again.stop() == 0
    got = _sessions(db)
    assert [r["session_id"] for r in got if r["status"] != "closed"] == []
    assert _stored(db) == _uninterrupted(tmp_path, server_factory, [*fillers, late_turn, late_span, *second_turns])


def test_a_stop_out_of_assembly_time_with_a_session_open_is_closed_by_the_next_start(server_factory, tmp_path):
    fillers, late_turn, late_span = _inputs()
    db = tmp_path / "stopped.duckdb"
    srv = server_factory(["--config", str(_config(tmp_path, "stop", shutdown_assembly_seconds=0))], db=db)
    for spans in [*fillers, late_turn]:
        _post(srv, spans)
    _late_span_between_pick_and_job(srv, late_span)
    assert srv.stop() == 0
    assert "not yet assembled" in srv.logs()  # the stop ran out of time with the late trace open

    again = server_factory(["--config", str(_config(tmp_path, "restart"))], db=db)
    again.admin_post("/flush")
    assert again.stop() == 0
    got = _sessions(db)
    assert [r["session_id"] for r in got if r["status"] != "closed"] == []
    assert _stored(db) == _uninterrupted(tmp_path, server_factory, [*fillers, late_turn, late_span])


def _flush_until_killed(srv: ServerProcess) -> None:
    try:
        srv.admin_post("/flush")
    except OSError:  # the kill closes the connection: expected
        pass


def test_a_kill_in_the_middle_of_session_jobs_appending_new_versions_restarts_to_an_uninterrupted_runs_sessions(
        server_factory, tmp_path):
    """Every session is stored (version 1); their next turns are flushed one job each, and the process is killed
    while those jobs append the sessions' next versions. The next start assembles what was left and ends with the
    rows an uninterrupted run has, and its compaction leaves one row per session that reads the same."""
    first = [_turn(f"conv-{i:03d}", tools=2) for i in range(FILLERS)]
    second = [_turn(f"conv-{i:03d}", n=1) for i in range(FILLERS)]
    db = tmp_path / "mid-job.duckdb"
    srv = server_factory(["--config", str(_config(tmp_path, "mid-job"))], db=db)
    for spans in first:
        _post(srv, spans)
    srv.admin_post("/flush")
    for spans in second:
        _post(srv, spans)
    assembled = _metrics(srv)["traces_assembled"]
    threading.Thread(target=_flush_until_killed, args=(srv,), daemon=True).start()
    _wait(lambda: _metrics(srv).get("traces_assembled", 0) >= assembled + FILLERS // 4, every=0.01)
    srv.kill()
    done = read_db(db, "SELECT count(*) AS n FROM sessions WHERE trace_count = 2")[0]["n"]
    assert 0 < done < FILLERS, "the kill came before or after the session jobs, not among them"

    again = started_after_kill(server_factory, ["--config", str(_config(tmp_path, "again", compact_every_seconds=0.2))], db)
    again.admin_post("/flush")
    _wait(lambda: sql(db, "SELECT count(*) AS n FROM session_rows") == [{"n": 0}])  # every appended row folded
    assert _metrics(again)["session_rows_compacted"] >= FILLERS - done
    assert again.stop() == 0
    got = _sessions(db)
    assert _stored(db) == _uninterrupted(tmp_path, server_factory, [*first, *second])
    assert all(r["trace_count"] == 2 and r["status"] == "closed" for r in got)
    assert read_db(db, "SELECT count(*) AS n FROM session_rows_compacted") == [{"n": FILLERS}]  # one row each


def test_traces_whose_assembly_hit_a_full_disk_are_assembled_once_space_is_freed(small_disk, tmp_path):  # noqa: F811
    cfg = _config(tmp_path, "disk", max_traces_per_job=256, assembly_retry_seconds=0.5)
    srv = ServerProcess(small_disk / "af.duckdb", ["--config", str(cfg)], log_dir=tmp_path).start()
    try:
        conversations = [f"conv-disk-{i}" for i in range(5)]
        for c in conversations:
            _post(srv, _turn(c, tools=20, pad=4000))
        filler = _fill(small_disk)
        srv.admin_post("/flush")  # assembly writes tool calls, index rows, stamps and sessions: it cannot commit
        metrics = _metrics(srv)
        assert metrics["traces_assembly_deferred"] >= 5 and metrics.get("traces_failed", 0) == 0, metrics
        assert metrics["traces_awaiting_retry"] == 5
        filler.unlink()
        rows = _wait(lambda: (r := sql(srv.db, "SELECT session_id, status, tool_call_count FROM sessions "
                                               "ORDER BY session_id")) and len(r) == 5 and r)
        assert rows == [{"session_id": c, "status": "closed", "tool_call_count": 20} for c in conversations]
        assert _metrics(srv)["traces_awaiting_retry"] == 0
    finally:
        srv.stop()
