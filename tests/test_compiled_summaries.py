"""The compiled GenAI-semconv summaries (``_wire.genai_summaries``) against the Python reference.

The reference is decode -> normalize -> the scorer's summarize per trace. Held: on every recorded
fixture and on generated GenAI traffic (with shapes sent back to Python mixed in) both give identical
summaries, trace by trace; hostile bytes (mutated fixtures, truncations, huge lengths, deep nesting)
never crash the walk, which answers within bounded time with summaries equal to the reference's or
hands the body back. Pure functions on bytes: no server.
"""

from __future__ import annotations

import json
import random
import time
from pathlib import Path

import pytest
from agentfunnel.collector import _wire
from agentfunnel.collector.session.compiled import (
    COMPILED_FACTS,
    GENAI_KEYS,
    PYTHON_KEYS,
    PYTHON_PREFIXES,
    CompiledSummaries,
    prepared_by_trace,
    records_by_trace,
    reference_summaries,
    registry_marks,
)
from agentfunnel.collector.errors import PermanentError
from agentfunnel.scoring import ScoringConfig, SessionScorer
from agentfunnel.scoring.facts import FACTS
from agentfunnel.semconv.dialects import REGISTRY
from agentfunnel.semconv.dialects.base import Marks
from agentfunnel.semconv.trace_rules import apply_trace_rules
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
)
from otlp_build import kvs

OTLP = Path(__file__).parent / "fixtures" / "otlp"
SCORER = SessionScorer()
CONFIGURED = SessionScorer(ScoringConfig.model_validate({"funnel": {"agents": {"Shop": "procurement", "shop-agent": "lodging"}}}))
COMPILED = CompiledSummaries(SCORER)
COMPILED_CONFIGURED = CompiledSummaries(CONFIGURED)


def assert_same(compiled: CompiledSummaries, body: bytes, where: str = "") -> None:
    """Both paths give the same summaries, by trace (or the reference refuses the body, and so does decoding)."""
    try:
        want = reference_summaries(body, compiled.scorer).by_trace
    except PermanentError:
        compiled.compiled(body)  # no crash and no hang is all that is asked of a body the decoder refuses
        return
    got = compiled.summaries(body).by_trace
    assert got.keys() == want.keys(), where
    for trace_id, summary in want.items():
        if got[trace_id] != summary:
            a, b = got[trace_id].by_fact(), summary.by_fact()
            differs = {name: (a[name], b[name]) for name in b if a[name] != b[name]}
            raise AssertionError(f"{where} trace {trace_id}: compiled differs in {sorted(differs)}: {differs}")


def test_the_compiled_path_knows_every_fact():
    assert COMPILED.available
    assert tuple(f.name for f in FACTS) == COMPILED_FACTS


def test_every_recorded_fixture_summarizes_as_the_reference():
    paths = sorted(OTLP.glob("*/*.traces.binpb"))
    assert len(paths) > 100
    compiled = 0
    for path in paths:
        body = path.read_bytes()
        for scorer in (COMPILED, COMPILED_CONFIGURED):
            assert_same(scorer, body, path.name)
        compiled += COMPILED.summaries(body).spans_compiled
    assert compiled >= 130  # the GenAI-semconv recordings without events are read in C


def test_a_plain_genai_trace_is_read_in_c_without_python():
    body = request([[span(1, 1, op="invoke_agent", name="invoke_agent Shop", start=1),
                     span(1, 2, parent=1, op="chat", attrs={"gen_ai.request.model": "gpt-4o",
                                                            "gen_ai.usage.input_tokens": 10,
                                                            "gen_ai.response.finish_reasons": ["tool_calls"]}),
                     span(1, 3, parent=1, op="execute_tool", attrs={"gen_ai.tool.name": "search_products",
                                                                    "gen_ai.tool.call.arguments": '{"q": "socks"}',
                                                                    "gen_ai.tool.call.result": '{"products": []}'})]])
    got = COMPILED.summaries(body)
    assert (got.spans_compiled, got.spans_python, got.traces_python) == (3, 0, 0)
    assert_same(COMPILED, body)


def test_traces_it_cannot_read_go_to_python_by_trace():
    body = request([[span(1, 1, op="chat")],
                    [span(2, 1, op="chat", attrs={"gen_ai.prompt": "hi"})],  # legacy prompt: Python's
                    [span(3, 1, op="chat", events=True)],  # events: Python's
                    [span(4, 1, op="chat", attrs={"gen_ai.system": "strands-agents"})]])  # marks Strands
    got = COMPILED.summaries(body)
    assert (got.spans_compiled, got.spans_python, got.traces_python) == (1, 3, 3)
    assert_same(COMPILED, body)


