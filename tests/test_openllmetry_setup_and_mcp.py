"""OpenLLMetry readings that were misread: agent set-up traces, models known only from run metadata,
and Traceloop's MCP client spans (SPEC §3, §4, §5).

- ``langchain.agents.create_agent`` is recorded as a one-span trace of its own: defining an agent is
  set-up, so that trace forms no session (its span is still a record, ignored as ``agent_setup``).
- A chat model that reports no model (``gen_ai.request.model=unknown``) is known from
  ``traceloop.association.properties.ls_model_name``.
- ``initialize.mcp`` / ``tools/list.mcp`` spans (opentelemetry-instrumentation-mcp) are a handshake
  and a listing, not unknown spans; a listing inside a session is generic ``discover``.
"""

from __future__ import annotations

from pathlib import Path

from agentfunnel.collector.session.assembly import assemble
from agentfunnel.collector.decode import decode_traces_protobuf
from agentfunnel.scoring import SessionScorer
from agentfunnel.semconv import SpanView, normalize
from conftest import FIXTURES

LANGGRAPH = FIXTURES / "otlp" / "langgraph-openllmetry"
MCP_SCOPE = "opentelemetry.instrumentation.mcp.instrumentation"
LC_SCOPE = "opentelemetry.instrumentation.langchain"
TRACE = "ab" * 16


def views_of(path: Path) -> list[SpanView]:
    b = decode_traces_protobuf(path.read_bytes())
    return [SpanView(b.trace_id[i], b.span_id[i], b.parent_span_id[i], b.name[i], b.attrs[i], b.resource_attrs[i],
                     b.event_list[i], b.kind[i], b.status_code[i], b.status_message[i], b.scope_name[i],
                     b.start_ns[i], b.end_ns[i]) for i in range(len(b))]


def span(n: int, name: str, attributes: dict, parent: int | None = None, scope: str = LC_SCOPE,
         trace: str = TRACE, status: str = "UNSET") -> SpanView:
    return SpanView(trace, f"{n:016x}", f"{parent:016x}" if parent else None, name, attributes, {}, [], "INTERNAL",
                    status, None, scope, n * 1000, n * 1000 + 900)


CREATE_AGENT = {"gen_ai.operation.name": "create_agent", "gen_ai.provider.name": "langchain",
                "gen_ai.agent.name": "shopping_agent", "gen_ai.system_instructions": "You are a shopping assistant."}


# --- create_agent is set-up

def test_the_recorded_create_agent_trace_forms_no_session_and_the_run_keeps_its_own():
    by_trace: dict[str, list[SpanView]] = {}
    for v in views_of(LANGGRAPH / "procurement_multiturn.traces.binpb"):
        by_trace.setdefault(v.trace_id, []).append(v)
    setup = [t for t in by_trace.values() if any(v.name.startswith("create_agent ") for v in t)]
    assert len(setup) == 1 and len(setup[0]) == 1  # one definition, a trace of its own, for two turns
    assembled = assemble(setup[0])
    assert assembled.session_ids == set()
    assert [(r.kind, r.ignored, r.agent_name) for r in assembled.records] == [("agent", "agent_setup",
                                                                                "procurement_agent")]
    runs = [assemble(t) for t in by_trace.values() if t is not setup[0]]
    assert [r.session_ids for r in runs] == [{"conv-langgraph-openllmetry-procurement_multiturn"}] * 2


def test_create_agent_alone_is_set_up_but_inside_a_run_it_stays_an_agent_span():
    assert assemble([span(1, "create_agent shopping_agent", CREATE_AGENT)]).session_ids == set()
    # by span name too, when an emitter leaves the operation out
    assert assemble([span(1, "create_agent shopping_agent", {"gen_ai.agent.name": "a"})]).session_ids == set()
    with_model = assemble([
        span(1, "create_agent shopping_agent", {**CREATE_AGENT, "gen_ai.conversation.id": "c1"}),
        span(2, "chat gpt-4o", {"gen_ai.operation.name": "chat", "gen_ai.request.model": "gpt-4o"}, parent=1)])
    assert with_model.session_ids == {"c1"}
    assert [r.ignored for r in with_model.records] == [None, None]
    invoke = assemble([span(1, "invoke_agent shopping_agent", {"gen_ai.operation.name": "invoke_agent"})])
    assert invoke.session_ids == {TRACE}  # a run with nothing else in it is still agent activity


# --- the model from run metadata

def chat(attributes: dict) -> SpanView:
    return span(1, "ScriptedChatModel.chat", {
        "traceloop.workflow.name": "shopping_agent", "gen_ai.operation.name": "chat",
        "traceloop.association.properties.ls_provider": "ollama", **attributes})


