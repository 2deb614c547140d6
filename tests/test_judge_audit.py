"""Judge audit: a stratified sample of stored judge calls, people's labels imported, agreement and kappa.

The numbers are checked against a hand computation of Cohen's kappa, (po - pe) / (1 - pe), from
confusion counts the test tallies itself.
"""

from __future__ import annotations

import csv
import json

import pytest

from agentfunnel.collector.store.schema import migrate
from agentfunnel.collector.store.writer import connect
from agentfunnel.scoring.judge_audit import (VERDICT, Agreement, Item, agreement, item_id, model_family, parse_label,
                                             pass_rate_bounds, shared_family, stratified_sample, wilson)
from conftest import read_db, run_cli

C1, C2 = "states the rate", "states the date"


def hand_kappa(pairs: list[tuple[bool, bool]]) -> float:
    n = len(pairs)
    po = sum(j == h for j, h in pairs) / n
    pj = sum(j for j, _ in pairs) / n
    ph = sum(h for _, h in pairs) / n
    pe = pj * ph + (1 - pj) * (1 - ph)
    return (po - pe) / (1 - pe)


def test_kappa_is_agreement_beyond_chance():
    a = Agreement(tp=20, fp=5, fn=10, tn=15)
    assert a.n == 50 and a.percent == pytest.approx(0.7)
    assert a.kappa == pytest.approx(0.4)  # po 0.7, pe 0.5*0.6 + 0.5*0.4 = 0.5
    assert agreement([(True, True)] * 20 + [(True, False)] * 5 + [(False, True)] * 10 + [(False, False)] * 15) == a
    assert Agreement(tp=5).kappa is None  # one label only on both sides: chance agreement is certain
    assert Agreement(tp=3, tn=3).kappa == pytest.approx(1.0) and Agreement(fp=3, fn=3).kappa == pytest.approx(-1.0)
    lo, hi = wilson(8, 10)
    assert lo == pytest.approx(0.4902, abs=1e-3) and hi == pytest.approx(0.9433, abs=1e-3)
    assert wilson(0, 0) == (0.0, 1.0)


def test_the_pass_rate_error_bar_follows_the_verdict_confusion_counts():
    verdicts = Agreement(tp=8, fp=2, fn=1, tn=9)
    b = pass_rate_bounds(n=20, passes=10, judged=16, judged_passes=8, verdicts=verdicts)
    assert b.stored == 0.5
    assert b.estimate == pytest.approx((2 + 8 * 0.8 + 8 * 0.1) / 20)  # 2 passes no judge decided
    ppv, fo = wilson(8, 10), wilson(1, 10)
    assert b.low == pytest.approx((2 + 8 * ppv[0] + 8 * fo[0]) / 20)
    assert b.high == pytest.approx((2 + 8 * ppv[1] + 8 * fo[1]) / 20)
    assert b.low < b.estimate < b.high
    perfect = pass_rate_bounds(20, 10, 16, 8, Agreement(tp=400, tn=400))
    assert perfect.high - perfect.low < b.high - b.low  # a judge people agree with narrows the bar
    assert pass_rate_bounds(0, 0, 0, 0, verdicts) is None


def test_the_sample_takes_from_every_stratum():
    items = [Item(f"s{i}", "h", C1, True, "satisfied") for i in range(40)]
    items += [Item(f"s{i}", "h", C1, False, "missing") for i in range(2)]  # a rare call
    items += [Item(f"s{i}", "h", VERDICT, i % 2 == 0, "complete") for i in range(10)]
    picked = stratified_sample(items, 8, seed=1)
    assert len(picked) == 8 and len({p.item_id for p in picked}) == 8
    strata = {p.stratum for p in picked}
    assert strata == {(C1, True), (C1, False), (VERDICT, True), (VERDICT, False)}
    assert stratified_sample(items, 8, seed=1) == picked
    assert len(stratified_sample(items, 500)) == len(items)
    with pytest.raises(ValueError):
        stratified_sample(items, 0)


