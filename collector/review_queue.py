"""The review queue: judge calls for people to label, from the judge audit's sample and from monitors' firings.

Two sources feed it. The judge audit's stratified sample (``judge_audit.export_rows``, the rows
``agentfunnel judge audit export`` writes) of the experiments a glob names; and the sessions behind
the latest monitor firings, whose stored judgments add their calls (a firing's session without a
judgment is listed to be read, and drafted as a case). A label given here is the row ``judge audit
import`` stores in ``judge_labels`` (same item id, same columns), so the audit's agreement figures
(``judge_audit.audit_report``) count it at once.

Reads go through a reader with ``rows(sql, params)`` (the UI's); nothing here writes.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass, field
from typing import Any

from ..scoring.judge_audit import VERDICT, criteria_of, item_id, items_of, parse_label
from .judge_audit import export_rows, latest_judgments
from .monitors.columns import TABLE as FIRINGS

MAX_NOTE_CHARS = 2000  # as judge audit import keeps
MAX_LABELER_CHARS = 200


@dataclass
class ReviewItem:
    """One judge call to label, where it came from, and its latest human label (None: not labelled yet)."""

    item_id: str
    session_id: str
    input_hash: str
    criterion: str
    judge_met: bool
    judge_call: str
    experiment: str | None
    source: str  # "sample", or the monitor whose firing brought it
    label: bool | None = None
    labeler: str | None = None


@dataclass
class Queue:
    items: list[ReviewItem]
    unjudged: list[dict[str, Any]] = field(default_factory=list)  # sessions behind firings with no judgment


_FIRINGS_SQL = (f"SELECT monitor, session_ids FROM {FIRINGS} ORDER BY fired_at DESC, firing_id LIMIT $n")
_JUDGED_SQL = """
SELECT j.session_id, j.input_hash, j.passed, j.status, j.criteria, s.experiment
FROM judgments j JOIN sessions s USING (session_id)
WHERE j.session_id IN (SELECT unnest($ids)) AND j.status IN ('complete', 'incomplete')
QUALIFY row_number() OVER (PARTITION BY j.session_id ORDER BY j.created_at DESC) = 1
"""
_LABELS_SQL = """
SELECT item_id, label, labeler FROM judge_labels WHERE item_id IN (SELECT unnest($ids))
QUALIFY row_number() OVER (PARTITION BY item_id ORDER BY imported_at DESC, labeled_at DESC) = 1
"""


def _has(reader: Any, table: str) -> bool:
    return bool(reader.rows("SELECT count(*) AS n FROM duckdb_tables() WHERE table_name = $t", {"t": table})[0]["n"])


def _firing_sessions(reader: Any, firings: int, max_sessions: int) -> dict[str, str]:
    """Session id -> the monitor that brought it, newest firings first, at most ``max_sessions``."""
    out: dict[str, str] = {}
    if not _has(reader, FIRINGS):
        return out
    for f in reader.rows(_FIRINGS_SQL, {"n": firings}):
        for sid in f["session_ids"] or []:
            if len(out) >= max_sessions:
                return out
            out.setdefault(sid, f["monitor"])
    return out


def build_queue(reader: Any, experiments: str, sample: int, firings: int, max_firing_sessions: int) -> Queue:
    """The sampled calls of ``experiments`` (a glob), then those of the sessions behind the latest firings."""
    items: dict[str, ReviewItem] = {}
    for r in export_rows(latest_judgments(reader, experiments), sample, seed=0):
        items[r["item_id"]] = ReviewItem(r["item_id"], r["session_id"], r["input_hash"], r["criterion"],
                                         r["judge_met"] == "met", r["judge_call"], r["experiment"], "sample")
    behind = _firing_sessions(reader, firings, max_firing_sessions)
    judged = {r["session_id"]: r for r in reader.rows(_JUDGED_SQL, {"ids": list(behind)})} if behind else {}
    unjudged = []
    for sid, monitor in behind.items():
        j = judged.get(sid)
        if j is None:
            unjudged.append({"session_id": sid, "monitor": monitor})
            continue
        for it in items_of(sid, j["input_hash"], j["passed"], j["status"], criteria_of(j["criteria"])):
            items.setdefault(it.item_id, ReviewItem(it.item_id, sid, it.input_hash, it.criterion, it.judge_met,
                                                    it.judge_status, j["experiment"], monitor))
    if items:
        for r in reader.rows(_LABELS_SQL, {"ids": list(items)}):
            items[r["item_id"]].label, items[r["item_id"]].labeler = bool(r["label"]), r["labeler"]
    # the calls nobody has labelled first (a stable sort keeps the sample's order within each part)
    return Queue(sorted(items.values(), key=lambda it: it.label is not None), unjudged)


_ONE_JUDGMENT_SQL = """
SELECT j.passed, j.status, j.criteria, s.experiment FROM judgments j JOIN sessions s USING (session_id)
WHERE j.session_id = $sid AND j.input_hash = $hash AND j.status IN ('complete', 'incomplete')
ORDER BY j.created_at DESC LIMIT 1
"""


def label_row(reader: Any, form: dict[str, str], labeler: str, now: dt.datetime) -> dict[str, Any]:
    """The ``judge_labels`` row for a reviewer's label of one stored judge call; ValueError names what is wrong."""
    sid, ih, crit = (form.get(k) or "" for k in ("session_id", "input_hash", "criterion"))
    if not (sid and ih and crit):
        raise ValueError("a label needs session_id, input_hash and criterion")
    label = parse_label(form.get("label"))
    if label is None:
        raise ValueError("label must be met or not_met")
    labeler = labeler.strip()[:MAX_LABELER_CHARS]
    if not labeler:
        raise ValueError("say who labels (labeler)")
    j = reader.one(_ONE_JUDGMENT_SQL, {"sid": sid, "hash": ih})
    if j is None:
        raise ValueError(f"no stored verdict of session {sid!r} with input hash {ih!r}")
    if crit != VERDICT and crit not in {c.get("criterion") for c in criteria_of(j["criteria"])}:
        raise ValueError(f"the judge assessed no criterion {crit!r} in that verdict")
    note = (form.get("note") or "").strip()[:MAX_NOTE_CHARS] or None
    return {"item_id": item_id(sid, ih, crit), "session_id": sid, "input_hash": ih, "criterion": crit,
            "experiment": j["experiment"], "label": label, "labeler": labeler, "labeled_at": now, "imported_at": now,
            "note": note}


def session_items(reader: Any, session_id: str) -> list[ReviewItem]:
    """The calls of a session's latest real verdict, with their latest labels (none: no verdict to label)."""
    j = reader.one(_JUDGED_SQL, {"ids": [session_id]})
    if j is None:
        return []
    items = {it.item_id: ReviewItem(it.item_id, session_id, it.input_hash, it.criterion, it.judge_met,
                                    it.judge_status, j["experiment"], "session")
             for it in items_of(session_id, j["input_hash"], j["passed"], j["status"], criteria_of(j["criteria"]))}
    for r in reader.rows(_LABELS_SQL, {"ids": list(items)}):
        items[r["item_id"]].label, items[r["item_id"]].labeler = bool(r["label"]), r["labeler"]
    return list(items.values())
