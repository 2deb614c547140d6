"""The experiment numbers' renderers: pure functions of ``ExperimentStats``, escaped, in time order."""

from __future__ import annotations

import datetime as dt

from agentfunnel.collector.report.experiments import (CaseStats, ExperimentStats, html_body, in_time_order, render_terminal,
                                               trends_html)

HOSTILE = "case\x1b]0;pwned\x07<script>"


def _stats(name: str, day: int, hat: float, exposure: bool = False) -> ExperimentStats:
    return ExperimentStats(name, (CaseStats(HOSTILE, 3, 2, 1.0, hat, {"crash": 1}),), runs=3,
                           started=dt.datetime(2026, 1, day), failure_mix={"crash": 1}, controlled_exposure=exposure)


def test_controlled_exposure_and_hostile_case_ids_render_inert():
    e = _stats("exp", 1, 0.0, exposure=True)
    text = render_terminal(e, 100)
    assert "controlled exposure (candidates supplied)" in text and "\x1b" not in text and "\x07" not in text
    assert "crash 1" in text and "0.00" in text and "1.00" in text
    page = html_body(e)
    assert "<script>" not in page and "&lt;script&gt;" in page and "controlled exposure" in page


def test_trends_need_three_experiments_and_follow_their_start_times():
    later, first, middle = _stats("z-last", 9, 1.0), _stats("a-first", 1, 0.0), _stats("m-mid", 5, 0.5)
    assert trends_html([later, first]) == ""
    assert [e.experiment for e in in_time_order([later, first, middle])] == ["a-first", "m-mid", "z-last"]
    page = trends_html([later, first, middle])
    assert "a-first → m-mid → z-last" in page
    reliable = page[page.index("reliable (pass^k)"):page.index("recoverable (pass@k)")]
    assert [t.split("<")[0] for t in reliable.split("<title>")[1:]] == ["a-first: 0.00", "m-mid: 0.50", "z-last: 1.00"]


def test_why_a_case_regressed_shows_the_judges_reasons_and_renders_inert():
    from agentfunnel.collector.regression import judge_reasons, render_html, terminal_renderables
    from rich.console import Console

    reasons = judge_reasons({"explanation": "The date is not stated.", "missing_requirements": '["the date"]',
                             "unsupported_claims": [], "error": None,
                             "criteria": '[{"criterion": "states the date", "status": "missing"}, '
                                         '{"criterion": "states the rate", "status": "satisfied"}]'})
    assert reasons == ("The date is not stated.", "missing: the date", "criterion missing: states the date")
    assert judge_reasons({"error": "HTTP 402: credit"}) == ("no verdict: HTTP 402: credit",)
    run = {"session_id": "s\x1b[2J", "run_id": "r", "passed": False, "first_failed_stage": "invocation",
           "failure_class": "invalid_tool_call", "fix_hint": None, "more_calls": 0, "judge_reasons": reasons,
           "calls": [{"tool": "get_rate", "arguments": '{"base": "<b>eur</b>"}', "error": "bad \x07"}]}
    why = {"fx-rate": {"a": None, "b": run}}
    buf = Console(width=120, file=__import__("io").StringIO(), markup=False)
    for t in terminal_renderables(why, "base", "cand"):
        buf.print(t)
    text = buf.file.getvalue()
    assert "\x1b" not in text and "\x07" not in text and "no passing run of A" in text
    assert "first failing stage: invocation" in " ".join(text.split()) and "missing: the date" in text
    page = render_html(why, "base", "cand")
    assert "<b>eur</b>" not in page and "&lt;b&gt;eur&lt;/b&gt;" in page
