"""What the user asked (``sessions.input``), the agent's own name, and Pydantic AI's answer text.

The recorded fixtures pin these end to end (tests/test_dialects.py); here each shape a dialect reads
is pinned on its own, with the cases the recordings do not hold: malformed and hostile values, the
turns of a session arriving in any order, the bound on the stored text, an older database upgraded.
"""

from __future__ import annotations

import itertools
import json
from datetime import datetime

import duckdb
import pytest

from agentfunnel.collector.session.rows import (INPUT_MAX_BYTES, ScoredSession, ScoringPass, bounded_input,
                                                 pass_rows, score_sessions, session_row)
from agentfunnel.collector.store.schema import MIGRATIONS, migrate
from agentfunnel.scoring import ScoringConfig, SessionScorer
from agentfunnel.scoring.assembled import Session, TraceShare
from agentfunnel.semconv import SpanRecord, SpanView, normalize
from agentfunnel.semconv.dialects.openinference import OpenInference
from agentfunnel.semconv.dialects.user_input import first_user_text, items, prompt_text

ASKED = "Buy the Trail Runner 2 in size 42."
NOW = datetime(2026, 1, 1)


def view(name: str = "span", attributes: dict | None = None, events: list | None = None, scope: str | None = None,
         parent: str | None = None, span_id: str = "00000000000000a1") -> SpanView:
    return SpanView("0" * 31 + "1", span_id, parent, name, attributes or {}, {}, events or [], scope_name=scope,
                    start_ns=1, end_ns=2)


GENAI_MESSAGES = [{"role": "system", "parts": [{"type": "text", "content": "Be brief."}]},
                  {"role": "user", "parts": [{"type": "text", "content": ASKED}]},
                  {"role": "assistant", "parts": [{"type": "text", "content": "Done."}]},
                  {"role": "user", "parts": [{"type": "text", "content": "Thanks."}]}]
CHAT = "chat m"
OP_CHAT = {"gen_ai.operation.name": "chat"}


