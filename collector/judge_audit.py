"""``agentfunnel judge audit``: export a sample of the judge's calls, import people's labels, report agreement.

``export`` writes a stratified sample (``scoring.judge_audit.stratified_sample``) of an experiment's
stored judgments as CSV or JSONL, one row per item with what the labeller needs to decide (the
user's request, the final answer, the judge's call and evidence) and empty ``label``, ``labeler``
and ``note`` columns. ``import`` reads the file back and stores every labelled row in
``judge_labels`` with who labelled it and when; a row whose ids were edited is refused by line.
``report`` compares the labels with the judge's stored calls: agreement and Cohen's kappa per
criterion, for the verdicts and overall, the confusion counts, the error bar they put on each
audited experiment's pass rate, and a warning where the judge and the agent share a model family.

Cells come from telemetry (answers, requests) and go to spreadsheets: a cell that a spreadsheet
would run as a formula is written with a leading apostrophe.
"""

from __future__ import annotations

import csv
import datetime as dt
import getpass
import io
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any


from ..scoring.judge_audit import (VERDICT, Agreement, agreement, criteria_of, item_id, items_of, judge_met,
                                   parse_label, pass_rate_bounds, shared_family, stratified_sample)
from .config import StoreSettings
from .phrasing import fixed, plural
from .query import admin_post, query, running_server
from .store.guard import connect_unless_held
from .store.schema import migrate

COLUMNS = ("item_id", "experiment", "session_id", "input_hash", "case_id", "criterion", "judge_call", "judge_met",
           "judge_score", "request", "final_answer", "judge_evidence", "judge_explanation", "label", "labeler", "note")
TEXT_MAX_CHARS = 4000
_FORMULA_START = ("=", "+", "-", "@", "\t", "\r")


def _literal(value: str) -> str:
    if "\x00" in value:
        raise ValueError("values cannot contain NUL")
    return "'" + value.replace("'", "''") + "'"


def _rows(db: Path | StoreSettings | Any, sql: str) -> list[dict[str, Any]]:
    """``db``: a file or the store settings (``query``), or a reader with ``rows(sql)`` (the UI's, in the server)."""
    if hasattr(db, "rows"):
        return db.rows(sql)
    res = query(db, sql)
    return [dict(zip(res.columns, r)) for r in res.rows]


_JUDGMENTS_SQL = """
SELECT j.session_id, j.input_hash, j.passed, j.status, j.score, j.criteria, j.explanation, j.judge_model,
       s.experiment, s.case_id, s.input, s.final_answer, s.model AS agent_model
FROM judgments j JOIN sessions s USING (session_id)
WHERE s.experiment GLOB {pattern} AND j.status IN ('complete', 'incomplete')
QUALIFY row_number() OVER (PARTITION BY j.session_id ORDER BY j.created_at DESC) = 1
ORDER BY j.session_id
"""


def latest_judgments(db: Path | StoreSettings | Any, pattern: str) -> list[dict[str, Any]]:
    """Each session's latest real verdict (complete or incomplete) in the experiments ``pattern`` matches."""
    return _rows(db, _JUDGMENTS_SQL.format(pattern=_literal(pattern)))


def _clip(value: Any) -> str:
    text = "" if value is None else str(value)
    return text if len(text) <= TEXT_MAX_CHARS else text[:TEXT_MAX_CHARS] + "…"


def export_rows(judgments: list[dict[str, Any]], sample: int, seed: int = 0) -> list[dict[str, Any]]:
    """The sampled items of these judgments, as the rows of the labelling file."""
    by_key = {(j["session_id"], j["input_hash"]): j for j in judgments}
    items = [it for j in judgments for it in items_of(j["session_id"], j["input_hash"], j["passed"], j["status"],
                                                      criteria_of(j["criteria"]))]
    rows = []
    for it in stratified_sample(items, sample, seed):
        j = by_key[(it.session_id, it.input_hash)]
        evidence = next((c.get("evidence") for c in criteria_of(j["criteria"]) if c.get("criterion") == it.criterion), "")
        rows.append({"item_id": it.item_id, "experiment": j["experiment"], "session_id": it.session_id,
                     "input_hash": it.input_hash, "case_id": j["case_id"], "criterion": it.criterion,
                     "judge_call": it.judge_status, "judge_met": "met" if it.judge_met else "not_met",
                     "judge_score": j["score"], "request": _clip(j["input"]), "final_answer": _clip(j["final_answer"]),
                     "judge_evidence": _clip(evidence), "judge_explanation": _clip(j["explanation"]),
                     "label": "", "labeler": "", "note": ""})
    return rows


