"""GenAI-semconv traces kept in C across requests (``CompiledTraces``, ``_wire.TraceStates``).

Held: a trace's spans sent in any number of requests, in any split, give (when it is taken) the
reference's summary of all of them; the traces read are exactly those the one-body walk reads; a
trace with a span the walk cannot read in any request is handed back whole and what was kept of it
let go; what is kept is counted and goes to nothing once every trace is taken. Pure functions on
bytes: no server.
"""

from __future__ import annotations

import random
import sys
import threading
from datetime import datetime, timezone
from pathlib import Path

from agentfunnel.collector import _wire
from agentfunnel.collector.session.compiled import (
    CompiledSummaries,
    CompiledTraces,
    prepared_by_trace,
    records_by_trace,
    reference_summaries,
)
from agentfunnel.collector.errors import PermanentError
from agentfunnel.collector.session.assembly import (
    AssembledTrace,
    assemble_kept,
    assemble_records,
    index_rows,
    span_stamps,
    tool_call_rows,
)
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from otlp_build import split_request
from test_compiled_summaries import COMPILED, SCORER, genai_requests, request, span

OTLP = Path(__file__).parent / "fixtures" / "otlp"


split = split_request


def taken(bodies: list[bytes]) -> tuple[CompiledTraces, dict]:
    kept = CompiledTraces(SCORER)
    for body in bodies:
        sent = bytearray(body)
        added = kept.add(sent)
        sent[:] = bytes(len(sent))  # the request's bytes are gone once it is added: nothing kept may point into them
        if added.whole_body_reason is not None:
            kept.hand_back(records_by_trace(body))
    trace_ids = {t for body in bodies for t in records_by_trace(body)}
    return kept, {t: (k.summary if (k := kept.take(t)) is not None else None) for t in trace_ids}


def test_every_fixture_split_across_requests_gives_the_reference_of_the_whole():
    rnd = random.Random(11)
    paths = sorted(OTLP.glob("*/*.traces.binpb"))
    read = 0
    for path in paths:
        body = path.read_bytes()
        want = reference_summaries(body, SCORER).by_trace
        compiled_whole = set(COMPILED.compiled(body)[0] or ())  # the traces the one-body walk reads
        for parts in (1, 2, 3):
            kept, got = taken(split(body, parts, rnd))
            assert {t for t, s in got.items() if s is not None} == compiled_whole, (path.name, parts)
            for trace_id, summary in got.items():
                if summary is not None:
                    assert summary == want[trace_id], (path.name, parts, trace_id)
            assert len(kept) == 0 and kept.counts()["bytes"] == 0 and kept.counts()["spans"] == 0
        read += len(compiled_whole)
    assert read >= 7  # the GenAI-semconv recordings without events are kept in C


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(genai_requests(), genai_requests(), st.randoms(use_true_random=False))
def test_generated_traffic_in_any_split_gives_the_reference_of_all(first: bytes, second: bytes, rnd: random.Random):
    try:
        want = reference_summaries(first + second, SCORER).by_trace  # concatenated requests are one request
    except PermanentError:
        return
    bodies = [*split(first, rnd.randint(1, 3), rnd), *split(second, rnd.randint(1, 3), rnd)]
    _, got = taken(bodies)
    for trace_id, summary in got.items():
        if summary is not None:
            assert summary == want[trace_id], trace_id


def agent_turn(trace: int, first_span: int, tool: str = "search_products") -> list[dict]:
    return [span(trace, first_span, op="invoke_agent", name="invoke_agent Shop", start=1, end=50,
                 attrs={"gen_ai.agent.name": "Shop"}),
            span(trace, first_span + 1, parent=first_span, op="chat", start=2, end=9,
                 attrs={"gen_ai.request.model": "gpt-4o", "gen_ai.usage.input_tokens": 10}),
            span(trace, first_span + 2, parent=first_span, op="execute_tool", start=10, end=12,
                 attrs={"gen_ai.tool.name": tool, "gen_ai.tool.call.result": '{"products": [{"id": "p1"}]}'})]


def test_a_trace_is_kept_across_requests_until_taken_and_counted_while_kept():
    kept = CompiledTraces(SCORER)
    turn = agent_turn(1, 1)
    assert kept.add(request([turn[:1]])).spans_kept == 1
    held_after_one = kept.counts()["bytes"]
    assert kept.add(request([turn[1:]])).spans_kept == 2
    assert kept.counts()["spans"] == 3 and kept.counts()["bytes"] > held_after_one > 0 and len(kept) == 1
    trace_id = (1).to_bytes(16, "big").hex()
    whole = reference_summaries(request([turn]), SCORER).by_trace[trace_id]
    assert kept.take(trace_id, keep=True).summary == whole  # a preview keeps it
    assert kept.counts()["spans"] == 3
    assert kept.take(trace_id).summary == whole
    assert kept.counts() == {"bytes": 0, "spans": 0, "handed_back": 0} and len(kept) == 0
    assert kept.take(trace_id) is None  # taken once: the records path would read it now


