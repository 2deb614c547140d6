"""Privacy end to end (SPEC §10): what real SDK exporters send is redacted before it is stored, judged or forwarded,
and with content capture off the demo's funnels and outcomes that need no content do not change.

Two real processes: an upstream agentfunnel with every detector on, a hashed ``user.id``, a case suite
judged by the real anthropic client against a local Messages API, forwarding to a downstream
agentfunnel. The oracle is every table of both databases and every request the judge received.
"""

from __future__ import annotations

import base64
import json
import subprocess
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import yaml
from opentelemetry.exporter.otlp.proto.grpc._log_exporter import OTLPLogExporter
from opentelemetry.proto.collector.logs.v1.logs_service_pb2 import ExportLogsServiceRequest
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import ExportMetricsServiceRequest
from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk._logs import LoggerProvider
from opentelemetry.sdk._logs.export import SimpleLogRecordProcessor
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.trace import SpanKind

from agentfunnel.collector.privacy import DETECTORS
from conftest import agentfunnel_cmd, read_db, run_cli
from otlp_build import trace_request
from test_forward import _count, _free_port, _metrics, _wait
from test_judge import FakeMessagesAPI, verdict_reply
from test_stages import ARGS, FX, RESULT

EMAIL = "jane.doe@example.com"
CARD = "4111 1111 1111 1111"
API_KEY = "sk-ant-api03-" + "Qx7" * 12
USER = "user-jane-42"
TOKEN = "opaque0token1for2jane3"
SECRETS = (EMAIL, CARD, CARD.replace(" ", ""), API_KEY, USER, TOKEN)
ALL_MET = {"status": "complete", "score": 1.0, "explanation": "Rate, direction and date match.",
           "missing_requirements": [], "unsupported_claims": [],
           "criteria": [{"criterion": c, "status": "satisfied", "evidence": "..."} for c in FX["completion_criteria"]]}


def _agent(grpc: str) -> None:
    """A case run and a production session of one user, through the SDK's span and log exporters."""
    resource = Resource.create({"service.name": "fx-agent", "service.version": "3.1.0"})
    tracer_provider = TracerProvider(resource=resource)
    tracer_provider.add_span_processor(SimpleSpanProcessor(OTLPSpanExporter(endpoint=grpc, insecure=True)))
    logger_provider = LoggerProvider(resource=resource)
    logger_provider.add_log_record_processor(SimpleLogRecordProcessor(OTLPLogExporter(endpoint=grpc, insecure=True)))
    tracer, logger = tracer_provider.get_tracer("fx.agent"), logger_provider.get_logger("fx.agent")
    answer = (f"On 2026-01-15, 1 EUR equals 1.10 USD. I sent it to {EMAIL}, charged card {CARD} and used "
              f"the key {API_KEY}.")
    runs = [("fx-1", {"agentfunnel.case.id": "fx-rate", "agentfunnel.experiment": "privacy", "agentfunnel.run.id": "1"}),
            ("prod-1", {})]
    for conversation, tags in runs:
        with tracer.start_as_current_span("invoke_agent fx", attributes={
                "gen_ai.operation.name": "invoke_agent", "gen_ai.agent.name": "fx-agent",
                "gen_ai.conversation.id": conversation, "user.id": USER, **tags,
                "gen_ai.output.messages": json.dumps([{"role": "assistant", "parts": [
                    {"type": "text", "content": answer}]}])}):
            with tracer.start_as_current_span("chat claude", kind=SpanKind.CLIENT, attributes={
                    "gen_ai.operation.name": "chat", "gen_ai.request.model": "claude-sonnet-4-5",
                    "gen_ai.response.finish_reasons": ["tool_call"],
                    "gen_ai.input.messages": json.dumps([{"role": "user", "parts": [
                        {"type": "text", "content": f"I am {EMAIL}, card {CARD}"}]}])}):
                logger.emit(body=f"user {EMAIL} asked with card {CARD}", event_name="app.request",
                            attributes={"user.id": USER, "authorization": f"Bearer {TOKEN}"})
            with tracer.start_as_current_span("execute_tool get_rate", attributes={
                    "gen_ai.operation.name": "execute_tool", "gen_ai.tool.name": "mcp__fxrates__get_rate",
                    "gen_ai.tool.call.arguments": json.dumps(ARGS),
                    "gen_ai.tool.call.result": json.dumps({**RESULT, "billed_to": EMAIL, "token": API_KEY})}):
                pass
            with tracer.start_as_current_span("chat claude", kind=SpanKind.CLIENT, attributes={
                    "gen_ai.operation.name": "chat", "gen_ai.request.model": "claude-sonnet-4-5",
                    "gen_ai.response.finish_reasons": ["stop"]}):
                pass
    tracer_provider.shutdown()
    logger_provider.shutdown()