def test_a_dialect_marking_a_genai_key_sends_its_spans_to_python():
    class Marker:
        name = "marker"
        marks = Marks(keys=frozenset({"gen_ai.usage.input_tokens"}))

    marks = registry_marks((*REGISTRY, Marker()))
    assert "gen_ai.usage.input_tokens" not in marks.keys and "gen_ai.usage.input_tokens" in marks.deny
    assert "gen_ai.usage.input_tokens" in registry_marks().keys


def test_every_key_the_genai_dialect_reads_is_read_in_c_or_sent_to_python():
    """A key the GenAI dialect or normalize reads, passed over in C, would make the paths differ."""
    from agentfunnel.semconv import attributes

    root = Path(attributes.__file__).parent
    sources = "".join((root / name).read_text() for name in ("normalize.py", "dialects/otel_genai.py",
                                                             "dialects/user_input.py", "dialects/base.py"))
    read = {value for name, value in vars(attributes).items()
            if name.isupper() and not name.startswith("EVENT_") and isinstance(value, str)
            and value.startswith("gen_ai.") and name in sources}
    unplaced = {k for k in read if k not in GENAI_KEYS and k not in PYTHON_KEYS and not k.startswith(PYTHON_PREFIXES)}
    assert not unplaced


# -- generated traffic ----------------------------------------------------------------------------

def tid(n: int) -> bytes:
    return n.to_bytes(16, "big")


def sid(n: int) -> bytes:
    return n.to_bytes(8, "big")


def span(trace: int, span_id: int, parent: int | None = None, op: str | None = None, name: str = "span",
         attrs: dict | None = None, start: int = 5, end: int = 9, status: tuple[int, str] | None = None,
         events: bool = False) -> dict:
    a = dict(attrs or {})
    if op is not None:
        a["gen_ai.operation.name"] = op
    s = {"trace_id": tid(trace), "span_id": sid(span_id), "name": name, "attributes": a, "start": start, "end": end}
    if parent is not None:
        s["parent_span_id"] = sid(parent)
    if status:
        s["status"] = status
    if events:
        s["events"] = [{"name": "exception", "attributes": {"exception.message": "boom"}}]
    return s


def request(resources: list[list[dict]], services: list[dict | None] | None = None,
            scopes: list[str] | None = None) -> bytes:
    req = ExportTraceServiceRequest()
    for i, spans in enumerate(resources):
        rs = req.resource_spans.add()
        res = (services or [None] * len(resources))[i]
        rs.resource.attributes.extend(kvs({"service.name": "shop-agent"} if res is None else res))
        ss = rs.scope_spans.add()
        ss.scope.name = (scopes or ["opentelemetry.instrumentation.openai_v2"] * len(resources))[i]
        for s in spans:
            pb = ss.spans.add(trace_id=s["trace_id"], span_id=s["span_id"], name=s["name"], kind=1,
                              start_time_unix_nano=s["start"], end_time_unix_nano=s["end"])
            if "parent_span_id" in s:
                pb.parent_span_id = s["parent_span_id"]
            pb.attributes.extend(kvs(s["attributes"]))
            for e in s.get("events", []):
                pb.events.add(name=e["name"]).attributes.extend(kvs(e["attributes"]))
            if "status" in s:
                pb.status.code, pb.status.message = s["status"]
    return req.SerializeToString()


OPS = (None, "chat", "text_completion", "generate_content", "execute_tool", "invoke_agent", "create_agent",
       "invoke_workflow", "embeddings", "")
NAMES = ("chat gpt-4o", "execute_tool search_products", "execute_tool ", "execute_tool \t mcp__shop__Checkout \x1c",
         "invoke_agent Shop", "create_agent Helper", "invoke_workflow flow", "invoke_agent ", "span", "",
         "execute_tool ünï", "invoke_agent  Shop ")
TOOLS = ("search_products", "get_product_details", "add_to_cart", "mcp__shop__checkout", "shop__Pay", "ghost", "")
RESULTS = ('{"products": [{"id": "p1"}]}', '{"cart_id": "c1", "checkout_url": "https://x"}',
           '{"order_id": "o1", "status": "confirmed"}', '{"status": "payment_required"}', "plain text", "[1, 2",
           '{"error": "no payment method on file"}', "")
