"""Issue 16, vocabulary: the built-in step names of real commerce and travel MCP servers, UCP services
declared in a captured MCP ``initialize`` result, MCP tool annotations in generic sessions, and the
outcome rungs (with how they read) of a custom variant (SPEC §5).

Everything here is pure and runs in milliseconds, except the last tests, which replay recorded
fixtures through the real ``agentfunnel ingest``.
"""

from __future__ import annotations

import itertools
import json
import re

import pytest
import yaml
from pydantic import ValidationError

from agentfunnel.collector.config import ConfigError, load_settings
from agentfunnel.collector.decode import decode_traces_protobuf
from agentfunnel.scoring import ScoringConfig, SessionScorer
from agentfunnel.scoring.assembled import Session, TraceShare
from agentfunnel.scoring.config import BUILTIN_VARIANTS, LODGING_HINTS, VOCABULARY, FunnelSettings
from agentfunnel.scoring.funnel import ServerFacts, StepMatcher, annotated_kind
from agentfunnel.semconv import SpanRecord, SpanView, normalize
from agentfunnel.semconv.dialects.mcp import declared_services, tool_annotations
import docs_text
from conftest import FIXTURES, read_db, run_cli

_ids = itertools.count(1)
TRACE = "t" * 32
MCP_SCOPE = "opentelemetry.instrumentation.mcp.instrumentation"


def call(tool, result=None, error=None, trace=TRACE):
    n = next(_ids)
    return SpanRecord(trace_id=trace, span_id=f"{n:016x}", parent_span_id=None, name=f"tools/call {tool}",
                      dialect="mcp", kind="tool", tool_name=tool, arguments={"n": n}, result=result, error=error,
                      mcp_method="tools/call", start_ns=n * 1000, end_ns=n * 1000 + 500)


def protocol(method, result=None, trace=TRACE):
    n = next(_ids)
    return SpanRecord(trace_id=trace, span_id=f"{n:016x}", parent_span_id=None, name=method, dialect="mcp",
                      kind="other", mcp_method=method, ignored="protocol", result=result,
                      start_ns=n * 1000, end_ns=n * 1000 + 500)


def agent(answer=None, declared=(), name="host", trace=TRACE):
    n = next(_ids)
    return SpanRecord(trace_id=trace, span_id=f"{n:016x}", parent_span_id=None, name="invoke_agent",
                      dialect="otel_genai", kind="agent", agent_name=name, final_answer=answer,
                      declared_services=tuple(declared), start_ns=1, end_ns=10**9)


def score(*records, config=None):
    return SessionScorer(config).score("s1", list(records))


def initialize(*services_in_experimental, instructions=None, trace=TRACE):
    return protocol("initialize", trace=trace, result={
        "protocolVersion": "2025-11-25", "serverInfo": {"name": "tools", "version": "1.0"},
        "capabilities": {"tools": {"listChanged": False},
                         "experimental": {s: {"version": "2026-01-11"} for s in services_in_experimental}},
        "instructions": instructions})


def listing(trace=TRACE, **annotations):
    return protocol("tools/list", {"tools": [{"name": name, "annotations": hints}
                                             for name, hints in annotations.items()]}, trace=trace)


MATCHER = StepMatcher(FunnelSettings())


# ------------------------------------------------------------------------------------ vocabulary


@pytest.mark.parametrize("family", VOCABULARY, ids=[f.family for f in VOCABULARY])
def test_each_family_reads_as_its_variant_and_its_names_reach_their_steps(family):
    for step, names in family.steps.items():
        for name in names:
            assert MATCHER.commerce_step(name.replace("*", "x"), family.variant) == step, (name, step)
    s = score(*(call(name.replace("*", "x")) for names in family.steps.values() for name in names))
    assert s.variant == family.variant and s.variant_source == "inferred"
    assert s.steps == tuple(k for k in BUILTIN_VARIANTS[family.variant] if k in family.steps)
    assert family.source