@pytest.mark.parametrize("span", [
    # GenAI v1.37+: on the span (JSON text or structured), or only in the operation-details event
    view(CHAT, {**OP_CHAT, "gen_ai.input.messages": json.dumps(GENAI_MESSAGES)}),
    view(CHAT, {**OP_CHAT, "gen_ai.input.messages": GENAI_MESSAGES}),
    view(CHAT, OP_CHAT, [{"name": "gen_ai.client.inference.operation.details",
                          "attributes": {"gen_ai.input.messages": GENAI_MESSAGES}}]),
    # before v1.28: JSON messages, OpenLIT's transcript (in its span event), OpenLLMetry's indexed form
    view(CHAT, {**OP_CHAT, "gen_ai.prompt": json.dumps([{"role": "user", "content": ASKED}])}),
    view(CHAT, OP_CHAT, [{"name": "gen_ai.content.prompt",
                          "attributes": {"gen_ai.prompt": f"system: Be brief.\nuser: {ASKED}\nassistant: Done."}}]),
    view(CHAT, {"gen_ai.system": "openai", "llm.request.type": "chat", "gen_ai.prompt.0.role": "system",
                "gen_ai.prompt.0.content": "Be brief.", "gen_ai.prompt.1.role": "user",
                "gen_ai.prompt.1.content": ASKED}),
    # v1.28-v1.36 message events: a log record's body, Azure's JSON, Strands' content blocks
    view(CHAT, OP_CHAT, [{"name": "log", "from_log": True, "attributes": {
        "event.name": "gen_ai.user.message", "body": {"content": ASKED}}}]),
    view(CHAT, OP_CHAT, [{"name": "gen_ai.user.message", "attributes": {
        "gen_ai.event.content": json.dumps({"role": "user", "content": ASKED})}}]),
    view(CHAT, {**OP_CHAT, "gen_ai.system": "strands-agents"}, [
        {"name": "gen_ai.system.message", "attributes": {"content": '[{"text": "Be brief."}]'}},
        {"name": "gen_ai.user.message", "attributes": {"content": json.dumps([{"text": ASKED}])}}]),
    # OpenInference: flattened messages (from 1 when there are no instructions), the input value
    view("response", {"openinference.span.kind": "LLM", "llm.input_messages.1.message.role": "user",
                      "llm.input_messages.1.message.content": ASKED}),
    view("ChatModel", {"openinference.span.kind": "LLM", "llm.input_messages.0.message.role": "user",
                       "llm.input_messages.0.message.contents.0.message_content.type": "text",
                       "llm.input_messages.0.message.contents.0.message_content.text": ASKED}),
    view("ChatModel", {"openinference.span.kind": "LLM", "input.value": json.dumps({"messages": [[
        {"lc": 1, "type": "constructor", "id": ["langchain", "schema", "messages", "SystemMessage"],
         "kwargs": {"content": "Be brief."}},
        {"lc": 1, "type": "constructor", "id": ["langchain", "schema", "messages", "HumanMessage"],
         "kwargs": {"content": ASKED}}]]})}),
    view("agent", {"openinference.span.kind": "AGENT", "input.value": json.dumps(
        {"messages": [{"type": "human", "data": {"content": ASKED, "type": "human"}}]})}),
    view("agent", {"openinference.span.kind": "AGENT", "input.value": json.dumps({"messages": [["user", ASKED]]})}),
    view("AgentExecutor", {"openinference.span.kind": "AGENT", "input.value": json.dumps({"input": ASKED})}),
    view("crew", {"openinference.span.kind": "AGENT", "input.value": ASKED}),
    # the AI SDK (v3-v6): a run's prompt, a model call's messages (content as parts)
    view("ai.generateText", {"ai.operationId": "ai.generateText", "ai.prompt": json.dumps({"prompt": ASKED})}),
    view("ai.generateText", {"ai.operationId": "ai.generateText", "ai.prompt": json.dumps(
        {"system": "Be brief.", "messages": [{"role": "user", "content": ASKED}]})}),
    view("ai.generateText.doGenerate", {"ai.operationId": "ai.generateText.doGenerate",
                                        "ai.prompt.messages": json.dumps([{"role": "system", "content": "Be brief."}, {
                                            "role": "user", "content": [{"type": "text", "text": ASKED}]}])}),
    # Langfuse: a generation's messages, an agent's text, the trace's input
    view("chat", {"langfuse.observation.type": "generation", "langfuse.observation.input": json.dumps(
        [{"role": "system", "content": "Be brief."}, {"role": "user", "content": ASKED}])}),
    view("agent", {"langfuse.observation.type": "agent", "langfuse.observation.input": ASKED}),
    view("step", {"langfuse.observation.type": "span", "langfuse.trace.input": ASKED,
                  "langfuse.observation.input": json.dumps({"args": ["x"], "kwargs": {}})}),
    # ADK 1.x: the model request; Pydantic AI: the run's messages
    view("call_llm", {"gcp.vertex.agent.llm_request": json.dumps(
        {"model": "m", "contents": [{"role": "user", "parts": [{"text": ASKED}]}]})}, scope="gcp.vertex.agent"),
    view("invoke_agent a", {"gen_ai.operation.name": "invoke_agent", "pydantic_ai.all_messages": json.dumps(
        GENAI_MESSAGES)}, scope="pydantic-ai"),
], ids=lambda v: ",".join(sorted(v.attributes))[:60] or v.events[0]["name"])
def test_each_convention_gives_the_first_user_message(span):
    assert normalize(span).input_message == ASKED


@pytest.mark.parametrize("span", [
    view("search", {"openinference.span.kind": "TOOL", "tool.name": "search", "input.value": ASKED}),
    view("execute_tool s", {"gen_ai.operation.name": "execute_tool", "gen_ai.tool.name": "s",
                            "gen_ai.input.messages": json.dumps(GENAI_MESSAGES)}),
    view("search", {"langfuse.observation.type": "tool", "langfuse.observation.input": ASKED}),
    view("step", {"langfuse.observation.type": "span", "langfuse.observation.input": ASKED}),  # a function's input
    view("node", {"openinference.span.kind": "CHAIN", "input.value": ASKED}),  # any chain: not what was asked
    view(CHAT, {**OP_CHAT, "gen_ai.input.messages": json.dumps([GENAI_MESSAGES[0], GENAI_MESSAGES[2]])}),
], ids=["oi-tool", "genai-tool", "langfuse-tool", "langfuse-span", "oi-chain", "no-user-message"])
def test_tool_inputs_and_other_text_are_not_what_the_user_asked(span):
    assert normalize(span).input_message is None


@pytest.mark.parametrize("value", [
    "[", "[1,", '[{"role": "user", "content": ', "[" * 100_000, '{"role": "user"}', "null", "[]", "[ ]",
    '[{"role": "user", "content": 5}]', '[{"role": 7}]', '[["user"]]', '[{"lc": 1, "kwargs": 3}]',
    '[{"type": "human", "data": []}]', '[[[[]]]]', 12, None, {"messages": 3},
])
def test_malformed_messages_read_as_none_and_never_raise(value):
    assert first_user_text(value) is None
    for attrs in ({**OP_CHAT, "gen_ai.input.messages": value}, {"openinference.span.kind": "LLM", "input.value": value},
                  {"openinference.span.kind": "AGENT", "input.value": value}, {**OP_CHAT, "gen_ai.prompt": value},
                  {"ai.operationId": "ai.generateText", "ai.prompt": value},
                  {"langfuse.observation.type": "generation", "langfuse.observation.input": value}):
        normalize(view(attributes=attrs))


