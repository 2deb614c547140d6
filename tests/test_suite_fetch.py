"""Loading a case suite from a URL is bounded: one deadline and a size cap for the whole fetch,
redirects only within the host, a bad charset is a failed fetch (so the fallback is used), YAML
alias bombs are refused, and a remote suite cannot make the server run a command or import code.

Every server here is on the loopback interface; the process tests run the real ``agentfunnel serve``.
"""

from __future__ import annotations

import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
import yaml

from agentfunnel.scoring.cases import CaseFileError, _same_host, load_suite
from conftest import agentfunnel_cmd

CASE = {"id": "remote-case", "task": "Find the EUR-to-USD rate.", "intent_summary": "A rate for one day.",
        "target": {"name": "FXRates"}}
SUITE = yaml.safe_dump({"cases": [CASE]}).encode()


class SuiteServer:
    """A loopback HTTP server whose paths answer however a test needs (slowly, redirecting, ...)."""

    def __init__(self) -> None:
        self.routes: dict[str, Callable[[BaseHTTPRequestHandler], None]] = {}
        self.stop = threading.Event()
        routes = self.routes

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802 - http.server's name
                route = routes.get(self.path)
                try:
                    route(self) if route else self.send_error(404)
                except OSError:  # the client gave up (as it should on a deadline)
                    pass

            def log_message(self, *args) -> None:
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.port = self.httpd.server_address[1]
        self.url = f"http://127.0.0.1:{self.port}"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def body(self, path: str, data: bytes = SUITE, content_type: str = "application/yaml",
             length: bool = True) -> str:
        def send(h: BaseHTTPRequestHandler) -> None:
            h.send_response(200)
            h.send_header("Content-Type", content_type)
            if length:
                h.send_header("Content-Length", str(len(data)))
            h.end_headers()
            h.wfile.write(data)
        self.routes[path] = send
        return self.url + path

    def redirect(self, path: str, location: str) -> str:
        def send(h: BaseHTTPRequestHandler) -> None:
            h.send_response(302)
            h.send_header("Location", location)
            h.send_header("Content-Length", "0")
            h.end_headers()
        self.routes[path] = send
        return self.url + path

    def trickle(self, path: str, seconds: float, headers_too: bool = False) -> str:
        """The suite, one byte at a time over about ``seconds``: no single read ever waits long."""
        head = b"HTTP/1.0 200 OK\r\nContent-Type: application/yaml\r\n\r\n"

        def send(h: BaseHTTPRequestHandler) -> None:
            slow = head + SUITE if headers_too else SUITE
            if not headers_too:
                h.wfile.write(head)
            for i in range(len(slow)):
                if self.stop.wait(seconds / len(slow)):
                    return
                h.wfile.write(slow[i:i + 1])
        self.routes[path] = send
        return self.url + path

    def close(self) -> None:
        self.stop.set()
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture
def web() -> Iterator[SuiteServer]:
    server = SuiteServer()
    yield server
    server.close()


@pytest.fixture
def local(tmp_path: Path) -> Path:
    path = tmp_path / "local.yaml"
    path.write_text(yaml.safe_dump({"cases": [{**CASE, "id": "local-copy"}]}))
    return path


def with_validator(validator: dict) -> bytes:
    return yaml.safe_dump({"cases": [{**CASE, "artifact": {"validator": validator}}]}).encode()


# --------------------------------------------------------------------------- time and size

@pytest.mark.parametrize("headers_too", [False, True], ids=["body", "headers"])
def test_a_trickling_server_hits_the_total_deadline_and_the_fallback_is_used(web, local, headers_too):
    url = web.trickle("/slow.yaml", seconds=20, headers_too=headers_too)
    started = time.monotonic()
    loaded = load_suite(url, fallback=local, timeout=1)
    assert time.monotonic() - started < 3
    assert loaded.origin == "fallback" and loaded.cases[0].id == "local-copy"
    assert url in loaded.note and "took longer than 1 s in all (cases.fetch_timeout_seconds)" in loaded.note


def test_without_a_fallback_the_deadline_is_an_error_naming_url_and_limit(web):
    url = web.trickle("/slow.yaml", seconds=20)
    with pytest.raises(CaseFileError) as err:
        load_suite(url, timeout=1)
    assert str(err.value).startswith(url) and "cases.fetch_timeout_seconds" in str(err.value)


