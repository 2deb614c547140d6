"""The rows a firing becomes in ``monitor_firings`` (columns in ``columns``), and the statements that read them."""

from __future__ import annotations

import datetime as dt
import hashlib
from typing import Any

from .columns import COLUMNS, TABLE
from .engine import Evaluation, rule_hash

def firing_row(ev: Evaluation, fired_at: dt.datetime) -> dict[str, Any]:
    """The stored row of a firing (delivery columns filled in once the webhook answered)."""
    assert ev.current is not None
    cur, base = ev.current, ev.baseline
    fid = hashlib.sha256(f"{ev.key()}|{cur.start.isoformat()}|{fired_at.isoformat()}".encode()).hexdigest()[:16]
    return {"firing_id": fid, "monitor": ev.rule.name, "rule_hash": rule_hash(ev.rule), "firing_key": ev.key(),
            "measure": ev.rule.measure.describe(), "slice": ev.rule.slice.describe(),
            "condition": ev.rule.condition.describe(), "window_start": cur.start, "window_end": cur.end,
            "baseline_start": base.start if base else None, "baseline_end": base.end if base else None,
            "version": cur.version, "baseline_version": base.version if base else None,
            "value": ev.value, "baseline_value": ev.baseline_value, "threshold": ev.threshold, "p_value": ev.p_value,
            "n": ev.n, "baseline_n": ev.baseline_n, "message": ev.message(), "session_ids": list(ev.session_ids),
            "fired_at": fired_at, "delivered": None, "delivery_attempts": 0, "delivery_error": None}


def insert(con: Any, rows: list[dict[str, Any]]) -> int:
    """Append firings (the writer's connection, or a file's)."""
    if rows:
        names = list(COLUMNS)
        con.executemany(f"INSERT INTO {TABLE} ({', '.join(names)}) VALUES ({', '.join('?' for _ in names)})",
                        [[r[c] for c in names] for r in rows])
    return len(rows)


PREVIOUS_SQL = (f"SELECT firing_key, window_end FROM {TABLE} WHERE monitor = $monitor AND rule_hash = $rule_hash "
                "ORDER BY fired_at DESC LIMIT 100")
RECENT_SQL = (f"SELECT {', '.join(COLUMNS)} FROM {TABLE} ORDER BY fired_at DESC, firing_id LIMIT $limit")
ONE_SQL = f"SELECT {', '.join(COLUMNS)} FROM {TABLE} WHERE firing_id = $firing_id"
