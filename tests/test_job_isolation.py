"""A poisoned job costs only itself: one session's failure, or one trace's, never takes the others with it.

End to end against a real ``agentfunnel serve`` with ``cases.archive_dir`` set: telemetry naming
an experiment 300 characters long, or like a path, writes a safe file inside the archive and
costs no session; an archive that cannot be written is logged once, counted, and costs none
either. Then, in process: a session whose scoring raises, and a trace whose assembly raises.
"""

from __future__ import annotations

import json
import logging
import os
import re
import time
import urllib.request
from concurrent.futures import Future
from datetime import datetime
from types import SimpleNamespace

import pytest
import yaml
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

from agentfunnel.collector.session.assembly import AssembledTrace, assemble, sessions_of
from agentfunnel.collector.config import SessionSettings
from agentfunnel.collector.decode import decode_traces_protobuf
from agentfunnel.collector.session.held import prepare
from agentfunnel.collector.session.rows import pass_rows, score_sessions
from agentfunnel.collector.session import jobs
from agentfunnel.collector.session.service import SessionService
from agentfunnel.collector.store.local import LocalSessionTables
from agentfunnel.collector.store.tables import Placement
from agentfunnel.collector.store.schema import migrate
from agentfunnel.collector.store.writer import connect
from agentfunnel.collector.telemetry import Metrics
from agentfunnel.scoring import SessionScorer
from agentfunnel.semconv import SpanView
from conftest import FIXTURES, sql
from otlp_build import trace_request
from test_stages import FX, RESULT

LONG_EXPERIMENT = "exp-" + "x" * 296
PATH_LIKE_EXPERIMENT = "../../escaped\x1b[31m/run"
SAFE_NAME = re.compile(r"^[A-Za-z0-9_-]+\.json$")


def _config(tmp_path, archive_dir) -> str:
    suite = tmp_path / "cases.yaml"
    suite.write_text(yaml.safe_dump({"cases": [{**FX, "completion_criteria": []}]}))  # no judge needed
    cfg = tmp_path / "agentfunnel.yaml"
    cfg.write_text(yaml.safe_dump({"cases": {"suite": str(suite), "archive_dir": str(archive_dir)},
                                   "sessions": {"idle_timeout_seconds": 1, "check_interval_seconds": 0.2,
                                                "open_refresh_seconds": 0}}))
    return str(cfg)


def _run(conversation: str, resource: dict) -> ExportTraceServiceRequest:
    """One agent run (an answer after one tool call), its case attribution on the resource."""
    tid, root = os.urandom(16), os.urandom(8)
    spans = [
        {"trace_id": tid, "span_id": root, "name": "invoke_agent fx", "start": 1, "end": 10**9,
         "attributes": {"gen_ai.operation.name": "invoke_agent", "gen_ai.agent.name": "fx-agent",
                        "gen_ai.conversation.id": conversation,
                        "gen_ai.output.messages": json.dumps([{"role": "assistant", "parts": [
                            {"type": "text", "content": "On 2026-01-15, 1 EUR equals 1.10 USD."}]}])}},
        {"trace_id": tid, "span_id": os.urandom(8), "parent_span_id": root, "name": "execute_tool get_rate",
         "start": 30, "end": 40,
         "attributes": {"gen_ai.operation.name": "execute_tool", "gen_ai.tool.name": "mcp__fxrates__get_rate",
                        "gen_ai.tool.call.arguments": json.dumps({"base": "EUR", "quote": "USD", "date": "2026-01-15"}),
                        "gen_ai.tool.call.result": json.dumps(RESULT)}},
    ]
    return trace_request(spans, resource={"service.name": "fx-agent", **resource})


def _case_run(experiment: str, run_id: str) -> dict:
    return {"agentfunnel.case.id": "fx-rate", "agentfunnel.experiment": experiment, "agentfunnel.run.id": run_id}


def _post(srv, *runs: ExportTraceServiceRequest) -> None:
    """The runs in one export request: their traces go idle together and are assembled in one job."""
    req = ExportTraceServiceRequest()
    for run in runs:
        req.resource_spans.extend(run.resource_spans)
    http = urllib.request.Request(srv.http_url + "/v1/traces", data=req.SerializeToString(),
                                  headers={"Content-Type": "application/x-protobuf"})
    assert urllib.request.urlopen(http).status == 200


