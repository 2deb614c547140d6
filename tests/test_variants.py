"""Funnel variants behind one ``Variant`` type (SPEC §5): a variant defined in one file and registered,
and one defined in the configuration, each get their steps, their ladder's outcome, a drop-off
diagnosis, a display name in the report and the outcome proof on the session page; the tables other
modules read are derived from the registry."""

from __future__ import annotations

import datetime as dt
import importlib.util
import itertools
import json
import urllib.request
from pathlib import Path

from agentfunnel.collector.report import Filters, load_report
from agentfunnel.collector.report.terminal import render_terminal
from agentfunnel.collector.session.rows import funnel_step_rows
from agentfunnel.collector.store.schema import migrate
from agentfunnel.collector.store.writer import connect
from agentfunnel.collector.ui import model
from agentfunnel.scoring import ScoringConfig, SessionScorer
from agentfunnel.scoring.config import BUILTIN_VARIANTS, STEP_LABELS
from agentfunnel.scoring.funnel import GLOBAL_ORDER
from agentfunnel.scoring.labels import VARIANT_OUTCOME_LABELS
from agentfunnel.scoring.variants import BUILTINS, STEP_KEYS
from agentfunnel.scoring.variant_registry import BUILTIN_REGISTRY
from agentfunnel.semconv import SpanRecord
from conftest import run_cli

EXAMPLE = Path(__file__).resolve().parent.parent / "docs" / "examples" / "rental_variant.py"
_ids = itertools.count(1)


def _rental():
    spec = importlib.util.spec_from_file_location("rental_variant", EXAMPLE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.VARIANT


def call(tool: str, result=None, error=None) -> SpanRecord:
    n = next(_ids)
    return SpanRecord(trace_id="t" * 32, span_id=f"{n:016x}", parent_span_id=None, name=f"execute_tool {tool}",
                      dialect="otel_genai", kind="tool", tool_name=tool, arguments={"n": n}, result=result,
                      error=error, start_ns=n * 1000, end_ns=n * 1000 + 500)


def _store(path: Path, scorer: SessionScorer, sid: str, records: list[SpanRecord]):
    """Score ``records`` and store the session, its calls and the funnel steps in a database of the real schema."""
    s = scorer.score(sid, records)
    con = connect(path)
    migrate(con)
    rows = funnel_step_rows(scorer)
    con.executemany("INSERT INTO funnel_steps VALUES (?, ?, ?, ?, ?)",
                    [[r["variant"], r["step"], r["step_index"], r["display_en"], r["display_ja"]] for r in rows])
    at = dt.datetime(2026, 1, 5, 9, 0)
    con.execute("INSERT INTO session_rows_compacted (session_id, status, first_seen, last_seen, variant, steps, completion_rate,"
                " outcome, outcome_reads_as, drop_reason, drop_step, drop_fix) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                [sid, "closed", at, at, s.variant, list(s.steps), s.completion_rate, s.outcome, s.outcome_reads_as,
                 s.drop.reason if s.drop else None, s.drop.step if s.drop else None, s.drop.fix if s.drop else None])
    con.close()
    return s, rows


def _proof(scorer: SessionScorer, s, records: list[SpanRecord], steps: list[dict]) -> tuple[list, str]:
    """The session page's call views and the kind of evidence its outcome rests on."""
    session = {"session_id": s.session_id, "variant": s.variant, "steps": list(s.steps), "outcome": s.outcome}
    calls = [{"span_id": r.span_id, "tool_name": r.tool_name, "step": s.call_steps.get(r.span_id),
              "error": r.error, "status_code": "ERROR" if r.error else "OK",
              "arguments": json.dumps(r.arguments), "result": json.dumps(r.result)} for r in records]
    mine = [r for r in steps if r["variant"] == s.variant]
    views = model.call_views(calls, session, mine, "en", None, scorer.variants)
    return views, model.outcome_proof(session, views, scorer.variants)


def test_a_variant_defined_in_one_file_is_read_like_a_built_in_one(tmp_path):
    scorer = SessionScorer(builtins=(*BUILTINS, _rental()))
    records = [call("search_equipment", {"items": [{"id": "drill-7"}]}), call("reserve_equipment", {"hold_id": "h1"}),
               call("pay_deposit", {"status": "requires_payment"})]
    s, steps = _store(tmp_path / "rental.duckdb", scorer, "rent-1", records)
    assert (s.variant, s.variant_source, s.steps) == ("rental", "inferred", ("browse", "reserve", "pay"))
    assert (s.outcome, s.outcome_reads_as, s.completion_rate) == ("paid", "pass", 1.0)
    assert s.drop is not None and (s.drop.reason, s.drop.step) == ("checkout_payment_required", "pay")
    assert ("rental", "pay", 3, "Pay Deposit", "保証金の支払い") in [tuple(r.values()) for r in steps]

    data = load_report(tmp_path / "rental.duckdb", Filters(), registry=scorer.variants)
    (drop,) = data.drops
    assert data.drop_note(drop, "en") == "Rental Confirmed not reached"
    out = render_terminal(data, "en", width=160)
    assert "Equipment Rental" in out and "Pay Deposit" in out

    views, proof = _proof(scorer, s, records, steps)
    assert proof == "steps_proof" and [v.evidence for v in views] == [False, False, True]

    confirmed = scorer.score("rent-2", [*records[:2], call("pay_deposit", {"order": {"id": "o9", "status": "confirmed"}})])
    assert (confirmed.outcome, confirmed.drop) == ("rental_confirmed", None)
    assert SessionScorer().score("rent-3", records).variant != "rental"  # only where it is registered