def _every_row(srv) -> dict[str, str]:
    """Each table of the server's database, every row, as one JSON text."""
    tables = srv.admin_post("/sql", {"query": "SELECT table_name FROM information_schema.tables WHERE table_schema = "
                                              "'main' AND table_catalog = current_database()"})  # views too
    return {t: json.dumps(srv.admin_post("/sql", {"query": f'SELECT * FROM "{t}"'})["rows"], ensure_ascii=False)
            for (t,) in tables["rows"]}


def _leaks(text: str) -> list[str]:
    return [s for s in SECRETS if s in text]


def test_redacted_before_it_is_stored_judged_or_forwarded(server_factory, tmp_path):
    api = FakeMessagesAPI()
    try:
        api.push(verdict_reply(ALL_MET))
        suite = tmp_path / "cases.yaml"
        suite.write_text(yaml.safe_dump({"cases": [FX]}))
        port = _free_port()
        config = _write(tmp_path / "up.yaml", {
            "privacy": {"detectors": sorted(DETECTORS), "hash_keys": ["user.id"]},
            "cases": {"suite": str(suite)},
            "judge": {"api_key": "test-key", "base_url": api.url, "max_retries": 0, "requests_per_minute": 60_000},
            "forward": {"endpoint": f"127.0.0.1:{port}", "insecure": True, "mode": "immediate", "max_retry_seconds": 30},
        })
        with ThreadPoolExecutor(2) as pool:  # side by side: the upstream retries until the downstream listens
            started = [pool.submit(server_factory, ["--config", str(_write(tmp_path / "down.yaml", {})),
                                                    "--grpc-port", str(port)], tmp_path / "down.duckdb"),
                       pool.submit(server_factory, ["--config", str(config)], tmp_path / "up.duckdb",
                                   {"AGENTFUNNEL_HASH_KEY": "test-hash-key"})]
            down, up = (f.result() for f in started)
        _agent(up.grpc)
        settled = ("SELECT (SELECT count(*) FROM judgments WHERE status = 'complete') = 1 AND "
                   "(SELECT count(*) FROM sessions WHERE status = 'closed') = 2")
        _wait(lambda: up.admin_post("/sql", {"query": settled})["rows"][0][0]
              and _count(_metrics(up), "forward_sent_spans") >= 8, 60, "sessions judged and forwarded")
        _wait(lambda: _count(_metrics(down), "spans_committed") >= 8, 30, "the downstream stored the spans")

        upstream, downstream = _every_row(up), _every_row(down)
        assert {t: _leaks(rows) for t, rows in upstream.items() if _leaks(rows)} == {}
        assert {t: _leaks(rows) for t, rows in downstream.items() if _leaks(rows)} == {}
        assert "[redacted:email]" in upstream["tool_calls"] and "[redacted:bearer_token]" in upstream["logs"]
        assert "[redacted:payment_card]" in upstream["sessions"]  # the final answer
        judged = json.dumps([r["body"] for r in api.requests], ensure_ascii=False)
        assert len(api.requests) == 1 and _leaks(judged) == []
        assert "[redacted:email]" in judged and "1.10" in judged  # it saw the answer and the data, redacted

        # the hashed user id still groups the user's sessions, and `delete --user` finds them by the raw id
        users = up.admin_post("/sql", {"query": "SELECT session_id, user_id FROM sessions ORDER BY 1"})["rows"]
        assert [s for s, _ in users] == ["fx-1", "prod-1"] and len({u for _, u in users}) == 1
        assert users[0][1] != USER and len(users[0][1]) == 16
        redactions = _metrics(up)["redactions"]
        assert {"email", "payment_card", "api_key", "bearer_token", "hash_key"} <= set(redactions), redactions
        out = run_cli("delete", "--db", str(up.db), "--user", USER).stdout
        assert "deleted" in out and "2 session(s)" in out
        tables = ("spans", "logs", "tool_calls", "trace_index", "sessions", "case_runs", "judgments")
        left = up.admin_post("/sql", {"query": "SELECT " + ", ".join(f"(SELECT count(*) FROM {t})" for t in tables)})
        assert dict(zip(tables, left["rows"][0])) == dict.fromkeys(tables, 0)
    finally:
        api.close()


