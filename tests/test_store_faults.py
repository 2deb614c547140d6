"""Faults a store must survive, against a real ``agentfunnel serve``: a write-ahead log cut short, deleted or
failing its checksum, files that are not a database, a full disk; and the receivers' answers on a half-closed
connection."""

from __future__ import annotations

import http.client
import json
import os
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from datetime import datetime, timedelta
from pathlib import Path

import duckdb
import pytest

from conftest import ServerProcess, agentfunnel_cmd, sql
from otlp_build import trace_request


def _body(n_spans: int, start_ns: int | None = None) -> bytes:
    trace_id = os.urandom(16)
    extra = {} if start_ns is None else {"start": start_ns, "end": start_ns + 1000}
    spans = [{"trace_id": trace_id, "span_id": os.urandom(8), "name": "execute_tool search", **extra}
             for _ in range(n_spans)]
    return trace_request(spans).SerializeToString()


def _post(addr: str, body: bytes) -> int:
    host, port = addr.split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=30)
    try:
        conn.request("POST", "/v1/traces", body=body, headers={"Content-Type": "application/x-protobuf"})
        resp = conn.getresponse()
        resp.read()
        return resp.status
    finally:
        conn.close()


def _serve(db: Path, *args: str, timeout: float = 60) -> subprocess.CompletedProcess:
    """A start that is expected to be refused: it must end by itself."""
    return subprocess.run(agentfunnel_cmd() + ["serve", "--db", str(db), "--grpc-port", "0", "--http-port", "0",
                                               *args], capture_output=True, text=True, timeout=timeout)


def _one_line(stderr: str) -> str:
    lines = [line for line in stderr.splitlines() if line.strip()]
    assert len(lines) == 1, stderr
    assert "Traceback" not in stderr
    return lines[0]


def _acknowledged_then_killed(server_factory, db: Path, requests: int = 30) -> None:
    srv = server_factory(db=db)
    for _ in range(requests):
        assert _post(srv.http, _body(50)) == 200
    srv.kill()
    assert Path(str(db) + ".wal").stat().st_size > 0