def test_a_variants_outcomes_are_listed_best_first_as_its_own_ladder_ranks_them(tmp_path):
    """The report (and the UI) order a variant's outcomes by its rungs in the registry, not by a list of the
    built-in outcomes: a Deposit Paid session comes before a Browsed one, then those below every ladder."""
    scorer = SessionScorer(builtins=(*BUILTINS, _rental()))
    db = tmp_path / "rental.duckdb"
    _store(db, scorer, "rent-paid", [call("search_equipment", {"items": [{"id": "drill-7"}]}),
                                     call("reserve_equipment", {"hold_id": "h1"}), call("pay_deposit", {"paid": True})])
    con = connect(db)
    con.execute("INSERT INTO session_rows_compacted (session_id, status, first_seen, last_seen, variant, steps, outcome,"
                " outcome_reads_as) SELECT 'rent-browsed', status, first_seen, last_seen, variant, ['browse'], 'browsed',"
                " 'partial' FROM session_rows_compacted")
    con.close()
    data = load_report(db, Filters(), registry=scorer.variants)
    assert [o.outcome for o in data.outcomes["rental"]] == ["paid", "browsed"]
    assert list(scorer.variants.outcome_rank("rental")) == ["rental_confirmed", "paid", "reserved", "browsed",
                                                            "info_provided", "failed", "abandoned"]
    support = SessionScorer(ScoringConfig.model_validate({"funnel": {"variants": {"support": SUPPORT}}})).variants
    assert list(support.outcome_rank("support"))[:2] == ["resolved", "triage_reached"]  # the furthest step's first


def test_a_failed_call_asking_for_payment_at_a_variants_own_payment_step_is_a_payment_drop_off():
    """Where a session pays is the variant's data (the step it checks for a pending payment, and those after):
    the rental's ``pay`` step, named neither checkout nor purchase."""
    scorer = SessionScorer(builtins=(*BUILTINS, _rental()))
    s = scorer.score("rent-4", [call("search_equipment", {"items": [{"id": "drill-7"}]}),
                                call("reserve_equipment", {"hold_id": "h1"}),
                                call("pay_deposit", error="no payment method on file")])
    assert s.drop is not None and (s.drop.reason, s.drop.step) == ("checkout_payment_required", "pay")
    assert s.drop.evidence == {"tool": "pay_deposit", "error": "no payment method on file"}


SUPPORT = {"name": "Support Desk", "name_ja": "サポート窓口",
           "steps": [{"key": "triage", "patterns": ["classify_*"], "label": "Triage"},
                     {"key": "resolve", "patterns": ["close_ticket"], "label": "Resolve"}],
           "outcomes": {"resolve": "resolved"}}
SUPPORT_YAML = "scoring:\n  funnel:\n    variants:\n      support: " + json.dumps(SUPPORT, ensure_ascii=False) + "\n"


def test_a_variant_of_the_configuration_gets_a_drop_off_a_name_and_a_proof(tmp_path, server_factory):
    config = ScoringConfig.model_validate({"funnel": {"variants": {"support": SUPPORT}}})
    scorer = SessionScorer(config)
    records = [call("classify_ticket", {"t": 1}), call("close_ticket", error="ticket locked")]
    s, steps = _store(tmp_path / "support.duckdb", scorer, "sup-1", records)
    assert (s.variant, s.steps, s.outcome) == ("support", ("triage",), "triage_reached")
    assert s.drop is not None and (s.drop.reason, s.drop.step) == ("tool_error", "resolve")
    assert scorer.score("sup-2", [call("classify_ticket", {"t": 1}), call("close_ticket", {"ok": True})]).drop is None

    data = load_report(tmp_path / "support.duckdb", Filters(), registry=scorer.variants)
    assert "Support Desk" in render_terminal(data, "en", width=160)
    assert "サポート窓口" in render_terminal(data, "ja", width=160)
    # the command reads the variants of the configuration it is given
    cfg = tmp_path / "agentfunnel.yaml"
    cfg.write_text(SUPPORT_YAML, encoding="utf-8")
    out = run_cli("report", "--config", str(cfg), "--db", str(tmp_path / "support.duckdb")).stdout
    assert "Support Desk" in out and "Support Desk" not in run_cli("report", "--db", str(tmp_path / "support.duckdb")).stdout
    # ... and so does the UI of a server run with it
    srv = server_factory(["--config", str(cfg)], db=tmp_path / "support.duckdb")
    with urllib.request.urlopen(srv.http_url + "/ui/", timeout=30) as resp:
        assert "Support Desk" in resp.read().decode()

    views, proof = _proof(scorer, s, records, steps)
    assert proof == "steps_proof" and [v.evidence for v in views] == [True, False]


def test_the_tables_other_modules_read_come_from_the_registry():
    assert BUILTIN_VARIANTS == {v.key: v.step_keys for v in BUILTINS}
    assert GLOBAL_ORDER == STEP_KEYS and set(STEP_KEYS) == {s for v in BUILTINS if not v.by_activity for s in v.step_keys}
    assert STEP_LABELS["lodging"]["en"]["purchase"] == "Booked"
    assert VARIANT_OUTCOME_LABELS == {"lodging": BUILTIN_REGISTRY["lodging"].outcome_labels}
    assert [BUILTIN_REGISTRY.terminal(k) for k in ("shopping", "procurement", "lodging", "generic")] == \
        ["purchase_completed", "po_submitted", "purchase_completed", None]
