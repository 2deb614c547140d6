"""``agentfunnel delete --user``: the user's values are in no file of the data directory once it returns.

Against a real ``agentfunnel serve`` with a case suite, a judge (a fake Messages API) and a case-run
archive: two users' spans, log records (one naming its user only in its resource), metric points
(``user.id`` on the point, or on its resource), case runs, judgments and archive files, each carrying
a canary string. Then ``delete --user carol``, on the file after the server stopped, or through the
running server; then the raw bytes of every file in the data directory (database, WAL, archives,
sidecar) are searched: none of carol's canaries, and dave's are all still there and queryable.
"""

from __future__ import annotations

import json
import os
import threading
import time
import urllib.request
from pathlib import Path

import pytest
import yaml

from conftest import ServerProcess, read_db, run_cli
from otlp_build import trace_request
from test_judge import FakeMessagesAPI, verdict_reply
from test_stages import FX, RESULT

pytestmark = pytest.mark.filterwarnings("ignore:The model .* is deprecated:DeprecationWarning")
USERS = ("carol", "dave")
KINDS = ("answer", "arguments", "span_log", "resource_log", "point_metric", "resource_metric", "explanation")


def canary(user: str, kind: str) -> str:
    # unique, long and without repeats: stored as written, never shortened by DuckDB's string compression
    return f"CANARY-{user}-{kind}-{os.urandom(12).hex()}"


def _judge(canaries: dict[str, dict[str, str]], holds: dict[str, threading.Event] | None = None) -> FakeMessagesAPI:
    """A judge whose explanation carries the canary of the user whose answer it is asked about; the answer
    about a user in ``holds`` waits for their event."""

    def route(body: dict) -> object:
        prompt = json.dumps(body)
        user = next(u for u in canaries if canaries[u]["answer"] in prompt)
        reply = verdict_reply({"status": "complete", "score": 1.0, "explanation": canaries[user]["explanation"],
                               "missing_requirements": [], "unsupported_claims": [],
                               "criteria": [{"criterion": c, "status": "satisfied", "evidence": "the answer"}
                                            for c in FX["completion_criteria"]]})
        reply.hold = (holds or {}).get(user)
        return reply

    return FakeMessagesAPI(route=route)


def _config(data: Path, api: FakeMessagesAPI) -> Path:
    suite = data.parent / "cases.yaml"
    suite.write_text(yaml.safe_dump({"cases": [{**FX, "judge_always": True}]}))  # judged whatever its stages
    cfg = data.parent / "agentfunnel.yaml"
    cfg.write_text(yaml.safe_dump({
        "cases": {"suite": str(suite), "archive_dir": str(data / "archive")},
        "judge": {"api_key": "test-key", "base_url": api.url, "max_retries": 0, "requests_per_minute": 60_000},
        "sessions": {"idle_timeout_seconds": 0.5, "check_interval_seconds": 0.1, "open_refresh_seconds": 0},
        "store": {"snapshot_path": str(data / "periodic.duckdb"), "snapshot_interval_seconds": 0.5}}))
    return cfg


def _post(srv: ServerProcess, path: str, body: bytes, ctype: str = "application/json") -> None:
    req = urllib.request.Request(srv.http_url + path, data=body, headers={"Content-Type": ctype})
    assert urllib.request.urlopen(req, timeout=30).status == 200


def _attrs(values: dict[str, str]) -> list[dict]:
    return [{"key": k, "value": {"stringValue": v}} for k, v in values.items()]


