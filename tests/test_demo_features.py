"""The demo's database shows the three features beyond sessions and cases: a monitor that fired, user feedback
beside the proven outcome, and reviewers' labels of the judge's calls with the agreement they give, each in the
report, in the web UI and in SQL."""

from __future__ import annotations

import urllib.request

import pytest

from conftest import read_db, run_cli, shared_demo
from test_ui_browser import UIProcess


@pytest.fixture(scope="module")
def demo(tmp_path_factory):
    return shared_demo(tmp_path_factory, "demo-features").db


def test_sql_holds_a_firing_feedback_and_the_reviewers_labels(demo):
    assert read_db(demo, "SELECT count(*) AS n FROM monitor_firings")[0]["n"] >= 1
    assert read_db(demo, "SELECT count(*) AS n FROM feedback_sessions WHERE joined_session_id IS NOT NULL")[0]["n"] > 0
    labels = read_db(demo, "SELECT count(*) AS n, count(DISTINCT labeler) AS people, min(labeler) AS who, "
                           "count(*) FILTER (WHERE label) AS met FROM judge_labels")[0]
    assert labels["n"] == 12 and labels["people"] == 1 and labels["who"] == "demo-reviewer"
    assert 0 < labels["met"] < 12  # the demo's judge says both, and so do its reviewer's labels


def test_the_report_shows_all_three(demo, tmp_path):
    out = run_cli("report", "--db", str(demo)).stdout
    assert "Monitors fired (most recent first)" in out and "User feedback" in out
    review = out.split("The judge against reviewers")[1]
    assert "Reviewers labelled 12 of the judge's calls and agree with" in review.replace("\n", " ")
    page = tmp_path / "report.html"
    run_cli("report", "--db", str(demo), "--html", str(page))
    html = page.read_text(encoding="utf-8")
    assert 'id="monitors"' in html and 'id="feedback"' in html and 'id="review"' in html


def test_the_ui_shows_all_three(demo):
    ui = UIProcess(demo)
    try:
        def get(path: str) -> str:
            with urllib.request.urlopen(ui.url + path, timeout=60) as resp:
                return resp.read().decode()

        assert "checkout-link-missing" in get("monitors")
        assert "demo-reviewer" in get("review")
        overview = get("")
        assert "User feedback" in overview
    finally:
        ui.stop()
