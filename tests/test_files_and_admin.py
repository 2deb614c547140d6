"""The files a server writes, the sidecar the CLI follows, and who may use the admin endpoint.

The sidecar holds the bearer token and the admin secret: it is created 0600 under a name nobody
can plant, the database and its WAL are 0600 from the start, the CLI follows only a sidecar its
own user wrote that points at loopback, and the admin endpoint refuses what a browser can be
made to send (cross-site posts, a rebound Host).
"""

from __future__ import annotations

import http.server
import json
import os
import stat
import threading
import urllib.error
import urllib.request

import pytest

from agentfunnel.collector.receivers.status import check_bearer
from agentfunnel.collector.errors import UnauthorizedError
from conftest import run_cli, sql
from otlp_build import trace_request


def _mode(path) -> int:
    return stat.S_IMODE(os.lstat(path).st_mode)


def _sidecar(db):
    return db.with_name(db.name + ".agentfunnel.json")


def test_sidecar_database_and_wal_are_private_and_planted_files_are_never_followed(server_factory, tmp_path):
    db = tmp_path / "af.duckdb"
    victim = tmp_path / "victim.txt"
    victim.write_text("original")
    os.symlink(victim, tmp_path / "af.duckdb.agentfunnel.json.tmp")  # the old, predictable temporary name
    os.symlink(victim, _sidecar(db))  # and a link where the sidecar goes
    os.umask(0o022)  # a common login default: the server must not depend on the caller's
    srv = server_factory(db=db, env={"AGENTFUNNEL_BEARER_TOKEN": "s3cret"})
    assert victim.read_text() == "original"
    assert stat.S_ISREG(os.lstat(_sidecar(db)).st_mode) and _mode(_sidecar(db)) == 0o600
    info = json.loads(_sidecar(db).read_text())
    assert info["token"] == "s3cret" and len(info["secret"]) >= 32
    path = tmp_path / "one.binpb"
    path.write_bytes(trace_request([{"name": "one"}]).SerializeToString())
    run_cli("ingest", "--db", str(db), str(path))
    assert _mode(db) == 0o600
    wal = db.with_name(db.name + ".wal")
    assert wal.exists() and _mode(wal) == 0o600
    srv.stop()
    assert not _sidecar(db).exists()


def _listener() -> tuple[http.server.HTTPServer, list[bytes]]:
    """A stranger's endpoint: records whatever a forged sidecar sends it."""
    received: list[bytes] = []

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_POST(self):  # noqa: N802
            received.append(self.rfile.read(int(self.headers.get("Content-Length", 0))))
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.end_headers()
            self.wfile.write(b'{"columns": ["x"], "types": ["INTEGER"], "rows": [[1]]}')

        def log_message(self, *args):
            pass

    server = http.server.HTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server, received


def _forge(db, url: str, mode: int, owner: int | None = None) -> None:
    side = _sidecar(db)
    side.write_text(json.dumps({"pid": os.getpid(), "admin_url": url, "token": None, "secret": "x"}))
    os.chmod(side, mode)
    if owner is not None:
        os.chown(side, owner, -1)


@pytest.mark.parametrize("case", ["world-readable", "other-owner", "remote-host"])
def test_cli_does_not_follow_a_sidecar_it_cannot_trust(tmp_path, case):
    db = tmp_path / "af.duckdb"
    db.touch()
    stranger, received = _listener()
    url = f"http://127.0.0.1:{stranger.server_port}"
    if case == "world-readable":
        _forge(db, url, 0o644)
    elif case == "other-owner":
        if os.geteuid() != 0:
            pytest.skip("handing a file to another user needs root")
        _forge(db, url, 0o600, owner=65534)
    else:
        _forge(db, "http://example.invalid:80", 0o600)
    out = run_cli("sql", "--db", str(db), "select 42 as secret_query", check=False)
    stranger.shutdown()
    assert out.returncode != 0 and ".agentfunnel.json" in out.stderr and "remove it" in out.stderr
    assert received == []  # the query never left


def _post(url: str, body: bytes, headers: dict[str, str]) -> int:
    req = urllib.request.Request(url, data=body, method="POST", headers=headers)
    try:
        with urllib.request.urlopen(req, timeout=10) as resp:
            return resp.status
    except urllib.error.HTTPError as exc:
        return exc.code


def test_admin_endpoint_refuses_cross_site_and_rebound_requests(server):
    secret = json.loads(_sidecar(server.db).read_text())["secret"]
    port = server.admin.rsplit(":", 1)[1]
    query = json.dumps({"query": "select 1"}).encode()
    # what a web page can make a browser send: a "simple" text/plain POST with its own Origin
    assert _post(server.admin + "/flush", b"{}", {"Content-Type": "text/plain", "Origin": "http://evil.example"}) == 403
    assert _post(server.admin + "/sql", query, {"Content-Type": "text/plain"}) == 415
    # DNS rebinding: the browser thinks it talks to evil.example
    assert _post(server.admin + "/sql", query, {"Content-Type": "application/json", "Host": f"evil.example:{port}",
                                               "X-Agentfunnel-Secret": secret}) == 403
    # same machine, right shape, no secret (no token is configured)
    assert _post(server.admin + "/sql", query, {"Content-Type": "application/json"}) == 401
    assert _post(server.admin + "/sql", query, {"Content-Type": "application/json",
                                               "X-Agentfunnel-Secret": "guess"}) == 401
    assert _post(server.admin + "/sql", query, {"Content-Type": "application/json",
                                               "X-Agentfunnel-Secret": secret}) == 200
    # and the CLI, which reads the secret from the sidecar, still works
    assert sql(server.db, "select 7 as n") == [{"n": 7}]