def _send(srv: ServerProcess, user: str, c: dict[str, str]) -> None:
    """One case run of ``user``'s (spans), its log records and metric points, every one with a canary."""
    tid, root, now = os.urandom(16), os.urandom(8), time.time_ns()
    answer = f"On 2026-01-15, 1 EUR equals 1.10 USD. {c['answer']}"
    spans = [
        {"trace_id": tid, "span_id": root, "name": "invoke_agent fx", "start": now, "end": now + 10**9,
         "attributes": {"gen_ai.operation.name": "invoke_agent", "gen_ai.agent.name": "fx-agent",
                        "gen_ai.conversation.id": f"conv-{user}", "user.id": user,
                        "gen_ai.output.messages": json.dumps([{"role": "assistant", "parts": [
                            {"type": "text", "content": answer}]}])}},
        {"trace_id": tid, "span_id": os.urandom(8), "parent_span_id": root, "name": "execute_tool get_rate",
         "start": now + 30, "end": now + 40,
         "attributes": {"gen_ai.operation.name": "execute_tool", "gen_ai.tool.name": "mcp__fxrates__get_rate",
                        "gen_ai.tool.call.arguments": json.dumps({"base": "EUR", "quote": "USD", "date": "2026-01-15",
                                                                  "note": c["arguments"]}),
                        "gen_ai.tool.call.result": json.dumps(RESULT)}},
    ]
    case = {"agentfunnel.case.id": "fx-rate", "agentfunnel.experiment": "deletion", "agentfunnel.run.id": user}
    _post(srv, "/v1/traces", trace_request(spans, resource={"service.name": "fx-agent", **case}).SerializeToString(),
          "application/x-protobuf")
    tied = {"timeUnixNano": str(now), "traceId": tid.hex(), "spanId": root.hex(),
            "body": {"stringValue": c["span_log"]}}
    untied = {"timeUnixNano": str(now), "body": {"stringValue": c["resource_log"]}}  # only its resource names the user
    _post(srv, "/v1/logs", json.dumps({"resourceLogs": [
        {"scopeLogs": [{"logRecords": [tied]}]},
        {"resource": {"attributes": _attrs({"service.name": "fx-agent", "user.id": user})},
         "scopeLogs": [{"logRecords": [untied]}]}]}).encode())

    def gauge(attributes: dict[str, str]) -> dict:
        return {"name": "agent.turns", "gauge": {"dataPoints": [
            {"asInt": "1", "timeUnixNano": str(now), "attributes": _attrs(attributes)}]}}

    _post(srv, "/v1/metrics", json.dumps({"resourceMetrics": [
        {"scopeMetrics": [{"metrics": [gauge({"user.id": user, "note": c["point_metric"]})]}]},
        {"resource": {"attributes": _attrs({"user.id": user})},
         "scopeMetrics": [{"metrics": [gauge({"note": c["resource_metric"]})]}]}]}).encode())


def _raw_files(data: Path) -> dict[str, bytes]:
    """Every file under the data directory, as bytes. The running server makes and removes files of its own (a
    periodic copy's partial file): one gone between listing and reading holds nothing anymore."""
    files = {}
    for p in sorted(data.rglob("*")):
        try:
            if p.is_file():
                files[str(p.relative_to(data))] = p.read_bytes()
        except FileNotFoundError:
            continue
    return files


def _found(files: dict[str, bytes], strings: list[str]) -> dict[str, list[str]]:
    return {s: [name for name, raw in files.items() if s.encode() in raw] for s in strings}


def _queryable(run_sql, c: dict[str, str]) -> dict[str, int]:
    """How many rows of each table hold each of a user's canaries, read by SQL."""
    like = {k: f"'%{v}%'" for k, v in c.items()}
    return {
        "answer": run_sql(f"SELECT count(*) AS n FROM spans WHERE attributes::VARCHAR LIKE {like['answer']}"),
        "arguments": run_sql(f"SELECT count(*) AS n FROM tool_calls WHERE arguments::VARCHAR LIKE {like['arguments']}"),
        "span_log": run_sql(f"SELECT count(*) AS n FROM logs WHERE body::VARCHAR LIKE {like['span_log']}"),
        "resource_log": run_sql(f"SELECT count(*) AS n FROM logs WHERE body::VARCHAR LIKE {like['resource_log']}"),
        "point_metric": run_sql(f"SELECT count(*) AS n FROM metrics WHERE attributes::VARCHAR LIKE {like['point_metric']}"),
        "resource_metric": run_sql(f"SELECT count(*) AS n FROM metrics WHERE attributes::VARCHAR "
                                   f"LIKE {like['resource_metric']}"),
        "explanation": run_sql(f"SELECT count(*) AS n FROM judgments WHERE explanation LIKE {like['explanation']}"),
    }