@pytest.mark.parametrize("length", [True, False], ids=["content-length", "read-to-close"])
def test_a_body_over_the_size_cap_is_a_failed_fetch(web, local, length):
    url = web.body("/big.yaml", SUITE + b"#" * 2000, length=length)
    loaded = load_suite(url, fallback=local, max_bytes=1000)
    assert loaded.origin == "fallback"
    assert "larger than 1000 bytes (cases.max_suite_bytes)" in loaded.note
    assert load_suite(web.body("/ok.yaml"), max_bytes=1000).origin == "url"


# --------------------------------------------------------------------------- redirects

def test_redirects_are_followed_only_on_the_same_host(web, local, tmp_path):
    web.body("/suite.yaml")
    assert load_suite(web.redirect("/moved.yaml", "/suite.yaml"), fallback=local).origin == "url"
    (tmp_path / "secret.yaml").write_bytes(SUITE)
    for target in (f"http://localhost:{web.port}/suite.yaml", f"ftp://127.0.0.1:{web.port}/suite.yaml",
                   f"file://{tmp_path / 'secret.yaml'}"):
        url = web.redirect("/away.yaml", target)
        loaded = load_suite(url, fallback=local, timeout=2)
        assert loaded.origin == "fallback", target
        assert f"to {target}: only redirects to http(s) on the same host are followed" in loaded.note


def test_a_redirect_loop_stops_after_a_few_hops(web, local):
    for i in range(10):
        web.redirect(f"/hop{i}", f"/hop{i + 1}")
    loaded = load_suite(f"{web.url}/hop0", fallback=local)
    assert loaded.origin == "fallback" and "more than 5 redirects" in loaded.note


@pytest.mark.parametrize(("current", "target", "followed"), [
    ("http://h.example/a", "http://h.example/b", True),
    ("http://h.example/a", "https://h.example/a", True),  # the upgrade on the same host
    ("https://h.example/a", "http://h.example/a", False),  # never the downgrade
    ("http://h.example:8080/a", "http://h.example:8081/a", False),
    ("http://h.example/a", "http://other.example/a", False),
    ("http://h.example/a", "ftp://h.example/a", False),
])
def test_the_redirect_rule(current, target, followed):
    assert _same_host(current, target) is followed


# --------------------------------------------------------------------------- charset

@pytest.mark.parametrize(("content_type", "data", "problem"), [
    ("application/yaml; charset=nonexistent-xyz", SUITE, "unknown charset 'nonexistent-xyz'"),
    ("application/yaml; charset=base64", SUITE, "unknown charset 'base64'"),  # a codec, not a text encoding
    ("application/yaml; charset=utf-8", b"\xff\xfe" + SUITE, "not valid utf-8 text"),
], ids=["unknown", "not-text", "undecodable"])
def test_a_bad_charset_is_a_failed_fetch_so_the_fallback_is_used(web, local, content_type, data, problem):
    url = web.body("/suite.yaml", data, content_type=content_type)
    loaded = load_suite(url, fallback=local)
    assert loaded.origin == "fallback" and problem in loaded.note
    with pytest.raises(CaseFileError, match="could not be fetched"):
        load_suite(url)


# --------------------------------------------------------------------------- YAML aliases

BOMB = ("lol: &a [lol, lol, lol, lol, lol, lol, lol, lol, lol]\n"
        + "".join(f"l{i}: &{chr(98 + i)} [{', '.join([f'*{chr(97 + i)}'] * 9)}]\n" for i in range(8))
        + yaml.safe_dump({"cases": [CASE]}))


def test_an_alias_bomb_is_refused_from_a_file_and_from_a_url(web, local, tmp_path):
    assert len(BOMB) < 700
    path = tmp_path / "bomb.yaml"
    path.write_text(BOMB)
    with pytest.raises(CaseFileError, match=r"bomb\.yaml: YAML aliases expand the document by \d+ nodes"):
        load_suite(path)
    url = web.body("/bomb.yaml", BOMB.encode())
    with pytest.raises(CaseFileError, match=r"^http://127\.0\.0\.1:\d+/bomb\.yaml: YAML aliases"):
        load_suite(url, fallback=local)  # fetched but unusable: an error, never replaced by the local copy
    recursive = tmp_path / "recursive.yaml"
    recursive.write_text("loop: &l [*l]\n" + yaml.safe_dump({"cases": [CASE]}))
    with pytest.raises(CaseFileError, match="recursive"):
        load_suite(recursive)
    legit = tmp_path / "anchors.yaml"
    legit.write_text("cases:\n- &base {id: one, task: t, intent_summary: i, target: &fx {name: FXRates}}\n"
                     "- {<<: *base, id: two, competitors: [{name: XE}], target: *fx}\n")
    assert [c.id for c in load_suite(legit).cases] == ["one", "two"]


