"""Every recorded framework's spans read into the right normalized records, tool calls and sessions.

The payloads in tests/fixtures/otlp were recorded from the real frameworks (see
tests/fixtures/recorders); each scenario's ``expected.yaml`` was written by the recorder from the
script it played, so it is known without agentfunnel. Per-span goldens (tests/golden) pin the full
normalized records; refresh them with ``pytest --update-golden`` and review the diff.
"""

from __future__ import annotations

import importlib.util
import json
import sys
from typing import Any
from functools import cache
from pathlib import Path

import pytest
import yaml

from agentfunnel.collector.session.assembly import assemble
from agentfunnel.collector.decode import decode_logs_protobuf, decode_traces_protobuf
from agentfunnel.collector.session.held import log_events
from agentfunnel.semconv import SpanView, normalize
from conftest import FIXTURES, ROOT, ServerProcess, read_db, run_cli

OTLP = FIXTURES / "otlp"
GOLDEN = ROOT / "tests" / "golden"
SCENARIOS = sorted(p for p in OTLP.glob("*/*.expected.yaml"))
IDS = [f"{p.parent.name}/{p.name.removesuffix('.expected.yaml')}" for p in SCENARIOS]


def views_of(path: Path) -> list[SpanView]:
    """The recording's spans, with its log records (``<name>.logs.binpb``) joined to them as the server joins them."""
    b = decode_traces_protobuf(path.read_bytes())
    stem = path.name.removesuffix(".traces.binpb")
    logs = _log_events(path.with_name(stem + ".logs.binpb")) if stem != path.name else {}
    return [SpanView(b.trace_id[i], b.span_id[i], b.parent_span_id[i], b.name[i], b.attrs[i], b.resource_attrs[i],
                     list(b.event_list[i] or []) + logs.get((b.trace_id[i], b.span_id[i]), []), b.kind[i],
                     b.status_code[i], b.status_message[i], b.scope_name[i], b.start_ns[i], b.end_ns[i])
            for i in range(len(b))]


def _log_events(path: Path) -> dict[tuple[str, str], list[dict]]:
    if not path.exists():
        return {}
    batch = decode_logs_protobuf(path.read_bytes())
    return {k: sorted(events, key=lambda e: e["time_unix_nano"]) for k, (events, _) in log_events(batch).items()}


@pytest.fixture(scope="module")
def replayed(tmp_path_factory) -> Path:
    """Every fixture (spans and log records) replayed through a live ``agentfunnel serve``: ``agentfunnel
    ingest`` sends the files to the server that owns the database, which assembles and scores them as it
    would live traffic. (tests/test_held.py replays them offline too and compares.)"""
    db = tmp_path_factory.mktemp("replay") / "fixtures.duckdb"
    files = sorted(str(p) for p in OTLP.glob("*/*.binpb"))
    srv = ServerProcess(db).start()
    try:
        out = run_cli("ingest", "--db", str(db), *files)
        assert "into the running server" in out.stdout and "0 refused" in out.stdout, out.stdout
        srv.admin_post("/flush")
    finally:
        assert srv.stop() == 0
    return db


def _expected(path: Path) -> dict:
    return yaml.safe_load(path.read_text())


@pytest.mark.parametrize("expected_file", SCENARIOS, ids=IDS)
def test_replay_matches_the_scripted_scenario(replayed, expected_file):
    exp = _expected(expected_file)
    notes = exp.get("notes") or {}
    traces = sorted({v.trace_id for v in views_of(expected_file.with_name(exp["scenario"] + ".traces.binpb"))})
    in_traces = "trace_id IN (" + ",".join(f"'{t}'" for t in traces) + ")"
    calls = read_db(replayed, f"SELECT * FROM tool_calls WHERE {in_traces} ORDER BY start_time, span_id")
    assert [c["tool_name"] for c in calls] == [c["tool"] for c in exp["tool_calls"]]
    assert [c["error"] is not None for c in calls] == [c["error"] for c in exp["tool_calls"]]
    for got, want in zip(calls, exp["tool_calls"]):
        if notes.get("tool_arguments_recorded") is not False:
            assert json.loads(got["arguments"]) == want["arguments"], got["tool_name"]
        if notes.get("tool_results_recorded") is not False and not want["error"] and "result" in want:
            assert json.loads(got["result"]) == want["result"], got["tool_name"]
    sessions = read_db(replayed, f"SELECT DISTINCT session_id FROM spans WHERE {in_traces} AND session_id IS NOT NULL")
    assert len(sessions) == exp["sessions"]
    if exp["session_key"]:
        assert sessions[0]["session_id"] == exp["session_key"]
    assert {c["session_id"] for c in calls} <= {s["session_id"] for s in sessions}
    dialects = read_db(replayed, f"SELECT count(*) AS n FROM spans WHERE {in_traces} AND dialect IS NULL")
    assert dialects[0]["n"] == 0