def test_a_span_it_cannot_read_in_a_later_request_hands_the_whole_trace_back():
    kept = CompiledTraces(SCORER)
    trace_id = (1).to_bytes(16, "big").hex()
    kept.add(request([agent_turn(1, 1)]))
    assert kept.counts()["spans"] == 3
    later = kept.add(request([[span(1, 9, parent=1, op="chat", events=True)]]))  # events: the records path's
    assert later.handed_back == [trace_id] and later.spans_python == 1
    assert kept.counts() == {"bytes": 0, "spans": 0, "handed_back": 1}
    again = kept.add(request([agent_turn(1, 20)]))  # and stays the records path's
    assert again.handed_back == [trace_id] and again.spans_kept == 0
    assert kept.take(trace_id) is None and len(kept) == 0


def test_a_span_id_sent_twice_across_requests_goes_to_the_records_path():
    kept = CompiledTraces(SCORER)
    turn = agent_turn(1, 1)
    kept.add(request([turn]))
    kept.add(request([turn[2:]]))  # a resend: the store keeps one, the records path reads what it kept
    assert kept.take((1).to_bytes(16, "big").hex()) is None
    assert kept.counts()["spans"] == 0


def test_a_body_it_cannot_walk_is_said_and_its_traces_handed_back():
    kept = CompiledTraces(SCORER)
    kept.add(request([agent_turn(1, 1)]))
    added = kept.add(b"\x0a\x05\x0a\x03\x0a\x01")  # a resource_spans field cut short
    assert added.whole_body_reason and "byte" in added.whole_body_reason
    kept.hand_back([(1).to_bytes(16, "big").hex()])
    assert kept.take((1).to_bytes(16, "big").hex()) is None and kept.counts()["bytes"] == 0


def test_dropping_a_trace_lets_go_of_it():
    kept = CompiledTraces(SCORER)
    kept.add(request([agent_turn(1, 1), agent_turn(2, 1)]))
    assert kept.drop((1).to_bytes(16, "big").hex()) and not kept.drop((1).to_bytes(16, "big").hex())
    assert len(kept) == 1 and kept.counts()["spans"] == 3


def test_many_traces_come_and_go_without_keeping_anything():
    kept = CompiledTraces(SCORER)
    for round_ in range(5):
        kept.add(request([agent_turn(t, 1, tool=f"t{round_}") for t in range(1, 201)]))
        for t in range(1, 201):
            assert kept.take(t.to_bytes(16, "big").hex()) is not None
    assert len(kept) == 0 and kept.counts()["bytes"] == 0


# -- sessions and rows from the kept spans ----------------------------------------------------------

def records_path(bodies: list[bytes], session_keys: tuple[str, ...] = ()) -> dict[str, AssembledTrace]:
    """Each trace as the stage assembles what it held: every body's records (normalized with the session keys),
    by trace in the store's order (start, then span id: ``held`` reads them so), with the trace rules and sessions."""
    out = {}
    for t, (records, views) in prepared_by_trace(bodies, session_keys).items():
        order = sorted(range(len(views)), key=lambda i: (views[i].start_ns, views[i].span_id))
        out[t] = assemble_records([records[i] for i in order], [views[i] for i in order])
    return out


def by_span(rows: list[dict]) -> list[dict]:
    return sorted(rows, key=lambda r: r["span_id"])


def stamped(groups: list[dict]) -> list[tuple]:
    """Span stamps (a row per trace, session and dialect) as each span's, in span order."""
    return sorted((span_id, g["trace_id"], g["session_id"], g["dialect"]) for g in groups for span_id in g["span_ids"])