def _cell(value: Any) -> str:
    text = "" if value is None else str(value)
    return "'" + text if text.startswith(_FORMULA_START) else text


def write_sample(path: Path, rows: list[dict[str, Any]]) -> None:
    """CSV (``.csv``) or JSON lines (anything else, e.g. ``.jsonl``)."""
    if path.suffix.lower() == ".csv":
        buf = io.StringIO()
        w = csv.DictWriter(buf, fieldnames=COLUMNS, lineterminator="\n")
        w.writeheader()
        for r in rows:
            w.writerow({k: _cell(r.get(k)) for k in COLUMNS})
        path.write_text(buf.getvalue(), encoding="utf-8")
    else:
        path.write_text("".join(json.dumps({k: r.get(k) for k in COLUMNS}, ensure_ascii=False) + "\n" for r in rows),
                        encoding="utf-8")


def _unguard(value: Any) -> Any:
    return value[1:] if isinstance(value, str) and value.startswith("'") and value[1:].startswith(_FORMULA_START) else value


def read_labels(path: Path, default_labeler: str, now: dt.datetime) -> tuple[list[dict[str, Any]], list[str]]:
    """The labelled rows of a sample file (blank labels skipped), and one problem per refused line."""
    text = path.read_text(encoding="utf-8-sig")
    if path.suffix.lower() == ".csv":
        raw = list(csv.DictReader(io.StringIO(text)))
        lines = [(i + 2, r) for i, r in enumerate(raw)]
    else:
        lines = []
        for i, line in enumerate(text.splitlines(), 1):
            if line.strip():
                try:
                    lines.append((i, json.loads(line)))
                except json.JSONDecodeError as exc:
                    lines.append((i, {"__error__": f"not JSON: {exc.msg}"}))
    out, problems = [], []
    for number, r in lines:
        if not isinstance(r, dict) or "__error__" in r:
            problems.append(f"line {number}: {r.get('__error__') if isinstance(r, dict) else 'not an object'}")
            continue
        try:
            label = parse_label(r.get("label"))
        except ValueError as exc:
            problems.append(f"line {number}: {exc}")
            continue
        if label is None:
            continue
        sid, ih, crit = (_unguard(r.get(k)) for k in ("session_id", "input_hash", "criterion"))
        if not all(isinstance(v, str) and v for v in (sid, ih, crit)) or item_id(sid, ih, crit) != r.get("item_id"):
            problems.append(f"line {number}: item_id does not match session_id, input_hash and criterion "
                            "(edit only label, labeler and note)")
            continue
        labeler = str(r.get("labeler") or "").strip() or default_labeler
        out.append({"item_id": r["item_id"], "session_id": sid, "input_hash": ih, "criterion": crit,
                    "experiment": _unguard(r.get("experiment")) or None, "label": label, "labeler": labeler[:200],
                    "labeled_at": now, "imported_at": now, "note": str(_unguard(r.get("note")) or "")[:2000] or None})
    return out, problems


LABEL_COLUMNS = ("item_id", "session_id", "input_hash", "criterion", "experiment", "label", "labeler", "labeled_at",
                 "imported_at", "note")


def insert_labels(con: Any, rows: list[dict[str, Any]]) -> int:
    """Append the labels (the writer's connection, or a file's)."""
    if rows:
        con.executemany(f"INSERT INTO judge_labels ({', '.join(LABEL_COLUMNS)}) VALUES "
                        f"({', '.join('?' for _ in LABEL_COLUMNS)})",
                        [[r[c] for c in LABEL_COLUMNS] for r in rows])
    return len(rows)


