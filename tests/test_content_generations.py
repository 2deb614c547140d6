"""Every generation of GenAI message content, read from real recordings, down to the judge's input.

Three recordings (tests/fixtures/recorders), one per generation and carrier:
- ``strands-latest``: Strands with ``OTEL_SEMCONV_STABILITY_OPT_IN=gen_ai_latest_experimental``; tool
  results as ``gen_ai.tool.call.result`` holding Strands content blocks (``[{"text": "<json>"}]``);
- ``openai-v2-events``: contrib's ``opentelemetry-instrumentation-openai-v2`` 2.1b0, the v1.28-v1.36
  ``gen_ai.*.message`` / ``gen_ai.choice`` events as **log records** (named only by ``event.name``);
- ``openlit-content-events``: OpenLIT 1.34.10, the pre-v1.28 ``gen_ai.content.prompt`` /
  ``gen_ai.content.completion`` **span events**;
- ``azure-inference-events``: ``azure-ai-inference`` 1.0.0b9, the v1.28-v1.36 events as **span
  events**, each message as JSON in ``gen_ai.event.content`` (Strands' default is the other real
  emitter of that shape: tests/fixtures/otlp/strands).
No real library emits the pre-v1.28 events as log records: that generation defined only span events.

The chat-client recordings' first response of each turn that calls a tool also has text ("Let me call
X first."): that text is kept on the model call, and is never the session's final answer.

Goldens: ``tests/golden/<dir>/<scenario>.yaml`` are the normalized records (the rows
tests/test_dialects.py builds), here with the scenario's log records joined to their spans as the
server joins them; ``<scenario>.session.yaml`` is the stored session and its tool calls. Refresh
with ``pytest tests/test_content_generations.py --update-golden`` and review the diff.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from agentfunnel.collector.session.assembly import assemble
from agentfunnel.semconv import SpanView, normalize
from agentfunnel.scoring.judge.checks import sha256_text
from agentfunnel.scoring.judge.rubric import fence
from conftest import FIXTURES, ROOT, read_db, run_cli
from test_dialects import views_of
from test_judge import FakeMessagesAPI, verdict_reply

OTLP = FIXTURES / "otlp"
GOLDEN = ROOT / "tests" / "golden"
DIRS = ("strands-latest", "openai-v2-events", "openlit-content-events", "azure-inference-events")
SCENARIOS = sorted(p for d in DIRS for p in (OTLP / d).glob("*.expected.yaml"))
IDS = [f"{p.parent.name}/{p.name.removesuffix('.expected.yaml')}" for p in SCENARIOS]
# the chat-client recordings: their scripted server says text alongside the first tool call of a turn
PREAMBLE_DIRS = ("openai-v2-events", "openlit-content-events", "azure-inference-events")


def _expected(path: Path) -> dict[str, Any]:
    return yaml.safe_load(path.read_text())


def _traces(expected_file: Path) -> Path:
    return expected_file.with_name(_expected(expected_file)["scenario"] + ".traces.binpb")


def _check_golden(path: Path, got: Any, update: bool) -> None:
    if update:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(yaml.safe_dump(got, sort_keys=False, allow_unicode=True, width=120))
    assert path.exists(), f"no golden file {path.relative_to(ROOT)}: run pytest --update-golden and review it"
    assert got == yaml.safe_load(path.read_text())


@pytest.mark.parametrize("expected_file", SCENARIOS, ids=IDS)
def test_the_scripted_tool_calls_and_answers_are_read(expected_file):
    """Known without agentfunnel: what the recorder scripted (expected.yaml)."""
    exp = _expected(expected_file)
    records = [r for t in _by_trace(views_of(_traces(expected_file))) for r in assemble(t).records]
    records.sort(key=lambda r: (r.start_ns, r.span_id))
    calls = [r for r in records if r.is_tool_call]
    assert [c.tool_name for c in calls] == [c["tool"] for c in exp["tool_calls"]]
    for got, want in zip(calls, exp["tool_calls"]):
        assert got.arguments == want["arguments"]
        assert (got.error is not None) == want["error"]
        if not want["error"]:
            assert got.result == want["result"], got.tool_name  # unwrapped: the object the tool returned
    llms = [r for r in records if r.kind == "llm"]
    answers = [r.final_answer for r in llms if r.finish_reason != "tool_call" and r.final_answer]
    if exp["final_answer"]:
        assert answers[-1] == exp["final_answer"]
    else:
        assert answers == []
    if exp["framework"] in PREAMBLE_DIRS:  # the text said alongside a tool call is kept on that call
        first_calls = [r.final_answer for r in llms if r.finish_reason == "tool_call" and r.final_answer]
        assert first_calls == [f"Let me call {t['calls'][0]} first." for t in _turns_with_calls(exp)]


def _by_trace(views: list[SpanView]) -> list[list[SpanView]]:
    by: dict[str, list[SpanView]] = {}
    for v in views:
        by.setdefault(v.trace_id, []).append(v)
    return list(by.values())


def _turns_with_calls(exp: dict[str, Any]) -> list[dict[str, Any]]:
    """The scripted turns that call tools, from the scenario script (expected.yaml flattens its turns)."""
    import sys

    sys.path.insert(0, str(FIXTURES / "recorders"))
    from scenarios import SCENARIOS as SCRIPTS

    return [{"calls": [c.tool for c in t.calls]} for t in SCRIPTS[exp["scenario"]].turns if t.calls]


# -- sessions, replayed through the real ingest (log records joined by the server) ----------------

@pytest.fixture(scope="module")
def replayed(tmp_path_factory) -> Path:
    db = tmp_path_factory.mktemp("generations") / "generations.duckdb"
    files = sorted(str(p) for d in DIRS for p in (OTLP / d).glob("*.binpb"))
    out = run_cli("ingest", "--db", str(db), *files)
    assert "0 refused" in out.stdout
    return db


SESSION_COLUMNS = ("session_id", "status", "trace_count", "variant", "variant_source", "steps", "completion_rate",
                   "outcome", "outcome_reads_as", "stopped_by_error", "hit_cap", "agent_name", "user_id", "model",
                   "llm_calls", "cycles", "tool_call_count", "invalid_tool_calls", "tool_errors", "input_tokens",
                   "output_tokens", "final_answer")
CALL_COLUMNS = ("tool_name", "call_id", "arguments", "result", "error", "step", "args_valid")


def _session(db: Path, session_id: str) -> dict[str, Any]:
    rows = read_db(db, f"SELECT {', '.join(SESSION_COLUMNS)} FROM sessions WHERE session_id = '{session_id}'")
    assert len(rows) == 1, session_id
    row = rows[0]
    row["completion_rate"] = round(row["completion_rate"], 4)
    calls = read_db(db, f"SELECT {', '.join(CALL_COLUMNS)} FROM tool_calls WHERE session_id = '{session_id}' "
                        "ORDER BY start_time, span_id")
    for c in calls:
        c["arguments"] = json.loads(c["arguments"]) if c["arguments"] is not None else None
        c["result"] = json.loads(c["result"]) if c["result"] is not None else None
    return {**row, "tool_calls": calls}


ANSWER_PARAMS = [pytest.param(p, id=i) for p, i in zip(SCENARIOS, IDS)]


@pytest.mark.parametrize("expected_file", ANSWER_PARAMS)
def test_the_session_matches_its_golden_file(replayed, expected_file, update_golden):
    exp = _expected(expected_file)
    got = _session(replayed, exp["session_key"])
    _check_golden(GOLDEN / expected_file.parent.name / (exp["scenario"] + ".session.yaml"), got, update_golden)


@pytest.mark.parametrize("expected_file", ANSWER_PARAMS)
def test_the_session_final_answer_is_the_scripted_one(replayed, expected_file):
    exp = _expected(expected_file)
    assert _session(replayed, exp["session_key"])["final_answer"] == exp["final_answer"]


# -- the judge gets the answer the recording carries ------------------------------------------

CASE = {"id": "trail-runner-buy", "task": "Buy the Trail Runner 2 in size 42.",
        "intent_summary": "One pair of Trail Runner 2, size 42, ordered and confirmed.",
        "target": {"name": "Shop", "provider": "shop.example"},
        "allowed_tools": ["search_products", "get_product_details", "add_to_cart", "complete_checkout"],
        "completion_criteria": ["states the confirmed order id ord_555"]}
VERDICT = {"status": "complete", "score": 1.0, "explanation": "The order id is stated.", "missing_requirements": [],
           "unsupported_claims": [],
           "criteria": [{"criterion": CASE["completion_criteria"][0], "status": "satisfied", "evidence": "ord_555"}]}


def _tagged(traces: Path, out: Path, run_id: str) -> Path:
    """The recording with the case attribution a harness adds to its resource (SPEC §6)."""
    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

    from otlp_build import kvs

    req = ExportTraceServiceRequest.FromString(traces.read_bytes())
    for rs in req.resource_spans:
        rs.resource.attributes.extend(kvs({"agentfunnel.case.id": CASE["id"], "agentfunnel.experiment": "generations",
                                           "agentfunnel.run.id": run_id}))
    out.write_bytes(req.SerializeToString())
    return out


@pytest.mark.parametrize("framework", DIRS)
def test_the_judge_gets_the_final_answer_and_the_unwrapped_results(tmp_path, framework):
    api = FakeMessagesAPI()
    try:
        api.push(verdict_reply(VERDICT))
        suite = tmp_path / "cases.yaml"
        suite.write_text(yaml.safe_dump({"cases": [CASE]}))
        cfg = tmp_path / "agentfunnel.yaml"
        cfg.write_text(yaml.safe_dump({"cases": {"suite": str(suite)},
                                       "judge": {"api_key": "test-key", "base_url": api.url, "max_retries": 0,
                                                 "requests_per_minute": 60_000}}))
        src = OTLP / framework / "shop_purchase.traces.binpb"
        files = [str(_tagged(src, tmp_path / "shop_purchase.traces.binpb", framework))]
        logs = src.with_name("shop_purchase.logs.binpb")
        if logs.exists():
            files.append(str(logs))
        db = tmp_path / "judged.duckdb"
        run_cli("ingest", "--db", str(db), "--config", str(cfg), *files)
        assert len(api.requests) == 1
        body = api.requests[0]["body"]
        prompt = "".join(block["text"] for m in body["messages"] for block in
                         (m["content"] if isinstance(m["content"], list) else [{"text": m["content"]}]))
        assert fence("final_answer", "Done: order ord_555 is confirmed.") in prompt
        assert "Let me call" not in prompt  # the text said alongside a tool call is not the answer
        # the tool data the judge checks the answer against: what the tools returned, not their wrappers
        assert _escape_json({"result": {"order": {"id": "ord_555", "status": "confirmed"}},
                             "tool": "complete_checkout"}) in prompt
        # and the judgment stored says so: the answer it graded, and the verdict (the case run's other stages,
        # e.g. Discovery on these scripted messages, are the stage tests' business)
        judgment = read_db(db, "SELECT status, answer_sha256 FROM judgments")[0]
        assert judgment == {"status": "complete", "answer_sha256": sha256_text("Done: order ord_555 is confirmed.")}
    finally:
        api.close()


def _escape_json(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False, sort_keys=True)


# -- the shapes, one by one -------------------------------------------------------------------

def _span(attrs: dict[str, Any], events: list[dict] | None = None, scope: str | None = None) -> SpanView:
    return SpanView("0" * 31 + "1", "00000000000000a1", None, "span", attrs, {}, events or [], "CLIENT", "UNSET",
                    None, scope, 1, 2)


STRANDS_TOOL = {"gen_ai.operation.name": "execute_tool", "gen_ai.tool.name": "complete_checkout",
                "gen_ai.provider.name": "strands-agents"}


@pytest.mark.parametrize("blocks, want", [
    ([{"text": '{"order": {"id": "ord_555", "status": "confirmed"}}'}],
     {"order": {"id": "ord_555", "status": "confirmed"}}),
    ([{"text": '{"order": '}, {"text": '{"id": "ord_555"}}'}], {"order": {"id": "ord_555"}}),  # text blocks joined
    ([{"text": "Booked."}], "Booked."),  # text that is not JSON stays text
    ([{"json": {"order": {"id": "ord_555"}}}], {"order": {"id": "ord_555"}}),
    ([{"image": {"format": "png"}}], [{"image": {"format": "png"}}]),  # nothing to unwrap: kept as it came
    ([{"text": "[" * 5000 + "]" * 5000}], "[" * 5000 + "]" * 5000),  # nested past the recursion limit: text
])
def test_strands_latest_tool_results_are_unwrapped_from_content_blocks(blocks, want):
    for value in (json.dumps(blocks), blocks):  # a JSON string, or a structured AnyValue
        record = normalize(_span({**STRANDS_TOOL, "gen_ai.tool.call.result": value}, scope="strands.telemetry.tracer"))
        assert record.result == want


def test_json_nested_past_the_recursion_limit_never_raises():
    record = normalize(_span({"gen_ai.operation.name": "execute_tool", "gen_ai.tool.name": "x",
                              "gen_ai.tool.call.arguments": "[" * 100_000 + "]" * 100_000}))
    assert record.span_id == "00000000000000a1"


CHAT = {"gen_ai.operation.name": "chat", "gen_ai.system": "openai", "gen_ai.request.model": "m"}


def _log(name: str, body: Any, named: bool = True) -> dict[str, Any]:
    """A log record joined to its span, as collector.session.held.log_events shapes it; ``named=False``: the record has
    no event_name of its own, only the ``event.name`` attribute the SDK's Events API wrote (SDK 1.30)."""
    return {"name": name if named else "log", "time_unix_nano": 1, "from_log": True,
            "attributes": {"event.name": name, "gen_ai.system": "openai", "body": body}}


