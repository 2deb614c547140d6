"""A span's attribution comes from its own resource, whichever spans are normalized beside it.

The resource gives a record its service name, user id, declared services, store page and case
attribution (where the span itself does not name them). The spans of a batch share their
resource's dict, so ``held.prepare`` reads each resource once for its batch; a span normalized
alone reads its own. Either way, and from any thread, a span's record is the one it has alone.
"""

from __future__ import annotations

import sys
import threading
import time
from dataclasses import replace
from typing import Any

import pytest

from agentfunnel.collector.decode import decode_traces_protobuf
from agentfunnel.collector.session.held import prepare
from agentfunnel.semconv import SpanRecord, SpanView, normalize
from agentfunnel.semconv.normalize import ResourceReadings
from conftest import FIXTURES
from otlp_build import trace_request

SHOP = {"service.name": "shop-agent", "user.id": "u-shop", "agentfunnel.case.id": "case-shop",
        "agentfunnel.experiment": "exp-shop", "agentfunnel.run.id": "run-shop",
        "agentfunnel.server.services": "dev.ucp.shopping, dev.ucp.checkout", "agentfunnel.store_page": "true",
        "telemetry.sdk.language": "python"}
TRAVEL = {"service.name": "travel-agent", "user.id": "u-travel", "telemetry.sdk.language": "python"}  # no key of ours

# What each resource gives a span that does not name these itself.
READS = {"shop-agent": {"service_name": "shop-agent", "user_id": "u-shop", "case_id": "case-shop",
                        "experiment": "exp-shop", "run_id": "run-shop", "store_page": True,
                        "declared_services": ("dev.ucp.shopping", "dev.ucp.checkout")},
         "travel-agent": {"service_name": "travel-agent", "user_id": "u-travel", "case_id": None,
                          "experiment": None, "run_id": None, "store_page": False, "declared_services": ()}}


def _spans(agent: str, conversation: str) -> list[dict[str, Any]]:
    """An agent's turn: the agent span, a model call, a tool call, and a span naming a case and user of its own."""
    return [
        {"name": f"invoke_agent {agent}", "attributes": {"gen_ai.operation.name": "invoke_agent",
                                                        "gen_ai.agent.name": agent,
                                                        "gen_ai.conversation.id": conversation}},
        {"name": "chat gpt-4o", "attributes": {"gen_ai.operation.name": "chat", "gen_ai.request.model": "gpt-4o",
                                               "gen_ai.usage.input_tokens": 12, "gen_ai.usage.output_tokens": 3}},
        {"name": "execute_tool search", "attributes": {"gen_ai.operation.name": "execute_tool",
                                                       "gen_ai.tool.name": "search", "gen_ai.tool.call.id": "c1"}},
        {"name": "chat gpt-4o", "attributes": {"gen_ai.operation.name": "chat", "agentfunnel.case.id": f"{agent}-own",
                                               "enduser.id": f"{agent}-user"}},
    ]


class _GivingWay(dict):
    """A resource that lets the other thread run each time a key of it is read: reading one resource is
    interrupted by the other thread reading its own."""

    def get(self, key: Any, default: Any = None) -> Any:
        time.sleep(0)
        return super().get(key, default)


def _views(resource: dict[str, Any], agent: str, giving_way: bool = False) -> list[SpanView]:
    """The spans as the server decodes them: one resource dict, shared by all of them."""
    b = decode_traces_protobuf(trace_request(_spans(agent, f"conv-{agent}"), resource).SerializeToString())
    assert len({id(r) for r in b.resource_attrs}) == 1
    res = _GivingWay(b.resource_attrs[0]) if giving_way else b.resource_attrs[0]
    return [SpanView(b.trace_id[i], b.span_id[i], b.parent_span_id[i], b.name[i], b.attrs[i], res,
                     list(b.event_list[i]), b.kind[i], b.status_code[i], b.status_message[i], b.scope_name[i],
                     b.start_ns[i], b.end_ns[i]) for i in range(len(b))]


def _alone(view: SpanView) -> SpanRecord:
    """The span's record with nothing normalized before it: over a copy of its resource, read by nothing else."""
    return normalize(replace(view, resource_attributes=dict(view.resource_attributes)))


