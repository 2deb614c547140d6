"""``agentfunnel cases check | add``: validate a case file; draft a case from a production session."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from ...scoring import SessionScorer
from ..config import Settings
from ..phrasing import plural
from ..query import QueryError, query
from ..store.lake import LakeUnavailable, ReaderTables, open_reader
from ..store.rows import LOG_COLUMNS, SPAN_COLUMNS, span_views
from .common import database_options, settings_for


def register(sub: argparse._SubParsersAction) -> None:
    cases = sub.add_parser("cases", help="evaluation case files").add_subparsers(dest="cases_command", required=True)
    p = cases.add_parser("check", help="validate a case file (YAML or TOML, a path or a URL)")
    p.add_argument("file", help="case file path or http(s) URL")
    p.add_argument("--fallback", type=Path, default=None, help="local copy when the URL cannot be fetched")
    p.set_defaults(func=run)
    p = cases.add_parser("add", help="draft a case from a production session")
    database_options(p, "read")
    p.add_argument("--from-session", required=True, metavar="ID", help="the session to turn into a case")
    p.add_argument("--id", default=None, help="the new case's id")
    p.add_argument("--out", type=Path, default=None, help="write the YAML here instead of printing it")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    return check(args) if args.cases_command == "check" else add(args)


def check(args: argparse.Namespace) -> int:
    """Validate a case file; errors name the case and the field."""
    # start-up time: the case models, rich
    from ...scoring.cases import CaseFileError, load_suite

    try:
        loaded = load_suite(args.file, args.fallback)
    except (CaseFileError, OSError, ValueError) as exc:
        print(f"agentfunnel cases check: {exc}", file=sys.stderr)
        return 2
    fit = sum(1 for c in loaded.cases if c.fit)
    print(f"{len(loaded.cases)} case(s) OK ({fit} target-fit, {len(loaded.cases) - fit} negative control(s)); "
          f"{loaded.describe()}; sha256 {loaded.sha256[:12]}")
    for c in loaded.cases:
        judge = "judge" if c.completion_criteria else "no judge"
        print(f"  {c.id}: {len(c.plan())} allowed tool(s), "
              f"{plural(len(c.completion_criteria), 'criterion', 'criteria')} ({judge})"
              + (", probe" if c.probe else ""))
    return 0


def add(args: argparse.Namespace) -> int:
    """Turn a (failing) production session into a draft case: every production failure becomes a row."""
    from ..case_draft import draft_text  # start-up time: the case models
    settings = settings_for(args)
    lake = settings.store.lake
    try:
        found = session_records(settings, args.from_session)
    except (LakeUnavailable, QueryError) as exc:  # the lake cannot be reached, no such file, a bound of sql.*
        print(f"agentfunnel cases add: {exc}", file=sys.stderr)
        return 1
    if found is None:
        where = "the lake" if lake is not None else settings.store.path
        print(f"agentfunnel cases add: no session {args.from_session!r} in {where}", file=sys.stderr)
        return 1
    score, records = found
    text = draft_text(records, score, args.id or f"from-{args.from_session}", args.from_session)
    if args.out:
        args.out.write_text(text)
        print(f"wrote a draft case to {args.out}: review the task, the criteria and the marked fields")
    else:
        print(text)
    return 0


def session_records(settings: Settings, session_id: str):
    """The scored session and its records, read back from the store (for case drafts)."""
    from ..session.jobs import gather_sessions  # start-up time: the session stage
    keys = tuple(settings.sessions.session_keys)
    if settings.store.lake is not None:  # every replica's traces, through the lake's views (no server needed)
        con = open_reader(settings.store.lake)
        try:
            found = gather_sessions(con, ReaderTables(), [session_id], session_keys=keys)
        finally:
            con.close()
    else:
        found = stored_session(settings.store.path, session_id, keys)
    session = found.get(session_id)
    if session is None:
        return None
    records = list(session.records)
    return SessionScorer(settings.scoring).score(session_id, records), records


def stored_session(db: Path, session_id: str, session_keys: tuple[str, ...]) -> dict[str, Any]:
    """A session's traces read back with read-only SQL (``query``): through the server that owns the file, or
    from the file itself; assembled as the session stage assembles them."""
    from ..session.assembly import assemble, sessions_of  # start-up time: the session stage
    literal = "'" + session_id.replace("'", "''") + "'"
    traces = ("SELECT DISTINCT trace_id FROM (SELECT unnest(session_ids) AS s, trace_id FROM trace_index) "
              f"WHERE s = {literal}")
    spans = query(db, f"SELECT {SPAN_COLUMNS} FROM spans WHERE trace_id IN ({traces}) "
                      "ORDER BY trace_id, start_time, span_id").rows
    logs = query(db, f"SELECT {LOG_COLUMNS} FROM logs WHERE span_id IS NOT NULL AND trace_id IN ({traces}) "
                     "ORDER BY t").rows if spans else []
    assembled = [assemble(views, session_keys) for views in span_views(spans, logs).values()]
    return sessions_of(assembled, {session_id}, ())
