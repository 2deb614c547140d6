"""Forwarding: a real OTel SDK agent → agentfunnel (upstream) → agentfunnel (downstream), both real processes.

The downstream's DuckDB is the oracle: every span arrives, with the ``agentfunnel.*`` labels and
the ``gen_ai.evaluation.result`` events, in both modes, and a downstream that is down for a
while costs the upstream nothing it stored.
"""

from __future__ import annotations

import json
import os
import socket
import time
import urllib.request
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from hypothesis import given, settings, strategies as st
from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor
from opentelemetry.trace import SpanKind

from agentfunnel.collector.batches import SPAN_COLUMNS
from agentfunnel.collector.config import ForwardSettings
from agentfunnel.collector.decode import decode_traces_protobuf_reference, decode_traces_protobuf_wire
from agentfunnel.collector.forward import chunked, encode_traces, rows_of
from agentfunnel.collector.forward.exporter import Answer, Exporter, Request
from agentfunnel.collector.forward.hold import HoldBuffer
from agentfunnel.collector.telemetry import Metrics
from agentfunnel.scoring import ScoringConfig
from conftest import sql
from otlp_build import trace_request

SUMMARY = "agentfunnel.session"


# ---------------------------------------------------------------------------- the agent


def _agent(endpoint: str, conversations: list[str], quiet_trace: bool = False) -> set[str]:
    """One shopping turn per conversation, through the OTel SDK; returns the span ids sent."""
    provider = TracerProvider(resource=Resource.create({"service.name": "shop-agent"}))
    provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter(endpoint=endpoint, insecure=True),
                                                   schedule_delay_millis=30_000))  # one export, at force_flush
    tracer = provider.get_tracer("shop.agent", "1.0")
    ids: set[str] = set()

    def chat(n: int, final: str | None = None) -> None:
        attrs = {"gen_ai.operation.name": "chat", "gen_ai.request.model": "claude-x",
                 "gen_ai.usage.input_tokens": 100 + n, "gen_ai.usage.output_tokens": 10,
                 "gen_ai.response.finish_reasons": ["stop" if final else "tool_call"]}
        if final:
            attrs["gen_ai.output.messages"] = json.dumps([{"role": "assistant", "parts": [
                {"type": "text", "content": final}], "finish_reason": "stop"}])
        with tracer.start_as_current_span("chat claude-x", kind=SpanKind.CLIENT, attributes=attrs) as span:
            ids.add(format(span.get_span_context().span_id, "016x"))

    def tool(name: str, args: dict, result: dict) -> None:
        with tracer.start_as_current_span(f"execute_tool {name}", attributes={
                "gen_ai.operation.name": "execute_tool", "gen_ai.tool.name": name,
                "gen_ai.tool.call.id": uuid.uuid4().hex[:8], "gen_ai.tool.call.arguments": json.dumps(args),
                "gen_ai.tool.call.result": json.dumps(result)}) as span:
            ids.add(format(span.get_span_context().span_id, "016x"))

    for conv in conversations:
        with tracer.start_as_current_span("invoke_agent shop", attributes={
                "gen_ai.operation.name": "invoke_agent", "gen_ai.agent.name": "shop",
                "gen_ai.conversation.id": conv}) as root:
            ids.add(format(root.get_span_context().span_id, "016x"))
            chat(1)
            tool("search_products", {"q": "running shoes"}, {"products": [{"id": "p1", "name": "Runner"}]})
            chat(2)
            tool("add_to_cart", {"product_id": "p1"}, {"cart_id": "c1", "checkout_url": "https://shop.example/c/c1"})
            chat(3, final="Your cart is ready: https://shop.example/c/c1")
    if quiet_trace:  # no agent activity: forms no session
        with tracer.start_as_current_span("GET /healthz", kind=SpanKind.SERVER,
                                          attributes={"http.request.method": "GET"}) as span:
            ids.add(format(span.get_span_context().span_id, "016x"))
    provider.force_flush()
    provider.shutdown()
    return ids


# ---------------------------------------------------------------------------- helpers