def test_no_built_in_name_is_in_two_steps():
    owner: dict[str, str] = {}
    for family in VOCABULARY:
        for step, names in family.steps.items():
            for name in names:
                assert owner.setdefault(name, step) == step, (name, owner[name], step, family.family)
    FunnelSettings()  # the default configuration passes its own consistency check


@pytest.mark.parametrize("family", [f for f in VOCABULARY if f.family in ("flights", "trains", "car_rental")],
                         ids=lambda f: f.family)
def test_travel_that_is_not_lodging_carries_no_lodging_hint(family):
    for names in family.steps.values():
        for name in names:
            assert not any(hint in name for hint in LODGING_HINTS), name


def test_a_flight_booking_is_never_lodging():
    booked = {"booking": {"id": "ord_0000A", "status": "confirmed"}}
    flight = score(call("search_flights", {"offers": [{"id": "off_1"}]}), call("get_offer_details", {"id": "off_1"}),
                   call("hold_seat", {"hold_id": "h1"}), call("book_flight", booked))
    assert (flight.variant, flight.steps, flight.outcome) == (
        "shopping", ("search", "details", "cart", "checkout"), "purchase_completed")
    # the booking-session names UCP lodging uses are not lodging-specific: a flight's session stays shopping
    session = score(call("search_flight"), call("create_booking_session", {"hold_id": "x"}),
                    call("complete_booking_session", booked))
    assert session.variant == "shopping" and session.variant_source == "inferred"
    for trip in ([call("search_trains"), call("create_flight_booking")], [call("search_cars"), call("rent_car")]):
        assert score(*trip).variant == "shopping"
    # a hotel in the same session makes it lodging (mixed sessions: lodging > shopping), as declaring it does
    assert score(call("search_flights"), call("search_hotels"), call("book_room")).variant == "lodging"
    assert score(call("create_booking_session"), agent(declared=["dev.ucp.lodging"])).variant == "lodging"


def test_vacation_rentals_are_lodging():
    s = score(call("airbnb_search", {"listings": [{"id": "l1"}]}), call("airbnb_listing_details", {"id": "l1"}))
    assert s.variant == "lodging" and s.steps == ("search",)
    assert s.call_steps and set(s.call_steps.values()) == {"search", "details"}


def test_hyphenated_names_match_as_underscores():
    assert MATCHER.commerce_step("search-flight") == "search"  # Kiwi.com's MCP server
    assert MATCHER.commerce_step("mcp__kiwi__search-flight") == "search"
    assert MATCHER.commerce_step("search-car-hire") == "search"
    cfg = ScoringConfig.model_validate({"funnel": {"extra_patterns": {"cart": ["put-in-basket"]}}})
    assert score(call("put_in_basket"), config=cfg).steps == ("cart",)
    with pytest.raises(ValidationError, match="'add_to_cart' is in two steps of variant shopping: search and cart"):
        FunnelSettings.model_validate({"extra_patterns": {"search": ["add-to-cart"]}})


def test_store_admin_tools_are_not_a_shoppers_steps():
    # WooCommerce / Shopify admin servers manage a store: creating a product is no cart
    assert score(call("create_product"), call("woo_products_create"), call("update_order")).variant == "generic"


def test_the_docs_list_every_family():
    section = docs_text.section("docs/sessions.md", "## Built-in vocabulary")
    for family in VOCABULARY:
        row = next((line for line in section.splitlines() if line.startswith(f"| {family.family} |")), None)
        assert row, family.family
        for names in family.steps.values():
            for name in names:
                assert f"`{name}`" in row, (family.family, name)


# ------------------------------------------------------------------ UCP services in MCP initialize


