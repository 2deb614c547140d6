"""Two credentials, and what each opens, against a real ``agentfunnel serve``.

The ingest token (``receivers.bearer_token``) is held by every agent: it sends telemetry and
nothing else. The admin token (``admin.token``) or the sidecar's per-process secret runs the admin
endpoint and reads the UI; the files an admin request writes stay beside the database unless
``admin.write_dirs`` names another directory. Also here: the UI's headers on every response, ids of
any spelling in its links, a session too large for one page, the sign-in limit, and compressed
files given to ``agentfunnel ingest``.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import gzip
import json
import os
import re
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from html import unescape
from pathlib import Path

import duckdb
import pytest

from agentfunnel.collector.store.schema import migrate
from agentfunnel.collector.store.writer import connect
from agentfunnel.collector.ui.app import CSP, serve_file
from agentfunnel.collector.ui.queries import Reader
from conftest import agentfunnel_cmd, run_cli
from otlp_build import trace_request

INGEST = "agents-ingest-token"
ADMIN = "operators-admin-token"
ADMIN_PATHS = ("/sql", "/flush", "/rescore", "/judge", "/audit/labels", "/prune", "/delete", "/export", "/snapshot")


def _call(url: str, body: dict | None = None, headers: dict[str, str] | None = None,
          data: bytes | None = None) -> tuple[int, dict[str, str], str]:
    payload = data if data is not None else (json.dumps(body).encode() if body is not None else None)
    req = urllib.request.Request(url, data=payload, headers=headers or {}, method="POST" if payload is not None else "GET")
    try:
        with urllib.request.urlopen(req, timeout=60) as resp:
            return resp.status, dict(resp.headers), resp.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, dict(exc.headers), exc.read().decode()


def _admin(srv, path: str, body: dict, token: str) -> tuple[int, str]:
    status, _, text = _call(srv.admin + path, body, {"Content-Type": "application/json",
                                                    "Authorization": f"Bearer {token}"})
    return status, text


def _metrics(srv) -> dict:
    return json.loads(urllib.request.urlopen(srv.admin + "/metrics", timeout=30).read())


# ---------------------------------------------------------------------------- finding: the ingest token administers


def test_the_ingest_token_gets_403_on_every_admin_endpoint_and_the_admin_token_works(server_factory, tmp_path):
    srv = server_factory(env={"AGENTFUNNEL_BEARER_TOKEN": INGEST, "AGENTFUNNEL_ADMIN_TOKEN": ADMIN})
    victim = tmp_path / "victim.txt"
    victim.write_text("original")
    bodies = {"/sql": {"query": "select 1"}, "/snapshot": {"to": str(victim)}, "/export": {"to": str(tmp_path / "x")},
              "/prune": {"before": "2100-01-01"}, "/delete": {"users": ["someone"]}, "/audit/labels": {"labels": []}}
    for path in ADMIN_PATHS:
        status, text = _admin(srv, path, bodies.get(path, {}), INGEST)
        assert status == 403, (path, status, text)
        assert "ingest token" in json.loads(text)["error"] and "admin.token" in json.loads(text)["error"]
    assert victim.read_text() == "original" and not (tmp_path / "x").exists()
    assert _metrics(srv)["admin_refused"]["ingest_token"] == len(ADMIN_PATHS)
    assert _admin(srv, "/sql", {"query": "select 1"}, "a-guess-of-a-token")[0] == 401
    # the admin token runs them
    status, text = _admin(srv, "/sql", {"query": "select 41 + 1 AS n"}, ADMIN)
    assert status == 200 and json.loads(text)["rows"] == [[42]]
    status, text = _admin(srv, "/snapshot", {"to": str(tmp_path / "copy.duckdb")}, ADMIN)
    assert status == 200 and (tmp_path / "copy.duckdb").exists()
    assert _admin(srv, "/prune", {"before": "2000-01-01"}, ADMIN)[0] == 200
    # the same token sends no telemetry: it is the admin's, not an agent's
    assert _call(srv.http_url + "/v1/traces", data=b"", headers={"Content-Type": "application/x-protobuf",
                                                                 "Authorization": f"Bearer {ADMIN}"})[0] == 401
    assert _call(srv.http_url + "/v1/traces", data=b"", headers={"Content-Type": "application/x-protobuf",
                                                                 "Authorization": f"Bearer {INGEST}"})[0] == 200


def test_an_admin_token_equal_to_the_ingest_token_is_refused_at_start(tmp_path):
    proc = subprocess.run(agentfunnel_cmd() + ["serve", "--db", str(tmp_path / "af.duckdb"), "--grpc-port", "0",
                                               "--http-port", "0"], capture_output=True, text=True, timeout=60,
                          env={**os.environ, "AGENTFUNNEL_BEARER_TOKEN": INGEST, "AGENTFUNNEL_ADMIN_TOKEN": INGEST})
    assert proc.returncode != 0
    assert "admin.token is the same as receivers.bearer_token" in proc.stderr


# ---------------------------------------------------------------------------- finding: admin writes anywhere


def test_snapshot_and_export_targets_stay_in_the_data_directory(server_factory, tmp_path):
    data, elsewhere, allowed = tmp_path / "data", tmp_path / "elsewhere", tmp_path / "allowed"
    for d in (data, elsewhere, allowed):
        d.mkdir()
    os.symlink(elsewhere, data / "link")
    cfg = tmp_path / "af.toml"
    cfg.write_text(f'[admin]\nwrite_dirs = ["{allowed}"]\n')
    srv = server_factory(["--config", str(cfg)], db=data / "af.duckdb", env={"AGENTFUNNEL_ADMIN_TOKEN": ADMIN})
    refused = [("/snapshot", elsewhere / "copy.duckdb"), ("/snapshot", data / ".." / "elsewhere" / "copy.duckdb"),
               ("/snapshot", data / "link" / "copy.duckdb"), ("/export", elsewhere / "parquet"),
               ("/export", data / "link")]
    for path, target in refused:
        status, text = _admin(srv, path, {"to": str(target)}, ADMIN)
        assert status == 403, (path, target, status, text)
        assert "outside the directories" in json.loads(text)["error"] and "admin.write_dirs" in json.loads(text)["error"]
    assert list(elsewhere.iterdir()) == []
    assert _metrics(srv)["admin_refused"]["outside_data_dir"] == len(refused)
    status, text = _admin(srv, "/snapshot", {"to": str(data / "af.duckdb.wal")}, ADMIN)
    assert status == 400 and "database's own files" in text
    assert _admin(srv, "/snapshot", {"to": str(data / "copy.duckdb")}, ADMIN)[0] == 200
    assert _admin(srv, "/export", {"to": str(allowed / "parquet")}, ADMIN)[0] == 200
    # the commands, run by the server's user, still write where that user asks: staged beside the database, moved
    spans = tmp_path / "one.binpb"
    spans.write_bytes(trace_request([{"name": "kept", "start": time.time_ns() - 10**9, "end": time.time_ns()}])
                      .SerializeToString())
    run_cli("ingest", "--db", str(srv.db), str(spans))
    run_cli("snapshot", "--db", str(srv.db), str(elsewhere / "mine.duckdb"))
    con = duckdb.connect(str(elsewhere / "mine.duckdb"), read_only=True)
    try:
        assert con.execute("SELECT name FROM spans").fetchall() == [("kept",)]
    finally:
        con.close()
    run_cli("export", "--db", str(srv.db), "--to", str(elsewhere / "parquet"), "--table", "spans")
    assert len(list((elsewhere / "parquet" / "spans").glob("day=*/part-0.parquet"))) == 1
    assert not [p for p in data.iterdir() if p.name.startswith(".agentfunnel-staging-")]


# ---------------------------------------------------------------------------- finding: the UI's smaller holes


ODD_IDS = ["{x}", "a/b/../c", "50% off", "fünf ü 日本", "q?x=1#frag", "{session_id}"]


def _ui_db(path: Path, sessions: list[str], big: str | None = None, big_spans: int = 0) -> Path:
    """Sessions with the given ids; with ``big``, that one holds ``big_spans`` spans of 100 KB of attributes each."""
    con = connect(path)
    migrate(con)
    t0 = dt.datetime(2025, 5, 1, 9, 0)
    for i, sid in enumerate(sessions):
        trace = f"t{i}"
        con.execute("INSERT INTO session_rows (session_id, status, first_seen, last_seen, trace_ids, variant, updated_at)"
                    " VALUES (?, 'closed', ?, ?, [?], 'generic', ?)", [sid, t0, t0, trace, t0 + dt.timedelta(minutes=1)])
        con.execute("INSERT INTO trace_index (trace_id, first_received, span_count, session_ids, assembled_at)"
                    " VALUES (?, ?, 1, [?], ?)", [trace, t0, sid, t0])
        n = big_spans if sid == big else 1
        for k in range(n):
            attrs = {"marker": f"payload-{k:03d}", "filler": "x" * (100_000 if sid == big else 10)}
            # stamped with a dialect, as an assembled trace's spans are (unstamped ones are reassembled at start)
            con.execute("INSERT INTO spans (trace_id, span_id, session_id, name, kind, start_time, end_time,"
                        " status_code, attributes, received_at, dialect)"
                        " VALUES (?, ?, ?, 'work', 'INTERNAL', ?, ?, 'UNSET', ?, ?, 'unknown')",
                        [trace, f"s{k}", sid, t0 + dt.timedelta(milliseconds=k), t0 + dt.timedelta(milliseconds=k + 1),
                         json.dumps(attrs), t0])
    con.close()
    return path


def test_every_ui_response_carries_the_security_headers(server):
    for url, data in [(server.http_url + "/ui/no-such-page", None), (server.http_url + "/no-such-path", None),
                      (server.http_url + "/ui/sessions", b"x=1"),  # 405
                      (server.http_url + "/ui/static/nope.css", None)]:
        status, headers, _ = _call(url, data=data)
        assert status in (404, 405), (url, status)
        assert headers.get("Content-Security-Policy") == CSP, (url, headers)
        assert headers.get("X-Content-Type-Options") == "nosniff" and headers.get("X-Frame-Options") == "DENY"


def test_a_ui_page_that_fails_answers_500_with_the_security_headers_and_no_details(tmp_path):
    """A page whose read breaks outside the query runner (here: its database connection closed under it) ends in
    aiohttp's own bare 500, which carries the headers too and shows neither the error nor a traceback."""
    db = tmp_path / "af.duckdb"
    con = connect(db)
    migrate(con)
    con.close()
    con = connect(db, read_only=True)
    reader = Reader(con.cursor)
    con.close()  # every page's first cursor now fails: duckdb.ConnectionException, not a QueryError
    urls: list[str] = []
    loop = asyncio.new_event_loop()
    stop = asyncio.Event()
    thread = threading.Thread(target=loop.run_until_complete,
                              args=(serve_file(reader, "127.0.0.1", 0, urls.append, stop=stop),), daemon=True)
    thread.start()
    try:
        deadline = time.monotonic() + 30
        while not urls:
            assert time.monotonic() < deadline and thread.is_alive(), "the UI did not start"
            time.sleep(0.05)
        for page in ("", "sessions", "sessions/any", "experiments"):
            status, headers, body = _call(urls[0] + page)
            assert status == 500, (page, status, body[:300])
            assert headers.get("Content-Security-Policy") == CSP, (page, headers)
            assert headers.get("X-Content-Type-Options") == "nosniff" and headers.get("X-Frame-Options") == "DENY"
            assert headers.get("Cache-Control") == "no-store"
            assert "Traceback" not in body and "closed" not in body and "duckdb" not in body.lower(), body
    finally:
        loop.call_soon_threadsafe(stop.set)
        thread.join(30)
        loop.close()