def test_a_conversation_is_decoded_only_up_to_its_first_user_message():
    """The history after it is never parsed: a tail that is not JSON at all still gives the message."""
    text = json.dumps([{"role": "system", "content": "Be brief."}, {"role": "user", "content": ASKED}])
    assert first_user_text(text[:-1] + ', {"role": "assistant", "content": BROKEN') == ASKED
    assert list(items("[1, 2 ,3 ]")) == [1, 2, 3] and list(items("[1 2]")) == [1]


def test_a_transcript_is_only_read_as_one_when_it_starts_with_a_role():
    assert prompt_text("Summarize this:\nuser: said hello") == "Summarize this:\nuser: said hello"
    assert prompt_text(f"system: Be brief.\nuser: {ASKED}\nsecond line\nassistant: Done.") == f"{ASKED}\nsecond line"
    assert prompt_text("system: only a system prompt") is None


# -- the agent's own name -------------------------------------------------------------------------

def test_an_openai_agents_trace_span_names_the_workflow_and_the_agent_span_the_agent():
    scope = "openinference.instrumentation.openai_agents"
    root = normalize(view("shopping workflow", {"openinference.span.kind": "AGENT"}, scope=scope))
    agent = normalize(view("shopping-agent", {"openinference.span.kind": "AGENT", "agent.name": "shopping-agent"},
                           scope=scope, parent=root.span_id, span_id="00000000000000a2"))
    assert (root.agent_name, root.workflow_name) == (None, "shopping workflow")
    assert (agent.agent_name, agent.workflow_name) == ("shopping-agent", None)
    # an AGENT span of any other instrumentation is named after its run, as before
    assert normalize(view("triage", {"openinference.span.kind": "AGENT"})).agent_name == "triage"


def test_a_genai_workflow_names_the_session_only_when_no_agent_does():
    workflow = {"gen_ai.operation.name": "invoke_workflow", "gen_ai.workflow.name": "shop flow"}
    root = normalize(view("invoke_workflow shop flow", workflow))
    assert (root.agent_name, root.workflow_name) == (None, "shop flow")
    agent = normalize(view("invoke_agent shopper", {"gen_ai.operation.name": "invoke_agent"},
                           parent=root.span_id, span_id="00000000000000a2"))
    scorer = SessionScorer()
    assert scorer.score("s", [root, agent]).agent_name == "shopper"
    assert scorer.score("s", [root]).agent_name == "shop flow"
    # a configuration naming the agent (or the workflow) pins the variant, wherever the name is
    for name in ("shopper", "shop flow"):
        configured = SessionScorer(ScoringConfig.model_validate({"funnel": {"agents": {name: "procurement"}}}))
        score = configured.score("s", [root, agent])
        assert (score.variant, score.variant_source) == ("procurement", "config")


def test_langchain_metadata_names_the_agent_and_the_user():
    metadata = {"lc_agent_name": "researcher", "user_id": "u-7", "thread_id": "t"}
    span = view("LangGraph", {"openinference.span.kind": "AGENT", "metadata": json.dumps(metadata)})
    found = OpenInference().extract(span)
    assert (found["agent_name"], found["user_id"]) == ("researcher", "u-7")
    assert OpenInference().extract(view("x", {"openinference.span.kind": "LLM", "metadata": json.dumps(
        {"langfuse_user_id": "u-8"})}))["user_id"] == "u-8"
    assert "user_id" not in OpenInference().extract(view("x", {"openinference.span.kind": "LLM", "metadata": "{}"}))
    assert normalize(span).agent_name == "researcher"


def test_crewai_agent_spans_are_named_after_the_agents_role():
    attributes = {"openinference.span.kind": "AGENT", "graph.node.id": "hotel_agent"}
    span = view("hotel_agent.Find me a hotel.execute", attributes, scope="openinference.instrumentation.crewai._event_listener")
    assert OpenInference().extract(span)["agent_name"] == "hotel_agent"
    # another instrumentor's graph node is not an agent's name
    assert OpenInference().extract(view("graph.run", attributes, scope="other"))["agent_name"] == "graph.run"