# --------------------------------------------------------------------------- code from a remote suite

@pytest.mark.parametrize(("validator", "field"), [
    ({"command": ["python", "-c", "print()"]}, "command"),
    ({"entry_point": "os:system"}, "entry_point"),
])
def test_a_remote_suite_may_not_declare_a_validator_unless_allowed(web, local, tmp_path, validator, field):
    url = web.body("/suite.yaml", with_validator(validator))
    with pytest.raises(CaseFileError) as err:
        load_suite(url, fallback=local)  # refused, not replaced by the local copy
    assert (f'cases[0] (id "remote-case").artifact.validator.{field}: a suite fetched from a URL' in str(err.value)
            and "cases.allow_remote_commands" in str(err.value))
    assert load_suite(url, allow_remote_commands=True).origin == "url"
    path = tmp_path / "same.yaml"
    path.write_bytes(with_validator(validator))
    assert load_suite(path).cases[0].artifact.validator is not None
    fallback = tmp_path / "fallback.yaml"
    fallback.write_bytes(with_validator(validator))  # the fallback is a local file too
    assert load_suite(web.url + "/missing.yaml", fallback=fallback).origin == "fallback"


# --------------------------------------------------------------------------- the serve process

def _config(tmp_path: Path, **cases) -> str:
    path = tmp_path / "agentfunnel.yaml"
    path.write_text(yaml.safe_dump({"cases": {k: str(v) if isinstance(v, Path) else v for k, v in cases.items()}}))
    return str(path)


def _serve(tmp_path: Path, config: str, timeout: float = 60) -> subprocess.CompletedProcess:
    """``serve`` that is expected to exit by itself (refusing to start)."""
    return subprocess.run([*agentfunnel_cmd(), "serve", "--db", str(tmp_path / "x.duckdb"), "--config", config,
                           "--grpc-port", "0", "--http-port", "0"], capture_output=True, text=True, timeout=timeout)


def test_serve_starts_promptly_with_the_fallback_when_the_suite_server_trickles(web, local, tmp_path,
                                                                                 server_factory):
    url = web.trickle("/slow.yaml", seconds=30)
    started = time.monotonic()
    srv = server_factory(["--config", _config(tmp_path, suite=url, fallback=local, fetch_timeout_seconds=2)])
    assert time.monotonic() - started < 25  # well before the 30 s the server trickles for, on a loaded machine too
    assert f"cases from the local copy {local}" in srv.logs() and "took longer than 2 s in all" in srv.logs()


def test_serve_without_a_fallback_fails_in_one_line_naming_the_url_and_limit(web, tmp_path):
    url = web.trickle("/slow.yaml", seconds=30)
    out = _serve(tmp_path, _config(tmp_path, suite=url, fetch_timeout_seconds=1))
    assert out.returncode == 2 and "Traceback" not in out.stderr
    assert out.stderr.strip().splitlines() == [
        f"agentfunnel: cases.suite: {url}: could not be fetched: took longer than 1 s in all "
        "(cases.fetch_timeout_seconds)"]


def test_serve_with_a_bad_charset_suite_starts_on_the_fallback(web, local, tmp_path, server_factory):
    url = web.body("/suite.yaml", content_type="application/yaml; charset=nonexistent-xyz")
    srv = server_factory(["--config", _config(tmp_path, suite=url, fallback=local)])
    assert f"cases from the local copy {local}" in srv.logs() and "unknown charset" in srv.logs()


def test_serve_refuses_a_remote_suite_with_a_validator_command(web, local, tmp_path):
    pwned = tmp_path / "pwned"
    url = web.body("/suite.yaml", with_validator({"command": ["python", "-c", f"open({str(pwned)!r}, 'w')"]}))
    out = _serve(tmp_path, _config(tmp_path, suite=url, fallback=local))
    assert out.returncode == 2 and "Traceback" not in out.stderr
    assert 'cases[0] (id "remote-case").artifact.validator.command' in out.stderr
    assert "cases.allow_remote_commands" in out.stderr
    assert not pwned.exists()