@pytest.mark.parametrize("expected_file", SCENARIOS, ids=IDS)
def test_normalized_records_match_the_golden_file(expected_file, update_golden):
    exp = _expected(expected_file)
    views = views_of(expected_file.with_name(exp["scenario"] + ".traces.binpb"))
    by_trace: dict[str, list[SpanView]] = {}
    for v in views:
        normalize(v, strict=True)  # no dialect raises on a recording nor returns a field a record has not
        by_trace.setdefault(v.trace_id, []).append(v)
    rows = []
    for trace_views in by_trace.values():
        t = assemble(trace_views)
        for r in t.records:
            rows.append({
                "span": r.span_id, "name": r.name, "dialect": r.dialect, "kind": r.kind,
                "session": t.sessions[r.span_id], "tool": r.tool_name if r.kind == "tool" else None,
                "arguments": r.arguments if r.kind == "tool" else None,
                "result": r.result if r.kind == "tool" else None, "error": r.error, "ignored": r.ignored,
                "model": r.model, "input_tokens": r.input_tokens, "output_tokens": r.output_tokens,
                "agent": r.agent_name, "workflow": r.workflow_name, "final_answer": r.final_answer,
                "finish_reason": r.finish_reason, "step_limit": r.step_limit is not None, "input": r.input_message,
            })
    rows.sort(key=lambda r: r["span"])
    golden = GOLDEN / expected_file.parent.name / (exp["scenario"] + ".yaml")
    if update_golden:
        golden.parent.mkdir(parents=True, exist_ok=True)
        golden.write_text(yaml.safe_dump(rows, sort_keys=False, allow_unicode=True, width=120))
    assert golden.exists(), f"no golden file {golden.relative_to(ROOT)}: run pytest --update-golden and review it"
    assert rows == yaml.safe_load(golden.read_text())
    # the scripted final answer is read from the telemetry wherever the framework records it (as text: a
    # structured output's one text field, pydantic-ai's Reply.answer, not the JSON document)
    answers = {r["final_answer"] for r in rows if r["final_answer"]}
    if exp["final_answer"] and not (exp.get("notes") or {}).get("no_llm_spans"):
        assert any(exp["final_answer"].strip() == a.strip() for a in answers), answers


def test_unknown_dialect_never_crashes_and_is_kept(tmp_path):
    from otlp_build import trace_request

    tid = bytes(range(1, 17))
    req = trace_request([
        {"trace_id": tid, "span_id": b"\x01" * 8, "name": "mystery", "attributes": {"foo.bar": {"x": [1, None]}}},
        {"trace_id": tid, "span_id": b"\x02" * 8, "parent_span_id": b"\x01" * 8, "name": "child",
         "attributes": {"gen_ai.tool.call.arguments": "{not json", "openinference.span.kind": 7,
                        "ai.operationId": ["odd"], "mcp.method.name": 5, "langfuse.observation.type": {}}},
    ])
    for v in views_of(_write(tmp_path / "odd.binpb", req.SerializeToString())):
        normalize(v)  # must not raise on any attribute shape
    db = tmp_path / "odd.duckdb"
    run_cli("ingest", "--db", str(db), str(tmp_path / "odd.binpb"))
    rows = read_db(db, "SELECT name, dialect, session_id, trace_id FROM spans ORDER BY name")
    assert [r["name"] for r in rows] == ["child", "mystery"]
    assert rows[1]["dialect"] == "unknown"
    assert {r["trace_id"] for r in rows} == {tid.hex()}
    assert read_db(db, "SELECT count(*) AS n FROM tool_calls")[0]["n"] == 0