def _write(path: Path, doc: dict) -> Path:
    base = {"sessions": {"idle_timeout_seconds": 0.5, "check_interval_seconds": 0.2, "open_refresh_seconds": 0}}
    path.write_text(yaml.safe_dump({**base, **doc}))
    return path


# ---------------------------------------------------------------------------- content capture off

# Session facts that need no content: the structure of the trace (spans, calls, steps, status, tokens).
STRUCTURE = ("variant", "status", "trace_count", "span_count", "llm_calls", "tool_call_count", "tool_errors",
             "input_tokens", "output_tokens", "hit_cap", "agent_name", "model")
# The rungs a tool result's or an answer's content proves (a purchase confirmation, a checkout link, an answer).
NEEDS_CONTENT = {"purchase_completed", "info_provided"}


def test_content_capture_off_keeps_what_needs_no_content(tmp_path):
    dbs, demos = {}, []
    for name, privacy in (("on", {}), ("off", {"capture_content": False})):  # the two demos side by side
        dbs[name] = tmp_path / f"demo-{name}.duckdb"
        config = _write(tmp_path / f"{name}.yaml", {"privacy": privacy} if privacy else {})
        demos.append(subprocess.Popen([*agentfunnel_cmd(), "demo", "--db", str(dbs[name]), "--sessions", "12",
                                       "--config", str(config)], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE))
    for demo in demos:
        _, err = demo.communicate(timeout=300)
        assert demo.returncode == 0, err.decode()
    rows = {name: {r["session_id"]: r for r in read_db(db, "SELECT * FROM sessions")} for name, db in dbs.items()}
    on, off = rows["on"], rows["off"]
    assert set(on) == set(off) and len(on) >= 50
    for sid, s in on.items():
        assert {k: off[sid][k] for k in STRUCTURE} == {k: s[k] for k in STRUCTURE}, sid
        needs_content = s["outcome"] in NEEDS_CONTENT or (s["outcome"] == "checkout_reached"
                                                          and "checkout" not in s["steps"])
        if not needs_content:
            assert off[sid]["outcome"] == s["outcome"], sid
        assert off[sid]["final_answer"] is None
        # lodging's purchase step is proved by the confirmation in its result; every other step by the call alone
        assert off[sid]["steps"] == [st for st in s["steps"] if not (s["variant"] == "lodging" and st == "purchase")]
    funnel = {name: {(r["variant"], r["step"]): r["sessions"] for r in read_db(db, "SELECT * FROM funnel_conversion")}
              for name, db in dbs.items()}
    assert {k: v for k, v in funnel["off"].items() if k != ("lodging", "purchase")} == {
        k: v for k, v in funnel["on"].items() if k != ("lodging", "purchase")}
    # what does need content says so: arguments and results not captured are missing, never failed
    stages = read_db(dbs["off"], "SELECT invocation, invocation_evidence->>'$.reason' AS why FROM case_runs WHERE fit")
    states = {(r["invocation"], r["why"]) for r in stages}
    assert ("missing", "arguments not captured") in states  # after an earlier exit: not_observed, never failed
    assert states <= {("missing", "arguments not captured"), ("not_observed", None)}
    spans = read_db(dbs["off"], "SELECT count(*) AS n FROM spans WHERE attributes::VARCHAR LIKE '%tool.call.arguments%' "
                                "OR attributes::VARCHAR LIKE '%tool.call.result%'")
    assert spans[0]["n"] == 0


