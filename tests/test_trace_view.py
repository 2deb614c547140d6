"""The session page's trace view, without a server: each model call's messages in order whatever convention
wrote them, JSON (and JSON inside strings) as bounded trees, tokens and cost per span, one time axis per trace."""

from __future__ import annotations

import json

import pytest

from agentfunnel.collector.config import ConfigError, UISettings, load_settings
from agentfunnel.collector.ui.jsontree import TreeBudget, parse_json_text
from agentfunnel.collector.ui.model import waterfall
from agentfunnel.scoring.prices import PriceTable
from agentfunnel.semconv.dialects import read_messages
from agentfunnel.semconv.records import SpanView

SYSTEM = [{"type": "text", "content": "You are a buyer."}]
DEFS = json.dumps([{"type": "function", "name": "search", "parameters": {"type": "object"}}])


def call_messages(attrs):
    """A model call's messages as the trace view reads them: the dialect registry's reading of the span."""
    return read_messages(SpanView("a" * 32, "b" * 16, None, "chat", attrs))


def _roles(messages):
    return [(m.role, m.text, [(c.name, c.arguments) for c in m.tool_calls], [(r.id, r.result) for r in m.tool_results],
             m.output) for m in messages]


def test_an_otel_genai_call_reads_system_prompt_tool_calls_results_and_response_in_order():
    attrs = {"gen_ai.system_instructions": json.dumps(SYSTEM), "gen_ai.input.messages": json.dumps([
        {"role": "user", "parts": [{"type": "text", "content": "Find bolts"}]},
        {"role": "assistant", "parts": [{"type": "tool_call", "id": "c1", "name": "search", "arguments": {"q": "bolt"}}]},
        {"role": "tool", "parts": [{"type": "tool_call_response", "id": "c1", "response": {"items": [1]}}]}]),
        "gen_ai.output.messages": json.dumps([{"role": "assistant", "parts": [{"type": "text", "content": "Found one"}]}])}
    assert _roles(call_messages(attrs)) == [
        ("system", "You are a buyer.", [], [], False), ("user", "Find bolts", [], [], False),
        ("assistant", "", [("search", {"q": "bolt"})], [], False), ("tool", "", [], [("c1", {"items": [1]})], False),
        ("assistant", "Found one", [], [], True)]


def test_openllmetry_and_openinference_flattened_lists_read_back_with_their_tool_calls():
    openllmetry = {"gen_ai.prompt.0.role": "system", "gen_ai.prompt.0.content": "Be brief.",
                   "gen_ai.prompt.1.role": "user", "gen_ai.prompt.1.content": "Find bolts",
                   "gen_ai.prompt.2.role": "assistant", "gen_ai.prompt.2.tool_calls.0.name": "search",
                   "gen_ai.prompt.2.tool_calls.0.arguments": '{"q": "bolt"}',
                   "gen_ai.prompt.3.role": "tool", "gen_ai.prompt.3.content": '{"items": []}',
                   "gen_ai.prompt.3.tool_call_id": "c1",
                   "gen_ai.completion.0.role": "assistant", "gen_ai.completion.0.content": "None found"}
    assert _roles(call_messages(openllmetry)) == [
        ("system", "Be brief.", [], [], False), ("user", "Find bolts", [], [], False),
        ("assistant", "", [("search", '{"q": "bolt"}')], [], False), ("tool", "", [], [("c1", '{"items": []}')], False),
        ("assistant", "None found", [], [], True)]
    openinference = {"llm.input_messages.0.message.role": "user", "llm.input_messages.0.message.content": "Hi",
                     "llm.output_messages.0.message.role": "assistant",
                     "llm.output_messages.0.message.tool_calls.0.tool_call.function.name": "search",
                     "llm.output_messages.0.message.tool_calls.0.tool_call.function.arguments": '{"q": "x"}'}
    assert _roles(call_messages(openinference)) == [("user", "Hi", [], [], False),
                                                    ("assistant", "", [("search", '{"q": "x"}')], [], True)]


def test_a_vercel_ai_call_reads_its_prompt_parts_and_the_tool_calls_it_asked_for():
    attrs = {"ai.prompt.messages": json.dumps([
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": [{"type": "text", "text": "Find bolts"}]},
        {"role": "assistant", "content": [{"type": "tool-call", "toolCallId": "t1", "toolName": "search", "args": {"q": 1}}]},
        {"role": "tool", "content": [{"type": "tool-result", "toolCallId": "t1", "result": {"n": 0}}]}]),
        "ai.response.toolCalls": json.dumps([{"toolCallId": "t2", "toolName": "order", "args": '{"sku": "B"}'}])}
    assert _roles(call_messages(attrs)) == [
        ("system", "Be brief.", [], [], False), ("user", "Find bolts", [], [], False),
        ("assistant", "", [("search", {"q": 1})], [], False), ("tool", "", [], [("t1", {"n": 0})], False),
        ("assistant", "", [("order", '{"sku": "B"}')], [], True)]