def _assert_own_resource(records: list[SpanRecord], views: list[SpanView]) -> None:
    """Each record is its span's alone, and says what its resource gives (the last span of a turn names its own
    case and user)."""
    assert records == [_alone(v) for v in views]
    service = views[0].resource_attributes["service.name"]
    read = READS[service]
    for i, r in enumerate(records):
        own = i % len(_spans("", "")) == 3
        agent = "shopper" if service == "shop-agent" else "booker"
        assert (r.service_name, r.experiment, r.run_id, r.store_page, r.declared_services) == (
            service, read["experiment"], read["run_id"], read["store_page"], read["declared_services"])
        assert (r.case_id, r.user_id) == ((f"{agent}-own", f"{agent}-user") if own else (read["case_id"], read["user_id"]))


@pytest.fixture
def often_switching():
    """Threads switch every microsecond (the default is 5 ms): two threads' normalize calls interleave."""
    before = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    yield
    sys.setswitchinterval(before)


def test_alternating_resources_each_give_their_own_spans_their_attribution():
    shop, travel = _views(SHOP, "shopper"), _views(TRAVEL, "booker")
    readings = ResourceReadings()
    both = [normalize(v, resources=readings) for pair in zip(shop, travel) for v in pair]
    _assert_own_resource(both[0::2], shop)
    _assert_own_resource(both[1::2], travel)
    assert [normalize(v) for pair in zip(shop, travel) for v in pair] == both


@pytest.mark.parametrize("giving_way", [False, True], ids=["decoded", "giving way"])
@pytest.mark.parametrize("readings", ["none", "one per thread", "one for both threads"])
def test_spans_of_two_resources_normalized_from_two_threads_read_their_own_resource(often_switching, readings,
                                                                                    giving_way):
    views = {"shop": _views(SHOP, "shopper", giving_way), "travel": _views(TRAVEL, "booker", giving_way)}
    shared = ResourceReadings()
    rounds = 300
    step = threading.Barrier(2, timeout=30)  # each round both threads start their spans together
    out: dict[str, list[SpanRecord]] = {"shop": [], "travel": []}
    failed: list[BaseException] = []

    def run(name: str) -> None:
        try:
            mine = {"none": None, "one per thread": ResourceReadings(), "one for both threads": shared}[readings]
            for _ in range(rounds):
                step.wait()
                out[name] += [normalize(v, resources=mine) for v in views[name]]
        except BaseException as exc:  # noqa: BLE001 - reported by the test below
            failed.append(exc)
            step.abort()

    threads = [threading.Thread(target=run, args=(name,)) for name in views]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not failed, failed
    for name, records in out.items():
        _assert_own_resource(records, views[name] * rounds)


def test_batches_of_two_resources_prepared_from_two_threads_read_their_own_resource(often_switching):
    """The prepare worker's path: each batch's resources read once, the batches in two threads at once."""
    def body(first: dict[str, Any], second: dict[str, Any]) -> bytes:
        req = trace_request(_spans("shopper", "conv-shopper"), first)  # two resources, each twice, alternating
        for resource, agent in ((second, "booker"), (first, "shopper"), (second, "booker")):
            req.resource_spans.extend(trace_request(_spans(agent, f"conv-{agent}"), resource).resource_spans)
        return req.SerializeToString()

    bodies = [body(SHOP, TRAVEL), body(TRAVEL, SHOP)]
    expected = [[_alone(v) for v in prepare(decode_traces_protobuf(b)).views] for b in bodies]
    assert {r.service_name for r in expected[0]} == {"shop-agent", "travel-agent"}
    rounds = 100
    step = threading.Barrier(2, timeout=30)
    got: list[list[list[SpanRecord]]] = [[], []]
    failed: list[BaseException] = []

    def run(i: int) -> None:
        try:
            for _ in range(rounds):
                batch = decode_traces_protobuf(bodies[i])
                step.wait()
                got[i].append(prepare(batch).records)
        except BaseException as exc:  # noqa: BLE001 - reported by the test below
            failed.append(exc)
            step.abort()

    threads = [threading.Thread(target=run, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not failed, failed
    for i in range(2):
        assert got[i] == [expected[i]] * rounds


def test_every_recording_prepared_in_batches_gives_each_span_the_record_it_has_alone():
    bodies = sorted((FIXTURES / "otlp").glob("*/*.traces.binpb"))
    assert bodies
    for path in bodies:
        prepared = prepare(decode_traces_protobuf(path.read_bytes()))
        assert prepared.records == [_alone(v) for v in prepared.views], path.name
