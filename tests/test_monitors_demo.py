"""The demo configures two monitors: the share of shopping sessions that stop at a cart without a checkout link
fires on its traffic, every time; the newest version's pass rate, which rises, does not. The report lists the
firing in a short section of its own."""

from __future__ import annotations

from conftest import read_db, run_cli, shared_demo


def test_the_demos_checkout_monitor_fires_and_its_version_monitor_does_not(tmp_path_factory):
    demo = shared_demo(tmp_path_factory, "monitors-demo")
    rows = read_db(demo.db, "SELECT monitor, value, threshold, p_value, n, session_ids FROM monitor_firings")
    assert [r["monitor"] for r in rows] == ["checkout-link-missing"]
    fired = rows[0]
    assert fired["threshold"] == 0.03 and fired["value"] > 0.1 and fired["p_value"] < 0.001 and fired["n"] >= 20
    behind = read_db(demo.db, "SELECT DISTINCT drop_reason, variant FROM sessions WHERE session_id IN ("
                     + ", ".join(f"'{s}'" for s in fired["session_ids"]) + ")")
    assert behind == [{"drop_reason": "cart_no_checkout_url", "variant": "shopping"}]
    section = demo.stdout.split("Monitors fired (most recent first)")[1]
    assert "checkout-link-missing" in section and "above 0.03" in section
    report = run_cli("report", "--db", str(demo.db)).stdout
    assert "Monitors fired (most recent first)" in report and "new-version-pass-rate" not in report