@pytest.fixture
def populated(tmp_path):
    """A server's data directory holding both users' case runs, judged and archived; yields (server, canaries, cfg)."""
    data = tmp_path / "data"
    data.mkdir()
    canaries = {u: {k: canary(u, k) for k in KINDS} for u in USERS}
    api = _judge(canaries)
    cfg = _config(data, api)
    srv = ServerProcess(data / "af.duckdb", ["--config", str(cfg)]).start()
    try:
        for user in USERS:
            _send(srv, user, canaries[user])
        srv.admin_post("/flush")
        deadline = time.monotonic() + 30
        while len(srv.admin_post("/sql", {"query": "SELECT 1 FROM judgments j JOIN case_runs r USING (session_id)"})
                  ["rows"]) < 2 or len(list((data / "archive").glob("*.json"))) < 2:
            assert time.monotonic() < deadline, "the case runs were not judged and archived"
            time.sleep(0.2)
        # the archive of a run is written again once it is judged: wait for both to carry the explanation
        while sum(canaries[u]["explanation"] in p.read_text() for u in USERS
                  for p in (data / "archive").glob("*.json")) < 2:
            assert time.monotonic() < deadline, "the archives do not hold the judgments"
            time.sleep(0.2)
        # the server's own copy (store.snapshot_path) holds them too
        while not (data / "periodic.duckdb").exists() or canaries["carol"]["explanation"].encode() not in (
                data / "periodic.duckdb").read_bytes():
            assert time.monotonic() < deadline, "the periodic snapshot does not hold the judgments"
            time.sleep(0.2)
        yield srv, canaries, cfg
    finally:
        srv.stop()
        api.close()


def _assert_only_dave_left(data: Path, canaries: dict[str, dict[str, str]], run_sql) -> None:
    files = _raw_files(data)
    assert {n for n in files if not n.endswith(".log")} >= {"af.duckdb"}
    left = {s: where for s, where in _found(files, list(canaries["carol"].values())).items() if where}
    assert left == {}, f"carol's values still in the files: {left}"
    assert _queryable(run_sql, canaries["carol"]) == dict.fromkeys(KINDS, 0)
    assert _queryable(run_sql, canaries["dave"]) == dict.fromkeys(KINDS, 1)
    archives = {p.name: p.read_text() for p in (data / "archive").glob("*.json")}
    assert sum(canaries["dave"]["explanation"] in text for text in archives.values()) == 1


def test_delete_on_the_file_leaves_none_of_the_users_bytes_in_any_file(populated):
    srv, canaries, cfg = populated
    data = srv.db.parent
    srv.stop()
    # stopped cleanly: everything is checkpointed into the file, as it was when the deletion was found wanting
    assert all("af.duckdb" in where for where in _found(_raw_files(data), list(canaries["carol"].values())).values())
    out = run_cli("delete", "--db", str(srv.db), "--config", str(cfg), "--user", "carol").stdout
    _assert_only_dave_left(data, canaries, lambda q: read_db(srv.db, q)[0]["n"])
    assert f"in {srv.db}" in out and "removed 1 case-run archive file(s)" in out and "rewrote the database file" in out
    assert "wrote the periodic snapshot" in out
    assert read_db(data / "periodic.duckdb", "SELECT count(*) AS n FROM sessions")[0]["n"] == 1


def test_delete_through_the_running_server_leaves_none_of_the_users_bytes_in_any_file(populated):
    srv, canaries, cfg = populated
    data = srv.db.parent
    out = run_cli("delete", "--db", str(srv.db), "--config", str(cfg), "--user", "carol").stdout
    read = lambda q: srv.admin_post("/sql", {"query": q})["rows"][0][0]  # noqa: E731
    _assert_only_dave_left(data, canaries, read)
    # read while the server keeps the file open and writes on: a new session goes in and is read back
    canaries["erin"] = {k: canary("erin", k) for k in KINDS}
    _send(srv, "erin", canaries["erin"])
    srv.admin_post("/flush")
    _assert_only_dave_left(data, canaries, read)
    deadline = time.monotonic() + 30
    while srv.admin_post("/sql", {"query": "SELECT session_id FROM sessions ORDER BY 1"})["rows"] != [
            ["conv-dave"], ["conv-erin"]]:
        assert time.monotonic() < deadline, "the session sent after the deletion was not stored"
        time.sleep(0.2)
    assert srv.db.stat().st_mode & 0o077 == 0  # the rewritten file is its owner's only, as the one it replaced
    assert "in the running server" in out and "removed 1 case-run archive file(s)" in out
    assert "rewrote the database file" in out and "wrote the periodic snapshot" in out