@pytest.mark.parametrize("result,services", [
    ({"capabilities": {"experimental": {"dev.ucp.shopping": {"version": "2026-01-11"}}}}, ("dev.ucp.shopping",)),
    ({"capabilities": {"experimental": {"ucp": {"services": {"dev.ucp.lodging": [{"transport": "mcp"}]},
                                                "capabilities": {"dev.ucp.lodging.booking": [{}]}}}}},
     ("dev.ucp.lodging",)),
    ({"capabilities": {"extensions": {"dev.ucp.shopping.checkout": {}}}}, ("dev.ucp.shopping",)),
    ({"instructions": "A UCP business: dev.ucp.shopping.checkout and dev.ucp.food.checkout over MCP."},
     ("dev.ucp.shopping", "dev.ucp.food")),
    ({"_meta": {"ucp": {"version": "2026-01-11", "services": ["dev.ucp.procurement"]}}}, ("dev.ucp.procurement",)),
    ({"serverInfo": {"name": "shop-tools"}, "capabilities": {"experimental": {}}, "instructions": None}, ()),
    ({"instructions": "see https://ucp.dev/specification/overview"}, ()),
    ("not a result", ()), (None, ()), ([1, {"dev.ucp.shopping": 1}], ("dev.ucp.shopping",)),
])
def test_ucp_services_are_read_from_an_initialize_result(result, services):
    assert declared_services(result) == services


def test_a_hostile_initialize_result_is_read_within_bounds():
    deep: dict = {}
    node = deep
    for _ in range(5000):
        node["x"] = {}
        node = node["x"]
    node["dev.ucp.shopping"] = 1
    assert declared_services(deep) == ()  # past the depth read
    wide = {"capabilities": {"experimental": {f"k{i}": i for i in range(10_000)} | {"dev.ucp.lodging": 1}}}
    assert declared_services(wide) == ()  # past the nodes read


def test_the_dialect_keeps_a_captured_handshake_result():
    result = {"protocolVersion": "2025-11-25", "capabilities": {"experimental": {"dev.ucp.lodging": {}}},
              "serverInfo": {"name": "hotel-tools", "version": "1.0"}}
    semconv = SpanView("a" * 32, "b" * 16, None, "initialize", {"mcp.method.name": "initialize",
                                                               "mcp.response.value": json.dumps(result)})
    r = normalize(semconv)
    assert (r.kind, r.ignored, r.mcp_method, r.result) == ("other", "protocol", "initialize", result)
    traceloop = SpanView("a" * 32, "c" * 16, None, "initialize.mcp", {"traceloop.entity.output": json.dumps(result)},
                         scope_name=MCP_SCOPE)
    r = normalize(traceloop)
    assert (r.dialect, r.kind, r.ignored, r.mcp_method, r.result) == ("openllmetry", "other", "protocol",
                                                                      "initialize", result)
    # a listing is kept cut to what is read of it: names and annotations, not the schemas
    listed = {"tools": [{"name": "list_issues", "inputSchema": {"type": "object"},
                         "annotations": {"readOnlyHint": True}},
                        {"name": "archive_issue", "inputSchema": {}, "annotations": None}, {"bad": 1}],
              "nextCursor": None}
    r = normalize(SpanView("a" * 32, "d" * 16, None, "tools/list.mcp",
                           {"traceloop.entity.output": json.dumps(listed)}, scope_name=MCP_SCOPE))
    assert r.result == {"tools": [{"name": "list_issues", "annotations": {"readOnlyHint": True}},
                                  {"name": "archive_issue", "annotations": None}]}
    # the instrumentation's other spans stay OpenLLMetry's alone
    stream = normalize(SpanView("a" * 32, "e" * 16, None, "ResponseStreamWriter", {"mcp.request.id": 1},
                                scope_name=MCP_SCOPE))
    assert stream.mcp_method is None and stream.result is None
    # without a captured result (the MCP SDK's own spans) nothing is invented
    bare = normalize(SpanView("a" * 32, "f" * 16, None, "initialize", {"mcp.method.name": "initialize"}))
    assert bare.result is None


def test_declared_in_initialize_decides_the_variant_and_says_so():
    lodging = score(initialize("dev.ucp.lodging"), call("create_booking_session", {"hold_id": "h"}),
                    call("complete_booking_session", {"booking": {"id": "b1", "status": "confirmed"}}))
    assert (lodging.variant, lodging.variant_source, lodging.outcome) == ("lodging", "mcp_initialize",
                                                                          "purchase_completed")
    assert lodging.steps == ("cart", "checkout", "purchase")
    without = score(call("create_booking_session", {"hold_id": "h"}))
    assert (without.variant, without.variant_source) == ("shopping", "inferred")
    by_instructions = score(initialize(instructions="Implements dev.ucp.lodging.booking."), call("search_products"))
    assert (by_instructions.variant, by_instructions.variant_source) == ("lodging", "mcp_initialize")
    # no tool call: the declared variant still applies
    info = score(initialize("dev.ucp.shopping"), agent("We ship worldwide."))
    assert (info.variant, info.variant_source, info.outcome) == ("shopping", "mcp_initialize", "info_provided")


