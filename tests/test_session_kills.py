"""kill -9 at the moments the session stage is most exposed: in the middle of ingest (with checkpoints frequent and
session jobs running), in the middle of a checkpoint, in the middle of a restart's recovery, in the middle of a stop's
last assembly, and in the middle of ``agentfunnel ingest``'s closing flush. Each ends, after a restart, with exactly
the sessions, tool calls and case runs of an uninterrupted run of the same input; against a real process.

The session stage's other moments are in test_session_faults.py: a kill among session jobs appending new versions,
and late spans (a span between its trace's pick and its job) with a kill after them."""

from __future__ import annotations

import random
import subprocess
import threading
import time
from pathlib import Path

from conftest import ServerProcess, agentfunnel_cmd, read_db, run_cli, started_after_kill
from otlp_build import trace_request
from test_session_faults import (_flush_until_killed, _metrics, _post, _sessions, _stored, _turn, _uninterrupted,
                                 _wait)

CONVERSATIONS = 24
TURNS = 40  # the most a client sends in the ingest test; the kill comes well before
CLIENTS = 4


def _config(tmp_path: Path, name: str, checkpoint_mb: int = 1, **sessions: object) -> Path:
    """Traces assembled only when flushed, one per job; checkpoints at every ``checkpoint_mb`` of write-ahead log."""
    settings = {"idle_timeout_seconds": 600, "check_interval_seconds": 0.2, "open_refresh_seconds": 0,
                "max_traces_per_job": 1, **sessions}
    path = tmp_path / f"{name}.toml"
    path.write_text(f"[store]\ncheckpoint_threshold_mb = {checkpoint_mb}\n\n[sessions]\n"
                    + "".join(f"{k} = {v}\n" for k, v in settings.items()))
    return path


def _input(turns: int = 3, pad: int = 3000) -> list[list[dict]]:
    """Requests of one turn each, the turns of each conversation in order."""
    return [_turn(f"conv-{c:03d}", n=n, tools=3, pad=pad) for n in range(turns) for c in range(CONVERSATIONS)]


def _spans_once(db: Path) -> None:
    assert read_db(db, "SELECT count(*) - count(DISTINCT (trace_id, span_id)) AS d FROM spans") == [{"d": 0}]


class _Exporters:
    """Clients sending turn after turn of their own conversations, as exporters do, until a kill cuts each off;
    what each sent and how much of it was acknowledged is kept, so what was cut off can be sent again."""

    def __init__(self) -> None:
        self.attempted: list[list[list[dict]]] = [[] for _ in range(CLIENTS)]  # each client's requests, in order
        self.acknowledged = [0] * CLIENTS
        self._threads: list[threading.Thread] = []
        self._killed = threading.Event()

    def start(self, srv: ServerProcess, turns: range) -> None:
        self._killed.clear()
        self._threads = [threading.Thread(target=self._client, args=(srv, k, turns)) for k in range(CLIENTS)]
        for t in self._threads:
            t.start()

    def _client(self, srv: ServerProcess, k: int, turns: range) -> None:
        for n in turns:
            for c in range(k, CONVERSATIONS, CLIENTS):
                if self._killed.is_set():
                    return
                self.attempted[k].append(_turn(f"conv-{c:03d}", n=n, tools=3, pad=3000))
                try:
                    _post(srv, self.attempted[k][-1])
                except OSError:  # cut off by the kill: not acknowledged, sent again by ``retry``
                    return
                self.acknowledged[k] += 1
            time.sleep(0.1)  # a turn of each conversation every so often: earlier turns go idle and are assembled

    def kill(self, srv: ServerProcess) -> None:
        """kill -9 the server they send to, and wait until each has stopped sending."""
        self._killed.set()
        srv.kill()
        for t in self._threads:
            t.join(60)

    def retry(self, srv: ServerProcess) -> None:
        """The requests not acknowledged, sent again, as an exporter retries; each may have been committed already."""
        for k in range(CLIENTS):
            for spans in self.attempted[k][self.acknowledged[k]:]:
                _post(srv, spans)
            self.acknowledged[k] = len(self.attempted[k])

    @property
    def requests(self) -> list[list[dict]]:
        return [spans for k in range(CLIENTS) for spans in self.attempted[k]]


def _ends_as_an_uninterrupted_run(server_factory, tmp_path: Path, again: ServerProcess,
                                  requests: list[list[dict]]) -> None:
    """``again`` (restarted after the kill, the retries sent) flushed and stopped: every span stored once, every
    session closed, and what it leaves equal to what an uninterrupted process leaves of the same requests."""
    again.admin_post("/flush")
    assert again.stop() == 0
    _spans_once(again.db)
    assert [r["session_id"] for r in _sessions(again.db) if r["status"] != "closed"] == []
    plain = server_factory(["--config", str(_config(tmp_path, "plain", max_traces_per_job=256))],
                           db=tmp_path / "uninterrupted.duckdb")
    for spans in requests:
        _post(plain, spans)
    plain.admin_post("/flush")
    assert plain.stop() == 0
    assert _stored(again.db) == _stored(plain.db)