def test_labels_and_model_families():
    assert [parse_label(v) for v in ("met", "NOT_MET", "pass", "0", "", None)] == [True, False, True, False, None, None]
    with pytest.raises(ValueError, match="not one of met"):
        parse_label("maybe")
    assert model_family("claude-sonnet-4-5") == model_family("anthropic/claude-3-haiku") == "anthropic"
    assert model_family("openai/gpt-4.1") == model_family("o3-mini") == "openai"
    assert model_family("gemini-2.5-pro") == "google" and model_family("scripted-tool-caller") is None
    assert shared_family(["claude-sonnet-4-5"], ["claude-3-haiku", "gpt-4.1"]) == [
        ("anthropic", "claude-sonnet-4-5", "claude-3-haiku")]


# ---------------------------------------------------------------------------- stored judgments, end to end

N_RUNS = 12


def _judged_db(path, agent_model="claude-3-haiku"):
    """Twelve judged runs: the judge passes the even ones; criterion C2 is missed on every third."""
    con = connect(path)
    migrate(con)
    for i in range(N_RUNS):
        sid, passed = f"run-{i:02d}", i % 2 == 0
        answer = "=HYPERLINK(\"http://evil.example\")" if i == 1 else f"answer {i}"
        con.execute("INSERT INTO session_rows (session_id, experiment, case_id, passed, judge_status, model, final_answer, "
                    "input, failure_class) VALUES (?, 'exp', 'c', ?, ?, ?, ?, 'the task', ?)",
                    [sid, passed, "complete" if passed else "incomplete", agent_model, answer,
                     None if passed else "wrong_output"])
        con.execute("INSERT INTO case_run_rows_compacted (session_id, case_id, experiment, passed, first_failed_stage) "
                    "VALUES (?, 'c', 'exp', ?, ?)", [sid, passed, None if passed else "completion"])
        criteria = [{"criterion": C1, "status": "satisfied" if passed else "missing", "evidence": "1.10"},
                    {"criterion": C2, "status": "missing" if i % 3 == 0 else "satisfied", "evidence": "date"}]
        con.execute("INSERT INTO judgments (session_id, input_hash, judge_model, rubric_sha256, prompt_version, status, "
                    "passed, score, criteria, explanation, created_at) VALUES (?, ?, 'claude-sonnet-4-5', 'r1', '2', ?, "
                    "?, ?, ?, 'why', now()::TIMESTAMP)",
                    [sid, f"h{i}", "complete" if passed else "incomplete", passed, 1.0 if passed else 0.4,
                     json.dumps(criteria)])
    con.close()


def _human(row: dict) -> bool:
    """A labeller who agrees with the judge except on runs 3 and 4 (every item of them flipped)."""
    judge = row["judge_met"] == "met"
    return not judge if row["session_id"] in ("run-03", "run-04") else judge


