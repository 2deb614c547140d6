"""Shared fixtures: a real ``agentfunnel serve`` process on free ports, and SQL against its file."""

from __future__ import annotations

import compileall
import json
import os
import re
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from hypothesis import settings

# Property tests search at random, as they should, but a loaded machine must not turn a slow example into a failure
settings.register_profile("agentfunnel", deadline=None, print_blob=True)
settings.load_profile("agentfunnel")

ROOT = Path(__file__).resolve().parent.parent
FIXTURES = ROOT / "tests" / "fixtures"
READY = re.compile(r"agentfunnel serving db=(\S+) grpc=(\S+) http=(\S+) sql=(\S+)")


def agentfunnel_cmd() -> list[str]:
    return [sys.executable, "-m", "agentfunnel.collector.cli"]


@dataclass
class ServerProcess:
    """A running ``agentfunnel serve``; ``stop()`` is graceful, ``kill()`` is kill -9."""

    db: Path
    args: list[str] = field(default_factory=list)
    env: dict[str, str] | None = None
    proc: subprocess.Popen | None = None
    grpc: str = ""
    http: str = ""
    admin: str = ""
    log_path: Path | None = None
    python: str = sys.executable  # another environment's interpreter (the lake's)
    log_dir: Path | None = None  # where its stderr goes (default: beside the database)

    def start(self, timeout: float = 30.0) -> "ServerProcess":
        name = f"{self.db.stem}.serve{int(time.time() * 1000) % 100000}.log"
        self.log_path = (self.log_dir or self.db.parent) / name
        log = open(self.log_path, "w")
        cmd = [self.python, "-m", "agentfunnel.collector.cli", "serve", "--db", str(self.db), "--grpc-port", "0", "--http-port", "0", *self.args]
        self.proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=log, text=True,
                                     env={**os.environ, **(self.env or {})})
        deadline = time.monotonic() + timeout
        assert self.proc.stdout is not None
        while time.monotonic() < deadline:
            line = self.proc.stdout.readline()
            if not line:
                break
            m = READY.search(line)
            if m:
                _, self.grpc, self.http, self.admin = m.groups()
                return self
        self.proc.kill()
        raise RuntimeError(f"server did not start: {self.log_path.read_text()[-3000:]}")

    @property
    def http_url(self) -> str:
        return f"http://{self.http}"

    def stop(self, timeout: float = 30.0) -> int:
        assert self.proc is not None
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        return self.proc.returncode

    def kill(self) -> None:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait()

    def logs(self) -> str:
        return self.log_path.read_text() if self.log_path else ""

    def admin_post(self, path: str, payload: dict[str, Any] | None = None, timeout: float = 120) -> dict[str, Any]:
        """POST to the admin endpoint as agentfunnel's own commands do: with the secret from the sidecar."""
        side = self.db.with_name(self.db.name + ".agentfunnel.json")
        secret = json.loads(side.read_text())["secret"]
        req = urllib.request.Request(self.admin + path, data=json.dumps(payload or {}).encode(), method="POST",
                                     headers={"Content-Type": "application/json", "X-Agentfunnel-Secret": secret})
        try:
            with urllib.request.urlopen(req, timeout=timeout) as resp:
                return json.loads(resp.read())
        except urllib.error.HTTPError as exc:  # the server's own message, in the test's failure
            raise AssertionError(f"{path} answered {exc.code}: {exc.read()[:2000]!r}") from None


def run_cli(*args: str, check: bool = True, input: str | None = None, timeout: float = 120) -> subprocess.CompletedProcess:
    proc = subprocess.run(agentfunnel_cmd() + list(args), capture_output=True, text=True, input=input, timeout=timeout)
    if check and proc.returncode != 0:
        raise AssertionError(f"agentfunnel {' '.join(args)} failed ({proc.returncode}):\n{proc.stdout}\n{proc.stderr}")
    return proc


SHARED_DEMO_SESSIONS = 30


@dataclass(frozen=True)
class DemoDatabase:
    db: Path
    stdout: str  # what `agentfunnel demo` printed (its report)