ERRORS = ("", "ValidationError: 1 validation error", "tool_error", "Tool ghost not found in agent Shop",
          "MaxTurnsExceeded: Max turns (10) exceeded", "no payment method on file")
OPTIONAL = {
    "gen_ai.request.model": st.sampled_from(("gpt-4o", "unknown", "", "claude-3-5-sonnet-20241022")),
    "gen_ai.response.model": st.sampled_from(("gpt-4o-2024-08-06", "unknown", "")),
    "gen_ai.usage.input_tokens": st.one_of(st.integers(0, 2**40), st.sampled_from((-3, 2**62, "12"))),
    "gen_ai.usage.output_tokens": st.integers(0, 5000),
    "gen_ai.response.finish_reasons": st.one_of(
        st.lists(st.sampled_from(("stop", "TOOL_CALLS", "tool_use", "length", "end_turn", "Ünïcode", "")), max_size=3),
        st.sampled_from(("end_turn", "tool_calls"))),
    "gen_ai.tool.name": st.sampled_from(TOOLS),
    "gen_ai.agent.name": st.sampled_from(("Shop", "", "shop-agent", "Helper")),
    "gen_ai.workflow.name": st.sampled_from(("checkout flow", "")),
    "error.type": st.sampled_from(ERRORS),
    "gen_ai.tool.call.arguments": st.sampled_from(('{"q": "socks", "n": 1}', '{"n": 1, "q": "socks"}', "not json",
                                                   "[1, 2]", "")),
    "gen_ai.tool.call.result": st.sampled_from(RESULTS),
    "gen_ai.system": st.sampled_from(("openai", "strands-agents")),
    "gen_ai.provider.name": st.just("openai"),
    "gen_ai.task.kind": st.just("step"),  # read by nothing: passed over
    "http.method": st.just("POST"),
    "gen_ai.request.temperature": st.just(0.5),
    "user.id": st.sampled_from(("u1", "", 7)),  # a user key: an int's trace goes to Python
    "enduser.id": st.sampled_from(("u2", "")),
    "gen_ai.input.messages": st.sampled_from((
        '[{"role": "user", "parts": [{"type": "text", "content": "find socks"}]}]',
        '[{"role": "system", "parts": [{"type": "text", "content": "be brief"}]}, {"role": "user", "parts": []}]',
        "[]", "not json", "")),
    "gen_ai.output.messages": st.sampled_from((
        '[{"role": "assistant", "parts": [{"type": "text", "content": "Ordered."}], "finish_reason": "stop"}]',
        '[{"role": "assistant", "parts": [{"type": "tool_call", "name": "ghost", "arguments": {}}]}]',
        ('[{"role": "assistant", "parts": [{"type": "text", "content": "None"}, {"type": "tool_call",'
         ' "name": "search_products"}]}]'),
        '[{"role": "assistant", "parts": [{"type": "tool_call", "name": "final_result"}], "finish_reason": "length"}]',
        '{"role": "assistant"}', "[]", "[1,")),
    "gen_ai.tool.definitions": st.sampled_from((
        ('[{"type": "function", "name": "search_products", "parameters": {"type": "object",'
         ' "properties": {"q": {"type": "string"}}, "required": ["q"]}}]'),
        '[{"type": "function", "name": "Ghost"}, {"type": "function", "name": "mcp__shop__checkout"}]',
        '[{"type": "function", "function": {"name": "add_to_cart", "parameters": {"type": "object"}}}]',
        "[]", "{")),
    "gen_ai.tool.call.id": st.one_of(st.just("call_1"), st.integers(0, 3)),
    "gen_ai.request.stop_sequences": st.just(["\n"]),
}


