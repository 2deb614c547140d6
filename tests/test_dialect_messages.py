"""Each dialect reads its own messages into semconv's one message shape; the registry picks the reader."""

from __future__ import annotations

import json

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


READ = [
    [("user", "Find bolts", [], [], False), ("assistant", "", [("search", {"q": "bolt"}, "c1")], [], True)],
    [("user", "Find bolts", [], [], False), ("assistant", "None found", [], [], True)],
    [("user", "Hi", [], [], False), ("assistant", "", [("search", None, None)], [], True)],
    [("user", "Find bolts", [], [], False), ("assistant", "Done", [("order", "{}", "t2")], [], True)],
]


def test_the_registry_reads_every_shape():
    for attrs, expected in zip(SHAPES, READ, strict=True):
        assert _plain(read_messages(SpanView("a" * 32, "b" * 16, None, "call", attrs))) == expected, attrs


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


def _rows(views):
    """A recording's spans as the UI's queries return them, and its tool calls (the spans normalize calls so)."""
    import datetime as dt

    from agentfunnel.semconv.normalize import normalize

    def iso(ns):
        return dt.datetime.fromtimestamp(ns / 1e9, dt.UTC).isoformat()

    spans = sorted(({"trace_id": v.trace_id, "span_id": v.span_id, "parent_span_id": v.parent_span_id, "name": v.name,
                     "start_time": iso(v.start_ns), "end_time": iso(v.end_ns), "attributes": json.dumps(v.attributes),
                     "events": json.dumps(v.events, default=str)} for v in views), key=lambda r: (r["start_time"], r["span_id"]))
    records = {v.span_id: normalize(v) for v in views}
    calls = [{"span_id": s["span_id"], "tool_name": records[s["span_id"]].tool_name, "result": records[s["span_id"]].result}
             for s in spans if records[s["span_id"]].is_tool_call]
    return spans, calls


def test_every_recordings_conversation_shows_a_model_calls_request_once_and_never_shows_a_tool_result_as_the_user():
    """The history every model call repeats is shown once (Strands' operation-details events repeat the assistant's
    earlier tool requests), and a tool's answer in a user-role message (Pydantic AI's) is not the user speaking."""
    from agentfunnel.collector.ui.conversation import Message, conversation
    from test_dialects import OTLP, views_of

    for path in sorted(OTLP.glob("*/*.traces.binpb")):
        spans, calls = _rows(views_of(path))
        turns = conversation(spans, calls, None)
        asked = [m.span_id for t in turns for m in t.items if isinstance(m, Message) and m.tool_calls]
        assert len(asked) == len(set(asked)), path  # one request a model call: its response, not its history
        results = {json.dumps(c["result"]) if not isinstance(c["result"], str) else c["result"] for c in calls}
        said = {t.user.text.strip() for t in turns if t.user}
        assert not said & results, (path, said & results)