def test_initialize_ranks_below_configuration_and_the_declared_attribute():
    cfg = ScoringConfig.model_validate({"funnel": {"agents": {"concierge": "procurement"}}})
    assert score(initialize("dev.ucp.lodging"), agent(name="concierge"), config=cfg).variant_source == "config"
    both = score(initialize("dev.ucp.lodging"), agent(declared=["dev.ucp.shopping"]), call("search_products"))
    assert (both.variant, both.variant_source) == ("shopping", "declared")
    switched = score(initialize("dev.ucp.shopping"), call("search_catalog"), call("create_rfq", {"rfq_id": "r"}))
    assert (switched.variant, switched.variant_source) == ("procurement", "mcp_initialize+inferred")
    unmapped = score(initialize("dev.ucp.common"), call("list_issues"))
    assert (unmapped.variant, unmapped.variant_source) == ("generic", "inferred")


def test_server_facts_are_the_same_scored_whole_or_trace_by_trace():
    turn1 = [agent(trace="1" * 32), initialize("dev.ucp.lodging", trace="1" * 32),
             listing(trace="1" * 32, archive_issue=None)]
    turn2 = [agent("Held.", trace="2" * 32), call("create_booking_session", {"hold_id": "h"}, trace="2" * 32)]
    records = [*turn1, *turn2]
    scorer = SessionScorer()
    whole = scorer.score("s1", records)
    session = Session("s1", {"1" * 32: TraceShare("1" * 32, tuple(r for r in records if r.trace_id == "1" * 32)),
                             "2" * 32: TraceShare("2" * 32, tuple(turn2))})
    assert scorer.score_session(session) == whole
    assert (whole.variant, whole.variant_source, whole.steps) == ("lodging", "mcp_initialize", ("cart",))


# ------------------------------------------------------------------------------ tool annotations


@pytest.mark.parametrize("hints,kind", [
    ({"readOnlyHint": True}, "read"), ({"readOnlyHint": True, "destructiveHint": True}, "read"),
    ({"readOnlyHint": False}, "action"), ({"destructiveHint": True}, "action"),
    ({"destructiveHint": False}, "action"), ({"readOnlyHint": False, "destructiveHint": False}, "action"), ({}, None),
])
def test_annotation_kinds(hints, kind):
    assert annotated_kind(hints) == kind


def test_tool_annotations_reader_keeps_only_boolean_hints():
    result = {"tools": [{"name": "a", "annotations": {"readOnlyHint": True, "title": "A", "openWorldHint": True}},
                        {"name": "b", "annotations": json.dumps({"destructiveHint": True})},
                        {"name": "c", "annotations": {"readOnlyHint": "yes"}}, {"name": "d"}, "junk",
                        {"annotations": {}}]}
    assert tool_annotations(result) == {"a": {"readOnlyHint": True}, "b": {"destructiveHint": True}}
    assert tool_annotations({"tools": "x"}) == {} and tool_annotations(None) == {}