def test_a_tool_span_has_no_messages_and_odd_values_do_not_raise():
    assert call_messages({"gen_ai.tool.name": "search", "gen_ai.input.messages": "[]"}) == []
    for odd in ({"gen_ai.input.messages": "[" * 100_000}, {"gen_ai.input.messages": 7},
                {"gen_ai.prompt.x.role": "user", "gen_ai.prompt.99999.role": "user"}, {"ai.prompt": "{not json"}):
        call_messages(odd)


def test_a_json_string_inside_json_is_a_tree_of_its_own():
    block = TreeBudget().block(json.dumps({"gen_ai.tool.definitions": DEFS, "n": 3, "ok": True, "none": None}))
    assert block is not None and block.plain is None
    defs = block.tree.children[0]
    assert (defs.key, defs.kind, defs.from_string) == ("gen_ai.tool.definitions", "array", True)
    assert [c.key for c in defs.children[0].children] == ["type", "name", "parameters"]
    assert [(c.kind, c.text) for c in block.tree.children[1:]] == [("number", "3"), ("bool", "true"), ("null", "null")]
    assert parse_json_text('"just a string"') is None and parse_json_text("[1, 2") is None
    assert TreeBudget().block("plain words").text == "plain words"


def test_trees_are_bounded_by_bytes_depth_and_the_page():
    settings = UISettings(max_json_tree_bytes=200, max_json_tree_depth=3, max_json_tree_page_bytes=300)
    budget = TreeBudget(settings)
    big = budget.block({"x": "y" * 300})
    assert big.tree is None and big.plain == "bytes" and '"x"' in big.text and big.size > 200
    deep = budget.block({"a": {"b": {"c": {"d": 1}}}})
    node = deep.tree
    for key in "abc":
        node = node.children[0]
        assert node.key == key
    assert node.kind == "text" and node.text == '{"d": 1}'  # past the depth limit: compact text
    budget.block({"k": "v" * 150})
    spent = budget.block({"k": "v" * 150})
    assert spent.tree is None and spent.plain == "page"
    nested = TreeBudget().block(json.dumps({"s": "[" * 5000 + "]" * 5000}))  # nesting past Python's recursion limit
    assert nested is not None


def test_ui_settings_name_the_field_of_a_bad_value(tmp_path):
    config = tmp_path / "c.yaml"
    config.write_text("ui:\n  max_json_tree_bytes: 0\n")
    with pytest.raises(ConfigError, match="ui.max_json_tree_bytes"):
        load_settings(config)


def _span(trace, span, parent, start_ms, end_ms, attrs, name="chat"):
    return {"trace_id": trace, "span_id": span, "parent_span_id": parent, "name": name, "kind": "CLIENT",
            "start_us": start_ms * 1000, "end_us": end_ms * 1000, "start_time": f"2026-01-01T00:00:{start_ms // 1000:02d}",
            "status_code": "UNSET", "attributes": json.dumps(attrs), "events": None}


def test_each_trace_has_its_own_time_axis_and_each_model_call_its_tokens_and_cost():
    chat = {"gen_ai.operation.name": "chat", "gen_ai.request.model": "gpt-4o", "gen_ai.usage.input_tokens": 1000,
            "gen_ai.usage.output_tokens": 100,
            "gen_ai.input.messages": json.dumps([{"role": "user", "parts": [{"type": "text", "content": "hi"}]}])}
    agent = {"gen_ai.operation.name": "invoke_agent", "gen_ai.agent.name": "a"}
    spans = [_span("t1", "r1", None, 0, 2000, agent, "invoke_agent"), _span("t1", "c1", "r1", 500, 1500, chat),
             _span("t2", "r2", None, 60_000, 61_000, agent, "invoke_agent"), _span("t2", "c2", "r2", 60_000, 60_250, chat)]
    prices = PriceTable()
    traces = waterfall(spans, [], TreeBudget(), prices)
    assert [(t.trace_id, t.n, t.duration_ms) for t in traces] == [("t1", 1, 2000.0), ("t2", 2, 1000.0)]
    for t in traces:  # the root spans its own trace, whatever came before it
        assert (t.spans[0].offset, t.spans[0].width) == (0.0, 100.0)
    assert (traces[0].spans[1].offset, traces[0].spans[1].width) == (25.0, 50.0)
    assert (traces[1].spans[1].offset, traces[1].spans[1].width) == (0.0, 25.0)
    c1 = traces[0].spans[1]
    assert (c1.input_tokens, c1.output_tokens, c1.model) == (1000, 100, "gpt-4o")
    assert c1.cost == prices.cost("gpt-4o", 1000, 100) and c1.cost is not None
    assert [(m.role, m.text) for m in c1.messages] == [("user", "hi")]
    assert traces[0].spans[0].input_tokens is None and traces[0].input_tokens == 1000