def _metrics(srv) -> dict:
    return json.loads(urllib.request.urlopen(srv.http_url + "/metrics?format=json").read())


def _stored_sessions(srv, expected: int, timeout: float = 20.0) -> list[str]:
    """The stored session ids, once ``expected`` of them are there (or the timeout passed)."""
    deadline = time.monotonic() + timeout
    while True:
        ids = [r["session_id"] for r in sql(srv.db, "SELECT session_id FROM sessions ORDER BY session_id")]
        if len(ids) >= expected or time.monotonic() > deadline:
            return ids
        time.sleep(0.3)


def _send_runs(srv) -> list[str]:
    _post(srv, _run("run-long", _case_run(LONG_EXPERIMENT, "1")),
          _run("run-path", _case_run(PATH_LIKE_EXPERIMENT, "../2")),
          _run("run-plain", _case_run("plain", "3")), _run("no-case", {}))
    return _stored_sessions(srv, 4)


ALL_SESSIONS = ["no-case", "run-long", "run-path", "run-plain"]


def test_experiment_names_from_telemetry_never_pick_the_archive_path_nor_cost_a_session(server_factory, tmp_path):
    archive = tmp_path / "runs" / "archive"
    srv = server_factory(["--config", _config(tmp_path, archive)])
    assert _send_runs(srv) == ALL_SESSIONS
    assert sql(srv.db, "SELECT count(*) AS n FROM case_runs") == [{"n": 3}]
    files = sorted(p for p in tmp_path.rglob("*.json") if not p.name.startswith(srv.db.name))  # not the sidecar
    assert [p.parent for p in files] == [archive] * 3  # every run archived, nothing written outside the archive
    for p in files:
        assert SAFE_NAME.match(p.name) and len(p.name.encode()) < 200, p.name
    experiments = {json.loads(p.read_text())["experiment"] for p in files}
    assert experiments == {LONG_EXPERIMENT, PATH_LIKE_EXPERIMENT, "plain"}  # the full values are kept inside
    metrics = _metrics(srv)
    assert metrics.get("archive_errors", 0) == 0 and metrics.get("assembly_errors", 0) == 0
    srv.stop()
    assert "Traceback" not in srv.logs()


def test_an_archive_that_cannot_be_written_is_logged_once_counted_and_costs_no_session(server_factory, tmp_path):
    blocker = tmp_path / "not-a-directory"
    blocker.write_text("a file where the archive's parent should be")
    srv = server_factory(["--config", _config(tmp_path, blocker / "archive")])
    assert _send_runs(srv) == ALL_SESSIONS
    metrics = _metrics(srv)
    assert sum(metrics.get("archive_errors", {}).values()) >= 3  # each run's archive, by error kind
    assert metrics.get("assembly_errors", 0) == 0 and metrics.get("sessions_failed", 0) == 0
    _post(srv, _run("run-later", _case_run("plain", "4")))  # a later job: counted again, not logged again
    assert "run-later" in _stored_sessions(srv, 5)
    assert sum(_metrics(srv)["archive_errors"].values()) >= 4
    srv.stop()
    assert srv.logs().count("cannot write a case-run archive") == 1


# ---------------------------------------------------------------------------- in process


def _session_trace(session_id: str) -> AssembledTrace:
    tid = os.urandom(16).hex()
    return assemble([SpanView(tid, "1" * 16, None, "invoke_agent a", {
        "gen_ai.operation.name": "invoke_agent", "gen_ai.conversation.id": session_id}, start_ns=1, end_ns=2)])


def _score_failing_for(session_id: str):
    scorer = SessionScorer()

    def score(session):
        if session.session_id == session_id:
            raise ValueError("this session's data cannot be scored")
        return scorer.score(session.session_id, session.records)

    return score


class _EvaluatorFailingFor:
    """Every session is a case run; evaluating the named one raises (as a full disk would)."""

    def __init__(self, session_id: str) -> None:
        self.failing = session_id

    def is_case_run(self, score) -> bool:
        return True

    def evaluate(self, score, records, status, judgment):
        if score.session_id == self.failing:
            raise OSError(36, "File name too long")
        return None