def test_a_kill_during_ingest_checkpoints_and_jobs_then_the_clients_retries_end_as_an_uninterrupted_run(
        server_factory, tmp_path):
    db = tmp_path / "ingest.duckdb"
    cfg = _config(tmp_path, "ingest", idle_timeout_seconds=0.5, max_traces_per_job=256)  # jobs among the posts
    srv = server_factory(["--config", str(cfg)], db=db)
    empty_file = db.stat().st_size
    exporters = _Exporters()
    exporters.start(srv, range(TURNS))
    _wait(lambda: _metrics(srv).get("traces_assembled", 0) >= CONVERSATIONS and db.stat().st_size > empty_file,
          every=0.01)  # sessions written, and checkpoints into the file among them
    exporters.kill(srv)
    assert sum(exporters.acknowledged) < CONVERSATIONS * TURNS, "the kill came after the ingest, not in it"

    again = started_after_kill(server_factory, ["--config", str(cfg)], db)
    exporters.retry(again)
    _ends_as_an_uninterrupted_run(server_factory, tmp_path, again, exporters.requests)


def _iteration(db: Path) -> int:
    """The database's checkpoint iteration, from its header (as the store's log check reads it): DuckDB writes it
    as a checkpoint's last step, after the checkpoint's blocks and before it empties the write-ahead log."""
    from agentfunnel.collector.store.guard import _HEADER_BYTES, _iteration as header_iteration

    with open(db, "rb") as f:
        return header_iteration(f.read(_HEADER_BYTES))


def _written(db: Path) -> tuple[int, int]:
    st = db.stat()
    return st.st_size, st.st_mtime_ns


def _kill_in_a_checkpoint(srv: ServerProcess, exporters: _Exporters, timeout: float = 30.0) -> bool:
    """kill -9 as soon as a checkpoint is seen under way: the file written to (only a checkpoint writes it: commits go
    to the log) while its header still names the last checkpoint. Returns whether the kill came before the header
    was written, as the file shows once the process is gone (a checkpoint of a megabyte takes 10-40 ms)."""
    db = srv.db
    iteration, written = _iteration(db), _written(db)
    deadline = time.monotonic() + timeout
    while True:
        assert time.monotonic() < deadline, "no checkpoint began while the clients sent"
        now = _written(db)  # before the header: if the header was written meanwhile, the iteration says so
        current = _iteration(db)
        if current != iteration:  # one finished between two looks: wait for the next
            iteration, written = current, now
        elif now != written:
            break
        time.sleep(0.0005)
    exporters.kill(srv)
    return _iteration(db) == iteration and _written(db) != written


def test_kills_in_the_middle_of_checkpoints_during_ingest_and_jobs_end_as_an_uninterrupted_run(
        server_factory, tmp_path):
    """Clients send and sessions are written while the log is checkpointed into the file at every megabyte; the
    process is killed as a checkpoint writes the file, before its header says it is done (so the next start reads
    the file as it was before and replays the whole log), and started again; up to five times, until a kill came
    in a checkpoint (a look and a kill can miss one that ends first; counted)."""
    db = tmp_path / "checkpoint.duckdb"
    cfg = _config(tmp_path, "checkpoint", idle_timeout_seconds=0.5, max_traces_per_job=256)
    exporters = _Exporters()
    in_checkpoint = trials = 0
    while not in_checkpoint and trials < 5:
        srv = started_after_kill(server_factory, ["--config", str(cfg)], db)
        exporters.retry(srv)  # what the last kill cut off
        exporters.start(srv, range(trials * TURNS, (trials + 1) * TURNS))
        in_checkpoint += _kill_in_a_checkpoint(srv, exporters)
        trials += 1
    assert in_checkpoint, f"none of {trials} kills came in the middle of a checkpoint"

    again = started_after_kill(server_factory, ["--config", str(cfg)], db)
    exporters.retry(again)
    _ends_as_an_uninterrupted_run(server_factory, tmp_path, again, exporters.requests)