@st.composite
def genai_requests(draw) -> bytes:
    n = draw(st.integers(1, 12))
    ids = draw(st.lists(st.integers(1, 14), min_size=n, max_size=n))  # a span id may repeat
    traces = draw(st.lists(st.integers(1, 2), min_size=n, max_size=n))
    python_keys = draw(st.booleans())
    keys = [k for k in OPTIONAL if python_keys or k != "gen_ai.system"]
    spans = []
    for i in range(n):
        attrs = {k: draw(OPTIONAL[k]) for k in draw(st.lists(st.sampled_from(keys), max_size=6, unique=True))}
        start = draw(st.sampled_from((0, 1, 2, 3, 3, 5, 2**63 - 1)))
        status = draw(st.sampled_from((None, (2, ""), (1, "ok"), *((2, e) for e in ERRORS))))
        spans.append(span(traces[i], ids[i], parent=draw(st.sampled_from((None, 99, *ids))),
                          op=draw(st.sampled_from(OPS)), name=draw(st.sampled_from(NAMES)), attrs=attrs,
                          start=start, end=start + draw(st.integers(0, 4)), status=status,
                          events=python_keys and draw(st.integers(0, 9)) == 0))
    cut = draw(st.integers(0, n))
    services = [draw(st.sampled_from(({"service.name": "shop-agent"}, {"service.name": "other-svc"}, {},
                                      {"service.name": ""}, {"service.name": "Shop", "host.name": "h"},
                                      {"user.id": "u"}, {"user.id": ""},
                                      *(({"user.id": 5}, {"agentfunnel.case.id": "c1"}) if python_keys else ()))))
                for _ in range(2)]
    scopes = [draw(st.sampled_from(("opentelemetry.instrumentation.openai_v2", "",
                                    *(("strands.telemetry.tracer",) if python_keys else ())))) for _ in range(2)]
    return request([spans[:cut], spans[cut:]], services, scopes)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(genai_requests())
def test_generated_genai_traffic_summarizes_as_the_reference(body: bytes):
    assert_same(COMPILED, body)
    assert_same(COMPILED_CONFIGURED, body)


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(genai_requests(), genai_requests())
def test_summaries_of_two_requests_merge_into_the_reference_of_both(first: bytes, second: bytes):
    """A trace's spans arrive in several requests: their compiled summaries merge as the reference's, and into
    the reference of both requests at once unless a span was sent in both (a resend: the store keeps one)."""
    try:
        whole = reference_summaries(first + second, SCORER).by_trace  # concatenated requests are one request
    except PermanentError:
        return
    parts = [COMPILED.summaries(first).by_trace, COMPILED.summaries(second).by_trace]
    ref_parts = [reference_summaries(first, SCORER).by_trace, reference_summaries(second, SCORER).by_trace]
    ids = [{(r.trace_id, r.span_id) for rs in records_by_trace(b).values() for r in rs} for b in (first, second)]
    # a trace rule reads the whole trace: where one changes a record, the parts' summaries are not the whole's
    ruled = ruled_traces(first) | ruled_traces(second) | ruled_traces(first + second)
    for trace_id, summary in whole.items():
        merged = SCORER.merge([p[trace_id] for p in parts if trace_id in p])
        assert merged == SCORER.merge([p[trace_id] for p in ref_parts if trace_id in p])
        if ids[0].isdisjoint(ids[1]) and trace_id not in ruled:
            assert merged == summary


def ruled_traces(body: bytes) -> set[str]:
    """The traces of a body whose records a trace rule changes."""
    return {t for t, (records, views) in prepared_by_trace([body]).items() if apply_trace_rules(records, views) != records}


def test_a_trace_a_rule_reads_whole_is_the_records_paths():
    """One tool call seen twice, set-up only, agentfunnel's own judge call: the records path reads these traces,
    which the stage scores after the trace rules."""
    bodies = [
        request([[span(1, 1, op="create_agent", name="create_agent Shop", attrs={"gen_ai.agent.name": "Shop"})]]),
        request([[span(1, 1, op="execute_tool", attrs={"gen_ai.tool.name": "search"}),
                  span(1, 2, parent=1, op="execute_tool", attrs={"gen_ai.tool.name": "search",
                                                                 "gen_ai.tool.call.result": '{"cart_id": 1}'})]]),
        request([[span(1, 1, op="chat", attrs={"gen_ai.request.model": "gpt-4o"})]], scopes=["agentfunnel.judge"]),
    ]
    for body in bodies:
        assert ruled_traces(body)  # a rule changes a record of each
        got = COMPILED.summaries(body)
        assert got.spans_compiled == 0 and got.traces_python == 1
        assert_same(COMPILED, body)
    plain = request([[span(1, 1, op="create_agent", name="create_agent Shop"), span(1, 2, op="chat")]])
    assert not ruled_traces(plain) and COMPILED.summaries(plain).spans_compiled == 2  # set-up beside a run: read