@pytest.mark.parametrize("breaks", ["score", "evaluate"])
def test_one_session_that_raises_leaves_its_row_as_it_was_and_the_others_are_written(tmp_path, breaks):
    con = connect(tmp_path / "iso.duckdb")
    migrate(con)
    tables = LocalSessionTables()
    ids = {"s-ok", "s-bad"}
    sessions = sessions_of([_session_trace("s-ok"), _session_trace("s-bad")], ids, ())

    def write(scoring) -> None:
        rows = pass_rows(scoring, datetime(2026, 1, 1))
        tables.replace_sessions(con, rows.replaced, rows.sessions, rows.call_steps, rows.case_runs, rows.cased)

    first = score_sessions(sessions, ids, _score_failing_for("none"), tables.lookup(con, ids).versions)
    assert sorted(x.score.session_id for x in first.written) == ["s-bad", "s-ok"] and not first.failed
    write(first)

    score = _score_failing_for("s-bad" if breaks == "score" else "none")
    evaluator = _EvaluatorFailingFor("s-bad") if breaks == "evaluate" else None
    again = score_sessions(sessions, ids, score, tables.lookup(con, ids).versions, evaluator)
    assert [x.score.session_id for x in again.written] == ["s-ok"]
    assert [f.session_id for f in again.failed] == ["s-bad"] and again.replaced == ["s-ok"]
    assert isinstance(again.failed[0].error, (ValueError, OSError))
    write(again)
    rows = dict(con.execute("SELECT session_id, version FROM sessions").fetchall())
    assert rows == {"s-ok": 2, "s-bad": 1}  # the failed one keeps its previous row


POISON = "poisoned-trace"


class _InlineStore:
    """Runs each job at once on the caller's thread; the assembly job itself is faked."""

    settings = SimpleNamespace(lake=None)

    def __init__(self) -> None:
        self.jobs: list[tuple[str, ...]] = []
        self.failing: str | None = None  # why commits fail (the real store's state), None while they succeed
        self.probes = 0

    def probe(self) -> None:
        self.probes += 1

    def submit_job(self, job, **_) -> Future:
        fut: Future = Future()
        try:
            fut.set_result(job(None))
        except Exception as exc:  # noqa: BLE001 - handed to the caller like the real store does
            fut.set_exception(exc)
        return fut


def _assembled(traces) -> jobs.Assembly:
    """What a fake assembly of these traces gives: each trace, without spans."""
    made = [AssembledTrace(tid, [], {}) for tid in traces]
    return jobs.Assembly(made, made, set(), datetime(2026, 1, 1))


def test_a_trace_that_cannot_be_assembled_costs_only_itself_once(monkeypatch, caplog):
    store = _InlineStore()

    def fake_assemble_in(parts, con, traces, preview=False):
        store.jobs.append(tuple(traces))
        if POISON in traces:
            raise ValueError("this trace's data cannot be assembled")
        return _assembled(traces)

    monkeypatch.setattr(jobs, "assemble_traces", fake_assemble_in)
    metrics = Metrics()
    svc = SessionService(SessionSettings(), store, LocalSessionTables(), metrics)  # type: ignore[arg-type]
    svc.tracker.observe(["a", POISON, "b"], datetime(2026, 1, 1))
    with caplog.at_level(logging.ERROR, logger="agentfunnel.collector.session.service"):
        done = svc.flush()
        assert sorted(t.trace_id for t in done) == ["a", "b"]
        assert store.jobs == [("a", POISON, "b"), ("a",), (POISON,), ("b",)]  # the chunk, then each trace alone once
        assert POISON not in svc.tracker and len(svc.tracker) == 0
        assert svc.flush() == [] and len(store.jobs) == 4  # given up: not retried on the next pass
    assert metrics.get("traces_failed") == 1 and metrics.get("traces_assembled") == 2
    assert metrics.get("assembly_errors") == 2
    assert sum(POISON in r.getMessage() for r in caplog.records) == 1