def test_a_kill_during_a_restarts_recovery_then_a_second_restart_ends_as_an_uninterrupted_run(server_factory, tmp_path):
    first, later = _input(turns=1, pad=200), [_turn(f"conv-{c:03d}", n=1, tools=2) for c in range(CONVERSATIONS)]
    db = tmp_path / "recovery.duckdb"
    cfg = _config(tmp_path, "recovery")
    srv = server_factory(["--config", str(cfg)], db=db)
    for spans in first:
        _post(srv, spans)
    srv.admin_post("/flush")
    for spans in later:  # open when killed: the restart reopens them and must assemble them
        _post(srv, spans)
    srv.kill()

    recovering = started_after_kill(server_factory, ["--config", str(cfg)], db)
    assembled = _metrics(recovering).get("traces_assembled", 0)
    threading.Thread(target=_flush_until_killed, args=(recovering,), daemon=True).start()
    _wait(lambda: _metrics(recovering).get("traces_assembled", 0) >= assembled + CONVERSATIONS // 4, every=0.01)
    recovering.kill()
    done = read_db(db, "SELECT count(*) AS n FROM sessions WHERE trace_count = 2")[0]["n"]
    assert 0 < done < CONVERSATIONS, "the kill came before or after the recovery's assembly, not in it"

    again = started_after_kill(server_factory, ["--config", str(cfg)], db)
    again.admin_post("/flush")
    assert again.stop() == 0
    _spans_once(db)
    got = _sessions(db)
    assert all(r["status"] == "closed" and r["trace_count"] == 2 for r in got)
    assert _stored(db) == _uninterrupted(tmp_path, server_factory, [*first, *later])


def test_a_kill_during_a_stops_last_assembly_ends_after_a_restart_as_an_uninterrupted_run(server_factory, tmp_path):
    requests = [_turn(f"conv-{c:03d}", tools=2) for c in range(CONVERSATIONS * 3)]
    db = tmp_path / "stopping.duckdb"
    cfg = _config(tmp_path, "stopping", shutdown_assembly_seconds=120)
    srv = server_factory(["--config", str(cfg)], db=db)
    for spans in requests:
        _post(srv, spans)
    wal = db.with_name(db.name + ".wal")
    at_signal = wal.stat().st_size if wal.exists() else 0
    srv.proc.send_signal(15)  # SIGTERM: every trace is still open, the stop assembles them one job after another
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and (not wal.exists() or wal.stat().st_size < at_signal + 20_000):
        time.sleep(0.002)  # until the stop's jobs have written something
    time.sleep(random.uniform(0.0, 0.05))
    srv.kill()
    done = read_db(db, "SELECT count(*) AS n FROM sessions")[0]["n"]
    assert 0 < done < len(requests), "the kill came before or after the stop's assembly, not in it"

    again = started_after_kill(server_factory, ["--config", str(cfg)], db)
    again.admin_post("/flush")
    assert again.stop() == 0
    _spans_once(db)
    got = _sessions(db)
    assert all(r["status"] == "closed" for r in got)
    assert _stored(db) == _uninterrupted(tmp_path, server_factory, requests)


def _length_prefixed(requests: list[list[dict]], path: Path) -> Path:
    """The requests in one file as the Collector's file exporter writes protobuf: each after its 4-byte length."""
    with open(path, "wb") as f:
        for spans in requests:
            body = trace_request(spans).SerializeToString()
            f.write(len(body).to_bytes(4, "big") + body)
    return path


def test_a_kill_during_ingests_closing_flush_then_the_same_command_again_ends_as_an_uninterrupted_ingest(tmp_path):
    """``agentfunnel ingest`` into a file of its own assembles every trace as its input ends (one job each here); it is
    killed once a quarter of those jobs have committed, and the command run again on the same file (its spans
    recognised as stored, the traces left reopened and assembled) leaves what one uninterrupted ``agentfunnel ingest``
    of it leaves."""
    conversations = 30
    requests = [_turn(f"conv-{c:03d}", n=n, tools=2) for n in range(2) for c in range(conversations)]
    spans = sum(len(r) for r in requests)
    turns = _length_prefixed(requests, tmp_path / "turns.binpb")
    # no checkpoint until it stops: every job's commit stays in the log, where the test counts them
    cfg = _config(tmp_path, "flush", checkpoint_mb=1024)
    db = tmp_path / "flush.duckdb"
    wal = db.with_name(db.name + ".wal")
    proc = subprocess.Popen([*agentfunnel_cmd(), "ingest", "--config", str(cfg), "--db", str(db), str(turns)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 60
        # session rows are written by the flush alone (ingest closes nothing when idle), a job's commit naming them once
        while not wal.exists() or wal.read_bytes().count(b"session_rows") < len(requests) // 4:
            assert proc.poll() is None and time.monotonic() < deadline, "the flush ended before the kill"
            time.sleep(0.002)
    finally:
        proc.kill()
        proc.wait()
    assert read_db(db, "SELECT count(*) AS n FROM spans") == [{"n": spans}]  # the flush had begun
    done = read_db(db, "SELECT count(*) AS n FROM sessions WHERE trace_count = 2")[0]["n"]
    assert 0 < done < conversations, "the kill came before or after the flush's jobs, not among them"

    out = run_cli("ingest", "--db", str(db), str(turns)).stdout  # as configured by default: the rest in one job
    assert f"({spans} already stored, 0 refused)" in out, out  # every span recognised: none stored twice
    _spans_once(db)
    got = _sessions(db)
    assert len(got) == conversations and all(r["status"] == "closed" and r["trace_count"] == 2 for r in got)
    plain = tmp_path / "uninterrupted.duckdb"
    run_cli("ingest", "--db", str(plain), str(turns))  # as configured by default: every trace in one job
    assert _stored(db) == _stored(plain)