def _write(path: Path, data: bytes) -> Path:
    path.write_bytes(data)
    return path


def test_exceptions_and_content_in_log_records_are_joined_to_their_spans(tmp_path):
    """Since semconv v1.40 exceptions may come as log records, and content as operation-details events."""
    from opentelemetry.proto.collector.logs.v1.logs_service_pb2 import ExportLogsServiceRequest

    from otlp_build import kvs, trace_request

    tid, agent, tool = bytes(range(1, 17)), b"\x0a" * 8, b"\x0b" * 8
    spans = trace_request([
        {"trace_id": tid, "span_id": agent, "name": "invoke_agent shop",
         "attributes": {"gen_ai.operation.name": "invoke_agent", "gen_ai.conversation.id": "conv-logs"}},
        {"trace_id": tid, "span_id": tool, "parent_span_id": agent, "name": "execute_tool complete_checkout",
         "attributes": {"gen_ai.operation.name": "execute_tool", "gen_ai.tool.name": "complete_checkout"}},
    ])
    logs = ExportLogsServiceRequest()
    records = logs.resource_logs.add().scope_logs.add().log_records
    exc = records.add(trace_id=tid, span_id=tool, event_name="gen_ai.client.operation.exception")
    exc.attributes.extend(kvs({"exception.type": "PaymentRequired", "exception.message": "card declined"}))
    details = records.add(trace_id=tid, span_id=agent, event_name="gen_ai.client.inference.operation.details")
    details.attributes.extend(kvs({"gen_ai.output.messages": [
        {"role": "assistant", "parts": [{"type": "text", "content": "Sorry, the card was declined."}]}]}))
    db = tmp_path / "logs.duckdb"
    run_cli("ingest", "--db", str(db), str(_write(tmp_path / "t.binpb", spans.SerializeToString())),
            str(_write(tmp_path / "t.logs.binpb", logs.SerializeToString())))
    call = read_db(db, "SELECT * FROM tool_calls")[0]
    assert call["error"] == "card declined" and call["session_id"] == "conv-logs"
    views = {v.span_id: v for v in views_of(tmp_path / "t.binpb")}
    assert views[tool.hex()].events == []  # the error is not on the span itself


SESSION_EXPECTATIONS = {
    # scenario: (variant, steps, completion_rate, outcome, hit_cap)
    "shop_purchase": ("shopping", ["search", "details", "cart", "checkout"], 1.0, "purchase_completed", False),
    "shop_cart_stop": ("shopping", ["search", "cart"], 0.5, "cart_created", False),
    # the cart result carried a checkout link, so checkout was reached before the payment error
    "shop_tool_error": ("shopping", ["search", "cart"], 0.5, "checkout_reached", False),
    "procurement_multiturn": ("procurement", ["search", "rfq", "quote", "po"], 1.0, "po_submitted", False),
    "lodging_step_limit": ("lodging", ["search"], 0.25, "search_only", True),
    "info_answer": ("generic", [], 0.0, "no_activity", False),
    "generic_invalid_args": ("generic", ["discover", "read", "action"], 1.0, "action_taken", False),
    # mcp-sdk: one tools/call per session, no results: the steps reached are the only evidence
    "checkout_only": ("shopping", ["checkout"], 0.25, "checkout_reached", False),
    "cart_stop": ("shopping", ["cart"], 0.25, "cart_created", False),
    "search_only": ("shopping", ["search"], 0.25, "search_only", False),
    "tool_error": ("shopping", [], 0.0, "failed", False),
    # langgraph-openllmetry, the shop's tools served by an MCP server
    "mcp_shop_tool_error": ("shopping", ["search", "cart"], 0.5, "checkout_reached", False),
    # mcp-openllmetry: a hotel server declaring dev.ucp.lodging at initialize (so lodging, not inferred),
    # an issue tracker whose tools/list annotations say which tool changes state
    "lodging_declared": ("lodging", ["cart", "checkout", "purchase"], 1.0, "purchase_completed", False),
    "generic_annotated": ("generic", ["discover", "read", "action"], 1.0, "action_taken", False),
    "generic_read_only": ("generic", ["discover", "read"], 2 / 3, "read_only", False),
}
# Where a framework's telemetry legitimately says less: MCP spans carry no tool results (so no
# order confirmation: the checkout step reached is the evidence), and an MCP session lists its
# tools (discovery) even when it answers.
FRAMEWORK_EXCEPTIONS = {
    ("mcp", "shop_purchase"): {"outcome": "checkout_reached"},
    ("mcp", "shop_tool_error"): {"outcome": "cart_created"},
    ("mcp", "info_answer"): {"steps": ["discover"], "completion_rate": 1 / 3, "outcome": "read_only"},
}