def test_ids_of_any_spelling_round_trip_through_ui_links(server_factory, tmp_path):
    srv = server_factory(db=_ui_db(tmp_path / "ids.duckdb", ODD_IDS))
    status, _, listing = _call(srv.http_url + "/ui/sessions")
    assert status == 200
    hrefs = [unescape(h) for h in re.findall(r'class="sid" href="([^"]+)"', listing)]
    assert len(hrefs) == len(ODD_IDS)
    seen = set()
    for href in hrefs:
        status, _, page = _call(srv.http_url + href)
        assert status == 200, (href, status)
        seen.add(unescape(re.search(r'<code id="session-id">([^<]*)</code>', page).group(1)))
    assert seen == set(ODD_IDS)


def test_a_session_larger_than_a_page_is_shown_in_parts(server_factory, tmp_path):
    db = _ui_db(tmp_path / "big.duckdb", ["small", "big"], big="big", big_spans=40)  # 4 MB of attributes
    cfg = tmp_path / "af.toml"
    cfg.write_text("[sql]\nmax_result_bytes = 1048576\n")  # a page budget of 128 KiB per kind
    srv = server_factory(["--config", str(cfg)], db=db)
    markers: set[str] = set()
    url, parts = srv.http_url + "/ui/sessions/big", 0
    while url:
        status, _, page = _call(url)
        assert status == 200, page[:500]
        parts += 1
        markers |= set(re.findall(r"payload-\d{3}", page))
        more = re.search(r'<a rel="next" href="([^"]+)"', page)
        url = srv.http_url + "/ui/sessions/big" + unescape(more.group(1)) if more else ""
        assert parts < 50
    assert parts > 1 and markers == {f"payload-{k:03d}" for k in range(40)}
    assert _metrics(srv)["ui_payloads_paged"] == parts