def test_generated_traffic_is_mostly_read_in_c():
    """The generator above is not only exercising the hand-back: most plain spans are read in C."""
    rnd = random.Random(7)
    compiled = python = 0
    for _ in range(50):
        spans = [span(1, i, parent=rnd.choice((None, 1)), op=rnd.choice(OPS), name=rnd.choice(NAMES),
                      attrs={"gen_ai.tool.name": rnd.choice(TOOLS), "error.type": rnd.choice(ERRORS)})
                 for i in range(1, 6)]
        body = request([spans])
        got = COMPILED.summaries(body)
        compiled, python = compiled + got.spans_compiled, python + got.spans_python
        assert_same(COMPILED, body)
    assert compiled > 0.8 * (compiled + python)


# -- hostile bytes --------------------------------------------------------------------------------

def varint(n: int) -> bytes:
    out = bytearray()
    while True:
        b = n & 0x7F
        n >>= 7
        out.append(b | (0x80 if n else 0))
        if not n:
            return bytes(out)


def ld(fn: int, payload: bytes) -> bytes:
    return varint(fn << 3 | 2) + varint(len(payload)) + payload


def hostile_bodies() -> list[bytes]:
    plain = request([[span(1, 1, op="chat", attrs={"gen_ai.request.model": "m"})]])
    nested = ld(1, b"x")  # AnyValue{string_value}
    for _ in range(5000):  # an attribute value nested 5,000 arrays deep
        nested = ld(5, ld(1, nested))
    one_span = ld(1, b"\x11" * 16) + ld(2, b"\x22" * 8) + ld(9, ld(1, b"gen_ai.x") + ld(2, nested))
    deep_attr = ld(1, ld(2, ld(2, one_span)))
    return [
        b"", b"\x00", b"\x0a", b"\x0a\xff\xff\xff\xff\xff\xff\xff\xff\x7f",  # a length of 2^63
        b"\x0a" + varint(2**62) + b"xx",  # a huge length
        b"\x0b" * 64,  # groups
        ld(1, ld(2, ld(2, b"\x0a\x10" + b"\x01" * 16) * 3)),  # spans with odd ids
        deep_attr,
        plain * 2,  # two requests back to back: the same request, its resource spans twice
        plain[:-1], plain[:5], plain + b"\x80",
    ]


def test_a_body_handed_back_whole_says_why_and_where():
    assert COMPILED.compiled(b"\x0a\x02\x0b\x00")[4] == "a group or an unknown wire type (the field at byte 2)"
    assert COMPILED.compiled(b"\x0a\x05ab")[4] == "a field runs past its message (the field at byte 0)"


def test_hostile_bodies_never_crash_and_end_as_the_reference():
    for i, body in enumerate(hostile_bodies()):
        started = time.perf_counter()
        assert_same(COMPILED, body, f"hostile body {i}")
        assert time.perf_counter() - started < 5


def mutations(body: bytes, rnd: random.Random) -> bytes:
    b = bytearray(body)
    for _ in range(rnd.randint(1, 4)):
        op = rnd.randrange(5)
        if op == 0 and b:
            b[rnd.randrange(len(b))] = rnd.randrange(256)
        elif op == 1 and b:
            del b[rnd.randrange(len(b)):]
        elif op == 2:
            b[rnd.randrange(len(b) + 1):0] = bytes(rnd.randrange(256) for _ in range(rnd.randint(1, 10)))
        elif op == 3 and b:
            i = rnd.randrange(len(b))
            b[i:i + 1] = b"\xff\xff\xff\xff\xff\xff\xff\xff\xff\x01"  # a varint of 2^64 - 1 where a length was
        elif b:
            i, j = sorted(rnd.randrange(len(b)) for _ in range(2))
            b[i:i] = b[i:j]  # a slice repeated: fields given twice
    return bytes(b)


def test_mutated_fixtures_never_crash_and_end_as_the_reference():
    rnd = random.Random(11)
    bodies = [p.read_bytes() for p in sorted(OTLP.glob("openai-agents-otel/*.traces.binpb"))]
    bodies += [p.read_bytes() for p in sorted(OTLP.glob("*/*.traces.binpb"))[::17]]
    started = time.perf_counter()
    outcomes = {"compiled": 0, "python": 0, "refused": 0}
    for i in range(1500):
        body = mutations(rnd.choice(bodies), rnd)
        result = _wire.genai_summaries(body, *_args(COMPILED))
        outcomes["python" if result[0] is None else "compiled"] += 1
        if i % 5 == 0:
            assert_same(COMPILED, body, f"mutation {i}")
    assert time.perf_counter() - started < 60
    assert outcomes["compiled"] and outcomes["python"]


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=400))
def test_random_bytes_never_crash(body: bytes):
    result = _wire.genai_summaries(body, *_args(COMPILED))
    assert result[0] is None and isinstance(result[1], str) or isinstance(result[0], dict)