def test_annotations_win_over_name_patterns_in_generic_sessions():
    tools = listing(archive_issue={"readOnlyHint": False, "destructiveHint": True},
                    create_preview={"readOnlyHint": True}, list_issues=None)
    acted = score(tools, call("list_issues", {"issues": []}), call("create_preview", {"html": "<p/>"}),
                  call("archive_issue", {"ok": True}))
    assert (acted.variant, acted.steps, acted.outcome) == ("generic", ("discover", "read", "action"), "action_taken")
    assert sorted(acted.call_steps.values()) == ["action", "read", "read"]
    read = score(tools, call("list_issues", {"issues": []}), call("create_preview", {"html": "<p/>"}))
    assert (read.steps, read.outcome, read.outcome_reads_as) == (("discover", "read"), "read_only", "partial")
    # the same calls without the listing: the name patterns decide (create_* acts, archive_* reads)
    patterns = score(call("create_preview"), call("archive_issue"))
    assert sorted(patterns.call_steps.values()) == ["action", "read"]
    only_archive = score(call("archive_issue"))
    assert only_archive.outcome == "read_only"
    assert score(tools, call("archive_issue")).outcome == "action_taken"
    # an errored annotated action reaches no step
    errored = score(tools, call("list_issues"), call("archive_issue", error="tool_error"))
    assert (errored.steps, errored.outcome, errored.stopped_by_error) == (("discover", "read"), "read_only", True)


def test_annotations_match_prefixed_and_hyphenated_calls_and_disagreeing_listings_act():
    tools = listing(**{"Archive-Issue": {"destructiveHint": True}})
    assert score(tools, call("mcp__tracker__archive_issue")).outcome == "action_taken"
    reads = ServerFacts.of([listing(sync={"readOnlyHint": True})])
    acts = ServerFacts.of([listing(sync={"readOnlyHint": False})])
    assert ServerFacts.merged([reads, acts]).annotations == {"sync": "action"}
    assert ServerFacts.merged([acts, reads]).annotations == {"sync": "action"}
    assert ServerFacts.of([listing(sync={"readOnlyHint": True}), listing(sync={"readOnlyHint": False}),
                           listing(sync={"readOnlyHint": True})]).annotations == {"sync": "action"}


def test_annotations_do_not_touch_commerce_steps():
    s = score(listing(search_products={"readOnlyHint": True}, add_to_cart={"destructiveHint": False}),
              call("search_products", {"products": [{"id": "p"}]}), call("add_to_cart", {"cart_id": "c"}))
    assert (s.variant, s.steps) == ("shopping", ("search", "cart"))


# --------------------------------------------------------------------- custom variants' outcomes


SUPPORT = {"steps": [{"key": "lookup", "patterns": ["find_ticket"]}, {"key": "reply", "patterns": ["draft_reply"]},
                     {"key": "resolve", "patterns": ["close_ticket"]}]}


def test_custom_outcomes_read_as_configured_or_by_their_place():
    cfg = ScoringConfig.model_validate({"funnel": {"variants": {"support": {
        **SUPPORT, "outcomes": {"lookup": "looked_up", "reply": {"outcome": "replied", "reads_as": "info"},
                                "resolve": {"outcome": "resolved"}}}}}})
    full = score(call("find_ticket"), call("draft_reply"), call("close_ticket"), config=cfg)
    assert (full.variant, full.outcome, full.outcome_reads_as) == ("support", "resolved", "pass")
    replied = score(call("find_ticket"), call("draft_reply"), config=cfg)
    assert (replied.outcome, replied.outcome_reads_as) == ("replied", "info")
    looked = score(call("find_ticket"), config=cfg)
    assert (looked.outcome, looked.outcome_reads_as) == ("looked_up", "partial")
    plain = ScoringConfig.model_validate({"funnel": {"variants": {"support": SUPPORT}}})
    assert [(s.outcome, s.outcome_reads_as) for s in (score(call("find_ticket"), config=plain),
                                                      score(call("find_ticket"), call("close_ticket"), config=plain))] \
        == [("lookup_reached", "partial"), ("resolve_reached", "pass")]
    # a built-in outcome value reads as it does everywhere; below every rung the built-in ones apply
    built_in = ScoringConfig.model_validate({"funnel": {"variants": {"support": {
        **SUPPORT, "outcomes": {"lookup": "search_only"}}}}})
    assert score(call("find_ticket"), config=built_in).outcome_reads_as == "partial"
    errored = score(call("find_ticket", error="503"), agent(name="support-bot"), config=plain)
    assert (errored.outcome, errored.outcome_reads_as) == ("failed", "fail")