def _config(tmp_path: Path, name: str, forward: dict | None, idle: float = 1.0) -> Path:
    lines = ["[sessions]", f"idle_timeout_seconds = {idle}", "check_interval_seconds = 0.2", "open_refresh_seconds = 0"]
    if forward:
        lines.append("[forward]")
        lines += [f"{k} = {json.dumps(v)}" for k, v in forward.items()]
    path = tmp_path / f"{name}.toml"
    path.write_text("\n".join(lines) + "\n")
    return path


def _metrics(srv) -> dict:
    with urllib.request.urlopen(srv.admin + "/metrics") as resp:
        return json.loads(resp.read())


def _metrics_when(srv, name: str, at_least: int) -> dict | None:
    m = _metrics(srv)
    return m if _count(m, name) >= at_least else None


def _count(m: dict, name: str) -> int:
    value = m.get(name, 0)
    return sum(value.values()) if isinstance(value, dict) else value


def _wait(predicate, timeout: float = 30.0, what: str = "condition"):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.1)
    raise AssertionError(f"{what} not reached in {timeout}s")


def _spans(db: Path) -> list[dict]:
    rows = sql(db, "SELECT span_id, trace_id, name, attributes, events, links FROM spans")
    for r in rows:
        for col in ("attributes", "events", "links"):
            r[col] = json.loads(r[col]) if isinstance(r[col], str) else (r[col] or ([] if col != "attributes" else {}))
    return rows


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _pair(server_factory, tmp_path: Path, down_args: list[str], up_args: list[str]):
    """Downstream and upstream started side by side (the upstream's endpoint names a port chosen in advance)."""
    with ThreadPoolExecutor(2) as pool:
        down = pool.submit(server_factory, down_args, tmp_path / "down.duckdb")
        up = pool.submit(server_factory, up_args, tmp_path / "up.duckdb")
        return down.result(), up.result()


def _check_summaries(summaries: list[dict], upstream_sessions: dict[str, dict], roots: dict[str, str]) -> None:
    assert {s["attributes"]["agentfunnel.session.id"] for s in summaries} == set(upstream_sessions)
    for s in summaries:
        a = s["attributes"]
        row = upstream_sessions[a["agentfunnel.session.id"]]
        assert a["agentfunnel.session.outcome"] == row["outcome"] == "checkout_reached"
        assert a["agentfunnel.session.outcome_reads_as"] == "pass"
        assert a["agentfunnel.session.completion_rate"] == row["completion_rate"]
        assert a["agentfunnel.session.variant"] == "shopping"
        assert a["agentfunnel.session.steps"] == row["steps"] == ["search", "cart"]
        assert a["agentfunnel.session.version"] >= 1
        evals = [e for e in s["events"] if e["name"] == "gen_ai.evaluation.result"]
        outcome = next(e["attributes"] for e in evals if e["attributes"]["gen_ai.evaluation.name"] == "agentfunnel.outcome")
        assert outcome["gen_ai.evaluation.score.label"] == "checkout_reached"
        assert outcome["gen_ai.evaluation.score.value"] == row["completion_rate"]
        assert "checkout_reached" in outcome["gen_ai.evaluation.explanation"]
        # linked to the root span of the session's trace
        assert [(ln["trace_id"], ln["span_id"]) for ln in s["links"]] == [
            (row["trace_ids"][0], roots[row["trace_ids"][0]])]


# ---------------------------------------------------------------------------- encoding


@settings(max_examples=40, deadline=None)
@given(st.dictionaries(st.text(min_size=1, max_size=8), st.recursive(
    st.none() | st.booleans() | st.integers(-(2**63), 2**63 - 1) | st.floats(allow_nan=False) | st.text(max_size=12)
    | st.binary(max_size=6),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(min_size=1, max_size=5), inner, max_size=3),
    max_leaves=8), max_size=6))