def _args(compiled: CompiledSummaries) -> tuple:
    m = compiled.marks
    return m.keys, m.deny, m.deny_prefixes, m.user_keys, m.session_keys, m.scopes, m.values, compiled._kit


def test_bad_arguments_are_refused_naming_them():
    with pytest.raises(TypeError, match="kit has 0 entries"):
        _wire.genai_summaries(b"", (), (), (), (), (), frozenset(), (), ())
    with pytest.raises(TypeError, match="strings"):
        _wire.genai_summaries(b"", (), (1,), (), (), (), frozenset(), (), COMPILED._kit)


def test_payload_json_is_read_by_the_reference_functions():
    """Arguments given in two key orders are one call (sorted-key JSON), as the reference reads them."""
    body = request([[span(1, i, op="execute_tool", start=i, attrs={
        "gen_ai.tool.name": "search", "gen_ai.tool.call.arguments": json.dumps(args)})
        for i, args in ((1, {"a": 1, "b": 2}), (2, {"b": 2, "a": 1}))]])
    got = COMPILED.summaries(body)
    assert got.spans_compiled == 2
    calls = next(iter(got.by_trace.values())).value(next(f for f in FACTS if f.name == "calls"))
    assert calls.wasted.repeats == 1
    assert_same(COMPILED, body)


def test_tools_asked_for_are_read_against_those_offered_and_run():
    """A model asking for a tool nobody offered or ran (refused), one offered, and one that ran."""
    asks = ('[{"role": "assistant", "parts": [{"type": "tool_call", "name": "ghost"}, {"type": "tool_call",'
            ' "name": "search_products"}, {"type": "tool_call", "name": "add_to_cart"}]}]')
    offers = '[{"type": "function", "name": "search_products", "parameters": {"type": "object"}}]'
    body = request([[span(1, 1, op="chat", start=1, attrs={"gen_ai.tool.definitions": offers,
                                                           "gen_ai.output.messages": asks}),
                     span(1, 2, op="execute_tool", start=2, attrs={"gen_ai.tool.name": "add_to_cart"})]])
    got = COMPILED.summaries(body)
    assert got.spans_compiled == 2
    refused = next(iter(got.by_trace.values())).value(next(f for f in FACTS if f.name == "refused"))
    assert refused == ("ghost",)
    assert_same(COMPILED, body)


def test_a_reader_refusing_a_value_hands_the_body_to_the_reference():
    compiled = CompiledSummaries(SCORER)

    def refuses(*_: object) -> None:
        raise ValueError("not readable")

    kit = list(compiled._kit)
    kit[21] = kit[-1] = refuses  # the tool-call payload reader, and the arguments reader beside the compiled result's
    compiled._kit = tuple(kit)
    body = request([[span(1, 1, op="execute_tool", attrs={"gen_ai.tool.name": "t", "gen_ai.tool.call.result": "{}"})]])
    got = compiled.summaries(body)
    assert got.whole_body_reason == "ValueError: not readable" and got.spans_python == 1
    assert got.by_trace == reference_summaries(body, SCORER).by_trace


def test_tool_results_are_read_in_c_and_only_those_it_declines_by_the_reference():
    compiled = CompiledSummaries(SCORER)
    read_by_reference: list[str] = []
    kit = list(compiled._kit)
    payload = kit[21]

    def counted(arguments: str | None, result: str | None, error: str | None) -> tuple:
        read_by_reference.append(result)
        return payload(arguments, result, error)

    kit[21] = counted
    compiled._kit = tuple(kit)
    results = ['{"order_id": "o-1", "status": "paid"}', '{"a": 1, "a": 2}', "requires_payment, plainly"]
    body = request([[span(1, i, op="execute_tool", start=i, attrs={
        "gen_ai.tool.name": "checkout", "gen_ai.tool.call.arguments": '{"x": 1}', "gen_ai.tool.call.result": result})
        for i, result in enumerate(results, 1)]])
    got = compiled.summaries(body)
    assert got.spans_compiled == 3
    assert read_by_reference == ['{"a": 1, "a": 2}']  # a key given twice: declined by the compiled reader
    assert got.by_trace == reference_summaries(body, SCORER).by_trace