# ---------------------------------------------------------------------------- what values decode to

ESCAPED_KEY = "sk-ant-api03-" + "Zr4" * 12
HIDDEN = ("bob@example.com", "bob\\u0040example.com", ESCAPED_KEY, ESCAPED_KEY[1:], "4111111111111111",
          base64.b64encode(f"key {ESCAPED_KEY}".encode()).decode(), base64.b64encode(ESCAPED_KEY.encode()).decode())


def _hidden(text: str) -> list[str]:
    return [s for s in HIDDEN if s in text]


def test_escaped_numeric_and_bytes_secrets_are_redacted_in_stored_forwarded_and_exported_rows(server_factory,
                                                                                             tmp_path):
    """JSON escapes, integer card numbers, bytes values and metric descriptions, sent over real OTLP/HTTP: no
    form of the secret reaches the tables, the downstream the spans are forwarded to, or the Parquet export."""
    port = _free_port()
    config = _write(tmp_path / "up.yaml", {
        "privacy": {"detectors": sorted(DETECTORS)},
        "forward": {"endpoint": f"127.0.0.1:{port}", "insecure": True, "mode": "immediate", "max_retry_seconds": 30}})
    with ThreadPoolExecutor(2) as pool:
        started = [pool.submit(server_factory, ["--config", str(_write(tmp_path / "down.yaml", {})),
                                                "--grpc-port", str(port)], tmp_path / "down.duckdb"),
                   pool.submit(server_factory, ["--config", str(config)], tmp_path / "up.duckdb")]
        down, up = (f.result() for f in started)
    spans = [{"name": "execute_tool send", "attributes": {
        "gen_ai.operation.name": "execute_tool", "gen_ai.tool.name": "send", "gen_ai.conversation.id": "esc-1",
        "gen_ai.tool.call.arguments": '{"to": "bob\\u0040example.com", "card": 4111111111111111}',
        "gen_ai.tool.call.result": '{"key": "\\u0073' + ESCAPED_KEY[1:] + '"}',
        "payment.card": 4111111111111111, "auth.blob": f"key {ESCAPED_KEY}".encode()}}]
    logs = ExportLogsServiceRequest()
    record = logs.resource_logs.add().scope_logs.add().log_records.add(time_unix_nano=1_700_000_000_000_000_000)
    record.body.bytes_value = ESCAPED_KEY.encode()
    metrics = ExportMetricsServiceRequest()
    metric = metrics.resource_metrics.add().scope_metrics.add().metrics.add(
        name="agent.sends", description="sends for bob@example.com", unit="{\\u0073" + ESCAPED_KEY[1:] + "}")
    metric.gauge.data_points.add(time_unix_nano=1_700_000_000_000_000_000, as_int=1)
    for path, body in (("/v1/traces", trace_request(spans).SerializeToString()), ("/v1/logs", logs.SerializeToString()),
                       ("/v1/metrics", metrics.SerializeToString())):
        req = urllib.request.Request(up.http_url + path, data=body, headers={"Content-Type": "application/x-protobuf"})
        with urllib.request.urlopen(req, timeout=30) as resp:
            assert resp.status == 200
    _wait(lambda: _count(_metrics(down), "spans_committed") >= 1, 30, "the downstream stored the span")
    upstream, downstream = _every_row(up), _every_row(down)
    assert {t: _hidden(rows) for t, rows in upstream.items() if _hidden(rows)} == {}
    assert {t: _hidden(rows) for t, rows in downstream.items() if _hidden(rows)} == {}
    assert "[redacted:email]" in upstream["spans"] and "[redacted:payment_card]" in upstream["spans"]
    assert "[redacted:email]" in upstream["metrics"]
    assert base64.b64encode(b"key [redacted:api_key]").decode() in upstream["spans"]
    out = tmp_path / "export"
    run_cli("export", "--db", str(up.db), "--to", str(out))
    exported = b"".join(f.read_bytes() for f in out.rglob("*.parquet"))
    assert exported and [s for s in HIDDEN if s.encode() in exported] == []
    assert {"email", "payment_card", "api_key"} <= set(_metrics(up)["redactions"])