def test_traces_whose_job_hit_an_io_error_are_kept_and_assembled_once_the_store_writes_again(monkeypatch):
    """A full disk is the store's fault, not the traces': their chunk is not split into jobs of one, nothing is
    given up, and they are tried again once commits succeed (a probe finds out while they fail)."""
    import duckdb

    store = _InlineStore()
    disk_full = [True]

    def fake_assemble_in(parts, con, traces, preview=False):
        store.jobs.append(tuple(traces))
        if disk_full[0]:
            store.failing = "No space left on device"
            raise duckdb.IOException("Could not write file: No space left on device")
        return _assembled(traces)

    monkeypatch.setattr(jobs, "assemble_traces", fake_assemble_in)
    metrics = Metrics()
    svc = SessionService(SessionSettings(), store, LocalSessionTables(), metrics)  # type: ignore[arg-type]
    svc.tracker.observe(["a", "b"], datetime(2026, 1, 1))
    assert svc.flush() == [] and store.jobs == [("a", "b")]
    assert metrics.get("traces_assembly_deferred") == 2 and metrics.get("traces_failed") == 0
    assert svc.flush() == [] and len(store.jobs) == 1 and store.probes == 1  # still failing: not tried, probed
    store.failing, disk_full[0] = None, False
    assert sorted(t.trace_id for t in svc.flush()) == ["a", "b"] and store.jobs[-1] == ("a", "b")
    assert svc.flush() == [] and len(store.jobs) == 2 and metrics.get("traces_assembled") == 2


def test_a_span_arriving_for_a_trace_whose_job_failed_has_the_whole_trace_read_back(monkeypatch):
    """The failed job had taken the trace's held records with it: a later span of the trace, held on its own,
    must not pass for the whole trace (its assembly reads every stored span back instead)."""
    store = _InlineStore()
    batch = decode_traces_protobuf((FIXTURES / "otlp" / "strands" / "shop_purchase.traces.binpb").read_bytes())
    poisoned = batch.trace_id[0]

    def fake_assemble_in(parts, con, traces, preview=False):
        for tid in traces:
            parts.held.take(tid)  # as the real job does, before it fails
        if poisoned in traces:
            raise ValueError("this trace's data cannot be assembled")
        return _assembled(traces)

    monkeypatch.setattr(jobs, "assemble_traces", fake_assemble_in)
    svc = SessionService(SessionSettings(), store, LocalSessionTables(), Metrics())  # type: ignore[arg-type]
    svc.held.add(prepare(batch), [])
    svc.tracker.observe([poisoned, "a"], datetime(2026, 1, 1))
    assert [t.trace_id for t in svc.flush()] == ["a"]  # the poisoned trace given up
    svc.held.add(prepare(batch), [])  # a later span of it (and of nothing else) is held
    assert svc.held.take(poisoned) is None
    svc.held.add(prepare(batch), [])
    assert svc.held.take(poisoned) is not None  # read back once, the trace is held whole again from then on


def test_a_poll_due_with_idle_traces_runs_in_their_job_and_a_failed_one_is_not_retried_alone(monkeypatch):
    """A lake replica's poll for sessions others assembled shares the tick's assembly job (one set of session
    reads and writes); when that job fails its traces are retried alone, without the poll, whose reading was
    rolled back with it."""
    store = _InlineStore()
    events: list[tuple[str, ...]] = []

    class PollingTables(LocalSessionTables):
        def __init__(self) -> None:
            super().__init__(Placement(poll_interval_seconds=1.0))

        def assembled_elsewhere(self, con):
            events.append(("poll",))
            return {"remote-session"}

    def fake_assemble_in(parts, con, traces, preview=False):
        events.append(("assemble", *traces))
        if POISON in traces:
            raise ValueError("this trace's data cannot be assembled")
        return _assembled(traces)

    def fake_score_in(parts, con, session_ids, out, fresh=(), still_open=(), fresh_traces=()):
        events.append(("score", *sorted(session_ids)))
        return []

    monkeypatch.setattr(jobs, "assemble_traces", fake_assemble_in)
    monkeypatch.setattr(jobs, "score_in", fake_score_in)
    svc = SessionService(SessionSettings(), store, PollingTables(), Metrics())  # type: ignore[arg-type]
    svc._assemble({"a": datetime(2026, 1, 1)}, follow=True).result()
    assert events == [("assemble", "a"), ("poll",), ("score", "remote-session")]
    events.clear()
    svc._assemble({"a": datetime(2026, 1, 1), POISON: datetime(2026, 1, 1)}, follow=True).result()
    assert events == [("assemble", "a", POISON), ("assemble", "a"), ("score",), ("assemble", POISON)]