def test_a_user_named_only_in_langchain_metadata_is_the_records_user():
    span = view("LangGraph", {"openinference.span.kind": "AGENT", "metadata": json.dumps({"user_id": "u-7"})})
    assert normalize(span).user_id == "u-7"
    # an attribute still wins over the metadata
    assert normalize(view("LangGraph", {"openinference.span.kind": "AGENT", "user.id": "u-1",
                                        "metadata": json.dumps({"user_id": "u-7"})})).user_id == "u-1"


# -- Pydantic AI's answer ---------------------------------------------------------------------------

SCHEMA = json.dumps({"type": "object", "properties": {"final_result": {"type": "object"}}})


@pytest.mark.parametrize("final, schema, answer", [
    ('{"answer":"Done."}', SCHEMA, "Done."),  # output_type=Reply: its one field
    ({"answer": "Done."}, None, "Done."),  # the same, as a structured value
    ('{"answer":"Done.","confidence":0.9}', SCHEMA, '{"answer": "Done.", "confidence": 0.9}'),  # stays JSON
    ('[{"type":"text","content":"Do"},{"type":"text","content":"ne."}]',
     json.dumps({"properties": {"final_result": {"type": "array"}}}), "Done."),  # text parts: their text
    ('{"answer":"Done."}', json.dumps({"properties": {"pydantic_ai.all_messages": {"type": "array"}}}),
     '{"answer":"Done."}'),  # a text output that happens to be JSON is text
    ("Done.", None, "Done."),
])
def test_pydantic_ai_final_answer_is_the_answer_text(final, schema, answer):
    attrs = {"gen_ai.operation.name": "invoke_agent", "final_result": final}
    if schema:
        attrs["logfire.json_schema"] = schema
    assert normalize(view("invoke_agent a", attrs, scope="pydantic-ai")).final_answer == answer


# -- the session's input --------------------------------------------------------------------------

def turn(trace: int, start: int, asked: str | None) -> list[SpanRecord]:
    tid = f"{trace:032x}"
    return [SpanRecord(tid, f"{trace:08x}00000001", None, "agent", "otel_genai", "agent", agent_name="a",
                       start_ns=start, end_ns=start + 10),
            SpanRecord(tid, f"{trace:08x}00000002", f"{trace:08x}00000001", "chat", "otel_genai", "llm",
                       input_message=asked, final_answer="ok", finish_reason="stop", start_ns=start + 1,
                       end_ns=start + 5)]


def test_the_first_turns_message_is_the_sessions_input_whatever_order_turns_arrive_in():
    turns = [turn(1, 100, "first question"), turn(2, 200, "second question"), turn(3, 50, None)]
    scorer = SessionScorer()
    for order in itertools.permutations(turns):
        summaries = [scorer.summarize(t) for t in order]
        assert scorer.combine("s", summaries).input_message == "first question"
        # a turn arriving later but asked earlier takes over: its summary is read like the others
        earlier = scorer.summarize(turn(4, 10, "the very first"))
        assert scorer.combine("s", [*summaries, earlier]).input_message == "the very first"


def scored(asked: str) -> ScoredSession:
    share = TraceShare("0" * 31 + "1", tuple(turn(1, 100, asked)))
    session = Session("s", {share.trace_id: share})
    scoring = score_sessions({"s": session}, ["s"], SessionScorer().score_session, {})
    return scoring.written[0]


def test_the_stored_input_is_bounded_marked_and_counted():
    short, long = scored(ASKED), scored("é" * INPUT_MAX_BYTES)  # two bytes a character: twice the bound
    assert session_row(short, NOW)["input"] == ASKED
    cut = session_row(long, NOW)["input"]
    assert cut.startswith("é" * (INPUT_MAX_BYTES // 2))
    assert cut.endswith(f"[truncated by agentfunnel: {INPUT_MAX_BYTES} more bytes]")
    assert session_row(long, NOW, max_input_bytes=3)["input"].startswith("é…")  # never half a character
    assert pass_rows(ScoringPass([short, long], [], ["s"]), NOW).inputs_truncated == 1
    assert bounded_input(None) is None


def test_an_older_database_gets_the_input_column_and_keeps_its_rows():
    con = duckdb.connect()
    before = [m for m in MIGRATIONS if m[0] < "0008"]
    migrate(con, before)
    con.execute("INSERT INTO sessions (session_id, agent_name) VALUES ('old', 'a')")
    assert migrate(con)[0] == "0008_session_input"
    assert con.execute("SELECT session_id, agent_name, input FROM sessions").fetchall() == [("old", "a", None)]
    con.execute("SELECT * FROM experiment_summary").fetchall()  # the views over sessions still bind
    con.execute("SELECT * FROM outcome_mix").fetchall()