def test_a_judgment_that_answers_after_the_deletion_is_not_stored(tmp_path):
    """Carol's judge is still thinking when she is deleted: its verdict, when it comes, is dropped."""
    data = tmp_path / "data"
    data.mkdir()
    canaries = {u: {k: canary(u, k) for k in KINDS} for u in USERS}
    hold = threading.Event()
    api = _judge(canaries, {"carol": hold})
    cfg = _config(data, api)
    srv = ServerProcess(data / "af.duckdb", ["--config", str(cfg)]).start()
    try:
        for user in USERS:
            _send(srv, user, canaries[user])
        deadline = time.monotonic() + 30
        while api.in_flight < 1 or not srv.admin_post("/sql", {"query": "SELECT 1 FROM judgments"})["rows"]:
            assert time.monotonic() < deadline, "dave was not judged, or carol's judge not asked"
            time.sleep(0.2)
        run_cli("delete", "--db", str(srv.db), "--config", str(cfg), "--user", "carol")
        hold.set()
        while api.in_flight:
            assert time.monotonic() < deadline, "carol's judge did not answer"
            time.sleep(0.1)
        time.sleep(1.0)  # the verdict travels to the writer
        srv.admin_post("/flush")
        read = lambda q: srv.admin_post("/sql", {"query": q})["rows"][0][0]  # noqa: E731
        assert _queryable(read, canaries["carol"]) == dict.fromkeys(KINDS, 0)
        assert _queryable(read, canaries["dave"]) == dict.fromkeys(KINDS, 1)
        assert srv.admin_post("/sql", {"query": "SELECT session_id FROM sessions"})["rows"] == [["conv-dave"]]
    finally:
        hold.set()
        srv.stop()
        api.close()
    left = {s: where for s, where in _found(_raw_files(data), list(canaries["carol"].values())).items() if where}
    assert left == {}, f"carol's values in the files: {left}"


def _batch(n: int = 20):
    from agentfunnel.collector.decode import decode_traces_protobuf

    tid = os.urandom(16)
    return decode_traces_protobuf(trace_request([{"trace_id": tid, "span_id": os.urandom(8), "name": f"s{i}"}
                                                 for i in range(n)]).SerializeToString())


def test_a_rewrite_loses_no_acknowledged_span_and_readers_never_see_a_closed_connection(tmp_path):
    """In process: batches keep arriving and readers keep reading while the file is rewritten three times."""
    from agentfunnel.collector.config import StoreSettings
    from agentfunnel.collector.store.writer import Store
    from agentfunnel.collector.telemetry import Metrics

    metrics = Metrics()
    store = Store(StoreSettings(path=tmp_path / "r.duckdb", rewrite_reader_wait_seconds=0.3), metrics).open()
    stop, acked, read_errors, reads = threading.Event(), [], [], [0]

    def ingest() -> None:
        while not stop.is_set():
            acked.append(store.submit(_batch()).result().written)
            time.sleep(0.005)

    def read() -> None:
        while not stop.is_set():
            cur = store.reader()
            try:
                cur.execute("SELECT count(*) FROM spans").fetchall()
                reads[0] += 1
            except Exception as exc:  # noqa: BLE001 - what the test counts
                read_errors.append(exc)
            finally:
                cur.close()
            time.sleep(0.005)

    threads = [threading.Thread(target=ingest), threading.Thread(target=read), threading.Thread(target=read)]
    for t in threads:
        t.start()
    try:
        for _ in range(3):
            time.sleep(0.2)
            assert store.rewrite().result()["seconds"] >= 0
        time.sleep(0.2)
    finally:
        stop.set()
        for t in threads:
            t.join(30)
    assert read_errors == [] and reads[0] > 0 and len(acked) > 3
    cur = store.reader()
    assert cur.execute("SELECT count(*) FROM spans").fetchall()[0][0] == sum(acked)
    cur.close()
    # a reader kept open past rewrite_reader_wait_seconds is interrupted and closed; the rewrite goes on
    held = store.reader()
    assert store.rewrite().result(timeout=30)["bytes_after"] > 0
    with pytest.raises(Exception, match="Connection already closed"):
        held.execute("SELECT 1")
    assert metrics.snapshot()["rewrite_readers_interrupted"] == 1 and metrics.snapshot()["file_rewrites"] == 4
    store.submit(_batch(7)).result()  # written after the last rewrite: into the file now in place, not the old one
    store.close()
    assert not (tmp_path / "r.duckdb.wal").exists()  # and no copy left beside it (the log's length record stays)
    assert [p.name for p in tmp_path.iterdir() if not p.name.endswith(".walmark")] == ["r.duckdb"]
    assert read_db(tmp_path / "r.duckdb", "SELECT count(*) AS n FROM spans")[0]["n"] == sum(acked) + 7


