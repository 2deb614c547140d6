"""Monitors without a server, in milliseconds: the tests fire on a real change with enough sample and not on a
small change or a small sample; rules evaluated over fake statement results; bad rules name their field; the
webhook body is inert Slack mrkdwn."""

from __future__ import annotations

import datetime as dt
import re

import pytest

from agentfunnel.collector.config import ConfigError, load_settings
from agentfunnel.collector.monitors import stats
from agentfunnel.collector.monitors.engine import evaluate, is_repeat
from agentfunnel.collector.monitors.settings import MonitorSettings, Rule
from agentfunnel.collector.monitors.webhook import mrkdwn, slack_body

NOW = dt.datetime(2026, 12, 5, 12, 0)


def test_a_real_drop_in_a_share_is_significant_and_a_small_one_is_not():
    assert stats.two_proportion_p(60, 200, 100, 200, "decrease") < 0.001  # 30% vs 50%, 200 a side
    assert stats.two_proportion_p(96, 200, 100, 200, "decrease") > 0.3  # 48% vs 50%
    assert stats.two_proportion_p(3, 10, 5, 10, "decrease") > 0.1  # 30% vs 50%, 10 a side: noise
    assert stats.two_proportion_p(60, 200, 100, 200, "increase") > 0.99  # the other way is no evidence
    two = stats.two_proportion_p(60, 200, 100, 200, "any")
    assert two == pytest.approx(2 * stats.two_proportion_p(60, 200, 100, 200, "decrease"))


def test_a_share_past_a_threshold_needs_enough_sessions():
    assert stats.one_proportion_p(30, 200, 0.05, "increase") < 1e-6
    assert stats.one_proportion_p(2, 10, 0.05, "increase") > 0.01  # 20% of 10 is not sure evidence
    assert stats.one_proportion_p(8, 200, 0.05, "increase") > 0.5
    assert stats.one_proportion_p(0, 50, 0.0, "increase") == 1.0


def test_pass_hat_k_bootstrap_is_seeded_and_sees_only_a_real_change():
    before = [(5, 5)] * 10  # every case passes every run
    after = [(5, 2)] * 10
    p = stats.bootstrap_pass_hat_k_p(after, before, 1, "decrease", 500, seed=3)
    assert p < 0.01 and p == stats.bootstrap_pass_hat_k_p(after, before, 1, "decrease", 500, seed=3)
    assert stats.bootstrap_pass_hat_k_p([(5, 4)] * 2, [(5, 5)] * 2, 1, "decrease", 500, seed=3) > 0.05
    assert stats.mean_pass_hat_k([(5, 5), (5, 0), (2, 2)], 3) == 0.5  # the case with 2 runs is left out
    assert stats.bootstrap_pass_hat_k_p([(5, 1)] * 10, None, 1, "decrease", 500, threshold=0.9, seed=1) < 0.01


class FakeRows:
    """Answers a rule's statements from per-side numbers, keyed on the bound window start."""

    def __init__(self, shares: dict[dt.datetime, tuple[int, int]], versions: list[str] | None = None):
        self.shares = shares
        self.versions = versions or []
        self.statements: list[str] = []

    def __call__(self, sql: str, params: dict) -> list[dict]:
        self.statements.append(sql)
        if "GROUP BY agent_version" in sql:
            return [{"agent_version": v} for v in self.versions]
        if sql.startswith("SELECT session_id"):
            return [{"session_id": f"s{i}"} for i in range(3)]
        key = params.get("agent_version") or params["start"]
        k, n = self.shares[key]
        return [{"k": k, "n": n}]


def _rule(**condition) -> Rule:
    return Rule.model_validate({"name": "r", "measure": {"kind": "outcome_share", "outcome": "purchase_completed"},
                                "window": "1h", "condition": condition})


def test_a_rule_fires_on_a_real_change_and_stays_quiet_on_noise_or_a_small_sample():
    settings = MonitorSettings(min_sample=30, alpha=0.01)
    cur, base = NOW - dt.timedelta(hours=1), NOW - dt.timedelta(hours=2)
    rule = _rule(against="previous_window", direction="decrease")
    fired = evaluate(rule, NOW, FakeRows({cur: (60, 200), base: (100, 200)}), settings)
    assert fired.fires and fired.p_value < 0.001 and (fired.n, fired.baseline_n) == (200, 200)
    assert fired.session_ids == ["s0", "s1", "s2"]
    assert re.search(r"went from 50\.0% .* n = 200\) to 30\.0% .* n = 200\) \(p = ", fired.message())
    assert evaluate(rule, NOW, FakeRows({cur: (96, 200), base: (100, 200)}), settings).result == "quiet"
    assert evaluate(rule, NOW, FakeRows({cur: (3, 10), base: (100, 200)}), settings).result == "too_few"
    small = _rule(against="previous_window", direction="decrease", min_change=0.25)
    assert evaluate(small, NOW, FakeRows({cur: (60, 200), base: (100, 200)}), settings).result == "too_small"


