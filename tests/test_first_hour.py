"""The traps a new user met in the first hour, each against the real ``agentfunnel`` process.

A taken port, a demo pointed at a real database, an unusable ``--db`` and a misspelt flag each
end in one line that says what is wrong and what to do, never a traceback or a silent surprise.
"""

from __future__ import annotations

import os
import re
import socket
import subprocess

import pytest

from conftest import agentfunnel_cmd, read_db, run_cli
from otlp_build import trace_request

# ---------------------------------------------------------------------------- helpers


def _one_line_error(proc: subprocess.CompletedProcess) -> str:
    """The process failed with exactly one line on stderr (and no traceback); that line."""
    assert proc.returncode != 0, proc.stdout
    assert "Traceback" not in proc.stderr, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    return lines[0]


def _spans_file(tmp_path, n: int = 3, name: str = "real") -> str:
    path = tmp_path / f"{name}.binpb"
    path.write_bytes(trace_request([{"name": f"{name}{i}"} for i in range(n)]).SerializeToString())
    return str(path)


def _run_in(cwd, *args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run(agentfunnel_cmd() + list(args), cwd=cwd, capture_output=True, text=True, timeout=timeout)


@pytest.fixture
def plain_listener():
    """A port some other program listens on (no SO_REUSEPORT): what a new user's 4317 often is."""
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    s.listen()
    yield s.getsockname()[1]
    s.close()


# ---------------------------------------------------------------------------- a taken port


@pytest.mark.parametrize("holder", ["agentfunnel serve", "another program"])
def test_a_second_serve_on_a_taken_grpc_port_refuses_in_one_line(tmp_path, server_factory, plain_listener, holder):
    if holder == "agentfunnel serve":
        first = server_factory()
        port = int(first.grpc.rsplit(":", 1)[1])
    else:
        port = plain_listener
    second = tmp_path / "second.duckdb"
    proc = run_cli("serve", "--db", str(second), "--grpc-port", str(port), "--http-port", "0", check=False, timeout=60)
    line = _one_line_error(proc)
    assert line == (f"agentfunnel serve: gRPC port 127.0.0.1:{port} is already in use (another agentfunnel serve?); "
                    "choose another with --grpc-port")
    assert "agentfunnel serving" not in proc.stdout
    assert not second.exists()  # refused before the store was touched
    if holder == "agentfunnel serve":  # the first server still has the port, and all the traffic
        assert first.proc.poll() is None


@pytest.mark.parametrize("holder", ["agentfunnel serve", "another program"])
def test_a_second_serve_on_a_taken_http_port_refuses_in_one_line(tmp_path, server_factory, plain_listener, holder):
    if holder == "agentfunnel serve":
        port = int(server_factory().http.rsplit(":", 1)[1])
    else:
        port = plain_listener
    second = tmp_path / "second.duckdb"
    proc = run_cli("serve", "--db", str(second), "--grpc-port", "0", "--http-port", str(port), check=False, timeout=60)
    line = _one_line_error(proc)
    assert line == (f"agentfunnel serve: HTTP port 127.0.0.1:{port} is already in use (another agentfunnel serve?); "
                    "choose another with --http-port")
    assert not second.exists()


def test_a_taken_sql_endpoint_port_refuses_in_one_line(tmp_path, plain_listener):
    config = tmp_path / "agentfunnel.toml"
    config.write_text(f"[store]\nadmin_port = {plain_listener}\n")
    proc = run_cli("serve", "--db", str(tmp_path / "af.duckdb"), "--config", str(config), "--grpc-port", "0",
                   "--http-port", "0", check=False, timeout=60)
    assert _one_line_error(proc) == (f"agentfunnel serve: SQL endpoint port 127.0.0.1:{plain_listener} is already in "
                                     "use (another agentfunnel serve?); choose another with store.admin_port in the "
                                     "configuration")


def test_a_port_freed_by_a_stopped_server_can_be_taken_again(tmp_path, server_factory):
    """The check is no stricter than the listeners: a stopped server's closing connections do not hold the port."""
    first = server_factory()
    grpc_port, http_port = first.grpc.rsplit(":", 1)[1], first.http.rsplit(":", 1)[1]
    import urllib.request

    urllib.request.urlopen(f"{first.http_url}/healthz", timeout=10).read()
    assert first.stop() == 0
    again = subprocess.Popen(agentfunnel_cmd() + ["serve", "--db", str(first.db), "--grpc-port", grpc_port,
                                                  "--http-port", http_port],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        line = again.stdout.readline()
        assert f"grpc=127.0.0.1:{grpc_port} http=127.0.0.1:{http_port}" in line, again.stderr.read() if not line else line
    finally:
        again.terminate()
        again.wait(30)


# ---------------------------------------------------------------------------- the demo and a real database


DEMO_REFUSAL = ("the file holds data the demo did not write; choose another --db, or delete the file yourself if you "
                "no longer need it")


def test_the_demo_refuses_to_replace_a_database_it_did_not_write(tmp_path):
    real = tmp_path / "real.duckdb"
    run_cli("ingest", "--db", str(real), _spans_file(tmp_path))
    before = real.read_bytes()
    proc = run_cli("demo", "--db", str(real), "--sessions", "5", check=False)
    assert proc.returncode == 2
    assert _one_line_error(proc) == f"agentfunnel demo: not replacing --db {real}: {DEMO_REFUSAL}"
    assert "starting agentfunnel" not in proc.stdout
    assert real.read_bytes() == before
    assert read_db(real, "SELECT count(*) AS n FROM spans") == [{"n": 3}]

    other = tmp_path / "notes.duckdb"  # not even a database: still not the demo's to delete
    other.write_text("my notes\n")
    proc = run_cli("demo", "--db", str(other), "--sessions", "5", check=False)
    assert proc.returncode == 2 and "not replacing" in _one_line_error(proc)
    assert other.read_text() == "my notes\n"


def test_the_demo_replaces_its_own_database_but_not_once_real_spans_are_added(tmp_path):
    db = tmp_path / "demo.duckdb"
    run_cli("demo", "--db", str(db), "--sessions", "5")
    first = read_db(db, "SELECT count(*) AS n FROM spans")[0]["n"]
    run_cli("demo", "--db", str(db), "--sessions", "5")  # its own file: replaced without asking
    assert read_db(db, "SELECT count(*) AS n FROM spans")[0]["n"] == first  # replaced, not appended to

    run_cli("ingest", "--db", str(db), _spans_file(tmp_path, 2))
    proc = run_cli("demo", "--db", str(db), "--sessions", "5", check=False)
    assert proc.returncode == 2
    assert _one_line_error(proc) == (f"agentfunnel demo: not replacing --db {db}: the demo wrote it, but 2 spans have "
                                     "been stored in it since; choose another --db, or delete the file yourself if "
                                     "you no longer need it")
    assert read_db(db, "SELECT count(*) AS n FROM spans")[0]["n"] == first + 2


def test_the_demo_leaves_a_file_a_server_has_open(tmp_path, server_factory):
    srv = server_factory(db=tmp_path / "busy.duckdb")
    proc = run_cli("demo", "--db", str(srv.db), "--sessions", "5", check=False)
    assert proc.returncode == 2
    assert f"another process has the file open (PID {srv.proc.pid}: a running agentfunnel serve?)" in \
        _one_line_error(proc)
    assert srv.proc.poll() is None


def test_a_second_server_on_a_file_one_has_open_says_so_in_one_line(tmp_path, server_factory):
    srv = server_factory(db=tmp_path / "busy.duckdb")
    proc = subprocess.run([*agentfunnel_cmd(), "serve", "--db", str(srv.db), "--grpc-port", "0", "--http-port", "0"],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2
    assert _one_line_error(proc) == (
        f"agentfunnel serve: cannot open the database {srv.db}: another process has the file open "
        f"(PID {srv.proc.pid}: a running agentfunnel serve?); stop that process, or give this one another --db")
    assert srv.proc.poll() is None


def test_the_readmes_first_command_runs_twice_in_a_fresh_directory_and_help_names_the_file(tmp_path):
    for _ in range(2):  # the second run replaces the first run's file without asking
        proc = _run_in(tmp_path, "demo")
        assert proc.returncode == 0, proc.stderr
        assert "Traceback" not in proc.stderr
        assert f"The DuckDB file is {(tmp_path / 'agentfunnel-demo.duckdb').resolve()}" in proc.stdout
    assert not (tmp_path / "agentfunnel.duckdb").exists()  # never the file `serve` fills
    demo_help = run_cli("demo", "--help").stdout
    assert "(default agentfunnel-demo.duckdb)" in " ".join(demo_help.split())
    assert "(default agentfunnel.duckdb)" in " ".join(run_cli("serve", "--help").stdout.split())


# ---------------------------------------------------------------------------- an unusable --db

# every command taking --db, with the other arguments it needs; the ones that may create the file
DB_COMMANDS = {
    "serve": ["serve", "--grpc-port", "0", "--http-port", "0"],
    "ingest": ["ingest", "FILE"],
    "demo": ["demo", "--sessions", "5"],
    "sql": ["sql", "SELECT 1"],
    "report": ["report"],
    "judge": ["judge"],
    "rescore": ["rescore"],
    "compare": ["compare", "a", "b"],
    "cases add": ["cases", "add", "--from-session", "s"],
}
CREATING = ("serve", "ingest", "demo")


def _db_args(tmp_path, command: str, db) -> list[str]:
    spans = _spans_file(tmp_path)
    return [spans if a == "FILE" else a for a in DB_COMMANDS[command]] + ["--db", str(db)]


@pytest.mark.parametrize("command", list(DB_COMMANDS))
def test_a_directory_as_db_is_one_line(tmp_path, command):
    proc = run_cli(*_db_args(tmp_path, command, tmp_path), check=False, timeout=60)
    assert proc.returncode == 2
    line = _one_line_error(proc)
    assert line.startswith(f"agentfunnel {command}: cannot use --db {tmp_path}: it is a directory"), line


@pytest.mark.parametrize("command", list(DB_COMMANDS))
def test_a_db_in_a_missing_directory_is_one_line(tmp_path, command):
    missing = tmp_path / "no-such-dir"
    db = missing / "af.duckdb"
    proc = run_cli(*_db_args(tmp_path, command, db), check=False, timeout=60)
    line = _one_line_error(proc)
    if command in CREATING:  # never a directory created behind the user's back (a typo in the path)
        assert proc.returncode == 2
        assert line == (f"agentfunnel {command}: cannot use --db {db}: directory {missing} does not exist (create it "
                        "first, or choose another --db)")
    else:  # commands that need an existing file say it does not exist, as before
        assert re.match(rf"agentfunnel {command}: database {re.escape(str(db))} does not exist", line), line
    assert not missing.exists()


@pytest.mark.skipif(os.geteuid() == 0, reason="root can write to any directory")
@pytest.mark.parametrize("command", CREATING)
def test_a_db_in_an_unwritable_directory_is_one_line(tmp_path, command):
    locked = tmp_path / "locked"
    locked.mkdir()
    locked.chmod(0o500)
    try:
        db = locked / "af.duckdb"
        proc = run_cli(*_db_args(tmp_path, command, db), check=False, timeout=60)
        assert proc.returncode == 2
        assert _one_line_error(proc) == (f"agentfunnel {command}: cannot use --db {db}: directory {locked} is not "
                                         "writable (DuckDB writes its WAL beside the file)")
    finally:
        locked.chmod(0o700)


# ---------------------------------------------------------------------------- a wrong flag


@pytest.mark.parametrize("argv, usage, wrong, suggestion", [
    (["serve", "--grpc-prot", "4317"], "usage: agentfunnel serve ", "--grpc-prot", "--grpc-port"),
    (["sql", "--fromat", "json", "SELECT 1"], "usage: agentfunnel sql ", "--fromat", "--format"),
    (["demo", "--sesions=3"], "usage: agentfunnel demo ", "--sesions", "--sessions"),
    # a misspelt required option: named as unrecognized, not the option reported missing
    (["cases", "add", "--from-sesion", "s1"], "usage: agentfunnel cases add ", "--from-sesion", "--from-session"),
    (["--verbse", "report"], "usage: agentfunnel [", "--verbse", "--verbose"),
])
def test_a_wrong_flag_prints_the_commands_usage_and_the_closest_flag(argv, usage, wrong, suggestion):
    proc = run_cli(*argv, check=False, timeout=60)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert proc.stderr.startswith(usage), proc.stderr
    last = proc.stderr.strip().splitlines()[-1]
    assert last.endswith(f"error: unrecognized arguments: {wrong}; did you mean {suggestion}?"), last


def test_a_flag_with_no_close_match_is_still_named():
    proc = run_cli("report", "--zzzz", check=False, timeout=60)
    assert proc.returncode == 2 and proc.stderr.startswith("usage: agentfunnel report ")
    assert proc.stderr.strip().splitlines()[-1] == "agentfunnel report: error: unrecognized arguments: --zzzz"
