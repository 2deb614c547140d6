"""What users said beside what we proved: the statements the report and the UI share, and their rows.

A session's user verdict is its latest positive or negative item (a user may change their mind),
else neutral. What we call it: a success when its outcome reads as pass (a proven purchase,
checkout, PO or action), a failure when it reads as fail, partial or unknown, and no call for
info and neutral outcomes (an answer, no activity). The two disagreements are users unhappy with a
session we call a success, and users happy with one we call a failure; they are counted per
furthest step reached and per drop-off reason, with the judge's mean score beside them.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

Row = dict[str, Any]
Run = Callable[[str], list[Row]]
MAX_DISAGREEMENTS = 10  # sessions listed by name in the report and on the overview
MAX_SESSION_ITEMS = 50  # feedback items shown on one session's page

HAS_TABLE = "SELECT count(*) AS n FROM information_schema.tables WHERE table_name = 'feedback'"


def _joined(where: str) -> str:
    return f"""
WITH s AS (SELECT * FROM sessions WHERE {where}),
verdict AS (
    SELECT joined_session_id AS session_id, count(*) AS items,
           count(*) FILTER (WHERE sentiment = 'positive') AS positive_items,
           count(*) FILTER (WHERE sentiment = 'negative') AS negative_items,
           coalesce(arg_max(sentiment, coalesce(time, received_at)) FILTER (WHERE sentiment <> 'neutral'),
                    'neutral') AS user_says,
           arg_max(comment, coalesce(time, received_at)) FILTER (WHERE comment IS NOT NULL) AS comment,
           max(coalesce(time, received_at)) AS latest
    FROM feedback_sessions WHERE joined_session_id IS NOT NULL GROUP BY 1),
j AS (
    SELECT s.session_id, s.variant, s.outcome, s.outcome_reads_as, s.judge_score, s.judge_status, s.drop_reason,
           s.drop_step, CASE WHEN len(s.steps) > 0 THEN s.steps[len(s.steps)] END AS last_step, v.*
               EXCLUDE (session_id),
           CASE WHEN s.outcome_reads_as = 'pass' THEN 'success'
                WHEN s.outcome_reads_as IN ('fail', 'partial', 'unknown') THEN 'failure'
                ELSE 'no_call' END AS we_say
    FROM s JOIN verdict v USING (session_id))
"""


_COUNTS = """count(*) AS sessions,
           count(*) FILTER (WHERE user_says = 'positive') AS positive,
           count(*) FILTER (WHERE user_says = 'negative') AS negative,
           count(*) FILTER (WHERE user_says = 'neutral') AS neutral,
           count(*) FILTER (WHERE we_say = 'success' AND user_says = 'negative') AS unhappy_on_success,
           count(*) FILTER (WHERE we_say = 'failure' AND user_says = 'positive') AS happy_on_failure,
           avg(judge_score) AS judge_mean"""


def summary_sql(where: str) -> str:
    return _joined(where) + f"""SELECT {_COUNTS},
           (SELECT count(*) FROM feedback) AS items,
           (SELECT count(*) FROM feedback_sessions WHERE joined_session_id IS NULL) AS pending,
           count(*) FILTER (WHERE we_say = 'success') AS we_success,
           count(*) FILTER (WHERE we_say = 'failure') AS we_failure,
           count(*) FILTER (WHERE we_say = 'success' AND user_says = 'positive') AS happy_on_success,
           count(*) FILTER (WHERE we_say = 'failure' AND user_says = 'negative') AS unhappy_on_failure
    FROM j"""


def by_step_sql(where: str) -> str:
    return _joined(where) + f"SELECT variant, last_step, {_COUNTS} FROM j GROUP BY ALL ORDER BY variant, sessions DESC, last_step"


def by_reason_sql(where: str) -> str:
    return (_joined(where) + f"SELECT variant, drop_reason, {_COUNTS} FROM j WHERE drop_reason IS NOT NULL "
            "GROUP BY ALL ORDER BY unhappy_on_success + happy_on_failure DESC, sessions DESC, variant, drop_reason")


def disagreements_sql(where: str) -> str:
    return _joined(where) + f"""SELECT session_id, variant, outcome, outcome_reads_as, judge_score, judge_status,
           last_step, drop_reason, user_says, we_say, items, comment, latest
    FROM j WHERE (we_say = 'success' AND user_says = 'negative') OR (we_say = 'failure' AND user_says = 'positive')
    ORDER BY latest DESC, session_id LIMIT {MAX_DISAGREEMENTS}"""


SESSION_ITEMS = f"""SELECT feedback_id, source, time, received_at, user_id, name, score, score_max, label, sentiment,
       comment, truncated, joined_by, trace_id, span_id
FROM feedback_sessions WHERE joined_session_id = $sid ORDER BY coalesce(time, received_at), feedback_id
LIMIT {MAX_SESSION_ITEMS}"""


@dataclass
class FeedbackView:
    """Feedback beside the proven outcome, over the sessions a report's filters select (all, in the UI)."""

    summary: Row
    by_step: list[Row] = field(default_factory=list)
    by_reason: list[Row] = field(default_factory=list)
    disagreements: list[Row] = field(default_factory=list)

    @property
    def agreement(self) -> float | None:
        """Of the sessions with both a call of ours and a user verdict, the share where they agree."""
        s = self.summary
        agree = int(s["happy_on_success"] or 0) + int(s["unhappy_on_failure"] or 0)
        disagree = int(s["unhappy_on_success"] or 0) + int(s["happy_on_failure"] or 0)
        return agree / (agree + disagree) if agree + disagree else None


def load(run: Run, where: str = "TRUE") -> FeedbackView | None:
    """None when no feedback is stored (or the database predates the table): the report and UI then show nothing."""
    if not int(run(HAS_TABLE)[0]["n"]):
        return None
    summary = run(summary_sql(where))[0]
    if not int(summary["items"] or 0):
        return None
    return FeedbackView(summary, run(by_step_sql(where)), run(by_reason_sql(where)), run(disagreements_sql(where)))


def session_verdict(items: list[Row]) -> str | None:
    """The session's user verdict from its items (as ``_joined`` reads it): the latest positive or negative."""
    said = [i for i in items if i.get("sentiment") in ("positive", "negative")]
    return said[-1]["sentiment"] if said else ("neutral" if items else None)


def we_say(outcome_reads_as: str | None) -> str:
    if outcome_reads_as == "pass":
        return "success"
    return "failure" if outcome_reads_as in ("fail", "partial", "unknown") else "no_call"
