"""kill -9 at the moments the session stage is most exposed: in the middle of ingest (with checkpoints frequent and
session jobs running), in the middle of a restart's recovery, and in the middle of a stop's last assembly. Each
ends, after a restart, with exactly the sessions of an uninterrupted run of the same input; against a real
``agentfunnel serve``."""

from __future__ import annotations

import random
import threading
import time
from pathlib import Path

from conftest import read_db
from test_session_faults import _flush_until_killed, _metrics, _post, _sessions, _turn, _uninterrupted, _wait

CONVERSATIONS = 24
TURNS = 40  # the most a client sends in the ingest test; the kill comes well before


def _config(tmp_path: Path, name: str, **sessions: object) -> Path:
    """Traces assembled only when flushed, one per job; checkpoints at every megabyte of write-ahead log."""
    settings = {"idle_timeout_seconds": 600, "check_interval_seconds": 0.2, "open_refresh_seconds": 0,
                "max_traces_per_job": 1, **sessions}
    path = tmp_path / f"{name}.toml"
    path.write_text("[store]\ncheckpoint_threshold_mb = 1\n\n[sessions]\n"
                    + "".join(f"{k} = {v}\n" for k, v in settings.items()))
    return path


def _input(turns: int = 3, pad: int = 3000) -> list[list[dict]]:
    """Requests of one turn each, the turns of each conversation in order."""
    return [_turn(f"conv-{c:03d}", n=n, tools=3, pad=pad) for n in range(turns) for c in range(CONVERSATIONS)]


def _spans_once(db: Path) -> None:
    assert read_db(db, "SELECT count(*) - count(DISTINCT (trace_id, span_id)) AS d FROM spans") == [{"d": 0}]


def test_a_kill_during_ingest_checkpoints_and_jobs_then_the_clients_retries_end_as_an_uninterrupted_run(
        server_factory, tmp_path):
    db = tmp_path / "ingest.duckdb"
    cfg = _config(tmp_path, "ingest", idle_timeout_seconds=0.5, max_traces_per_job=256)  # jobs among the posts
    srv = server_factory(["--config", str(cfg)], db=db)
    empty_file = db.stat().st_size
    attempted: list[list[list[dict]]] = [[] for _ in range(4)]  # each client's requests, in the order sent
    acknowledged = [0] * 4
    killed = threading.Event()

    def client(k: int) -> None:
        """Turn after turn of its own conversations, until the kill cuts one off."""
        for n in range(TURNS):
            for c in range(k, CONVERSATIONS, 4):
                if killed.is_set():
                    return
                attempted[k].append(_turn(f"conv-{c:03d}", n=n, tools=3, pad=3000))
                try:
                    _post(srv, attempted[k][-1])
                except OSError:  # cut off by the kill: not acknowledged, sent again below as an exporter would
                    return
                acknowledged[k] += 1
            time.sleep(0.1)  # a turn of each conversation every so often: earlier turns go idle and are assembled

    clients = [threading.Thread(target=client, args=(k,)) for k in range(4)]
    for t in clients:
        t.start()
    _wait(lambda: _metrics(srv).get("traces_assembled", 0) >= CONVERSATIONS and db.stat().st_size > empty_file,
          every=0.01)  # sessions written, and checkpoints into the file among them
    killed.set()
    srv.kill()
    for t in clients:
        t.join(60)
    assert sum(acknowledged) < CONVERSATIONS * TURNS, "the kill came after the ingest, not in it"

    again = server_factory(["--config", str(cfg)], db=db)
    for k in range(4):
        for spans in attempted[k][acknowledged[k]:]:  # the exporter's retry; it may have been committed already
            _post(again, spans)
    again.admin_post("/flush")
    assert again.stop() == 0
    _spans_once(db)
    got = _sessions(db)
    assert all(r["status"] == "closed" for r in got)
    plain = server_factory(["--config", str(_config(tmp_path, "plain", max_traces_per_job=256))],
                           db=tmp_path / "uninterrupted.duckdb")
    for spans in (spans for k in range(4) for spans in attempted[k]):
        _post(plain, spans)
    plain.admin_post("/flush")
    assert plain.stop() == 0
    assert got == _sessions(plain.db)


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

    recovering = server_factory(["--config", str(cfg)], db=db)
    assembled = _metrics(recovering).get("traces_assembled", 0)
    threading.Thread(target=_flush_until_killed, args=(recovering,), daemon=True).start()
    _wait(lambda: _metrics(recovering).get("traces_assembled", 0) >= assembled + CONVERSATIONS // 4, every=0.01)
    recovering.kill()
    done = read_db(db, "SELECT count(*) AS n FROM sessions WHERE trace_count = 2")[0]["n"]
    assert 0 < done < CONVERSATIONS, "the kill came before or after the recovery's assembly, not in it"

    again = server_factory(["--config", str(cfg)], db=db)
    again.admin_post("/flush")
    assert again.stop() == 0
    _spans_once(db)
    got = _sessions(db)
    assert all(r["status"] == "closed" and r["trace_count"] == 2 for r in got)
    assert got == _uninterrupted(tmp_path, server_factory, [*first, *later])


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

    again = server_factory(["--config", str(cfg)], db=db)
    again.admin_post("/flush")
    assert again.stop() == 0
    _spans_once(db)
    got = _sessions(db)
    assert all(r["status"] == "closed" for r in got)
    assert got == _uninterrupted(tmp_path, server_factory, requests)