def test_audit_on_stored_judgments_matches_a_hand_computation(tmp_path):
    db = tmp_path / "audit.duckdb"
    _judged_db(db)
    sample = tmp_path / "sample.csv"
    out = run_cli("judge", "audit", "export", "--db", str(db), "--experiment", "exp", "--sample", "100",
                  "--out", str(sample))
    assert "wrote 36 item(s) from 12 judgment(s) over 6 stratum(s)" in out.stdout  # met and not, for 2 criteria + verdict
    rows = list(csv.DictReader(sample.open()))
    assert {r["criterion"] for r in rows} == {VERDICT, C1, C2} and all(r["label"] == "" for r in rows)
    assert next(r for r in rows if r["session_id"] == "run-01")["final_answer"].startswith("'=HYPERLINK")
    for r in rows:
        assert r["item_id"] == item_id(r["session_id"], r["input_hash"], r["criterion"])
        r["label"] = "met" if _human(r) else "not_met"
        r["labeler"] = "ana" if int(r["session_id"][-2:]) < 6 else ""
    with sample.open("w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)
    # an edited id is refused by line, and nothing is stored
    tampered = tmp_path / "tampered.csv"
    tampered.write_text(sample.read_text().replace("run-05", "run-06", 1))
    bad = run_cli("judge", "audit", "import", "--db", str(db), str(tampered), check=False)
    assert bad.returncode == 1 and "item_id does not match" in bad.stderr and "nothing stored" in bad.stderr
    ok = run_cli("judge", "audit", "import", "--db", str(db), str(sample), "--labeler", "ben")
    assert "stored 36 label(s) by ana, ben" in ok.stdout
    stored = read_db(db, "SELECT labeler, count(*) AS n, min(labeled_at) IS NOT NULL AS dated FROM judge_labels "
                         "GROUP BY ALL ORDER BY ALL")
    assert stored == [{"labeler": "ana", "n": 18, "dated": True}, {"labeler": "ben", "n": 18, "dated": True}]

    doc = json.loads(run_cli("judge", "audit", "report", "--db", str(db), "--format", "json").stdout)
    pairs: dict[str, list[tuple[bool, bool]]] = {}
    for r in rows:
        pairs.setdefault(r["criterion"], []).append((r["judge_met"] == "met", r["label"] == "met"))
    for name, ps in pairs.items():
        got = doc["criteria"][name]
        assert got["n"] == len(ps) == N_RUNS
        assert got["kappa"] == pytest.approx(hand_kappa(ps)), name
        assert got["percent"] == pytest.approx(sum(j == h for j, h in ps) / len(ps))
    everything = [p for ps in pairs.values() for p in ps]
    assert doc["overall"]["kappa"] == pytest.approx(hand_kappa(everything))
    assert doc["overall"]["percent"] == pytest.approx(30 / 36)
    verdict = doc["criteria"][VERDICT]
    assert (verdict["tp"], verdict["fp"], verdict["fn"], verdict["tn"]) == (5, 1, 1, 5)  # run 4 passed, run 3 failed
    bar = doc["pass_rates"]["exp"]
    assert bar["stored"] == 0.5 and bar["low"] < bar["estimate"] < bar["high"]
    assert any("both anthropic models" in w for w in doc["warnings"])  # judge and agent share a family

    table = run_cli("judge", "audit", "report", "--db", str(db)).stdout
    assert "verdict (the run's completion)" in table and "overall" in table and "warning: the judge" in table
    assert f"{hand_kappa(everything):.2f}" in table and "pass rate of exp: 50% as judged" in table

    # compare and eval run can require an audited judge
    assert run_cli("compare", "--db", str(db), "exp", "exp", "--min-judge-kappa", "0.5").returncode == 0
    gated = run_cli("compare", "--db", str(db), "exp", "exp", "--min-judge-kappa", "0.9", check=False)
    said = " ".join(gated.stdout.split())
    assert gated.returncode == 1
    assert f"agrees with people at kappa {hand_kappa(everything):.2f} over 36 labels, below 0.90" in said


def test_an_unaudited_judge_fails_the_gate_and_labels_go_through_a_running_server(tmp_path, server_factory):
    db = tmp_path / "af.duckdb"
    _judged_db(db, agent_model="gpt-4.1")
    gated = run_cli("compare", "--db", str(db), "exp", "exp", "--min-judge-kappa", "0.1", check=False)
    assert gated.returncode == 1 and "is not audited: no labels" in gated.stdout
    assert "warning" not in gated.stdout  # an OpenAI agent judged by Claude
    sample = tmp_path / "s.jsonl"
    run_cli("judge", "audit", "export", "--db", str(db), "--experiment", "exp", "--sample", "4", "--out", str(sample))
    lines = [json.loads(line) for line in sample.read_text().splitlines()]
    assert len(lines) == 4
    sample.write_text("".join(json.dumps({**r, "label": "pass"}) + "\n" for r in lines))
    srv = server_factory(db=db)
    out = run_cli("judge", "audit", "import", "--db", str(db), str(sample), "--labeler", "cy")
    assert "stored 4 label(s) by cy in the running server" in out.stdout
    srv.stop()
    assert read_db(db, "SELECT count(*) AS n FROM judge_labels")[0]["n"] == 4