def test_decode_encode_decode_gives_identical_columns(attrs):
    spans = [{"trace_id": os.urandom(16), "span_id": os.urandom(8), "parent_span_id": os.urandom(8), "name": "s",
              "kind": 3, "attributes": attrs, "events": [{"name": "e", "attributes": attrs}], "status": (2, "bad")},
             {"trace_id": os.urandom(16), "span_id": os.urandom(8), "name": "t", "attributes": {}}]
    req = trace_request(spans)
    span = req.resource_spans[0].scope_spans[0].spans[0]
    span.trace_state, span.flags = "k=v", 0x101
    span.links.add(trace_id=os.urandom(16), span_id=os.urandom(8), trace_state="a=b").attributes.add(key="w").value.int_value = 1
    other = trace_request([{"trace_id": os.urandom(16), "span_id": os.urandom(8), "name": "u"}],
                          resource={"service.name": "other", "r": [1, 2]}, scope=("s2", "")).resource_spans[0]
    req.resource_spans.append(other)
    for decode in (decode_traces_protobuf_reference, decode_traces_protobuf_wire):
        first = decode(req.SerializeToString())
        again = decode(encode_traces(rows_of(first)).SerializeToString())
        for column in SPAN_COLUMNS:
            assert getattr(again, column) == getattr(first, column), column
        # split requests carry the same spans, in order
        parts = [decode(body) for body, _ in chunked(rows_of(first), 200)]
        assert [sid for p in parts for sid in p.span_id] == first.span_id


# ---------------------------------------------------------------------------- enrichment (pure)


def test_labels_at_once_in_hold_mode_and_on_the_summary_with_a_judge():
    from agentfunnel.collector.forward import enrich
    from agentfunnel.collector.evaluation import Evaluated
    from agentfunnel.collector.session.rows import ScoredSession
    from agentfunnel.scoring import SessionScorer
    from agentfunnel.scoring.assembled import Session, TraceShare
    from agentfunnel.scoring.funnel import StepMatcher
    from agentfunnel.semconv import SpanView, normalize

    tid = "ab" * 16
    root = SpanView(tid, "01" * 8, None, "invoke_agent shop", {"gen_ai.operation.name": "invoke_agent",
                                                                "gen_ai.conversation.id": "c1"})
    tool = SpanView(tid, "02" * 8, root.span_id, "execute_tool add_to_cart", {
        "gen_ai.operation.name": "execute_tool", "gen_ai.tool.name": "add_to_cart",
        "gen_ai.tool.call.result": '{"checkout_url": "https://s.example/c"}'})
    matcher = StepMatcher(ScoringConfig().funnel)
    labels, learned = enrich.immediate_labels([tool], matcher, (), {})  # the tool span first, alone
    assert labels == [{"agentfunnel.variant": "shopping", "agentfunnel.step": "cart"}] and learned == {}
    labels, learned = enrich.immediate_labels([tool, root], matcher, (), {})
    assert [lab["agentfunnel.session.id"] for lab in labels] == ["c1", "c1"] and learned == {tid: "c1"}
    assert enrich.immediate_labels([tool], matcher, (), learned)[0][0]["agentfunnel.session.id"] == "c1"

    records = tuple(normalize(v) for v in (root, tool))
    score = SessionScorer().score("c1", records)
    assert enrich.span_labels(score, tool.span_id)["agentfunnel.step"] == "cart"
    assert "agentfunnel.step" not in enrich.span_labels(score, root.span_id)
    judged = Evaluated(passed=True, failure_class=None, judge_status="complete", judge_score=0.8)
    summary = enrich.summary_span(ScoredSession(Session("c1", {tid: TraceShare(tid, records)}), score, 2, judged), 1)
    attrs, events = json.loads(summary.attributes), json.loads(summary.events)
    assert attrs["agentfunnel.judge.score"] == 0.8 and attrs["agentfunnel.judge.status"] == "complete"
    assert attrs["agentfunnel.session.version"] == 2 and attrs["agentfunnel.session.outcome"] == "checkout_reached"
    assert [e["attributes"]["gen_ai.evaluation.name"] for e in events] == ["agentfunnel.outcome", "agentfunnel.completion"]
    assert events[1]["attributes"]["gen_ai.evaluation.score.value"] == 0.8
    assert json.loads(summary.links) == [{"trace_id": tid, "span_id": root.span_id, "attributes": {}}]
    assert (summary.trace_id, summary.span_id) == enrich.summary_ids("c1", 2) != enrich.summary_ids("c1", 3)


