"""The ``feedback`` table from its one column list (``Feedback``'s fields), the view that joins it to sessions,
and its insert.

Feedback is joined to sessions when it is read, not when it is written: an item that arrives before
its session exists, after the session was scored, or after a restart is joined as soon as the
session is stored, and a session re-scored keeps its feedback. ``feedback_sessions`` joins by the
session id sent, else by the trace (the trace index names the sessions a trace belongs to).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pyarrow as pa

from ..feedback.model import COLUMNS, SQL_TYPES, Feedback

_ARROW = {"VARCHAR NOT NULL": pa.string(), "VARCHAR": pa.string(), "TIMESTAMP": pa.timestamp("us"),
          "DOUBLE": pa.float64(), "BOOLEAN": pa.bool_()}



def create_feedback_sql() -> str:
    """The migration: the table (its columns, then when it arrived) and the joining view. A field added to
    ``Feedback`` later needs a migration of its own that adds the column: this one has shipped."""
    columns = ",\n    ".join(f"{name} {kind}" for name, kind in SQL_TYPES.items())
    return f"""
    CREATE TABLE feedback (
    {columns},
    received_at TIMESTAMP
    );
    CREATE VIEW feedback_sessions AS
    SELECT f.*,
           coalesce(s.session_id, t.session_ids[1]) AS joined_session_id,
           CASE WHEN s.session_id IS NOT NULL THEN 'session_id'
                WHEN t.session_ids[1] IS NOT NULL THEN 'trace_id' END AS joined_by
    FROM feedback f
    LEFT JOIN sessions s ON s.session_id = f.session_id
    LEFT JOIN trace_index t ON t.trace_id = f.trace_id AND s.session_id IS NULL
                           AND len(t.session_ids) > 0;
    """


def insert_feedback(con: Any, items: Sequence[Feedback], received_at: Any) -> tuple[int, int]:
    """Store the items not stored yet (by ``feedback_id``); (new rows, duplicates). The caller's transaction."""
    unique = list({fb.feedback_id: fb for fb in items}.values())
    if not unique:
        return 0, len(items)
    ids = [fb.feedback_id for fb in unique]
    have = {r[0] for r in con.execute("SELECT feedback_id FROM feedback WHERE feedback_id IN "
                                      "(SELECT unnest(?::VARCHAR[]))", [ids]).fetchall()}
    new = [fb for fb in unique if fb.feedback_id not in have]
    if new:  # one Arrow append (executemany costs about a millisecond a row), columns in the table's order
        rows = [fb.row() for fb in new]
        columns = {name: pa.array([r[i] for r in rows], type=_ARROW[SQL_TYPES[name]]) for i, name in enumerate(COLUMNS)}
        columns["received_at"] = pa.array([received_at] * len(rows), type=pa.timestamp("us"))
        con.from_arrow(pa.table(columns)).insert_into("feedback")
    return len(new), len(items) - len(new)