def assert_rows_same(bodies: list[bytes], session_keys: tuple[str, ...] = ()) -> int:
    """Every trace kept in C gives the sessions, tool-call rows, span stamps and index row its records give;
    returns how many traces were kept."""
    kept = CompiledTraces(SCORER, session_keys=session_keys)
    for body in bodies:
        if kept.add(body).whole_body_reason is not None:
            return 0
    want = records_path(bodies, session_keys)
    since, now = datetime(2026, 1, 1, tzinfo=timezone.utc), datetime(2026, 1, 2, tzinfo=timezone.utc)
    read = 0
    for trace_id, trace in want.items():
        found = kept.take(trace_id)
        if found is None:
            continue
        read += 1
        got = assemble_kept(trace_id, found.spans, found.resource_version, found.summary)  # rows as jobs write them
        assert got.sessions == trace.sessions, trace_id
        # rows are written as a set: the kept spans come in session order, the records in arrival order
        assert by_span(tool_call_rows([got])) == by_span(tool_call_rows([trace])), trace_id
        assert stamped(span_stamps([got])) == stamped(span_stamps([trace])), trace_id
        assert index_rows([got], since, now) == index_rows([trace], since, now), trace_id
        assert found.summary == SCORER.summarize(trace.records), trace_id
    return read


def test_every_fixture_split_across_requests_gives_its_records_rows():
    rnd = random.Random(5)
    read = 0
    for path in sorted(OTLP.glob("*/*.traces.binpb")):
        body = path.read_bytes()
        for parts in (1, 3):
            read += assert_rows_same(split(body, parts, rnd))
            read += assert_rows_same(split(body, parts, rnd), session_keys=("gen_ai.agent.name", "session.id"))
    assert read >= 20


SESSION_ATTRS = {
    "gen_ai.conversation.id": st.sampled_from(("conv-1", "conv-2", "")),
    "session.id": st.sampled_from(("s-1", "")),
    "mcp.session.id": st.sampled_from(("m-1", "")),
    "gen_ai.tool.call.id": st.sampled_from(("call_1", "", "call_2")),
    "gen_ai.provider.name": st.sampled_from(("openai", "", "anthropic")),
    "gen_ai.system": st.sampled_from(("openai", "aws.bedrock")),
    "tenant": st.sampled_from(("t-1", "")),
}


@st.composite
def agent_traffic(draw) -> list[bytes]:
    """A few turns of agent traffic with session keys, providers and call ids, each turn's spans sent over
    one to three requests under resources naming versions or not."""
    bodies = []
    for turn in range(draw(st.integers(1, 3))):
        spans = []
        for i in range(100 * turn + 1, 100 * turn + draw(st.integers(2, 9))):  # a trace may span turns
            attrs = {k: draw(v) for k, v in SESSION_ATTRS.items() if draw(st.booleans())}
            op = draw(st.sampled_from(("invoke_agent", "chat", "execute_tool", "execute_tool", None)))
            if op == "execute_tool":
                attrs["gen_ai.tool.name"] = draw(st.sampled_from(("search", "shop__add_to_cart", "mcp__pay__checkout")))
                # texts the C writer writes as the row holds them, and some it declines (a key twice, a number
                # longer than it reads, an escaped lone surrogate) for the reference to write
                attrs["gen_ai.tool.call.arguments"] = draw(st.sampled_from(('{"q": "socks"}', '{"n":1,"a":[1.50,"é"]}',
                                                                           "not json", '{"q": 1, "q": 2}',
                                                                           '{"a": "\\ud800"}')))
                attrs["gen_ai.tool.call.result"] = draw(st.sampled_from(('{"cart_id": "c1"}', "ok", "[1, 2", "null",
                                                                        '{"n": ' + "1" * 80 + "}")))
            spans.append(span(draw(st.integers(1, 3)), i, parent=draw(st.sampled_from((None, 1, 2, i - 1))), op=op,
                              name=draw(st.sampled_from(("invoke_agent Shop", "chat", "execute_tool search", "x"))),
                              attrs=attrs, start=draw(st.integers(0, 5)), end=draw(st.integers(5, 9)),
                              status=draw(st.sampled_from((None, (2, "boom"), (1, ""))))))
        version = draw(st.sampled_from(({}, {"service.version": "1.2"}, {"service.version": "2.0"}, {"service.version": ""})))
        body = request([spans], [{"service.name": "shop-agent", **version}])
        bodies += split(body, draw(st.integers(1, 3)), draw(st.randoms(use_true_random=False)))
    return bodies


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(agent_traffic())
def test_generated_agent_traffic_gives_its_records_rows(bodies: list[bytes]):
    assert_rows_same(bodies)
    assert_rows_same(bodies, session_keys=("tenant",))


def test_a_kept_trace_names_its_session_and_its_agents_version():
    kept = CompiledTraces(SCORER)
    turn = agent_turn(1, 1)
    turn[0]["attributes"]["gen_ai.conversation.id"] = "conv-9"
    kept.add(request([turn], [{"service.name": "shop-agent", "service.version": "2.0"}]))
    found = kept.take((1).to_bytes(16, "big").hex())
    assert found is not None and found.resource_version == "2.0"
    assert [s.session_key for s in found.spans] == ["conv-9", None, None]
    trace = assemble_kept(found.spans[0].trace_id, found.spans, found.resource_version)
    assert trace.session_ids == {"conv-9"} and set(trace.sessions.values()) == {"conv-9"}