def test_the_judges_call_span_sends_its_token_counts_exactly_however_large():
    """The judge endpoint's usage is not bounded like an OTLP integer: the span the forwarder makes of the call goes
    out with the counts it was given (an int64 as an integer, a larger one as its digits), not read back from its
    JSON text as a float."""
    import datetime as dt

    from agentfunnel.collector.evaluation import Evaluated
    from agentfunnel.collector.forward import enrich
    from agentfunnel.collector.forward.encode import encode_traces
    from agentfunnel.collector.session.rows import ScoredSession
    from agentfunnel.scoring import SessionScorer
    from agentfunnel.scoring.assembled import Session, TraceShare
    from agentfunnel.scoring.judge.models import Judgment
    from agentfunnel.semconv import SpanView, normalize

    tid = "cd" * 16
    records = (normalize(SpanView(tid, "01" * 8, None, "invoke_agent a", {"gen_ai.operation.name": "invoke_agent",
                                                                          "gen_ai.conversation.id": "c2"})),)
    judgment = Judgment(status="complete", passed=True, score=0.9, judge_model="m", backend="anthropic",
                        base_url="http://127.0.0.1:1", rubric_id="r", rubric_version="1", rubric_sha256="0" * 64,
                        prompt_version="1", temperature=0.0, threshold=0.5, answer_sha256="0" * 64,
                        reference_sha256="0" * 64, input_hash="h", created_at=dt.datetime.now(dt.timezone.utc),
                        input_tokens=2**64, output_tokens=2**63 - 1, duration_ms=5.0)
    scored = ScoredSession(Session("c2", {tid: TraceShare(tid, records)}), SessionScorer().score("c2", records), 1,
                           Evaluated(passed=True, failure_class=None, judge_status="complete", judge_score=0.9,
                                     judgment=judgment))
    call = enrich.judge_call_span(scored)
    assert call is not None
    sent = {kv.key: kv.value for kv in encode_traces([call]).resource_spans[0].scope_spans[0].spans[0].attributes}
    assert sent["gen_ai.usage.input_tokens"].string_value == str(2**64)
    assert sent["gen_ai.usage.output_tokens"].int_value == 2**63 - 1


# ---------------------------------------------------------------------------- exporter and hold bounds


class FakeTransport:
    """Answers from a script; records what was sent."""

    def __init__(self, answers):
        self.answers, self.sent = list(answers), []

    def send(self, signal, body, timeout):
        self.sent.append(body)
        return self.answers.pop(0) if self.answers else Answer(True)

    def close(self):
        pass


def _exporter(transport, **overrides):
    cfg = ForwardSettings(endpoint="127.0.0.1:1", insecure=True, **overrides)
    metrics = Metrics()
    return Exporter(cfg, metrics, transport), metrics


def test_exporter_retries_only_retryable_answers_and_counts_every_drop():
    t = FakeTransport([Answer(False, True, "UNAVAILABLE", delay=0.01), Answer(True, rejected=1, message="bad span"),
                       Answer(False, False, "INVALID_ARGUMENT"), Answer(False, True, "http_503", delay=0.01)])
    exp, m = _exporter(t, max_retry_seconds=0.2)
    exp.start()
    exp.submit(Request("traces", b"a", 3))  # UNAVAILABLE, then accepted with one span refused
    exp.submit(Request("traces", b"b", 2))  # INVALID_ARGUMENT: dropped at once
    assert exp.flush(5)
    assert m.get("forward_sent_spans") == 2 and m.get("forward_retries", "UNAVAILABLE") == 1
    assert m.get("forward_dropped", "rejected_downstream") == 1
    assert m.get("forward_dropped", "downstream:INVALID_ARGUMENT") == 2
    t.answers = [Answer(False, True, "http_503", delay=0.05)] * 20  # retryable until the window closes
    exp.submit(Request("traces", b"c", 4))
    assert exp.flush(5)
    assert m.get("forward_dropped", "retry_expired") == 4 and m.get("forward_retries", "http_503") >= 2
    exp.stop(1)