@pytest.mark.parametrize("outcomes,message", [
    ({"resolv": "resolved"}, "outcomes.resolv: not a step of this variant (its steps: lookup, reply, resolve)"),
    ({"resolve": {"outcome": "resolved", "reads_as": "great"}},
     "variants.support.outcomes.resolve.reads_as\n  Input should be 'pass', 'partial', 'info', 'fail', 'unknown' or "
     "'neutral'"),
    ({"resolve": {"outcome": "Resolved!"}}, "variants.support.outcomes.resolve.outcome\n  String should match pattern"),
    ({"resolve": {"outcome": "resolved", "read_as": "pass"}},
     "variants.support.outcomes.resolve.read_as\n  Extra inputs"),
    ({"resolve": {"outcome": "purchase_completed", "reads_as": "fail"}},
     "outcomes.resolve.reads_as: 'purchase_completed' reads as 'pass' in every variant"),
    ({"reply": "done", "resolve": "done"},
     "outcomes: 'done' is the rung of steps reply and resolve, which read as 'partial' and 'pass'"),
])
def test_custom_outcome_errors_name_the_field(outcomes, message):
    with pytest.raises(ValidationError) as err:
        FunnelSettings.model_validate({"variants": {"support": {**SUPPORT, "outcomes": outcomes}}})
    assert message in str(err.value)


def test_two_steps_may_share_a_rung_that_reads_one_way():
    cfg = ScoringConfig.model_validate({"funnel": {"variants": {"support": {**SUPPORT, "outcomes": {
        "reply": {"outcome": "handled", "reads_as": "pass"}, "resolve": "handled"}}}}})
    assert [(s.outcome, s.outcome_reads_as) for s in (score(call("draft_reply"), config=cfg),
                                                      score(call("close_ticket"), config=cfg))] \
        == [("handled", "pass"), ("handled", "pass")]


def test_a_step_key_used_twice_is_refused():
    with pytest.raises(ValidationError, match="steps: key 'a' is used twice"):
        FunnelSettings.model_validate({"variants": {"v": {"steps": [{"key": "a", "patterns": ["x"]},
                                                                    {"key": "a", "patterns": ["y"]}]}}})


def test_config_file_errors_name_the_field(tmp_path):
    path = tmp_path / "agentfunnel.yaml"
    path.write_text(yaml.safe_dump({"scoring": {"funnel": {"variants": {"support": {
        **SUPPORT, "outcomes": {"resolve": {"outcome": "resolved", "reads_as": "yes"}}}}}}}))
    with pytest.raises(ConfigError) as err:
        load_settings(path)
    assert "scoring.funnel.variants.support.outcomes.resolve.reads_as: Input should be 'pass'" in str(err.value)


def test_the_docs_configuration_example_is_valid():
    block = re.search(r"```yaml\n(.*?)```", docs_text.section("docs/sessions.md", "## Configuration"), re.S).group(1)
    cfg = ScoringConfig.model_validate(yaml.safe_load(block)["scoring"])
    support = cfg.funnel.variants["support"]
    assert support.reads_as(support.outcome_of("resolve")) == "pass"


# ------------------------------------------------------------- end to end, from recorded fixtures


def test_recorded_traceloop_handshakes_are_read_and_change_nothing_without_ucp(tmp_path):
    """LangGraph + OpenLLMetry with MCP tools: its initialize and tools/list results are captured (no
    UCP service, no annotations), so the session reads as before: shopping, inferred."""
    db = tmp_path / "lg.duckdb"
    run_cli("ingest", "--db", str(db), str(FIXTURES / "otlp" / "langgraph-openllmetry" /
                                             "mcp_shop_tool_error.traces.binpb"))
    rows = read_db(db, "SELECT variant, variant_source, steps, outcome FROM sessions")
    assert rows == [{"variant": "shopping", "variant_source": "inferred", "steps": ["search", "cart"],
                     "outcome": "checkout_reached"}]