# -- hostile use ------------------------------------------------------------------------------------

def test_trace_ids_that_count_up_are_read_as_random_ones_are():
    """Ids differing only in their last bytes (a counter) once fell into a few buckets of the walk's table, so a
    request of them cost time quadratic in its traces; now they spread, and all are read."""
    spans = [span(t, 1, op="chat", attrs={"gen_ai.request.model": "gpt-4o"}) for t in range(1, 20_001)]
    body = request([spans])
    got = COMPILED.compiled(body)
    assert got[4] is None and len(got[0]) == 20_000
    kept = CompiledTraces(SCORER)
    assert kept.add(body).spans_kept == 20_000 and len(kept) == 20_000


def test_an_object_not_made_refuses_every_call():
    states = _wire.TraceStates.__new__(_wire.TraceStates)
    for call in (states.take, states.peek, states.drop, states.hand_back, states.add):
        with pytest.raises(TypeError, match="not made"):
            call("00" * 16)
    half = _wire.TraceStates.__new__(_wire.TraceStates)
    m = COMPILED.marks
    with pytest.raises(TypeError):  # a deny list holding a number: refused while being made
        half.__init__(m.keys, (1,), m.deny_prefixes, m.user_keys, m.session_keys, m.scopes, m.values, COMPILED._kit)
    with pytest.raises(TypeError, match="not made"):
        half.add(request([agent_turn(1, 1)]))


def test_a_reader_that_calls_back_in_is_refused_and_nothing_is_lost():
    """The readers the kit calls run Python; one that calls the same object (or another thread meanwhile) is
    refused, and what the outer call took is whole."""
    kept = CompiledTraces(SCORER)
    inner: list[BaseException] = []
    kit = list(kept.compiled._kit)
    arguments = kit[-1]

    def calls_back(text: str | None, canonical: str | None) -> tuple:
        try:
            kept._states.take((2).to_bytes(16, "big").hex())
        except RuntimeError as exc:
            inner.append(exc)
        return arguments(text, canonical)

    kit[-1] = calls_back
    m = kept.compiled.marks
    kept._states = _wire.TraceStates(m.keys, m.deny, m.deny_prefixes, m.user_keys, m.session_keys, m.scopes, m.values,
                                     tuple(kit))
    kept.add(request([agent_turn(1, 1), agent_turn(2, 1)]))
    first = kept.take((1).to_bytes(16, "big").hex())
    assert inner and "in use" in str(inner[0])
    assert first is not None and len(first.spans) == 3
    second = kept.take((2).to_bytes(16, "big").hex())  # untouched by the refused call
    assert second is not None and len(second.spans) == 3
    assert len(kept) == 0 and kept.counts()["spans"] == 0


def test_threads_take_turns():
    kept = CompiledTraces(SCORER)
    errors: list[BaseException] = []

    def turns(first: int) -> None:
        try:
            for t in range(first, first + 300):
                kept.add(request([agent_turn(t, 1)]))
                assert kept.take(t.to_bytes(16, "big").hex()) is not None
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    threads = [threading.Thread(target=turns, args=(1 + 1000 * i,)) for i in range(4)]
    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)  # threads switch inside every call's Python readers
    try:
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
    finally:
        sys.setswitchinterval(interval)
    assert errors == [] and len(kept) == 0 and kept.counts()["spans"] == 0


def test_a_value_the_pipeline_would_cut_sends_its_span_back():
    """The pipeline cuts a string value longer than receivers.max_attribute_value_bytes before the stage reads it:
    the walk, reading the request as sent, hands such a span's trace to the records path."""
    turn = agent_turn(1, 1)
    turn[2]["attributes"]["gen_ai.tool.call.result"] = '{"products": [' + '{"id": "p1"}, ' * 100 + '{"id": "p2"}]}'
    body = request([turn, agent_turn(2, 1)])
    long = len(turn[2]["attributes"]["gen_ai.tool.call.result"])
    for limit, back in ((long, []), (long - 1, [(1).to_bytes(16, "big").hex()])):
        kept = CompiledTraces(SCORER, max_value_bytes=limit)
        added = kept.add(body)
        assert added.handed_back == back and added.spans_kept == 6 - 3 * len(back)
        assert CompiledSummaries(SCORER, max_value_bytes=limit).compiled(body)[1] == back
