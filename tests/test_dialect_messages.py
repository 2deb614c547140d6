"""Each dialect reads its own messages into semconv's one message shape; the registry picks the reader."""

from __future__ import annotations

import json

from agentfunnel.collector.ui.conversation import call_messages
from agentfunnel.semconv.dialects import read_messages
from agentfunnel.semconv.records import SpanView

SHAPES = [
    {"gen_ai.input.messages": json.dumps([{"role": "user", "parts": [{"type": "text", "content": "Find bolts"}]}]),
     "gen_ai.output.messages": json.dumps([{"role": "assistant", "parts": [
         {"type": "tool_call", "id": "c1", "name": "search", "arguments": {"q": "bolt"}}]}])},
    {"gen_ai.prompt.0.role": "user", "gen_ai.prompt.0.content": "Find bolts",
     "gen_ai.completion.0.role": "assistant", "gen_ai.completion.0.content": "None found"},
    {"llm.input_messages.0.message.role": "user", "llm.input_messages.0.message.content": "Hi",
     "llm.output_messages.0.message.tool_calls.0.tool_call.function.name": "search"},
    {"ai.prompt.messages": json.dumps([{"role": "user", "content": "Find bolts"}]), "ai.response.text": "Done",
     "ai.response.toolCalls": json.dumps([{"toolCallId": "t2", "toolName": "order", "args": "{}"}])},
]


def _plain(messages):
    return [(m.role, m.text, [(c.name, c.arguments, c.id) for c in m.tool_calls],
             [(r.id, r.result) for r in m.tool_results], m.output) for m in messages]


def test_the_registry_reads_every_shape_as_the_trace_view_did():
    for attrs in SHAPES:
        got = read_messages(SpanView("a" * 32, "b" * 16, None, "call", attrs))
        assert got and _plain(got) == _plain(call_messages(attrs)), attrs


def test_a_runs_input_counts_only_without_other_messages():
    run = SpanView("a" * 32, "b" * 16, None, "agent", {"openinference.span.kind": "AGENT", "input.value": "Find bolts"})
    assert [(m.role, m.text, m.run) for m in read_messages(run)] == [("user", "Find bolts", True)]


class _Misspelled:
    name = "misspelled"
    marks = __import__("agentfunnel.semconv.dialects.base", fromlist=["Marks"]).Marks(keys=frozenset({"x.kind"}))

    def extract(self, span):
        return {"kind": "tool", "tool_nmae": "search"} if span.name == "typo" else {}["kind"]

    def messages(self, span):
        return None


def test_strict_normalize_names_the_dialect_span_and_field_the_lenient_default_drops():
    import pytest
    from agentfunnel.semconv.normalize import NormalizeError, normalize
    typo = SpanView("a" * 32, "b" * 16, None, "typo", {"x.kind": 1})
    assert normalize(typo, (_Misspelled(),)).tool_name is None  # lenient: dropped
    with pytest.raises(NormalizeError, match=r"misspelled.*'tool_nmae'.*bbbb"):
        normalize(typo, (_Misspelled(),), strict=True)
    with pytest.raises(NormalizeError, match=r"misspelled could not read span b+ \('boom'\): KeyError"):
        normalize(SpanView("a" * 32, "b" * 16, None, "boom", {"x.kind": 1}), (_Misspelled(),), strict=True)