def test_a_deletion_interrupted_before_its_rewrite_is_rewritten_at_the_next_open(tmp_path):
    """The marker left by a rewrite that did not finish makes the next open rewrite the file first."""
    from agentfunnel.collector.config import StoreSettings
    from agentfunnel.collector.store.writer import Store
    from agentfunnel.collector.telemetry import Metrics

    secret = canary("carol", "answer")
    settings = StoreSettings(path=tmp_path / "m.duckdb")
    store = Store(settings, Metrics()).open()
    store.submit(_batch()).result()
    tid = os.urandom(16)
    store.submit(decode_traces_protobuf_of([{"trace_id": tid, "name": secret}])).result()
    store.submit_job(lambda con: con.execute("DELETE FROM spans WHERE name = ?", [secret])).result()
    (tmp_path / ".m.duckdb.needs-rewrite").touch()  # as ``rewrite`` leaves it until the new file is in place
    store.close()
    for copy in (".m.duckdb.rewrite", "..m.duckdb.rewrite.99.partial"):  # a copy the stopped rewrite was writing
        (tmp_path / copy).write_bytes(b"a copy " + secret.encode())
    assert secret.encode() in (tmp_path / "m.duckdb").read_bytes()
    metrics = Metrics()
    store = Store(settings, metrics).open()
    try:
        assert metrics.snapshot()["file_rewrites"] == 1
        assert secret.encode() not in (tmp_path / "m.duckdb").read_bytes()
        assert sorted(p.name for p in tmp_path.iterdir() if not p.name.endswith(".walmark")) == ["m.duckdb"]
        cur = store.reader()
        assert cur.execute("SELECT count(*) FROM spans").fetchall()[0][0] == 20
        cur.close()
    finally:
        store.close()


def decode_traces_protobuf_of(spans: list[dict]):
    from agentfunnel.collector.decode import decode_traces_protobuf

    return decode_traces_protobuf(trace_request(spans).SerializeToString())


def test_delete_rows_takes_the_log_records_and_metric_points_that_name_the_user_or_a_session(tmp_path):
    """In process, on a migrated file: what names a user only in a resource, or on a metric point, goes too."""
    import duckdb

    from agentfunnel.collector.retention import delete_rows
    from agentfunnel.collector.store.schema import migrate

    con = duckdb.connect(str(tmp_path / "d.duckdb"))
    migrate(con)
    logs = [("r1", None, "{}", '{"user.id": "carol"}'), ("r2", None, '{"enduser.id": "carol"}', "{}"),
            ("r3", None, '{"gen_ai.conversation.id": "conv-carol"}', "{}"), ("r4", None, "{}", '{"user.id": "dave"}'),
            ("r5", None, '{"note": "carol"}', "{}")]
    con.executemany("INSERT INTO logs (record_id, trace_id, attributes, resource_attributes) VALUES (?, ?, ?, ?)", logs)
    points = [("p1", '{"user.id": "carol"}', "{}"), ("p2", "{}", '{"user.id": "carol"}'),
              ("p3", '{"gen_ai.conversation.id": "conv-carol"}', "{}"), ("p4", '{"user.id": "dave"}', "{}"),
              ("p5", "{}", "{}")]
    con.executemany("INSERT INTO metrics (point_id, attributes, resource_attributes) VALUES (?, ?, ?)", points)
    con.execute("INSERT INTO session_rows (session_id, user_id) VALUES ('conv-carol', 'carol'), ('conv-dave', 'dave')")
    con.execute("INSERT INTO judge_labels (session_id, note) VALUES ('conv-carol', 'x'), ('conv-dave', 'y')")
    done = delete_rows(con, ["carol"], [])
    assert done.sessions == ["conv-carol"]
    assert [r[0] for r in con.execute("SELECT record_id FROM logs ORDER BY 1").fetchall()] == ["r4", "r5"]
    assert [r[0] for r in con.execute("SELECT point_id FROM metrics ORDER BY 1").fetchall()] == ["p4", "p5"]
    assert con.execute("SELECT session_id FROM judge_labels").fetchall() == [("conv-dave",)]
    assert done.removed["logs"] == 3 and done.removed["metrics"] == 3
    con.close()
