"""What the lake tests need around agentfunnel: the lake environment, a private PostgreSQL, a trace-id router.

The lake extra pins DuckDB 1.5.5 (the only version with DuckLake and postgres extension wheels),
so it lives in its own virtual environment (``.venv-lake``, made by ``.ci/run``, or the
interpreter named by ``AGENTFUNNEL_LAKE_PYTHON``); the replicas and every lake reader run from it
as subprocesses. PostgreSQL runs from the server binaries on a private port and data directory.
"""

from __future__ import annotations

import concurrent.futures
import glob
import hashlib
import json
import os
import pwd
import re
import shutil
import socket
import subprocess
import tempfile
import threading
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import grpc
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2, trace_service_pb2_grpc
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

ROOT = Path(__file__).resolve().parent.parent


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# ---------------------------------------------------------------------------- environments


def lake_python() -> tuple[str | None, str]:
    """The lake environment's interpreter, or None and why it is not usable."""
    named = os.environ.get("AGENTFUNNEL_LAKE_PYTHON")
    python = named or str(ROOT / ".venv-lake" / "bin" / "python")
    if not Path(python).exists():
        return None, (f"no lake environment: {python} does not exist (.ci/run makes it: "
                      "python -m venv .venv-lake && .venv-lake/bin/pip install -e '.[lake,test]')")
    probe = subprocess.run([python, "-c", "import agentfunnel.collector.store.lake as l; "
                            "[l.extension_path(n) for n in l.EXTENSIONS]"], capture_output=True, text=True)
    if probe.returncode != 0:
        return None, f"the lake environment {python} cannot load the lake extensions: {probe.stderr.strip()[-300:]}"
    return python, ""


def pg_bindir() -> Path | None:
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"), key=lambda p: int(p.split("/")[4]))
    if found:
        return Path(found[-1]).parent
    initdb = shutil.which("initdb")
    return Path(initdb).parent if initdb else None


@dataclass
class Postgres:
    """A throwaway PostgreSQL server: trust auth on 127.0.0.1, fsync off, removed on stop."""

    bindir: Path
    port: int = field(default_factory=free_port)
    root: Path = field(default_factory=lambda: Path(tempfile.mkdtemp(prefix="agentfunnel-pg-")))
    user: str | None = None  # the OS user it runs as when we are root (PostgreSQL refuses root)

    def _run(self, *args: str) -> subprocess.CompletedProcess:
        cmd = [str(self.bindir / args[0]), *args[1:]]
        if self.user:
            cmd = ["runuser", "-u", self.user, "--", *cmd]
        return subprocess.run(cmd, capture_output=True, text=True, timeout=60, check=True)

    def start(self) -> "Postgres":
        if os.geteuid() == 0:
            self.user = next((u for u in ("postgres", "nobody") if _has_user(u)), None)
            uid = pwd.getpwnam(self.user).pw_uid if self.user else 0
            os.chmod(self.root, 0o755)
            os.chown(self.root, uid, -1)
        data = self.root / "data"
        self._run("initdb", "-D", str(data), "-A", "trust", "-U", "agentfunnel", "--no-sync", "-E", "UTF8")
        self._run("pg_ctl", "-D", str(data), "-l", str(self.root / "pg.log"), "-w", "-t", "60", "start", "-o",
                  f"-p {self.port} -k {self.root} -c listen_addresses=127.0.0.1 -c fsync=off "
                  "-c synchronous_commit=off -c full_page_writes=off -c max_connections=200")
        return self

    def createdb(self, name: str) -> str:
        """A new database; returns the DuckLake catalog string for it."""
        self._run("createdb", "-h", "127.0.0.1", "-p", str(self.port), "-U", "agentfunnel", name)
        return f"postgres:host=127.0.0.1 port={self.port} dbname={name} user=agentfunnel"

    def stop(self) -> None:
        try:
            self._run("pg_ctl", "-D", str(self.root / "data"), "-m", "immediate", "stop")
        finally:
            shutil.rmtree(self.root, ignore_errors=True)


def _has_user(name: str) -> bool:
    try:
        pwd.getpwnam(name)
        return True
    except KeyError:
        return False


def lake_config(path: Path, catalog: str, data_path: Path, replica: int, replicas: int,
                lake: dict[str, Any] | None = None, store: dict[str, Any] | None = None, **sessions: Any) -> Path:
    """A replica's configuration; ``lake`` adds or overrides ``store.lake`` keys (shipping, compaction), ``store``
    other ``store`` keys, ``sessions`` the ``sessions`` ones."""
    doc = {"store": {**(store or {}), "path": str(path.with_suffix(".duckdb")),
                     "lake": {"catalog": catalog, "data_path": str(data_path), "replica": replica,
                              "replicas": replicas, "poll_interval_seconds": 0.3, "ship_interval_seconds": 0.5,
                              **(lake or {})}},
           "sessions": {"idle_timeout_seconds": 1.0, "check_interval_seconds": 0.2, "open_refresh_seconds": 0,
                        **sessions}}
    path.write_text(json.dumps(doc))  # JSON is YAML
    return path