def test_the_model_comes_from_ls_model_name_only_when_the_span_does_not_know_it():
    ls = {"traceloop.association.properties.ls_model_name": "llama3.2"}
    assert normalize(chat({**ls, "gen_ai.request.model": "unknown", "gen_ai.response.model": "unknown"})).model == \
        "llama3.2"
    assert normalize(chat(ls)).model == "llama3.2"
    assert normalize(chat({**ls, "gen_ai.request.model": "unknown", "gen_ai.response.model": "gpt-4o-2024-08-06"})) \
        .model == "gpt-4o-2024-08-06"
    assert normalize(chat({**ls, "gen_ai.request.model": "gpt-4o"})).model == "gpt-4o"
    assert normalize(chat({"gen_ai.request.model": "unknown"})).model is None
    # run metadata on a span that is no model call names no model
    task = span(2, "execute_task model", {"traceloop.span.kind": "task", **ls})
    assert normalize(task).model is None


def test_a_bare_chat_model_span_with_only_association_properties_is_read():
    bare = span(1, "ChatOllama.chat", {"gen_ai.operation.name": "chat", "gen_ai.request.model": "unknown",
                                       "traceloop.association.properties.ls_model_name": "llama3.2"})
    record = normalize(bare)
    assert (record.dialect, record.kind, record.model) == ("openllmetry", "llm", "llama3.2")


def test_the_recorded_chat_spans_read_the_model_from_run_metadata():
    views = views_of(LANGGRAPH / "shop_purchase.traces.binpb")
    chats = [v for v in views if v.name.endswith(".chat")]
    assert chats and all(v.attributes.get("gen_ai.request.model") == "unknown"
                         and v.attributes.get("gen_ai.response.model", "unknown") == "unknown" for v in chats)
    assert {normalize(v).model for v in chats} == {"scripted-tool-caller"}
    by_trace: dict[str, list[SpanView]] = {}
    for v in views:
        by_trace.setdefault(v.trace_id, []).append(v)
    run = next(assemble(t) for t in by_trace.values() if len(t) > 1)
    score = SessionScorer().score("conv-langgraph-openllmetry-shop_purchase", run.records)
    assert score.model == "scripted-tool-caller"


# --- Traceloop's MCP client spans

def test_initialize_and_tools_list_spans_are_a_handshake_and_a_listing():
    for method in ("initialize", "tools/list", "ping", "notifications/initialized"):
        record = normalize(span(1, f"{method}.mcp", {}, scope=MCP_SCOPE))
        assert (record.dialect, record.kind, record.mcp_method, record.ignored) == ("openllmetry", "other", method,
                                                                                    "protocol"), method
    other = normalize(span(1, "resources/read.mcp", {"traceloop.entity.input": "{}"}, scope=MCP_SCOPE))
    assert (other.kind, other.mcp_method, other.ignored) == ("other", "resources/read", None)
    # the server-side response writer is Traceloop's too, and no activity
    writer = normalize(span(1, "ResponseStreamWriter", {"mcp.request.id": "2"}, scope=MCP_SCOPE))
    assert (writer.dialect, writer.kind) == ("openllmetry", "other")


def test_a_handshake_and_listing_trace_forms_no_session_but_a_listing_in_a_session_is_discover():
    handshake = assemble([span(1, "initialize.mcp", {}, scope=MCP_SCOPE),
                          span(2, "tools/list.mcp", {}, scope=MCP_SCOPE)])
    assert handshake.session_ids == set()
    run = assemble([
        span(1, "support_agent.workflow", {"traceloop.span.kind": "workflow", "traceloop.entity.name": "support_agent",
                                           "traceloop.association.properties.session_id": "s-mcp"}),
        span(2, "initialize.mcp", {}, parent=1, scope=MCP_SCOPE),
        span(3, "tools/list.mcp", {}, parent=1, scope=MCP_SCOPE)])
    assert run.session_ids == {"s-mcp"}
    score = SessionScorer().score("s-mcp", run.records)
    assert (score.variant, score.steps, score.outcome) == ("generic", ("discover",), "read_only")


def test_mcp_tool_spans_unwrap_the_instrumentation_payloads():
    tool = span(1, "search_products.tool", {
        "traceloop.span.kind": "tool", "traceloop.entity.name": "search_products",
        "traceloop.entity.input": '{"tool_name": "search_products", "arguments": {"query": "trail runner"}}',
        "traceloop.entity.output": '{"result": "{\\"products\\": [{\\"id\\": \\"prod_123\\"}]}"}'}, scope=MCP_SCOPE)
    record = normalize(tool)
    assert (record.kind, record.tool_name) == ("tool", "search_products")
    assert record.arguments == {"query": "trail runner"}
    assert record.result == {"products": [{"id": "prod_123"}]}
    failed = span(2, "complete_checkout.tool", {
        "traceloop.span.kind": "tool", "traceloop.entity.name": "complete_checkout", "error.type": "tool_error",
        "traceloop.entity.output": '{"result": "payment method required", "is_error": true}'}, scope=MCP_SCOPE,
        status="ERROR")
    record = normalize(failed)
    assert record.result == "payment method required" and record.error
    # content capture off: name only, and the call still reaches its step
    bare = normalize(span(3, "complete_checkout.tool", {
        "traceloop.span.kind": "tool", "traceloop.entity.name": "complete_checkout"}, scope=MCP_SCOPE))
    assert (bare.tool_name, bare.arguments, bare.result) == ("complete_checkout", None, None)
    assert SessionScorer().score("s", [bare]).outcome == "checkout_reached"