def test_exporter_queue_is_bounded_and_drops_the_oldest():
    exp, m = _exporter(FakeTransport([]), queue_max_items=2, queue_max_bytes=10)
    for body, n in ((b"1234", 1), (b"5678", 2), (b"9", 3)):  # not started: nothing is sent yet
        exp.submit(Request("traces", body, n))
    assert exp.queue_requests == 2 and m.get("forward_dropped", "queue_full") == 1
    exp.submit(Request("traces", b"x" * 10, 4))  # over the byte bound: both older ones go
    assert exp.queue_requests == 1 and m.get("forward_dropped", "queue_full") == 1 + 2 + 3
    exp.stop(0)
    assert m.get("forward_dropped", "shutdown") == 4


def test_hold_buffer_releases_the_oldest_trace_first_when_full():
    batch = decode_traces_protobuf_reference(trace_request(
        [{"trace_id": bytes([t + 1]) * 16, "span_id": os.urandom(8), "attributes": {"k": "v" * 50}}
         for t in range(3) for _ in range(2)]).SerializeToString())
    rows = rows_of(batch)
    hold = HoldBuffer(max_bytes=sum(r.size() for r in rows[:4]) + 1)
    assert hold.add(rows[:4]) == []
    evicted = hold.add(rows[4:])
    assert {r.trace_id for r in evicted} == {rows[0].trace_id} and len(hold) == 2
    hold.claim([rows[2].trace_id])
    assert hold.idle(0.0) == [rows[4].trace_id]  # the claimed trace waits for its session
    assert hold.take([rows[2].trace_id], {rows[2].span_id}) == [rows[2]] and rows[2].trace_id in hold
    assert len(hold.drain()) == 3 and hold.nbytes == 0


def test_headers_accept_the_otel_environment_format():
    cfg = ForwardSettings(endpoint="h:1", headers="Authorization=Bearer%20s3cret, x-team = shop")
    assert cfg.headers == {"Authorization": "Bearer s3cret", "x-team": "shop"}
    with pytest.raises(ValueError):
        ForwardSettings(endpoint="h:1", headers="novalue")


# ---------------------------------------------------------------------------- two processes chained


def test_immediate_mode_labels_tool_spans_at_once_and_summarises_closed_sessions(server_factory, tmp_path):
    port = _free_port()
    cfg = _config(tmp_path, "up", {"endpoint": f"http://127.0.0.1:{port}", "protocol": "grpc", "mode": "immediate",
                                   "max_retry_seconds": 20}, idle=3.0)
    down, up = _pair(server_factory, tmp_path, ["--config", str(_config(tmp_path, "down", None)), "--grpc-port", str(port)],
                     ["--config", str(cfg)])
    convs = [f"conv-{uuid.uuid4().hex[:8]}" for _ in range(2)]
    sent_at = time.monotonic()
    ids = _agent(up.grpc, convs)

    m = _wait(lambda: _metrics_when(up, "forward_sent_spans", len(ids)), what="spans forwarded")
    if time.monotonic() - sent_at < 2.5:  # inside the 3 s idle timeout: labelled before any session closed
        assert _count(m, "forward_summaries") == 0
    _wait(lambda: _count(_metrics(up), "forward_sent_spans") >= len(ids) + 2, what="summary spans")
    assert _count(_metrics(up), "forward_dropped") == 0

    spans = _spans(down.db)
    agent = {s["span_id"]: s for s in spans if s["name"] != SUMMARY}
    assert set(agent) == ids
    tools = {s["name"]: s["attributes"] for s in agent.values() if s["name"].startswith("execute_tool")}
    assert len([s for s in agent.values() if s["name"].startswith("execute_tool")]) == 4
    assert tools["execute_tool search_products"]["agentfunnel.step"] == "search"
    assert tools["execute_tool add_to_cart"]["agentfunnel.step"] == "cart"
    assert {t["agentfunnel.variant"] for t in tools.values()} == {"shopping"}
    assert all(s["attributes"]["agentfunnel.session.id"] in convs for s in agent.values())
    assert not any("agentfunnel.step" in s["attributes"] for s in agent.values() if not s["name"].startswith("execute_tool"))

    upstream = {r["session_id"]: r for r in sql(up.db, "SELECT * FROM sessions")}
    roots = {s["trace_id"]: s["span_id"] for s in agent.values() if s["name"] == "invoke_agent shop"}
    _check_summaries([s for s in spans if s["name"] == SUMMARY], upstream, roots)
    # the summaries form no session downstream: it reads the same two sessions the upstream did
    _wait(lambda: _metrics_when(down, "traces_assembled", 4), what="downstream assembly")
    down_sessions = sql(down.db, "SELECT session_id, outcome FROM sessions")
    assert {r["session_id"] for r in down_sessions} == set(convs)
    assert {r["outcome"] for r in down_sessions} == {"checkout_reached"}