def test_bearer_tokens_are_compared_in_constant_time(monkeypatch):
    import hmac

    compared: list[tuple[bytes, bytes]] = []
    real = hmac.compare_digest
    monkeypatch.setattr(hmac, "compare_digest", lambda a, b: compared.append((a, b)) or real(a, b))
    with pytest.raises(UnauthorizedError):
        check_bearer("Bearer s3creX", "s3cret")
    check_bearer("Bearer s3cret", "s3cret")
    assert compared == [(b"s3creX", b"s3cret"), (b"s3cret", b"s3cret")]


def test_listening_beyond_loopback_without_a_token_warns(server_factory):
    srv = server_factory(["--host", "0.0.0.0"])
    srv.stop()
    assert "beyond loopback without a bearer token" in srv.logs()


def test_a_key_flood_evicts_the_oldest_keys_and_counts_them(server_factory, tmp_path):
    config = tmp_path / "dedupe.yaml"
    config.write_text("store:\n  dedupe_max_keys: 100\n")
    srv = server_factory(["--config", str(config)])
    first = trace_request([{"name": f"s{i}"} for i in range(100)])
    flood = trace_request([{"name": f"f{i}"} for i in range(300)])
    for i, req in enumerate((first, flood, first)):  # the retry of `first` comes after its keys were evicted
        path = tmp_path / f"{i}.binpb"
        path.write_bytes(req.SerializeToString())
        run_cli("ingest", "--db", str(srv.db), str(path))
    metrics = json.loads(urllib.request.urlopen(srv.admin + "/metrics").read())
    assert metrics["dedupe_evictions"] >= 300
    assert metrics["dedupe_keys"] == 100
    # documented: a retry older than the window's bound is stored again, and counted as such
    assert sql(srv.db, "select count(*) as n from spans where name like 's%'") == [{"n": 200}]


def test_huge_attribute_values_are_cut_so_assembly_memory_stays_bounded(server_factory, tmp_path):
    import psutil

    from agentfunnel.collector.batches import SpanBatch, bound_values

    # the rule, in milliseconds: long strings anywhere in the value tree are cut at a character boundary
    batch = SpanBatch(attributes=['{"a":"' + "é" * 100 + '","b":[{"c":"' + "x" * 300 + '"}],"d":5}'],
                      events=[None], _attrs=None, _resource_attrs=None, _event_list=None)
    assert bound_values(batch, 100) == 2
    a = batch.attrs[0]
    assert a["a"].startswith("é" * 50) and "truncated by agentfunnel: 100 more bytes" in a["a"]
    assert a["b"][0]["c"].startswith("x" * 100) and a["d"] == 5
    # and a real server: 15 tool calls with 10 MB results in one trace
    srv = server_factory()
    proc = psutil.Process(srv.proc.pid)
    trace = os.urandom(16)
    root = os.urandom(8)
    spans = [{"trace_id": trace, "span_id": root, "name": "invoke_agent shop",
              "attributes": {"gen_ai.operation.name": "invoke_agent", "gen_ai.conversation.id": "big-1"}}]
    spans += [{"trace_id": trace, "parent_span_id": root, "name": f"execute_tool search_{i}",
               "attributes": {"gen_ai.operation.name": "execute_tool", "gen_ai.tool.name": "search_products",
                              "gen_ai.tool.call.result": json.dumps({"items": "r" * 10_000_000})}}
              for i in range(15)]
    for span in spans:
        req = urllib.request.Request(srv.http_url + "/v1/traces", data=trace_request([span]).SerializeToString(),
                                     headers={"Content-Type": "application/x-protobuf"})
        assert urllib.request.urlopen(req, timeout=60).status == 200
    peak = [0]
    done = threading.Event()

    def watch() -> None:
        while not done.is_set():
            peak[0] = max(peak[0], proc.memory_info().rss)
            done.wait(0.02)

    watcher = threading.Thread(target=watch)
    # ingest alone keeps about 150 MB (the stored rows in DuckDB's buffers); what is bounded here is assembly
    baseline = proc.memory_info().rss
    watcher.start()
    srv.admin_post("/flush")
    done.set()
    watcher.join()
    metrics = json.loads(urllib.request.urlopen(srv.admin + "/metrics").read())
    assert metrics["values_truncated"] == 15
    rows = sql(srv.db, "select count(*) as n, max(length(result)) as longest from tool_calls where session_id = 'big-1'")
    assert rows[0]["n"] == 15 and rows[0]["longest"] < 1_100_000
    # before: about 6 x 150 MB while the trace was assembled; now about one copy of the raw values
    assert peak[0] - baseline < 250 * 1024 * 1024, f"assembly grew the server by {(peak[0] - baseline) >> 20} MiB"
