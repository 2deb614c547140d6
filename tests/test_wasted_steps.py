"""Wasted steps by kind (SPEC §7): repeats, retries, re-derivations and walk-backs, each call in one kind.

Pure scoring on records built by hand, turn by turn (a trace per turn): no server, no store. The kinds are
checked against a reference written from their definitions, call by call over the whole session, and the
session scored from its turns' summaries (in any order, one turn at a time) against the whole session.
"""

from __future__ import annotations

import itertools
import json
import random
from dataclasses import replace

import pytest

from agentfunnel.scoring import ScoringConfig, SessionScorer
from agentfunnel.scoring.config import FunnelSettings
from agentfunnel.semconv import SpanRecord

SCORER = SessionScorer()
KINDS = ("wasted_repeats", "wasted_retries", "wasted_rederivations", "wasted_walk_backs")
_ids = itertools.count(1)
SHOP_STEPS = {"search_products": 1, "get_product_details": 2, "add_to_cart": 3, "complete_checkout": 4}


def call(turn: int, tool: str, args: dict | None = None, error: str | None = None, at: int | None = None) -> SpanRecord:
    """A tool call of turn ``turn`` (trace ``t<turn>``), in the order the calls are made."""
    n = next(_ids)
    start = at if at is not None else turn * 10**6 + n * 1000
    return SpanRecord(trace_id=f"t{turn}", span_id=f"{n:016x}", parent_span_id=None, name=f"execute_tool {tool}",
                      dialect="otel_genai", kind="tool", tool_name=tool, arguments=args or {}, error=error,
                      result=None if error else {"ok": True}, start_ns=start, end_ns=start + 500)


def turns_of(records: list[SpanRecord]) -> list[list[SpanRecord]]:
    out: dict[str, list[SpanRecord]] = {}
    for r in records:
        out.setdefault(r.trace_id, []).append(r)
    return list(out.values())


def kinds(score) -> tuple[int, int, int, int]:
    return tuple(getattr(score, k) for k in KINDS)


def scored(records: list[SpanRecord], scorer: SessionScorer = SCORER):
    """The whole session, after asserting that its turns' summaries combine to the same score in any order,
    turn by turn (each prefix of turns as the session then stood) and as one summary of every record."""
    whole = scorer.score("s1", records)
    summaries = [scorer.summarize(t) for t in turns_of(records)]
    for order in itertools.permutations(summaries) if len(summaries) <= 4 else (summaries, summaries[::-1]):
        assert scorer.combine("s1", list(order)) == whole
    for n in range(1, len(summaries) + 1):  # as each turn arrives
        so_far = [r for t in turns_of(records)[:n] for r in t]
        assert scorer.combine("s1", summaries[:n]) == scorer.score("s1", so_far)
    assert scorer.combine("s1", [scorer.summarize(records)]) == whole
    assert whole.wasted_steps == sum(kinds(whole))
    return whole


def reference(records: list[SpanRecord], steps: dict[str, int] = SHOP_STEPS) -> tuple[int, int, int, int]:
    """The kinds from their definitions, over the session's calls in the order they were made."""
    calls = sorted(records, key=lambda r: (r.start_ns, r.end_ns, r.span_id))
    made: dict[tuple, list[int]] = {}  # identity -> positions so far
    furthest: dict[str, int] = {}  # trace -> the furthest step a successful call of it reached
    counts = [0, 0, 0, 0]
    for i, c in enumerate(calls):
        identity = (c.tool_name, json.dumps(c.arguments, sort_keys=True, default=str))
        at = steps.get(c.tool_name)
        if identity in made:
            latest = calls[made[identity][-1]]
            counts[1 if latest.error else 0 if made[identity][-1] == i - 1 else 2] += 1
        elif at is not None and at < furthest.get(c.trace_id, 0):
            counts[3] += 1
        made.setdefault(identity, []).append(i)
        if at is not None and not c.error:
            furthest[c.trace_id] = max(furthest.get(c.trace_id, 0), at)
    return tuple(counts)


# -- each kind ---------------------------------------------------------------------------------------


def test_the_same_call_right_after_it_worked_is_a_repeat_even_across_a_turn():
    s = scored([call(1, "search_products", {"q": "shoes"}), call(1, "search_products", {"q": "shoes"}),
                call(2, "search_products", {"q": "shoes"}), call(2, "search_products", {"q": "boots"})])
    assert kinds(s) == (2, 0, 0, 0) and s.wasted_steps == 2


def test_the_same_call_after_it_failed_is_a_retry_adjacent_or_not():
    s = scored([call(1, "add_to_cart", {"v": "1"}, error="503"), call(1, "get_product_details", {"id": "p"}),
                call(1, "add_to_cart", {"v": "1"}, error="503"), call(2, "add_to_cart", {"v": "1"})])
    assert kinds(s) == (0, 2, 0, 0)  # the second and third add_to_cart; a retry that worked still repeated it


def test_a_fact_the_session_already_had_fetched_again_in_a_later_turn_is_a_re_derivation():
    turn1 = [call(1, "search_products", {"q": "shoes", "limit": 4}), call(1, "get_product_details", {"id": "p1"})]
    turn2 = [call(2, "get_product_details", {"id": "p2"}),
             call(2, "search_products", {"limit": 4, "q": "shoes"})]  # the same arguments, in another key order
    s = scored(turn1 + turn2)
    assert kinds(s) == (0, 0, 1, 0) and s.tool_call_count == 4
    assert kinds(SCORER.combine("s1", [SCORER.summarize(turn1)])) == (0, 0, 0, 0)  # turn 1 alone wasted nothing