# ---------------------------------------------------------------------------- the router


def go_seconds(duration: str) -> float:
    """A Go duration as the Collector's configs spell them (``500ms``, ``1s``, ``2m``), in seconds."""
    m = re.fullmatch(r"(\d+(?:\.\d+)?)(ms|s|m)", str(duration))
    assert m, f"not a duration this check reads: {duration!r}"
    return float(m[1]) * {"ms": 0.001, "s": 1.0, "m": 60.0}[m[2]]


def route(trace_id: bytes, n: int) -> int:
    """Which replica a trace goes to (the Collector uses a consistent-hash ring; any stable hash will do here)."""
    return int.from_bytes(hashlib.sha256(trace_id).digest()[:8], "big") % n


def split(req: ExportTraceServiceRequest, n: int) -> dict[int, ExportTraceServiceRequest]:
    """One request per replica, each span under a copy of its resource and scope."""
    out: dict[int, ExportTraceServiceRequest] = {}
    for rs in req.resource_spans:
        for ss in rs.scope_spans:
            for span in ss.spans:
                part = out.setdefault(route(span.trace_id, n), ExportTraceServiceRequest())
                if not part.resource_spans or part.resource_spans[-1].resource != rs.resource \
                        or part.resource_spans[-1].schema_url != rs.schema_url:
                    part.resource_spans.add(resource=rs.resource, schema_url=rs.schema_url)
                prs = part.resource_spans[-1]
                if not prs.scope_spans or prs.scope_spans[-1].scope != ss.scope:
                    prs.scope_spans.add(scope=ss.scope, schema_url=ss.schema_url)
                prs.scope_spans[-1].spans.append(span)
    return out


class Router:
    """OTLP in (gRPC and HTTP), split by trace id, forwarded over OTLP/HTTP to replica ``route(trace_id)``.

    Like the Collector's loadbalancing exporter with retry_on_failure: a replica's share is
    retried until ``retry_seconds`` pass, and the client is answered only when every share was
    committed (else 503, and the client retries the whole request). Every request is also copied,
    whole, to ``reference`` (a single process) first. ``acked`` holds the span ids answered with success.
    """

    def __init__(self, replicas: list[str], reference: str | None = None, retry_seconds: float = 60.0) -> None:
        self.replicas = replicas  # OTLP/HTTP base URLs; replaced when a replica restarts elsewhere
        self.reference = reference
        self.retry_seconds = retry_seconds
        self.acked: set[tuple[str, str]] = set()
        self.forwarded = [0] * len(replicas)
        self.delivered: list[set[tuple[str, str]]] = [set() for _ in replicas]  # spans each replica answered for
        self._lock = threading.Lock()
        self._pool = concurrent.futures.ThreadPoolExecutor(max_workers=16)
        router = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 - http.server's name
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                ok = router.export(body)
                self.send_response(200 if ok else 503)
                self.send_header("Content-Type", "application/x-protobuf")
                payload = trace_service_pb2.ExportTraceServiceResponse().SerializeToString()
                self.send_header("Content-Length", str(len(payload)))
                self.end_headers()
                self.wfile.write(payload)

            def log_message(self, *args: Any) -> None:
                pass

        class Servicer(trace_service_pb2_grpc.TraceServiceServicer):
            def Export(self, request, context):  # noqa: N802 - the gRPC method name
                if not router.export(request.SerializeToString()):
                    context.abort(grpc.StatusCode.UNAVAILABLE, "a replica did not commit its share")
                return trace_service_pb2.ExportTraceServiceResponse()

        self.http = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.http_url = f"http://127.0.0.1:{self.http.server_address[1]}"
        self.grpc = grpc.server(concurrent.futures.ThreadPoolExecutor(max_workers=8))
        trace_service_pb2_grpc.add_TraceServiceServicer_to_server(Servicer(), self.grpc)
        self.grpc_endpoint = f"127.0.0.1:{self.grpc.add_insecure_port('127.0.0.1:0')}"

    def start(self) -> "Router":
        threading.Thread(target=self.http.serve_forever, daemon=True).start()
        self.grpc.start()
        return self

    def stop(self) -> None:
        self.grpc.stop(0)
        self.http.shutdown()
        self._pool.shutdown(wait=False, cancel_futures=True)

    @staticmethod
    def _post(url: str, body: bytes) -> bool:
        req = urllib.request.Request(url + "/v1/traces", data=body, method="POST",
                                     headers={"Content-Type": "application/x-protobuf"})
        try:
            with urllib.request.urlopen(req, timeout=30) as resp:
                return resp.status == 200
        except (urllib.error.URLError, ConnectionError, TimeoutError, OSError):
            return False

    def _send(self, index: int, part: ExportTraceServiceRequest) -> bool:
        deadline = time.monotonic() + self.retry_seconds
        body = part.SerializeToString()
        while True:
            if self._post(self.replicas[index], body):
                ids = {(s.trace_id.hex(), s.span_id.hex()) for rs in part.resource_spans for ss in rs.scope_spans
                       for s in ss.spans}
                with self._lock:
                    self.delivered[index] |= ids
                    self.forwarded[index] += 1
                return True
            if time.monotonic() > deadline:
                return False
            time.sleep(0.1)

    def export(self, body: bytes) -> bool:
        req = ExportTraceServiceRequest.FromString(body)
        if self.reference and not self._post(self.reference, body):
            return False
        parts = split(req, len(self.replicas))
        futures = [self._pool.submit(self._send, i, p) for i, p in parts.items()]
        ok = all(f.result() for f in futures)
        if ok:
            ids = {(s.trace_id.hex(), s.span_id.hex()) for rs in req.resource_spans for ss in rs.scope_spans
                   for s in ss.spans}
            with self._lock:
                self.acked |= ids
        return ok