def test_ui_sign_in_is_rate_limited_per_client(server_factory):
    srv = server_factory(env={"AGENTFUNNEL_ADMIN_TOKEN": ADMIN})
    login = srv.http_url + "/ui/login"
    started = time.monotonic()
    answers = [_call(login, data=b"token=wrong-guess&next=%2Fui%2F") for _ in range(12)]
    assert [a[0] for a in answers[:10]] == [401] * 10
    assert answers[10][0] == 429 and 1 <= int(answers[10][1]["Retry-After"]) <= 60
    assert answers[10][1]["Content-Security-Policy"] == CSP
    # within the minute even the right token waits
    assert _call(login, data=f"token={ADMIN}&next=%2Fui%2F".encode())[0] == 429
    assert time.monotonic() - started < 50
    assert _metrics(srv)["ui_sign_in"] == {"wrong": 10, "limited": 3}


# ---------------------------------------------------------------------------- finding: ingest inflates without a cap


def test_a_gzip_bomb_given_to_ingest_fails_fast_with_bounded_memory(tmp_path):
    member = gzip.compress(b" " * (64 << 20), compresslevel=9)
    bomb = tmp_path / "spans.json.gz"
    bomb.write_bytes(gzip.compress(b'{"resourceSpans": [') + member * 16)  # 17 gzip members: 1 GiB of JSON inflated
    assert bomb.stat().st_size < 2 << 20
    measure = ("import resource, subprocess, sys, time; t = time.monotonic(); "
               "p = subprocess.run(sys.argv[1:], capture_output=True, text=True); "
               "print(p.returncode, resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss, time.monotonic() - t); "
               "print(p.stderr)")
    out = subprocess.run([sys.executable, "-c", measure, *agentfunnel_cmd(), "ingest", "--db",
                          str(tmp_path / "af.duckdb"), str(bomb)], capture_output=True, text=True, timeout=300).stdout
    first, stderr = out.split("\n", 1)
    code, rss_kib, seconds = first.split()
    assert int(code) == 1
    assert f"{bomb}: inflates past 67108864 bytes (receivers.max_request_bytes" in stderr
    assert int(rss_kib) < 400 * 1024, f"{int(rss_kib) // 1024} MiB"
    assert float(seconds) < 30