def test_recorded_ucp_declaration_and_tool_annotations_decide_through_ingest(tmp_path):
    """MCP client spans of OpenLLMetry's instrumentation, recorded (recorders/mcp-openllmetry): a hotel
    server declaring dev.ucp.lodging in its initialize result, and an issue tracker whose tools/list
    annotations contradict the name patterns."""
    db = tmp_path / "mcp.duckdb"
    recorded = FIXTURES / "otlp" / "mcp-openllmetry"
    run_cli("ingest", "--db", str(db), *sorted(str(p) for p in recorded.glob("*.binpb")))
    rows = {r["session_id"].removeprefix("conv-mcp-openllmetry-"): r for r in read_db(
        db, "SELECT session_id, variant, variant_source, steps, outcome, outcome_reads_as FROM sessions")}
    assert {k: (r["variant"], r["variant_source"], r["steps"], r["outcome"], r["outcome_reads_as"])
            for k, r in rows.items()} == {
        "lodging_declared": ("lodging", "mcp_initialize", ["cart", "checkout", "purchase"], "purchase_completed",
                             "pass"),
        "generic_annotated": ("generic", "inferred", ["discover", "read", "action"], "action_taken", "pass"),
        "generic_read_only": ("generic", "inferred", ["discover", "read"], "read_only", "partial"),
    }
    steps = {(r["session_id"].removeprefix("conv-mcp-openllmetry-"), r["tool_name"]): r["step"]
             for r in read_db(db, "SELECT session_id, tool_name, step FROM tool_calls")}
    assert steps == {
        ("lodging_declared", "create_booking_session"): "cart",
        ("lodging_declared", "complete_booking_session"): "checkout",
        ("generic_annotated", "list_issues"): "read",  # no annotations: the patterns
        ("generic_annotated", "create_preview"): "read",  # readOnlyHint, though create_* is an action pattern
        ("generic_annotated", "archive_issue"): "action",  # destructiveHint, though no pattern names it
        ("generic_read_only", "list_issues"): "read", ("generic_read_only", "create_preview"): "read",
    }


def test_the_recorded_calls_are_the_scripted_ones():
    """The recorder wrote what it scripted beside each fixture (expected.yaml): the calls normalize back to it."""
    recorded = FIXTURES / "otlp" / "mcp-openllmetry"
    for expected in sorted(recorded.glob("*.expected.yaml")):
        exp = yaml.safe_load(expected.read_text())
        b = decode_traces_protobuf(expected.with_name(exp["scenario"] + ".traces.binpb").read_bytes())
        records = sorted((normalize(SpanView(b.trace_id[i], b.span_id[i], b.parent_span_id[i], b.name[i], b.attrs[i],
                                             b.resource_attrs[i], b.event_list[i], b.kind[i], b.status_code[i],
                                             b.status_message[i], b.scope_name[i], b.start_ns[i], b.end_ns[i]))
                          for i in range(len(b))), key=lambda r: r.start_ns)
        calls = [r for r in records if r.is_tool_call]
        assert [(c.tool_name, c.arguments, c.result) for c in calls] == [
            (c["tool"], c["arguments"], c["result"]) for c in exp["tool_calls"]], expected.name
        assert [r.mcp_method for r in records if r.mcp_method] == ["initialize", "tools/list"]


def test_counts_agree_with_their_nouns_and_no_number_reads_minus_zero():
    from agentfunnel.collector.phrasing import fixed, plural
    from agentfunnel.collector.report.text import text
    from agentfunnel.collector.ui.words import t

    assert [text("n_sessions", "en", n=n) for n in (0, 1, 2)] == ["0 sessions", "1 session", "2 sessions"]
    assert text("wrote", "en", path="r.html", n=1) == "wrote HTML report to r.html (1 session)"
    assert text("n_sessions", "ja", n=1) == text("n_sessions", "ja", n=2).replace("2", "1")
    assert [t("results", "en", n=n) for n in (1, 3)] == ["1 session", "3 sessions"]
    assert [plural(n, "criterion", "criteria") for n in (1, 2)] == ["1 criterion", "2 criteria"]
    assert [plural(n, "label") for n in (1, 0)] == ["1 label", "0 labels"]
    assert [fixed(x) for x in (-0.001, -0.0, 0.004, -0.5, 0.25)] == ["0.00", "0.00", "0.00", "-0.50", "0.25"]