@pytest.mark.parametrize("expected_file", SCENARIOS, ids=IDS)
def test_replay_gives_the_expected_session(replayed, expected_file):
    exp = _expected(expected_file)
    variant, steps, completion, outcome, hit_cap = SESSION_EXPECTATIONS[exp["scenario"]]
    want = {"variant": variant, "steps": steps, "completion_rate": completion, "outcome": outcome, "hit_cap": hit_cap}
    want.update(FRAMEWORK_EXCEPTIONS.get((exp["framework"], exp["scenario"]), {}))
    traces = sorted({v.trace_id for v in views_of(expected_file.with_name(exp["scenario"] + ".traces.binpb"))})
    rows = read_db(replayed, "SELECT * FROM sessions WHERE list_has_any(trace_ids, ["
                   + ",".join(f"'{t}'" for t in traces) + "])")
    assert len(rows) == exp["sessions"]
    got = {k: rows[0][k] for k in want}
    assert got["completion_rate"] == pytest.approx(want.pop("completion_rate"), abs=1e-5)
    got.pop("completion_rate")
    assert got == want
    assert rows[0]["status"] == "closed" and rows[0]["trace_count"] == exp["traces"]


def _load(name: str, path: Path) -> Any:
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up while being made
    spec.loader.exec_module(module)
    return module


@cache
def _scripts() -> dict:
    """The scripted scenarios the recorders played (tests/fixtures/recorders/scenarios.py, and the MCP servers'
    own in mcp-openllmetry/ucp_scenarios.py), by name."""
    recorders = FIXTURES / "recorders"
    shared = _load("scenarios", recorders / "scenarios.py")  # ucp_scenarios imports it by this name
    ucp = _load("ucp_scenarios", recorders / "mcp-openllmetry" / "ucp_scenarios.py")
    return {**shared.SCENARIOS, **ucp.UCP_SCENARIOS}


PLAYS = {"mcp_shop_tool_error": "shop_tool_error"}  # recorded under its own name, playing a scripted scenario


@pytest.mark.parametrize("expected_file", SCENARIOS, ids=IDS)
def test_replay_keeps_what_the_user_asked_first(replayed, expected_file):
    """``sessions.input`` is the first user message of the first turn, from whichever field the framework
    records it in (multi-turn scenarios: the first turn's, whatever order the turns are stored in)."""
    exp = _expected(expected_file)
    if (exp.get("notes") or {}).get("no_llm_spans"):
        pytest.skip("no model call, agent input or message content in this telemetry")
    asked = _scripts()[PLAYS.get(exp["scenario"], exp["scenario"])].turns[0].user
    traces = sorted({v.trace_id for v in views_of(expected_file.with_name(exp["scenario"] + ".traces.binpb"))})
    rows = read_db(replayed, "SELECT input FROM sessions WHERE list_has_any(trace_ids, ["
                   + ",".join(f"'{t}'" for t in traces) + "])")
    assert [r["input"] for r in rows] == [asked] * exp["sessions"]


# The recorders name each agent and each run's workflow after the scenario's variant (Agent(name=...),
# RunConfig(workflow_name=...) in tests/fixtures/recorders/openai-agents-*/record.py)
AGENT_NAMES = {"openai-agents-openinference": "{variant}-agent", "openai-agents-otel": "{variant}-agent"}
ANSWER_TEXT = ("pydantic-ai", "pydantic-ai-logfire")  # structured output (Reply): the answer is Reply.answer