def test_a_new_version_is_compared_with_the_one_before_it_once():
    rule = _rule(against="previous_version", direction="decrease")
    rows = FakeRows({"2.0": (60, 200), "1.9": (100, 200)}, versions=["2.0", "1.9"])
    ev = evaluate(rule, NOW, rows, MonitorSettings())
    assert ev.fires and (ev.current.version, ev.baseline.version) == ("2.0", "1.9")
    assert "version 1.9" in ev.message() and "version 2.0" in ev.message()
    assert is_repeat(ev, [{"firing_key": "r:1.9->2.0", "window_end": NOW}])
    assert not is_repeat(ev, [{"firing_key": "r:1.8->1.9", "window_end": NOW}])
    assert evaluate(rule, NOW, FakeRows({}, versions=["2.0"]), MonitorSettings()).result == "no_baseline"


def test_a_window_that_fired_stays_quiet_until_it_has_moved_past():
    rule = _rule(above=0.05)
    ev = evaluate(rule, NOW, FakeRows({NOW - dt.timedelta(hours=1): (40, 200)}), MonitorSettings())
    assert ev.fires
    assert is_repeat(ev, [{"firing_key": "r", "window_end": (NOW - dt.timedelta(minutes=30)).isoformat()}])
    assert not is_repeat(ev, [{"firing_key": "r", "window_end": NOW - dt.timedelta(hours=2)}])


@pytest.mark.parametrize("rule, field", [
    ({"name": "a", "measure": {"kind": "step_conversion", "variant": "shopping"}, "condition": {"below": 0.5}},
     "monitors.rules.0.measure"),
    ({"name": "a", "measure": {"kind": "judged_pass_rate"}, "condition": {"below": 0.5, "above": 0.1}},
     "monitors.rules.0.condition"),
    ({"name": "a", "measure": {"kind": "judged_pass_rate"}, "window": "a day", "condition": {"below": 0.5}},
     "monitors.rules.0.window"),
    ({"name": "a", "measure": {"kind": "judged_pass_rate"}, "condition": {"below": 50}}, "monitors.rules.0"),
    ({"name": "a", "measure": {"kind": "judged_pass_rate", "colour": 1}, "condition": {"below": 0.5}},
     "monitors.rules.0.measure.colour"),
    ({"name": "a", "measure": {"kind": "outcome_share", "outcome": "purchased", "variant": "shopping"},
      "slice": {"variant": "lodging"}, "condition": {"below": 0.5}}, "monitors.rules.0"),  # would read nothing
])
def test_a_bad_rule_names_its_field(tmp_path, rule, field):
    import yaml

    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump({"monitors": {"rules": [rule]}}))
    with pytest.raises(ConfigError) as err:
        load_settings(path)
    assert f"  {field}: " in str(err.value)


def test_the_webhook_body_is_inert_mrkdwn():
    row = {"monitor": "m", "firing_id": "abc", "message": "version <!channel> & <http://x|y> went down",
           "session_ids": ["<@U123>", "s2"]}
    body = slack_body(row, "http://127.0.0.1:1/ui/")
    text = body["blocks"][0]["text"]["text"]
    assert "<!channel>" not in text and "<@U123>" not in text and "<http://x" not in body["text"]
    assert "&lt;!channel&gt; &amp; &lt;http://x|y&gt;" in text
    assert "<http://127.0.0.1:1/ui/monitors/abc|Open in agentfunnel>" in text  # the one link is ours
    assert mrkdwn("a\x1b[31mb", 100) == "a[31mb" and len(mrkdwn("x" * 500, 10)) == 10


def test_the_documented_configuration_is_valid():
    import yaml

    import docs_text
    from agentfunnel.collector.config import Settings

    block = re.search(r"```yaml\n(.*?)```", docs_text.page("docs/monitors.md"), re.S).group(1)
    rules = Settings.model_validate(yaml.safe_load(block)).monitors.rules
    assert {r.measure.kind for r in rules} == {"drop_off_share", "step_conversion", "cost_quantile", "pass_hat_k"}


def test_the_html_reports_firings_escape_what_telemetry_wrote():
    """A monitor's message quotes telemetry (a variant, a reason, a version): the HTML report escapes it, and links
    the first session behind the firing through the report's own session link."""
    from agentfunnel.collector.report.monitors import html_section

    firing = {"monitor": "m<1>", "fired_at": dt.datetime(2026, 3, 1, 12, 10, 34), "session_ids": ["s-1", "s-2"],
              "message": 'share of variant <img src=x onerror=alert(1)> is 40% "above" 0.03'}
    page = html_section([firing], "en", lambda sid: f'<a href="/ui/sessions/{sid}">{sid}</a>')
    assert "<img" not in page and "&lt;img src=x onerror=alert(1)&gt;" in page and "m&lt;1&gt;" in page
    assert "2026-03-01 12:10 UTC" in page and 'sessions behind it (2): <a href="/ui/sessions/s-1">s-1</a>' in page
    assert html_section([], "en", str) == ""