@pytest.mark.parametrize("events, answer, finish", [
    # v1.28-v1.36 as log records: the body is the choice; the SDK of the time names it only in event.name
    ([_log("gen_ai.user.message", {"content": "Hi?"}, named=False),
      _log("gen_ai.choice", {"index": 0, "finish_reason": "stop", "message": {"role": "assistant", "content": "Done."}},
           named=False)],
     "Done.", "stop"),
    # a response with text and a tool call: the text is kept, the call is the finish reason
    ([_log("gen_ai.choice", {"index": 0, "finish_reason": "tool_calls", "message": {
        "role": "assistant", "content": "Let me look.",
        "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "s", "arguments": "{}"}}]}})],
     "Let me look.", "tool_call"),
    # OpenLLMetry puts tool_calls beside the message
    ([_log("gen_ai.choice", {"index": 0, "message": {"content": None, "role": "assistant"},
                             "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "s"}}]})],
     None, "tool_call"),
    # v1.28 as span events: the choice in the event's attributes, the message as JSON
    ([{"name": "gen_ai.choice", "attributes": {"index": 0, "finish_reason": "stop",
                                               "message": json.dumps({"role": "assistant", "content": "Hi."})}}],
     "Hi.", "stop"),
    # ... or as JSON in gen_ai.event.content (Azure AI Inference)
    ([{"name": "gen_ai.choice", "attributes": {"gen_ai.system": "az.ai.inference", "gen_ai.event.content": json.dumps(
        {"message": {"content": "Calling.", "tool_calls": [{"id": "c1", "type": "function"}]},
         "finish_reason": "tool_calls", "index": 0})}}],
     "Calling.", "tool_call"),
    # content as a list of parts
    ([_log("gen_ai.choice", {"index": 0, "finish_reason": "stop", "message": {
        "role": "assistant", "content": [{"type": "text", "text": "Part one. "}, {"type": "text", "text": "Two."}]}})],
     "Part one. Two.", "stop"),
    # before v1.28: the gen_ai.content.completion span event
    ([{"name": "gen_ai.content.prompt", "attributes": {"gen_ai.prompt": "user: hi"}},
      {"name": "gen_ai.content.completion", "attributes": {"gen_ai.completion": "Hello there."}}],
     "Hello there.", None),
    # ... holding JSON messages (Langtrace's form)
    ([{"name": "gen_ai.content.completion", "attributes": {"gen_ai.completion": json.dumps(
        [{"role": "assistant", "content": "From JSON."}])}}], "From JSON.", None),
])
def test_every_generation_of_content_events_gives_the_answer(events, answer, finish):
    record = normalize(_span(CHAT, events))
    assert (record.final_answer, record.finish_reason) == (answer, finish)


def test_openlits_none_for_a_tool_only_response_is_no_text():
    events = [{"name": "gen_ai.content.completion", "attributes": {"gen_ai.completion": "None"}}]
    record = normalize(_span({**CHAT, "gen_ai.response.finish_reasons": ["tool_calls"]}, events))
    assert (record.final_answer, record.finish_reason) == (None, "tool_call")


def test_the_text_of_output_messages_that_also_call_tools_is_kept():
    messages = [{"role": "assistant", "finish_reason": "tool_call", "parts": [
        {"type": "text", "content": "Checking stock."},
        {"type": "tool_call", "id": "c1", "name": "s", "arguments": {}}]}]
    record = normalize(_span({**CHAT, "gen_ai.output.messages": json.dumps(messages)}))
    assert (record.final_answer, record.finish_reason) == ("Checking stock.", "tool_call")

