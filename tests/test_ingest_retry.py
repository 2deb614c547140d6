"""``agentfunnel ingest`` through a running server that pushes back: it retries as an OTLP exporter does.

A real ``agentfunnel ingest`` process finds the "server" through the sidecar next to the database,
as it finds a real one; the server is a small HTTP server run here that answers from a script, so
each retry and the time between retries can be seen.
"""

from __future__ import annotations

import threading
import time
from email.utils import formatdate
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from agentfunnel.collector.ingest import retry_after_seconds
from agentfunnel.collector.query import write_sidecar
from conftest import run_cli
from otlp_build import trace_request


class ScriptedServer:
    """Answers POST /v1/traces from ``script`` (status, Retry-After or None), its last answer for ever after;
    records when each request arrived and what it carried. ``/flush`` (the admin endpoint) answers no traces."""

    def __init__(self, script: list[tuple[int, str | None]]) -> None:
        self.script = script
        self.seen: list[tuple[float, bytes]] = []
        self.flushed = 0
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 - http.server's name
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                if self.path == "/flush":
                    outer.flushed += 1
                    self._answer(200, None, b'{"traces": 0}')
                    return
                outer.seen.append((time.monotonic(), body))
                status, retry_after = outer.script[min(len(outer.seen), len(outer.script)) - 1]
                self._answer(status, retry_after, b"" if status == 200 else b"saturated: try later")

            def _answer(self, status: int, retry_after: str | None, body: bytes) -> None:
                self.send_response(status)
                if retry_after is not None:
                    self.send_header("Retry-After", retry_after)
                self.send_header("Content-Type", "application/x-protobuf")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: object) -> None:
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def gaps(self) -> list[float]:
        return [b[0] - a[0] for a, b in zip(self.seen, self.seen[1:])]

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture
def scripted(tmp_path: Path):
    servers: list[ScriptedServer] = []

    def make(script: list[tuple[int, str | None]]) -> tuple[ScriptedServer, Path]:
        srv = ScriptedServer(script)
        servers.append(srv)
        db = tmp_path / "af.duckdb"
        write_sidecar(db, srv.url, None, srv.url, "secret")  # this (live) process as the server's pid
        return srv, db

    yield make
    for srv in servers:
        srv.close()


def _file(tmp_path: Path, name: str, spans: int = 3) -> Path:
    path = tmp_path / name
    path.write_bytes(trace_request([{"name": f"{name}-{i}"} for i in range(spans)]).SerializeToString())
    return path


def test_ingest_retries_503_and_429_waiting_as_retry_after_says(scripted, tmp_path):
    config = tmp_path / "af.toml"
    config.write_text("[ingest]\nmax_retry_wait_seconds = 2.5\n")
    srv, db = scripted([(503, "1"), (429, "2"), (503, "3600"), (200, None)])
    path = _file(tmp_path, "one.binpb")
    started = time.monotonic()
    out = run_cli("ingest", "--db", str(db), "--config", str(config), str(path))
    took = time.monotonic() - started
    assert out.returncode == 0, out.stderr
    assert "ingested 1 file(s) into the running server: 3 spans" in out.stdout
    assert len(srv.seen) == 4 and {body for _, body in srv.seen} == {path.read_bytes()}  # the same body, retried
    one, two, capped = srv.gaps()
    assert 1.0 <= one < 1.8, one  # Retry-After: 1
    assert 2.0 <= two < 2.8, two  # Retry-After: 2
    assert 2.5 <= capped < 3.3, capped  # Retry-After: 3600, bounded by ingest.max_retry_wait_seconds
    assert took < 5.5 + 10  # no wait beyond what was asked (the rest: the command's own start)
    assert srv.flushed == 1  # the end of the input closes its sessions on the server


def test_ingest_gives_up_after_its_bound_and_sends_nothing_after(scripted, tmp_path):
    srv, db = scripted([(503, "1")])
    first, second = _file(tmp_path, "first.binpb"), _file(tmp_path, "second.binpb")
    started = time.monotonic()
    out = run_cli("ingest", "--db", str(db), "--retry-seconds", "2.5", str(first), str(second), check=False)
    took = time.monotonic() - started
    assert out.returncode == 1
    assert "Traceback" not in out.stderr
    errors = [line for line in out.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1, out.stderr
    assert str(first) in errors[0] and "503" in errors[0] and "ingest.retry_seconds (2.5s)" in errors[0]
    assert "run the command again" in errors[0]
    assert 2 <= len(srv.seen) <= 3  # at 0, 1 (and 2) s; a third wait would pass the 2.5 s bound
    assert all(body == first.read_bytes() for _, body in srv.seen)  # the second file was never sent
    assert all(gap >= 1.0 for gap in srv.gaps())
    assert srv.seen[-1][0] - srv.seen[0][0] <= 2.5
    assert took < 2.5 + 10
    assert srv.flushed == 0  # sessions of a saturated server close when idle; no flush is asked of it


def test_ingest_says_in_one_line_when_the_server_cannot_be_reached(scripted, tmp_path):
    srv, db = scripted([(200, None)])
    srv.close()  # the sidecar still names it: a server that died without removing it, its pid alive
    out = run_cli("ingest", "--db", str(db), str(_file(tmp_path, "one.binpb")), check=False)
    assert out.returncode == 1
    assert "Traceback" not in out.stderr
    assert "cannot reach the running server" in out.stderr and srv.url in out.stderr


def test_retry_after_reads_seconds_and_http_dates_and_nothing_else():
    now = 1_800_000_000.0
    assert retry_after_seconds("2") == 2.0
    assert retry_after_seconds(" 0 ") == 0.0
    assert retry_after_seconds(formatdate(now + 30, usegmt=True), now=now) == pytest.approx(30.0)
    assert retry_after_seconds(formatdate(now - 30, usegmt=True), now=now) == 0.0  # a date past: at once
    for unreadable in (None, "", "-5", "soon", "nan", "inf"):
        assert retry_after_seconds(unreadable) is None, unreadable