# ---------------------------------------------------------------------------- reading the lake


def lake_sql(python: str, config: Path, query: str) -> list[dict[str, Any]]:
    """Rows through ``agentfunnel sql --config`` run from the lake environment (one DuckDB client)."""
    proc = subprocess.run([python, "-m", "agentfunnel.collector.cli", "sql", "--config", str(config), "--format",
                           "json", query], capture_output=True, text=True, timeout=120)
    if proc.returncode != 0:
        raise AssertionError(f"agentfunnel sql failed: {proc.stderr}")
    return json.loads(proc.stdout)


_READ_ALL = """
import json, sys
from pathlib import Path
from agentfunnel.collector.config import load_settings
from agentfunnel.collector.query import run_query
from agentfunnel.collector.store.lake import open_reader
con = open_reader(load_settings(Path(sys.argv[1])).store.lake)
out = {}
for name, q in json.loads(sys.argv[2]).items():
    r = run_query(con, q)
    out[name] = [dict(zip(r.columns, row)) for row in r.rows]
print(json.dumps(out))
"""


def lake_rows(python: str, config: Path, queries: dict[str, str]) -> dict[str, list[dict[str, Any]]]:
    """Several queries through one lake reader (what ``agentfunnel sql`` does, without a process per query)."""
    proc = subprocess.run([python, "-c", _READ_ALL, str(config), json.dumps(queries)], capture_output=True,
                          text=True, timeout=120)
    if proc.returncode != 0:
        raise AssertionError(f"reading the lake failed: {proc.stderr}")
    return json.loads(proc.stdout)


def file_rows(db: Path, queries: dict[str, str]) -> dict[str, list[dict[str, Any]]]:
    """The same queries against a DuckDB file no process holds, read with the same result conversion."""
    from agentfunnel.collector.query import run_query
    from agentfunnel.collector.store.writer import connect

    con = connect(db, read_only=True)
    try:
        out = {}
        for name, q in queries.items():
            r = run_query(con, q)
            out[name] = [dict(zip(r.columns, row)) for row in r.rows]
        return out
    finally:
        con.close()


_MAINTAIN = """
import json, sys
from pathlib import Path
from agentfunnel.collector.config import load_settings
from agentfunnel.collector.store import lake as L
con = L.connect_lake(load_settings(Path(sys.argv[1])).store.lake)
meta = "__ducklake_metadata_lake"
def count(sql):
    return con.execute(sql).fetchone()[0]
out = {"snapshot": L.snapshot(con), "files": L.file_count(con),
       "tables": count(f"SELECT count(DISTINCT table_id) FROM {meta}.ducklake_data_file WHERE end_snapshot IS NULL")}
if sys.argv[2] != "-":
    for s in L.complete_schemas(con):
        L.compact(con, s)
    out["files_after"] = L.file_count(con)
if sys.argv[2] == "compact-and-expire":
    out["snapshots"] = count("SELECT count(*) FROM ducklake_snapshots('lake')")
    out["newest_snapshot"] = L.snapshot(con)
    L.expire(con, 0)
    out["snapshots_after"] = count("SELECT count(*) FROM ducklake_snapshots('lake')")
    out["rows"] = count("SELECT count(*) FROM lake.main.spans")
print(json.dumps(out))
"""


def lake_maintenance(python: str, config: Path, what: str = "-") -> dict[str, int]:
    """Facts about the lake (its snapshot, live data files, tables holding some); ``what``: ``compact`` (what the
    replicas' scheduled maintenance runs, on every schema) or ``compact-and-expire`` (and every snapshot but the
    newest expired, files they alone used deleted), with the figures after."""
    proc = subprocess.run([python, "-c", _MAINTAIN, str(config), what], capture_output=True, text=True, timeout=600)
    if proc.returncode != 0:
        raise AssertionError(f"lake maintenance failed: {proc.stderr}")
    return json.loads(proc.stdout)