def test_hold_mode_forwards_sessions_labelled_when_they_close(server_factory, tmp_path):
    port = _free_port()
    cfg = _config(tmp_path, "up", {"endpoint": f"http://127.0.0.1:{port}", "protocol": "http/protobuf",
                                   "mode": "hold", "also_logs": True, "max_retry_seconds": 20})
    down, up = _pair(server_factory, tmp_path, ["--http-port", str(port)], ["--config", str(cfg)])
    convs = [f"conv-{uuid.uuid4().hex[:8]}" for _ in range(2)]
    ids = _agent(up.grpc, convs, quiet_trace=True)

    _wait(lambda: _count(_metrics(up), "forward_sent_spans") >= len(ids) + 2, what="sessions forwarded")
    m = _metrics(up)
    assert m["forward_unlabeled_spans"] == {"no_session": 1}
    assert _count(m, "forward_dropped") == 0 and m["forward_held_bytes"] == 0
    assert _count(m, "forward_sent_logs") == 2

    spans = _spans(down.db)
    agent = {s["span_id"]: s for s in spans if s["name"] != SUMMARY}
    assert set(agent) == ids
    upstream = {r["session_id"]: r for r in sql(up.db, "SELECT * FROM sessions")}
    for s in agent.values():
        a = s["attributes"]
        if s["name"] == "GET /healthz":
            assert not any(k.startswith("agentfunnel.") for k in a)
            continue
        row = upstream[a["agentfunnel.session.id"]]
        assert a["agentfunnel.session.outcome"] == row["outcome"] == "checkout_reached"
        assert a["agentfunnel.session.outcome_reads_as"] == "pass"
        assert a["agentfunnel.session.completion_rate"] == row["completion_rate"]
        assert a["agentfunnel.session.variant"] == "shopping"
        if s["name"].startswith("execute_tool"):
            assert a["agentfunnel.step"] == {"execute_tool search_products": "search",
                                             "execute_tool add_to_cart": "cart"}[s["name"]]
    roots = {s["trace_id"]: s["span_id"] for s in agent.values() if s["name"] == "invoke_agent shop"}
    summaries = [s for s in spans if s["name"] == SUMMARY]
    _check_summaries(summaries, upstream, roots)
    logs = sql(down.db, "SELECT span_id, event_name, attributes FROM logs")
    assert {r["span_id"] for r in logs} == {s["span_id"] for s in summaries}
    assert {r["event_name"] for r in logs} == {"gen_ai.evaluation.result"}
    assert {json.loads(r["attributes"])["agentfunnel.session.id"] for r in logs} == set(convs)