@pytest.mark.parametrize("expected_file", [p for p in SCENARIOS if p.parent.name in (*AGENT_NAMES, *ANSWER_TEXT)],
                         ids=[i for p, i in zip(SCENARIOS, IDS) if p.parent.name in (*AGENT_NAMES, *ANSWER_TEXT)])
def test_replay_names_the_agent_and_keeps_the_answer_as_text(replayed, expected_file):
    """The agent span's own name wins over the workflow's (OpenAI Agents' trace span); a structured output's
    answer is its text, not the JSON document."""
    exp = _expected(expected_file)
    traces = sorted({v.trace_id for v in views_of(expected_file.with_name(exp["scenario"] + ".traces.binpb"))})
    row = read_db(replayed, "SELECT agent_name, final_answer FROM sessions WHERE list_has_any(trace_ids, ["
                  + ",".join(f"'{t}'" for t in traces) + "])")[0]
    if exp["framework"] in AGENT_NAMES:
        assert row["agent_name"] == AGENT_NAMES[exp["framework"]].format(variant=exp["variant"])
    else:
        assert row["final_answer"] == exp["final_answer"]


TRAJECTORY = {  # scenario: (cycles, tool calls, invalid calls, hit cap, tool errors)
    "shop_purchase": (4, 4, 0, False, 0),
    "shop_cart_stop": (2, 2, 0, False, 0),
    "shop_tool_error": (3, 3, 0, False, 1),
    "procurement_multiturn": (4, 4, 0, False, 0),
    "lodging_step_limit": (3, 3, 0, True, 0),
    "info_answer": (0, 0, 0, False, 0),
    "generic_invalid_args": (3, 3, 1, False, 1),
    "checkout_only": (0, 1, 0, False, 0),
    "cart_stop": (0, 1, 0, False, 0),
    "search_only": (0, 1, 0, False, 0),
    "tool_error": (0, 1, 0, False, 1),
    "mcp_shop_tool_error": (3, 3, 0, False, 1),
    "lodging_declared": (0, 2, 0, False, 0),
    "generic_annotated": (0, 3, 0, False, 0),
    "generic_read_only": (0, 2, 0, False, 0),
}
NO_MODEL_SPANS = {"mcp", "mcp-sdk", "mcp-openllmetry", "openai-agents-otel"}  # cycles cannot be counted: NULL, not 0
TRAJECTORY_EXCEPTIONS = {
    # the SDK rejects the invalid arguments before running the tool: no tool span, no error to count
    ("vercel-ai", "generic_invalid_args"): (3, 2, 0, False, 0),
    ("vercel-ai-genai", "generic_invalid_args"): (3, 2, 0, False, 0),
    # the error text is redacted and no tool schema is in the telemetry: the call failed, validity unknown
    ("openai-agents-openinference", "generic_invalid_args"): (3, 3, 0, False, 1),
    ("openai-agents-otel", "generic_invalid_args"): (None, 3, 0, False, 1),
    ("mcp", "generic_invalid_args"): (None, 3, 0, False, 1),
}


@pytest.mark.parametrize("expected_file", SCENARIOS, ids=IDS)
def test_replay_gives_the_expected_trajectory(replayed, expected_file):
    exp = _expected(expected_file)
    fw, scenario = exp["framework"], exp["scenario"]
    want = TRAJECTORY_EXCEPTIONS.get((fw, scenario), TRAJECTORY[scenario])
    if fw in NO_MODEL_SPANS:
        want = (None, *want[1:])
    traces = sorted({v.trace_id for v in views_of(expected_file.with_name(scenario + ".traces.binpb"))})
    row = read_db(replayed, "SELECT cycles, tool_call_count, invalid_tool_calls, hit_cap, tool_errors FROM sessions "
                  "WHERE list_has_any(trace_ids, [" + ",".join(f"'{t}'" for t in traces) + "])")[0]
    assert tuple(row.values()) == want
