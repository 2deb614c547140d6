"""The demo's reviewer: labels some of the judge's calls, stored as the UI's review queue and ``judge audit
import`` store labels, agreeing with the judge on most, so the demo's database shows the judge's agreement with
people in the report, on ``/ui/review`` and in ``judge_labels``."""

from __future__ import annotations

import datetime as dt
import random
from typing import Any

from ...scoring.judge_audit import criteria_of, items_of
from ..judge_audit import insert_labels, latest_judgments
from ..review_queue import label_row
from ..ui.queries import Reader

LABELLED = 12  # judge calls the demo's reviewer labels
DISAGREE = 0.2  # of those, the share where the reviewer sees it the other way
REVIEWER = "demo-reviewer"


def review_demo_judgments(server: Any, seed: int) -> int:
    """Labels for calls spread over every judged session, committed before this returns; how many.

    The calls are chosen by session and criterion, not by the audit's sample, whose order follows item ids that
    hash the judge's input (trace ids differ from one demo to the next): the same seed labels the same calls."""
    reader = Reader(server.store.reader, server.settings.sql)
    calls = sorted((it for j in latest_judgments(reader, "*")
                    for it in items_of(j["session_id"], j["input_hash"], j["passed"], j["status"], criteria_of(j["criteria"]))),
                   key=lambda it: (it.session_id, it.criterion))
    chosen = calls[::max(1, len(calls) // LABELLED)][:LABELLED]
    rng = random.Random(seed * 104729 + 44)
    now = dt.datetime.now(dt.UTC).replace(tzinfo=None)
    rows = []
    for it in chosen:
        met = it.judge_met if rng.random() >= DISAGREE else not it.judge_met
        form = {"session_id": it.session_id, "input_hash": it.input_hash, "criterion": it.criterion,
                "label": "met" if met else "not_met"}
        rows.append(label_row(reader, form, REVIEWER, now))
    if rows:
        server.store.submit_job(lambda con: insert_labels(con, rows)).result(timeout=60)
    return len(rows)