def test_a_downstream_down_for_half_the_run_costs_nothing_stored_and_catches_up(server_factory, tmp_path):
    port = _free_port()
    cfg = _config(tmp_path, "up", {"endpoint": f"http://127.0.0.1:{port}", "protocol": "grpc",
                                   "max_retry_seconds": 30})
    up = server_factory(["--config", str(cfg)], db=tmp_path / "up.duckdb")
    first = _agent(up.grpc, [f"early-{i}-{uuid.uuid4().hex[:6]}" for i in range(3)])
    _wait(lambda: _count(_metrics(up), "forward_retries") >= 2, what="retries while the downstream is down")
    assert _count(_metrics(up), "forward_sent_spans") == 0

    down = server_factory(["--grpc-port", str(port)], db=tmp_path / "down.duckdb")
    second = _agent(up.grpc, [f"late-{i}-{uuid.uuid4().hex[:6]}" for i in range(3)])
    ids = first | second
    stored = {r["span_id"] for r in sql(up.db, "SELECT span_id FROM spans")}
    assert stored == ids  # nothing stored upstream is lost

    def settled():
        m = _metrics(up)
        done = _count(m, "forward_sent_spans") + _count(m, "forward_dropped")
        return m if done >= len(ids) + 6 and m["forward_queue_requests"] == 0 else None

    m = _wait(settled, timeout=40, what="forwarder caught up")
    forwarded = {s["span_id"] for s in _spans(down.db) if s["name"] != SUMMARY}
    missing = ids - forwarded
    assert len(missing) <= _count(m, "forward_dropped")  # anything not delivered was counted
    assert not missing, f"{len(missing)} spans dropped: {m.get('forward_dropped')}"
    assert _count(m, "forward_retries") >= 2
    assert _count(m, "forward_summaries") == 6


# ---------------------------------------------------------------------------- the docs document it


def test_the_docs_document_every_attribute_and_the_config_example_is_valid():
    import re
    import tomllib

    from agentfunnel.collector.config import ForwardSettings
    from agentfunnel.collector.forward import enrich
    from docs_text import section as doc_section

    section = doc_section("docs/operations.md", "## Forwarding downstream")
    emitted = {v for k, v in vars(enrich).items()
               if k.isupper() and isinstance(v, str) and v.startswith("agentfunnel.") and v != enrich.NS}
    documented = set(re.findall(r"`(agentfunnel\.[a-z0-9_.]+)`", section))
    assert emitted <= documented, emitted - documented
    block = re.search(r"```toml\n(.*?)```", section, re.S).group(1)
    ForwardSettings.model_validate(tomllib.loads(block)["forward"])


def test_the_forward_intake_counts_a_batch_at_what_it_keeps_alive():
    """Batches wait to be labelled with the views and records the session stage made of them (immediate mode
    labels from those): ``forward.queue_max_bytes`` bounds their memory only if the intake counts them. Measured
    with tracemalloc for agent traffic and every recorded framework; request bytes alone were an eighth of it."""
    import gc
    import sys
    import tracemalloc

    from agentfunnel.collector.forward.forwarder import Forwarder
    from agentfunnel.collector.session.held import Committed, prepare
    from agentfunnel.collector.telemetry import Metrics

    sys.path.insert(0, str(Path(__file__).parents[1] / "bench"))
    from payloads import genai_request

    fixtures = Path(__file__).parent / "fixtures" / "otlp"
    payloads = {"agent traffic": [genai_request(2000, seed=7).SerializeToString()],
                "recorded frameworks": [p.read_bytes() for p in sorted(fixtures.glob("*/*.traces.binpb"))]}
    for label, bodies in payloads.items():
        metrics = Metrics()
        forwarder = Forwarder(ForwardSettings(endpoint="127.0.0.1:1", insecure=True, queue_max_bytes=1 << 40),
                              metrics)  # not started: what it is given stays queued
        gc.collect()
        tracemalloc.start()
        try:
            for body in bodies:
                batch = decode_traces_protobuf_wire(body)
                forwarder.on_committed(Committed(batch, prepare(batch)))  # as the session stage hands it on
            del batch
            gc.collect()
            real = tracemalloc.get_traced_memory()[0]
        finally:
            tracemalloc.stop()
        counted = metrics.snapshot()["forward_intake_bytes"]
        assert 0.8 * real <= counted <= 1.6 * real, f"{label}: counted {counted:,} for {real:,} bytes queued"