@pytest.mark.parametrize("damage", ["half", "empty", "deleted"])
def test_a_write_ahead_log_cut_short_or_deleted_is_refused_and_kept(server_factory, tmp_path, damage):
    db = tmp_path / "af.duckdb"
    wal = Path(str(db) + ".wal")
    _acknowledged_then_killed(server_factory, db)
    size = wal.stat().st_size
    if damage == "deleted":
        wal.unlink()
    else:
        with open(wal, "r+b") as f:
            f.truncate(size // 2 if damage == "half" else 0)
    left = None if damage == "deleted" else wal.read_bytes()
    db_before = db.read_bytes()

    proc = _serve(db)
    assert proc.returncode == 2, proc.stderr
    line = _one_line(proc.stderr)
    assert str(wal) in line and "--accept-damaged-wal" in line and f"{size} bytes were committed" in line
    assert db.read_bytes() == db_before, "the database was changed"
    if left is not None:
        assert wal.read_bytes() == left, "the log was not kept as it was"

    # Accepting the damage opens with what the log holds, and keeps a copy of it
    srv = server_factory(["--accept-damaged-wal"], db=db)
    assert _post(srv.http, _body(5)) == 200
    srv.stop()
    copies = list(tmp_path.glob("af.duckdb.wal.damaged-*"))
    assert len(copies) == (0 if left is None else 1)
    if copies:
        assert copies[0].read_bytes() == left


def _entries(wal: Path) -> list[tuple[int, int]]:
    """(offset, length) of each framed entry of a write-ahead log (``guard.log_entries``), which must cover it."""
    from agentfunnel.collector.store.guard import log_entries

    size = wal.stat().st_size
    with open(wal, "rb") as f:
        found = list(log_entries(f.fileno(), size))
    assert found, "not a log of the version the store's check reads"
    assert all(n is not None for _, n in found) and found[-1][0] + 16 + found[-1][1] == size, \
        "the framing does not cover the log"
    return found


@pytest.mark.parametrize("damage", ["checksum", "length"])
def test_a_write_ahead_log_damaged_inside_what_was_committed_is_refused_in_one_line_and_kept(
        server_factory, tmp_path, damage):
    """Damage inside an entry fails DuckDB's checksum; damage to an entry's length makes it run past the log's
    end, which DuckDB alone would take for a torn write and replay nothing from there on."""
    db = tmp_path / "af.duckdb"
    wal = Path(str(db) + ".wal")
    _acknowledged_then_killed(server_factory, db)
    data = bytearray(wal.read_bytes())
    entries = _entries(wal)
    at, size = max(entries[:len(entries) // 2], key=lambda e: e[1])  # an early record of acknowledged spans
    where = at + 16 + size // 2 if damage == "checksum" else at
    data[where:where + 8] = bytes(b ^ 0xFF for b in data[where:where + 8])
    wal.write_bytes(bytes(data))
    db_before = db.read_bytes()

    proc = _serve(db)
    assert proc.returncode == 2, proc.stderr
    line = _one_line(proc.stderr)
    assert str(wal) in line, line
    if damage == "checksum":
        assert "checksum" in line, line
    else:
        assert f"damaged: the entry at byte {at}" in line and "--accept-damaged-wal" in line, line
    assert wal.read_bytes() == bytes(data), "the log was not kept as it was"
    assert db.read_bytes() == db_before, "the database was changed"
    if damage == "length":  # accepting the damage opens with what precedes it, and keeps a copy of the log
        srv = server_factory(["--accept-damaged-wal"], db=db)
        assert _post(srv.http, _body(5)) == 200
        srv.stop()
        copies = list(tmp_path.glob("af.duckdb.wal.damaged-*"))
        assert len(copies) == 1 and copies[0].read_bytes() == bytes(data)


@pytest.mark.parametrize("content", [b"", b"this is a text file, not a database\n" * 50, "bad header", "cut short"])
def test_a_file_that_is_not_a_database_is_refused_in_one_line_and_left_untouched(server_factory, tmp_path, content):
    db = tmp_path / "af.duckdb"
    if isinstance(content, str):  # a real database, damaged
        srv = server_factory(db=db)
        srv.stop()
        data = bytearray(db.read_bytes())
        if content == "bad header":
            data[4096:4096 + 64] = os.urandom(64)
            data[8192:8192 + 64] = os.urandom(64)
        else:
            del data[len(data) // 2:]
        content = bytes(data)
    db.write_bytes(content)
    proc = _serve(db)
    assert proc.returncode == 2, proc.stderr
    line = _one_line(proc.stderr)
    assert str(db) in line
    assert db.read_bytes() == content
    dump = tmp_path / "dump.jsonl"
    dump.write_text("")
    proc = subprocess.run(agentfunnel_cmd() + ["ingest", "--db", str(db), str(dump)], capture_output=True,
                          text=True, timeout=60)
    assert proc.returncode == 2 and str(db) in _one_line(proc.stderr)
    assert db.read_bytes() == content


def _readyz(srv: ServerProcess) -> tuple[int, dict]:
    try:
        with urllib.request.urlopen(srv.http_url + "/readyz", timeout=10) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


def _metrics(srv: ServerProcess) -> dict:
    with urllib.request.urlopen(srv.http_url + "/metrics?format=json", timeout=10) as resp:
        return json.loads(resp.read())


@pytest.fixture
def small_disk(tmp_path):
    where = tmp_path / "disk"
    where.mkdir()
    try:
        subprocess.run(["mount", "-t", "tmpfs", "-o", "size=24m", "tmpfs", str(where)], check=True,
                       capture_output=True, timeout=30)
    except (OSError, subprocess.CalledProcessError) as exc:
        pytest.skip(f"cannot mount a small file system here: {exc}")
    yield where
    subprocess.run(["umount", "-l", str(where)], capture_output=True, timeout=30)


def _fill(disk: Path) -> Path:
    """Fill the file system to its last block."""
    filler = disk / "filler"
    fd = os.open(filler, os.O_WRONLY | os.O_CREAT)
    try:
        for size in (1 << 20, 4096, 1):
            try:
                while True:
                    os.write(fd, b"\0" * size)
            except OSError:
                pass
    finally:
        os.close(fd)
    return filler


@pytest.fixture
def on_small_disk(small_disk, tmp_path):
    """Servers whose database is on the small file system and whose log is not."""
    started: list[ServerProcess] = []

    def make() -> ServerProcess:
        started.append(ServerProcess(small_disk / "af.duckdb", log_dir=tmp_path).start())
        return started[-1]

    yield make
    for srv in started:
        srv.stop()


def test_a_full_disk_makes_readyz_fail_until_space_is_freed(on_small_disk, small_disk):
    srv = on_small_disk()
    assert _readyz(srv)[0] == 200
    filler = _fill(small_disk)
    statuses = set()
    for _ in range(20):
        statuses.add(_post(srv.http, _body(200)))
        if 503 in statuses:
            break
    assert statuses <= {200, 503} and 503 in statuses
    # the gauge first: /readyz starts a probe, and on a disk whose failed commit gave back its blocks the
    # probe's tiny write can succeed (readiness then says so until the next commit fails)
    assert _metrics(srv)["store_failing"] == 1
    status, answer = _readyz(srv)
    assert status == 503 and "cannot commit" in answer["reason"], answer

    filler.unlink()
    deadline = time.monotonic() + 20
    while _readyz(srv)[0] != 200 and time.monotonic() < deadline:  # the probe commits without any client
        time.sleep(0.2)
    assert _readyz(srv)[0] == 200
    assert _metrics(srv)["store_failing"] == 0
    assert _post(srv.http, _body(20)) == 200
    assert srv.stop() == 0


def test_a_full_disk_at_stop_and_start_is_one_line_and_exit_2(on_small_disk, small_disk):
    db = small_disk / "af.duckdb"
    srv = on_small_disk()
    for _ in range(5):
        assert _post(srv.http, _body(200)) == 200
    filler = _fill(small_disk)
    assert srv.stop() == 2
    stderr = srv.logs()
    assert "Traceback" not in stderr, stderr
    assert stderr.splitlines()[-1].startswith("agentfunnel serve: could not checkpoint the database"), stderr
    wal_kept = Path(str(db) + ".wal").read_bytes()

    proc = _serve(db)
    assert proc.returncode == 2, proc.stderr
    assert str(db) in _one_line(proc.stderr)
    assert Path(str(db) + ".wal").read_bytes() == wal_kept

    filler.unlink()
    on_small_disk().stop()
    assert sql(db, "select count(*) as n from spans")[0]["n"] == 1000


def test_spans_dated_in_the_future_are_counted_and_kept_while_fresh(server_factory, tmp_path):
    config = tmp_path / "af.toml"
    config.write_text("[retention]\nraw_days = 1\ninterval_seconds = 0.5\nmax_future_seconds = 3600\n")
    srv = server_factory(["--config", str(config)])
    now_ns = time.time_ns()
    year_ns = 365 * 86400 * 10**9
    assert _post(srv.http, _body(3, now_ns + year_ns)) == 200  # a clock a year ahead
    assert _post(srv.http, _body(2, now_ns + 60 * 10**9)) == 200  # a minute ahead: within the setting
    assert _post(srv.http, _body(4, now_ns)) == 200
    assert _metrics(srv)["spans_future_dated"] == 3
    srv.stop()
    assert sql(srv.db, "select count(*) as n from spans")[0]["n"] == 9


def test_a_request_on_a_half_closed_connection_is_answered(server):
    host, port = server.http.split(":")
    body = _body(3)
    for request in (b"POST /v1/traces HTTP/1.1\r\nHost: x\r\nContent-Type: application/x-protobuf\r\n"
                    b"Content-Length: %d\r\n\r\n" % len(body) + body,
                    b"POST /v1/traces HTTP/1.1\r\nHost: x\r\nContent-Type: application/x-protobuf\r\n"
                    b"Content-Length: 5\r\n\r\nnope!"):
        with socket.create_connection((host, int(port)), timeout=10) as s:
            s.sendall(request)
            s.shutdown(socket.SHUT_WR)
            answer = b""
            while chunk := s.recv(65536):
                answer += chunk
        assert answer.startswith(b"HTTP/1.1 200" if request.endswith(body) else b"HTTP/1.1 400"), answer[:200]


def test_retention_ages_rows_dated_in_the_future_by_their_arrival(tmp_path):
    from agentfunnel.collector.retention import prune_chunk
    from agentfunnel.collector.store.schema import migrate
    from agentfunnel.collector.store.writer import connect

    con = connect(tmp_path / "af.duckdb")
    migrate(con)
    now = datetime(2026, 6, 1)
    rows = [  # (span, start, received): a week-old span; a span a year ahead that arrived a week ago; one that
        ("old", now - timedelta(days=7), now - timedelta(days=7)),  # arrived now; one a minute ahead, a week ago
        ("ahead_old", now + timedelta(days=358), now - timedelta(days=7)),
        ("ahead_new", now + timedelta(days=365), now),
        ("minute_ahead", now - timedelta(days=7) + timedelta(minutes=1), now - timedelta(days=7)),
        ("fresh", now, now),
    ]
    con.executemany("INSERT INTO spans (trace_id, span_id, start_time, received_at) VALUES ('t', ?, ?, ?)", rows)
    assert prune_chunk(con, "spans", now - timedelta(days=1), 100, max_future_seconds=3600) == 3
    assert sorted(r[0] for r in con.execute("SELECT span_id FROM spans").fetchall()) == ["ahead_new", "fresh"]


def test_the_log_check_follows_checkpoints_and_the_database_it_was_recorded_for(tmp_path):
    from agentfunnel.collector.store.guard import StoreUnusable, WalMark, check_files
    from agentfunnel.collector.store.writer import connect

    db = tmp_path / "af.duckdb"
    con = connect(db)
    con.execute("CREATE TABLE t (a INTEGER)")
    con.execute("CHECKPOINT")
    mark = WalMark(db)
    con.execute("INSERT INTO t VALUES (1)")
    mark.update()
    wal = Path(str(db) + ".wal")
    saved = wal.read_bytes()
    wal.unlink()
    with pytest.raises(StoreUnusable, match="is missing"):
        check_files(db)
    wal.write_bytes(saved)
    check_files(db)
    con.execute("CHECKPOINT")  # the log is folded into the file and removed: nothing is expected of it now
    mark.update()
    con.execute("INSERT INTO t VALUES (2)")
    assert not wal.exists() or wal.stat().st_size > 0
    con.close()
    mark.close()
    check_files(db)

    from agentfunnel.collector.store.guard import mark_path, read_mark

    recorded = read_mark(db)
    db.unlink()  # another database under the same name: the record is not its own
    wal.unlink(missing_ok=True)
    other = connect(db)
    other.execute("CREATE TABLE u (a INTEGER)")
    other.close()
    header = db.read_bytes()[:12288]
    iteration = max(int.from_bytes(header[at:at + 8], "little") for at in (4096 + 8, 8192 + 8))
    mark_path(db).write_text(f"{recorded[0]} {iteration:020d} {100:020d}\n")
    check_files(db)
    mark_path(db).write_text(f"{header[124:140].hex()} {iteration:020d} {100:020d}\n")
    with pytest.raises(StoreUnusable, match="is missing, but 100 bytes were committed"):
        check_files(db)


def test_commands_opening_the_file_themselves_say_in_one_line_who_holds_it(tmp_path):
    """``monitors check`` and a label import without a server open the file for writing: a file another
    process holds (no agentfunnel server to go through) is one line naming the holder, and nothing is written."""
    from agentfunnel.collector.judge_audit import store_labels
    from agentfunnel.collector.store.guard import StoreUnusable

    db = tmp_path / "held.duckdb"
    holder = subprocess.Popen([sys.executable, "-c", (
        "import duckdb, sys, time; c = duckdb.connect(sys.argv[1]); c.execute('CREATE TABLE t (x INT)'); "
        "print('open', flush=True); time.sleep(60)"), str(db)], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "open"
        proc = subprocess.run([*agentfunnel_cmd(), "monitors", "check", "--db", str(db)],
                              capture_output=True, text=True, timeout=60)
        assert proc.returncode == 2, proc.stderr
        assert "Traceback" not in proc.stderr, proc.stderr
        assert proc.stderr.strip().splitlines() == [
            f"agentfunnel monitors check: cannot open the database {db}: another process has the file open "
            f"(PID {holder.pid}: a running agentfunnel serve?)"], proc.stderr
        with pytest.raises(StoreUnusable, match=rf"another process has the file open \(PID {holder.pid}:"):
            store_labels(db, [])
    finally:
        holder.kill()
        holder.wait()
    con = duckdb.connect(str(db), read_only=True)
    try:  # the holder's table only: neither command migrated the file
        assert con.execute("SELECT table_name FROM information_schema.tables").fetchall() == [("t",)]
    finally:
        con.close()