# ---------------------------------------------------------------------------- the parts, without a server


def test_the_sign_in_limiter_counts_a_sliding_minute_and_forgets_the_oldest_clients():
    from agentfunnel.collector.ui.app import SignInLimiter

    limiter = SignInLimiter(3, max_clients=2)
    assert [limiter.wait("a", now=t) for t in (0.0, 1.0, 2.0)] == [0.0, 0.0, 0.0]
    assert limiter.wait("a", now=30.0) == pytest.approx(30.0)  # the first try leaves the window at 60 s
    assert limiter.wait("a", now=60.0) == 0.0
    limiter.wait("b", now=61.0)
    limiter.wait("c", now=62.0)  # a third address: "a", the least recently seen, is forgotten
    assert set(limiter._seen) == {"b", "c"}


def test_admin_settings_name_what_is_wrong(tmp_path):
    from agentfunnel.collector.config import ConfigError, load_settings
    from agentfunnel.collector.data_admin import OutsideDataDir, confined

    with pytest.raises(ConfigError, match=r"admin.write_dirs: .*relative is not an absolute path"):
        load_settings(overrides={("admin", "write_dirs"): ["relative"]}, environ={})
    with pytest.raises(ConfigError, match=r"admin.token: .*shorter than 8"):
        load_settings(environ={"AGENTFUNNEL_ADMIN_TOKEN": "short"})
    settings = load_settings(overrides={("store", "path"): str(tmp_path / "data" / "af.duckdb")}, environ={})
    assert confined(tmp_path / "data" / "sub" / "x.duckdb", settings) == (tmp_path / "data" / "sub" / "x.duckdb").resolve()
    with pytest.raises(OutsideDataDir, match="outside the directories"):
        confined(tmp_path / "data" / ".." / "x.duckdb", settings)


def test_an_admin_body_that_is_not_the_json_object_asked_for_is_answered_400_naming_the_shape(server):
    secret = json.loads(server.db.with_name(server.db.name + ".agentfunnel.json").read_text())["secret"]
    headers = {"Content-Type": "application/json", "X-Agentfunnel-Secret": secret}
    for path in ("/rescore", "/flush", "/judge", "/prune"):
        for data in (b"not json", b"[1]", b'"stale_only"'):
            status, _, text = _call(server.admin + path, headers=headers, data=data)
            assert status == 400 and "JSON" in text, (path, data, status, text)
    status, _, text = _call(server.admin + "/rescore", headers=headers, data=b'{"stale_only": "yes"}')
    assert status == 400 and "stale_only" in text, text
    status, _, text = _call(server.admin + "/rescore", headers=headers, data=b'{"stale_only": true}')
    assert status == 200 and json.loads(text) == {"traces": 0}, text
    assert " ERROR " not in server.logs() and "Traceback" not in server.logs()