def store_labels(db: Path, rows: list[dict[str, Any]]) -> str:
    """Through the server that owns the file, or into the file itself; returns where they went."""
    info = running_server(db)
    if info is not None:
        payload = [{**r, "labeled_at": r["labeled_at"].isoformat(), "imported_at": r["imported_at"].isoformat()}
                   for r in rows]
        admin_post(info, "/audit/labels", {"labels": payload})
        return "the running server"
    con = connect_unless_held(db)
    try:
        migrate(con)
        con.execute("BEGIN TRANSACTION")
        insert_labels(con, rows)
        con.execute("COMMIT")
    finally:
        con.close()
    return str(db)


def labels_from_json(doc: Any) -> list[dict[str, Any]]:
    """The admin endpoint's body, checked: every row has the columns, with the types the table takes."""
    rows = doc.get("labels") if isinstance(doc, dict) else None
    if not isinstance(rows, list):
        raise ValueError('body must be JSON {"labels": [...]}')
    out = []
    for r in rows:
        if not isinstance(r, dict) or not isinstance(r.get("label"), bool) or any(
                not isinstance(r.get(k), str) for k in ("item_id", "session_id", "input_hash", "criterion", "labeler")):
            raise ValueError("each label needs item_id, session_id, input_hash, criterion, labeler (text) and label "
                             "(true or false)")
        out.append({**{c: r.get(c) for c in LABEL_COLUMNS},
                    "labeled_at": dt.datetime.fromisoformat(r["labeled_at"]),
                    "imported_at": dt.datetime.fromisoformat(r["imported_at"])})
    return out


# ---------------------------------------------------------------------------- report


_LABELLED_SQL = """
WITH latest AS (
    SELECT * FROM judge_labels
    QUALIFY row_number() OVER (PARTITION BY item_id, labeler ORDER BY imported_at DESC, labeled_at DESC) = 1
)
SELECT l.item_id, l.criterion, l.label, l.labeler, j.session_id, j.passed, j.status, j.criteria, j.judge_model,
       j.rubric_sha256, j.prompt_version, s.experiment
FROM latest l JOIN judgments j ON j.session_id = l.session_id AND j.input_hash = l.input_hash
JOIN sessions s ON s.session_id = l.session_id
WHERE {where}
QUALIFY row_number() OVER (PARTITION BY l.item_id, l.labeler ORDER BY j.created_at DESC) = 1
"""


@dataclass(frozen=True)
class AuditReport:
    by_criterion: dict[str, Agreement]  # VERDICT among them
    overall: Agreement  # every labelled item
    labels: int
    labelers: tuple[str, ...]
    experiments: dict[str, Any]  # experiment -> PassRateBounds | None
    families: list[tuple[str, str, str]]  # judge and agent sharing a model family
    judges: tuple[str, ...]


def labelled_pairs(db: Path | StoreSettings | Any, where: str = "TRUE") -> list[tuple[dict[str, Any], bool, bool]]:
    out = []
    for r in _rows(db, _LABELLED_SQL.format(where=where)):
        met = judge_met(r)
        if met is not None:
            out.append((r, met, bool(r["label"])))
    return out


