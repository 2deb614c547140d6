"""``agentfunnel sql`` and ``agentfunnel ingest`` as a user runs them, with and without a server."""

from __future__ import annotations

import gzip
import json
import os

from opentelemetry.proto.collector.logs.v1.logs_service_pb2 import ExportLogsServiceRequest

from conftest import run_cli, sql
from otlp_build import kvs, to_otlp_json, to_otlp_json_bytes, trace_request


def _logs_request(trace_id: bytes, span_id: bytes) -> ExportLogsServiceRequest:
    req = ExportLogsServiceRequest()
    rl = req.resource_logs.add()
    rl.resource.attributes.extend(kvs({"service.name": "file-svc"}))
    rec = rl.scope_logs.add().log_records.add(trace_id=trace_id, span_id=span_id, event_name="gen_ai.choice",
                                              time_unix_nano=1_700_000_000_000_000_000, severity_number=9)
    rec.body.string_value = "the answer"
    return req


def test_sql_reads_while_the_server_writes_and_refuses_writes(server):
    req = trace_request([{"name": f"s{i}"} for i in range(5)])
    run_cli("ingest", "--db", str(server.db), _write(server.db.parent / "five.binpb", req.SerializeToString()))
    assert sql(server.db, "select count(*) as n from spans")[0]["n"] == 5
    csv_out = run_cli("sql", "--db", str(server.db), "--format", "csv", "select name from spans order by name").stdout
    assert csv_out.splitlines() == ["name", "s0", "s1", "s2", "s3", "s4"]
    table = run_cli("sql", "--db", str(server.db), "select count(*) as n from spans").stdout
    assert "5" in table and "n" in table
    bad = run_cli("sql", "--db", str(server.db), "delete from spans", check=False)
    assert bad.returncode == 1 and "only read-only queries" in bad.stderr and "DELETE" in bad.stderr
    bad = run_cli("sql", "--db", str(server.db), "select nope from spans", check=False)
    assert bad.returncode == 1 and "nope" in bad.stderr
    assert sql(server.db, "select count(*) as n from spans")[0]["n"] == 5


def _write(path, data: bytes) -> str:
    path.write_bytes(data)
    return str(path)


def test_ingest_every_file_format_gives_what_live_ingest_gives(tmp_path):
    db = tmp_path / "files.duckdb"
    tid, sid = os.urandom(16), os.urandom(8)
    req = trace_request([{"trace_id": tid, "span_id": sid, "name": "p", "attributes": {"n": {"deep": [1, 2]}}}])
    req_json = trace_request([{"name": "j"}])
    lines = [trace_request([{"name": f"line{i}"}]) for i in range(3)]
    logs = _logs_request(tid, sid)
    files = [
        _write(tmp_path / "a.binpb", req.SerializeToString()),
        _write(tmp_path / "b.json", to_otlp_json_bytes(req_json)),
        _write(tmp_path / "c.jsonl", b"\n".join(json.dumps(to_otlp_json(r)).encode() for r in lines)
               + b"\n" + json.dumps(to_otlp_json(logs)).encode() + b"\n"),
        _write(tmp_path / "d.proto", b"".join(len(b).to_bytes(4, "big") + b for b in
                                              (trace_request([{"name": "lp1"}]).SerializeToString(),
                                               trace_request([{"name": "lp2"}]).SerializeToString()))),
        _write(tmp_path / "e.logs.binpb.gz", gzip.compress(logs.SerializeToString())),
    ]
    out = run_cli("ingest", "--db", str(db), *files)
    assert "7 spans, 1 log records (1 already stored" in out.stdout
    names = sorted(r["name"] for r in sql(db, "select name from spans"))
    assert names == ["j", "line0", "line1", "line2", "lp1", "lp2", "p"]
    row = sql(db, f"select attributes from spans where span_id = '{sid.hex()}'")[0]
    assert json.loads(row["attributes"]) == {"n": {"deep": [1, 2]}}
    log = sql(db, "select * from logs")
    assert len(log) == 1 and log[0]["span_id"] == sid.hex() and json.loads(log[0]["body"]) == "the answer"
    assert log[0]["severity"] == "INFO"
    # replaying the same files again stores nothing new
    again = run_cli("ingest", "--db", str(db), *files)
    assert "0 spans, 0 log records (9 already stored" in again.stdout


def test_ingest_names_the_bad_file_and_line_and_keeps_the_good_ones(tmp_path):
    db = tmp_path / "bad.duckdb"
    good = _write(tmp_path / "good.binpb", trace_request([{"name": "good"}]).SerializeToString())
    bad_lines = _write(tmp_path / "bad.jsonl", to_otlp_json_bytes(trace_request([{"name": "l1"}])) + b"\n{oops\n")
    bad_pb = _write(tmp_path / "bad.binpb", b"\x0a\xff\xff")
    out = run_cli("ingest", "--db", str(db), good, bad_lines, bad_pb, check=False)
    assert out.returncode == 1
    assert f"{bad_lines}:2: not valid JSON" in out.stderr
    assert f"{bad_pb}: body (3 bytes) is not a valid OTLP ExportTraceServiceRequest" in out.stderr
    assert sorted(r["name"] for r in sql(db, "select name from spans")) == ["good", "l1"]


def test_config_errors_name_the_field(tmp_path):
    cfg = tmp_path / "bad.toml"
    cfg.write_text("[receivers]\nhttp_prot = 4318\nmax_request_bytes = -1\n")
    out = run_cli("serve", "--config", str(cfg), "--db", str(tmp_path / "x.duckdb"), check=False)
    assert out.returncode == 2
    assert "receivers.http_prot: unknown field" in out.stderr
    assert "receivers.max_request_bytes: Input should be greater than 0" in out.stderr
    ycfg = tmp_path / "bad.yaml"
    ycfg.write_text("receivers: [1, 2\n")
    out = run_cli("serve", "--config", str(ycfg), check=False)
    assert out.returncode == 2 and "is not valid YAML" in out.stderr