def test_going_back_to_an_earlier_step_after_reaching_a_later_one_is_a_walk_back():
    s = scored([call(1, "search_products", {"q": "shoes"}), call(1, "get_product_details", {"id": "p1"}),
                call(1, "add_to_cart", {"v": "v1"}), call(1, "search_products", {"q": "trail shoes"}),
                call(1, "get_product_details", {"id": "p2"}), call(1, "add_to_cart", {"v": "v2"})])
    assert kinds(s) == (0, 0, 0, 2)  # cart -> search again, and its details: back from the cart
    assert s.steps == ("search", "details", "cart")


def test_a_new_turn_starts_from_the_top_of_the_funnel_without_walking_back():
    s = scored([call(1, "search_products", {"q": "shoes"}), call(1, "add_to_cart", {"v": "v1"}),
                call(2, "search_products", {"q": "socks"}), call(2, "add_to_cart", {"v": "v2"})])
    assert kinds(s) == (0, 0, 0, 0)


def test_a_failed_call_reaches_no_step_so_going_back_after_it_is_no_walk_back():
    s = scored([call(1, "search_products", {"q": "shoes"}), call(1, "add_to_cart", {"v": "v1"}, error="sold out"),
                call(1, "search_products", {"q": "boots"})])
    assert kinds(s) == (0, 0, 0, 0)


def test_a_call_counts_in_one_kind_the_call_made_before_first():
    # back at search after the cart, with the very search made before: a re-derivation, not also a walk-back
    s = scored([call(1, "search_products", {"q": "shoes"}), call(1, "add_to_cart", {"v": "v1"}),
                call(1, "search_products", {"q": "shoes"})])
    assert kinds(s) == (0, 0, 1, 0) and s.wasted_steps == 1
    # the same across two turns: turn 2's search repeats turn 1's, and its walk-back is not counted again
    s = scored([call(1, "search_products", {"q": "a"}), call(2, "search_products", {"q": "b"}),
                call(2, "add_to_cart", {"v": "v"}), call(2, "search_products", {"q": "a"})])
    assert kinds(s) == (0, 0, 1, 0)


def test_generic_sessions_do_not_walk_back():
    s = scored([call(1, "list_issues"), call(1, "create_issue", {"t": "x"}), call(1, "search_docs", {"q": "y"})])
    assert s.variant == "generic" and kinds(s) == (0, 0, 0, 0)


def test_a_variant_of_your_own_walks_back_along_its_own_steps():
    config = ScoringConfig(funnel=FunnelSettings(variants={"support": {"steps": [
        {"key": "triage", "patterns": ["classify_*"]}, {"key": "resolve", "patterns": ["close_ticket"]}]}}))
    scorer = SessionScorer(config)
    s = scored([call(1, "classify_ticket", {"id": 1}), call(1, "close_ticket", {"id": 1}),
                call(1, "classify_ticket", {"id": 2})], scorer)
    assert s.variant == "support" and kinds(s) == (0, 0, 0, 1)


# -- against the reference, on many sessions ---------------------------------------------------------


def _random_session(rnd: random.Random) -> list[SpanRecord]:
    tools = list(SHOP_STEPS) + ["check_inventory"]
    records, t = [], 0
    for turn in range(1, rnd.randint(1, 4) + 1):
        for _ in range(rnd.randint(0, 6)):
            t += rnd.choice((1000, 1000, 0))  # sometimes two calls start at one instant
            records.append(call(turn, rnd.choice(tools), {"q": rnd.randint(1, 3)},
                                error="503" if rnd.random() < 0.2 else None, at=turn * 10**9 + t))
    return records


def test_every_kind_matches_its_definition_call_by_call():
    rnd = random.Random(7)
    seen = [0, 0, 0, 0]
    for _ in range(300):
        records = _random_session(rnd)
        s = scored(records)
        assert kinds(s) == reference(records), [(r.trace_id, r.tool_name, r.arguments, r.error) for r in records]
        # the kinds that repeat a call add up to what wasted steps counted before the kinds had names
        distinct = {(r.tool_name, json.dumps(r.arguments, sort_keys=True)) for r in records}
        assert sum(kinds(s)[:3]) == len(records) - len(distinct)
        seen = [a + bool(b) for a, b in zip(seen, kinds(s))]
    assert all(n >= 20 for n in seen), seen  # every kind was exercised


def test_a_call_span_id_in_two_traces_is_read_as_one_call_as_the_rest_of_scoring_reads_it():
    first = call(1, "search_products", {"q": "a"})
    again = replace(call(2, "search_products", {"q": "a"}), span_id=first.span_id)
    s = SCORER.combine("s1", [SCORER.summarize([first]), SCORER.summarize([again])])
    assert s == SCORER.score("s1", [first, again]) and s.wasted_steps == s.wasted_repeats == 1


@pytest.mark.parametrize("order", [lambda s: s, lambda s: s[::-1]])
def test_traces_that_overlap_in_time_are_read_as_one_sequence(order):
    # turn 2's first call starts between turn 1's calls: the summaries are merged, calls read by start
    a = [call(1, "search_products", {"q": "a"}, at=1000), call(1, "add_to_cart", {"v": "v"}, at=3000)]
    b = [call(2, "search_products", {"q": "a"}, at=2000)]
    s = SCORER.combine("s1", order([SCORER.summarize(a), SCORER.summarize(b)]))
    assert s == SCORER.score("s1", a + b) and kinds(s) == (1, 0, 0, 0)
