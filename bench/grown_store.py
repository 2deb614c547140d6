"""A store file as one that has run for a while holds it: older traces indexed, their sessions' rows, their tool calls.

What a session job reads of its sessions meets every stored row it cannot skip, so its cost on a fresh
file says little of a store that has run for days. ``bench/job_size.py`` and ``bench/ingest.py`` take
``--stored-traces N`` and start from this.
"""

from __future__ import annotations

from pathlib import Path

from agentfunnel.collector.store.schema import migrate
from agentfunnel.collector.store.writer import connect


def grown_store(path: Path, traces: int) -> None:
    """A store file holding ``traces`` older traces' index rows (two a session), their sessions' rows (compacted) and four tool
    calls a trace, received a day before now."""
    con = connect(path)
    migrate(con)
    con.execute("""
        INSERT INTO trace_index (trace_id, first_received, span_count, session_ids, assembled_at, agent_version,
                                 providers, servers)
        SELECT md5('trace-' || i), now()::TIMESTAMP - INTERVAL 1 DAY + INTERVAL (i) MILLISECOND, 9,
               [md5('session-' || (i // 2))], now()::TIMESTAMP - INTERVAL 1 DAY, 'v1', ['openai'], []::VARCHAR[]
        FROM range(?) t(i)""", [traces])
    con.execute("INSERT INTO session_rows_compacted (session_id, status, version) "
                "SELECT md5('session-' || i), 'closed', 1 FROM range(? // 2) t(i)", [traces])
    con.execute("INSERT INTO tool_calls (trace_id, span_id, session_id, first_received) SELECT md5('trace-' || (i // 4)), "
                "md5('span-' || i)[:16], md5('session-' || (i // 8)), now()::TIMESTAMP - INTERVAL 1 DAY "
                "FROM range(? * 4) t(i)", [traces])
    con.execute("CHECKPOINT")
    con.close()