def shared_demo(tmp_path_factory: pytest.TempPathFactory, into: str) -> DemoDatabase:
    """A copy of one `agentfunnel demo --sessions 30` database, made once per test run for every file and
    xdist worker that only reads a demo's data (each demo takes seconds; the command itself is tested in
    test_demo.py). Workers share the run's temporary root; a lock makes the first one build it."""
    import fcntl
    import shutil

    base = tmp_path_factory.getbasetemp()
    root = base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base
    built = root / "shared-demo"
    with open(root / "shared-demo.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not (built / "done").exists():
            shutil.rmtree(built, ignore_errors=True)
            built.mkdir()
            out = run_cli("demo", "--db", str(built / "demo.duckdb"), "--sessions", str(SHARED_DEMO_SESSIONS),
                          timeout=300).stdout
            (built / "stdout.txt").write_text(out, encoding="utf-8")
            (built / "done").touch()
    copy = tmp_path_factory.mktemp(into) / "demo.duckdb"
    shutil.copyfile(built / "demo.duckdb", copy)
    if (built / "demo.duckdb.wal").exists():
        shutil.copyfile(built / "demo.duckdb.wal", copy.with_name("demo.duckdb.wal"))
    return DemoDatabase(copy, (built / "stdout.txt").read_text(encoding="utf-8"))


def sql(db: Path, query: str) -> list[dict[str, Any]]:
    """Rows as dicts, through the real ``agentfunnel sql`` command (server or file)."""
    out = run_cli("sql", "--db", str(db), "--format", "json", query).stdout
    return json.loads(out)


def pytest_configure(config):
    """Compile the package's sources once, before any test starts a process. The suite starts hundreds of
    ``agentfunnel`` processes; where ``PYTHONDONTWRITEBYTECODE`` is set, each would compile every module it imports
    again (about 0.15 s each). The bytecode goes where Python looks for it (``__pycache__``, ignored by git);
    xdist's workers find it done by the process that started them."""
    if hasattr(config, "workerinput"):
        return
    for package in ("semconv", "scoring", "collector"):
        compileall.compile_dir(ROOT / package, quiet=2)


def pytest_addoption(parser):
    parser.addoption("--update-golden", action="store_true",
                     help="rewrite tests/golden from the current output (review the diff before committing)")


@pytest.fixture
def update_golden(request) -> bool:
    return request.config.getoption("--update-golden")


def read_db(db: Path, query: str) -> list[dict[str, Any]]:
    """Rows as dicts, straight from a file no process holds (faster than ``sql`` for many queries)."""
    import duckdb

    con = duckdb.connect(str(db), read_only=True)
    try:
        cur = con.execute(query)
        names = [d[0] for d in cur.description]
        return [dict(zip(names, row)) for row in cur.fetchall()]
    finally:
        con.close()


@pytest.fixture
def server(tmp_path: Path):
    """Start a server on a fresh database; extra args via ``server_factory`` instead."""
    srv = ServerProcess(tmp_path / "af.duckdb").start()
    yield srv
    srv.stop()


# DuckDB's refusal of a file whose block fails its checksum, as the server's one line says it
TORN_BLOCK = "Corrupt database file: computed checksum"


def started_after_kill(server_factory, args: list[str], db: Path) -> ServerProcess:
    """A server started on a file a kill -9 left behind.

    DuckDB writes a checkpoint's metadata into blocks the file's current header still points into, in place
    (``MetadataManager::Flush`` in its storage/metadata/metadata_manager.cpp), and Linux stops a write part way
    when its process gets SIGKILL: a kill inside that one write leaves a block whose checksum fails, and DuckDB
    refuses the file at the next start. That outcome is DuckDB's, rare (the write takes tens of microseconds),
    and documented in docs/operations.md: the test is marked xfail, saying so, once the refusal is checked to be
    the server's one line with the file left as it was; any other refusal fails it."""
    before = db.read_bytes() if db.exists() else None
    try:
        return server_factory(args, db=db)
    except RuntimeError as exc:
        if TORN_BLOCK not in str(exc):
            raise
        lines = [line for line in str(exc).split("server did not start: ", 1)[1].splitlines() if line.strip()]
        assert len(lines) == 1 and lines[0].startswith("agentfunnel serve: cannot open the database"), lines
        assert db.read_bytes() == before, "the refused file was changed"
        pytest.xfail(f"a kill -9 tore a block DuckDB rewrites in place during a checkpoint: {lines[0]}")


@pytest.fixture
def server_factory(tmp_path: Path):
    started: list[ServerProcess] = []

    def make(args: list[str] | None = None, db: Path | None = None, env: dict[str, str] | None = None) -> ServerProcess:
        srv = ServerProcess(db or tmp_path / "af.duckdb", args or [], env).start()
        started.append(srv)
        return srv

    yield make
    for srv in started:
        if srv.proc and srv.proc.poll() is None:
            srv.stop()