def audit_report(db: Path | StoreSettings | Any, pattern: str | None = None) -> AuditReport:
    where = "TRUE" if pattern is None else f"s.experiment GLOB {_literal(pattern)}"
    pairs = labelled_pairs(db, where)
    by: dict[str, list[tuple[bool, bool]]] = {}
    for r, judge, human in pairs:
        by.setdefault(r["criterion"], []).append((judge, human))
    by_criterion = {k: agreement(v) for k, v in sorted(by.items(), key=lambda kv: (kv[0] != VERDICT, kv[0]))}
    overall = agreement((j, h) for _, j, h in pairs)
    verdicts = by_criterion.get(VERDICT, Agreement())
    experiments: dict[str, Any] = {}
    for name in sorted({r["experiment"] for r, _, _ in pairs if r["experiment"]}):
        counts = _rows(db, "SELECT count(*) FILTER (WHERE s.passed IS NOT NULL) AS n, count(*) FILTER (WHERE s.passed) "
                           "AS passes, count(*) FILTER (WHERE s.judge_status IN ('complete', 'incomplete') AND (s.passed "
                           "OR r.first_failed_stage = 'completion')) AS judged, count(*) FILTER (WHERE s.judge_status IN "
                           "('complete', 'incomplete') AND s.passed) AS judged_passes FROM sessions s LEFT JOIN "
                           f"case_runs r USING (session_id) WHERE s.experiment = {_literal(name)} AND s.case_id IS NOT "
                           "NULL AND NOT coalesce(r.probe, false)")[0]
        experiments[name] = pass_rate_bounds(int(counts["n"]), int(counts["passes"]), int(counts["judged"]),
                                             int(counts["judged_passes"]), verdicts)
    models = _rows(db, "SELECT DISTINCT s.model AS agent, j.judge_model AS judge FROM sessions s JOIN judgments j "
                       f"USING (session_id) WHERE {where}")
    families = shared_family([m["judge"] for m in models], [m["agent"] for m in models])
    return AuditReport(by_criterion, overall, len(pairs), tuple(sorted({r["labeler"] for r, _, _ in pairs})),
                       experiments, families, tuple(sorted({m["judge"] for m in models if m["judge"]})))


def family_warnings(families: list[tuple[str, str, str]]) -> list[str]:
    return [f"the judge {judge} and the agent's model {agent} are both {family} models: a judge may favour its own "
            "family's answers (self-preference); audit it, or judge with another family" for family, judge, agent in families]


def judge_kappa(db: Path | StoreSettings, pattern: str) -> tuple[float | None, int, list[str]]:
    """The kappa of the judge that graded ``pattern``'s runs (every label of judgments by the same model, rubric and
    prompt, in any experiment), the labels it rests on, and that judge's names; (None, 0, []) without a judge."""
    judges = _rows(db, "SELECT DISTINCT j.judge_model, j.rubric_sha256, j.prompt_version FROM judgments j JOIN "
                       f"sessions s USING (session_id) WHERE s.experiment GLOB {_literal(pattern)} "
                       "AND j.status IN ('complete', 'incomplete')")
    if not judges:
        return None, 0, []
    keys = " OR ".join(f"(j.judge_model = {_literal(str(r['judge_model']))} AND j.rubric_sha256 = "
                       f"{_literal(str(r['rubric_sha256']))} AND j.prompt_version = {_literal(str(r['prompt_version']))})"
                       for r in judges)
    pairs = labelled_pairs(db, keys)
    found = agreement((j, h) for _, j, h in pairs)
    return found.kappa, found.n, sorted({str(r["judge_model"]) for r in judges})


def kappa_gate(db: Path | StoreSettings, pattern: str, minimum: float | None) -> list[str]:
    """``--min-judge-kappa``: a failed gate when the judge of ``pattern`` is not audited to that agreement."""
    if minimum is None:
        return []
    kappa, n, judges = judge_kappa(db, pattern)
    if not judges:
        return []  # no run of it was judged: nothing rests on a judge
    if n == 0:
        return [f"the judge of {pattern} ({', '.join(judges)}) is not audited: no labels (agentfunnel judge audit "
                "export, label, import)"]
    if kappa is None or kappa < minimum:
        shown = "undefined" if kappa is None else fixed(kappa)
        return [f"the judge of {pattern} agrees with people at kappa {shown} over {plural(n, 'label')}, "
                f"below {fixed(minimum)}"]
    return []


def default_labeler() -> str:
    try:
        return getpass.getuser()
    except (KeyError, OSError):
        return "unknown"


def judge_warnings(db: Path | StoreSettings, pattern: str) -> list[str]:
    """A warning per judge model of ``pattern``'s runs that shares a model family with the agent's."""
    models = _rows(db, "SELECT DISTINCT s.model AS agent, j.judge_model AS judge FROM sessions s JOIN judgments j "
                       f"USING (session_id) WHERE s.experiment GLOB {_literal(pattern)}")
    return family_warnings(shared_family([m["judge"] for m in models], [m["agent"] for m in models]))
