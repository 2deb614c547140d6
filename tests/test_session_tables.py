"""The session stage's one storage interface: rows by column name, each table's columns defined once.

The migrations define a table's columns; the stage's row builders name them. These tests hold the
two together (a column added to a table and forgotten by its row, or named by a row and missing
from the table, fails here, not in production), and drive ``LocalSessionTables`` on a real DuckDB file
the way a job does: assemble, score, replace.
"""

from __future__ import annotations

from datetime import datetime, timedelta, timezone
from types import SimpleNamespace

import pytest

from agentfunnel.collector.session.assembly import (AssembledTrace, assemble, index_rows, sessions_of, span_stamps,
                                                    tool_call_rows)
from agentfunnel.collector.decode import decode_traces_protobuf
from agentfunnel.collector.evaluation import case_run_row, judgment_row
from agentfunnel.collector.retention import OLDER_THAN, delete_rows, prune_chunk
from agentfunnel.collector.evaluation import Evaluated
from agentfunnel.collector.session.rows import (ScoredSession, call_step_rows, funnel_step_rows,
                                                 pass_rows, score_sessions, session_row, with_steps)
from agentfunnel.collector.store.lake import LAKE_MIGRATIONS
from agentfunnel.collector.store.schema import MIGRATIONS, migrate
from agentfunnel.collector.store.local import LocalSessionTables
from agentfunnel.collector.store.rows import UnknownColumn, case_run_tables, insert_rows
from agentfunnel.collector.store.tables import traces_in
from agentfunnel.collector.store.writer import connect
from agentfunnel.scoring import SessionScorer
from agentfunnel.scoring.judge import Judgment
from agentfunnel.scoring.stages import evaluate_run
from conftest import FIXTURES
from test_dialects import views_of
from test_stages import GOOD, case_of

NOW = datetime(2026, 12, 1, 12, 0)
SHOP = FIXTURES / "otlp" / "strands" / "shop_purchase.traces.binpb"


@pytest.fixture
def con(tmp_path):
    con = connect(tmp_path / "tables.duckdb")
    migrate(con)
    migrate(con, LAKE_MIGRATIONS)  # call_scores: a lake replica's table, same definitions
    yield con
    con.close()


def _columns(con, table: str) -> set[str]:
    return {r[0] for r in con.execute(f"DESCRIBE {table}").fetchall()}


def _traces():
    by_trace: dict[str, list] = {}
    for v in views_of(SHOP):
        by_trace.setdefault(v.trace_id, []).append(v)
    return [assemble(sorted(vs, key=lambda v: (v.start_ns, v.span_id))) for vs in by_trace.values()]


def _scored():
    traces = _traces()
    ids = {s for t in traces for s in t.session_ids}
    scorer = SessionScorer()
    return traces, score_sessions(sessions_of(traces, ids, ()), ids, lambda s: scorer.score(s.session_id, s.records), {})


def test_every_row_builder_names_exactly_its_tables_columns(con):
    traces, scoring = _scored()
    x = scoring.written[0]
    assert set(session_row(x, NOW)) == _columns(con, "sessions")
    assert set(index_rows(traces, NOW, NOW)[0]) == _columns(con, "trace_index")
    # scoring's part, and the bound the tables add (the job's first_received)
    assert set(tool_call_rows(traces)[0]) == _columns(con, "tool_calls") - {"step", "args_valid", "first_received"}
    assert set(call_step_rows(x, NOW)[0]) == _columns(con, "call_scores")
    assert set(funnel_step_rows(SessionScorer())[0]) == _columns(con, "funnel_steps")
    result = evaluate_run(case_of(), x.records, x.score, GOOD)
    runs, stage_rows = case_run_tables([{**case_run_row(x.score, result), "updated_at": NOW}])
    assert set(runs[0]) == _columns(con, "case_run_results")
    assert {frozenset(r) for r in stage_rows} == {frozenset(_columns(con, "stage_results"))}
    judgment = Judgment.model_validate({
        "status": "complete", "passed": True, "score": 1.0, "judge_model": "m", "backend": "anthropic",
        "base_url": "http://127.0.0.1:1", "rubric_id": "r", "rubric_version": "1", "rubric_sha256": "0" * 64,
        "prompt_version": "1", "temperature": 0.0, "threshold": 0.8, "answer_sha256": "1" * 64,
        "reference_sha256": "2" * 64, "input_hash": "3" * 64, "created_at": NOW.replace(tzinfo=timezone.utc)})
    assert set(judgment_row(x.score.session_id, judgment)) == _columns(con, "judgments")


def test_a_row_naming_a_column_the_table_lacks_is_refused_whole_saying_which(con):
    with pytest.raises(UnknownColumn, match="trace_index has no column colour, size"):
        insert_rows(con, "trace_index", [{"trace_id": "t1"}, {"trace_id": "t2", "colour": "red", "size": 3}])
    assert con.execute("SELECT count(*) FROM trace_index").fetchone() == (0,)
    insert_rows(con, "trace_index", [{"trace_id": "t1"}])  # a column left out is NULL
    assert con.execute("SELECT trace_id, span_count FROM trace_index").fetchall() == [("t1", None)]


def test_a_job_through_the_tables_assembles_scores_and_replaces(con):
    """What a job does, step by step, on a real file; then the session loses its spans and its row goes."""
    tables = LocalSessionTables()
    batch = decode_traces_protobuf(SHOP.read_bytes())
    traces, scoring = _scored()
    since = datetime(2026, 1, 1)
    insert_rows(con, "spans", [{"trace_id": batch.trace_id[i], "span_id": batch.span_id[i], "name": batch.name[i],
                                "attributes": batch.attributes[i], "received_at": NOW} for i in range(len(batch))])
    assert set(tables.start(con, []).traces) == {t.trace_id for t in traces}
    tables.write_assembled(con, since, span_stamps(traces), index_rows(traces, since, NOW))
    tables.write_tool_calls(con, since, tool_call_rows(traces))
    assert tables.start(con, []).traces == {}
    sid = scoring.written[0].score.session_id
    assert [t.session_ids for t in tables.indexed(con, [traces[0].trace_id])] == [(sid,)]
    assert set(traces_in(tables.lookup(con, [sid], versions=False).index)) == {t.trace_id for t in traces}
    back = tables.read_traces(con, [traces[0].trace_id], since)
    assert {v.span_id for v in back[traces[0].trace_id]} == {r.span_id for r in traces[0].records}
    assert any(v.attributes for v in back[traces[0].trace_id])  # parsed back from the stored JSON
    assert tables.read_traces(con, [traces[0].trace_id], datetime(2027, 1, 1)) == {}  # received before `since`

    # a job reads its sessions' index rows once: the traces it gathers and the slices it writes come from them
    index = tables.lookup(con, [sid]).index
    assert {tid for tid, *_ in index[sid]} == {t.trace_id for t in traces}
    # what it holds in memory is whole here (this file assembles every trace); the rest is read from the spans
    held = tables.session_traces(con, traces_in(index), [traces[0].trace_id], "any format")
    assert held.kept == (traces[0].trace_id,) and held.texts == {} and set(held.views) == {t.trace_id for t in traces[1:]}
    read = tables.session_traces(con, traces_in(index), [], "any format")
    assert read.kept == () and set(read.views) == {t.trace_id for t in traces}
    rows = pass_rows(scoring, NOW)
    later = {sid: [(tid, since, "9.9.9", ["acme"], ["shopsrv"]) for tid, since, *_ in index[sid]]}
    tables.replace_sessions(con, rows.replaced, rows.sessions, rows.call_steps, rows.case_runs, rows.cased, index=later)
    assert con.execute("SELECT agent_version, provider, servers FROM sessions").fetchall() == [("9.9.9", "acme", ["shopsrv"])]
    tables.replace_sessions(con, rows.replaced, rows.sessions, rows.call_steps, rows.case_runs, rows.cased)
    assert con.execute("SELECT agent_version, provider, servers FROM sessions").fetchall() != [
        ("9.9.9", "acme", ["shopsrv"])]  # without one, read from the store
    assert tables.lookup(con, [sid]).versions == {sid: 1}
    steps = dict(con.execute("SELECT tool_name, step FROM tool_calls WHERE step IS NOT NULL").fetchall())
    assert steps and set(steps.values()) <= {"search", "details", "cart", "checkout", "purchase"}

    evaluated = ScoredSession(scoring.written[0].session, scoring.written[0].score, 2,
                              Evaluated(True, None, None, None, {"session_id": sid, "case_id": "c", "passed": True}))
    again = pass_rows(type(scoring)([evaluated], [], [sid]), NOW)
    tables.replace_sessions(con, again.replaced, again.sessions, again.call_steps, again.case_runs, again.cased)
    assert tables.lookup(con, [sid]).versions == {sid: 2}
    assert con.execute("SELECT session_id, passed FROM case_runs").fetchall() == [(sid, True)]
    gone = pass_rows(type(scoring)([], [], [sid]), NOW)  # asked for, found in no trace: its row is removed
    tables.replace_sessions(con, gone.replaced, gone.sessions, gone.call_steps, gone.case_runs, gone.cased)
    assert tables.lookup(con, [sid]).versions == {}


def test_a_start_finds_the_traces_left_open_and_the_sessions_left_open_without_them(con):
    """A restart reopens the traces whose index row is not marked assembled (shown while open), and re-scores a
    session stored open none of whose traces is open; a trace closing as shown only has its row marked."""
    tables = LocalSessionTables()
    since, steps = datetime(2026, 1, 1), [{"variant": "shop", "step": "search", "step_index": 0}]
    tables.write_assembled(con, since, [], [{"trace_id": tid, "first_received": since, "session_ids": [sid]}
                                                for tid, sid in (("t1", "s1"), ("t2", "s2"))])
    tables.replace_sessions(con, ["s1", "s2"], [{"session_id": s, "version": 1, "status": "open"} for s in ("s1", "s2")],
                            [], [], [], index={})
    left = tables.start(con, steps)
    assert left.traces == {"t1": since - timedelta(seconds=1), "t2": since - timedelta(seconds=1)}
    assert left.open_sessions == ()
    tables.write_assembled(con, since, [], [], shown=["t1"], now=NOW)
    left = tables.start(con, steps)
    assert list(left.traces) == ["t2"] and left.open_sessions == ("s1",)
    assert con.execute("SELECT count(*) FROM funnel_steps").fetchone() == (1,)  # written by each start, replaced


def test_span_stamps_go_by_trace_session_and_dialect_and_stamp_exactly_their_spans(con):
    """The stamp statement carries one row per trace, session and dialect; each span still gets its own, and a
    stored span the stamps do not name (or one received before the job's traces) keeps none."""
    old = datetime(2025, 1, 1)
    insert_rows(con, "spans", [{"trace_id": tid, "span_id": sp, "received_at": at} for tid, sp, at in (
        ("t1", "a", NOW), ("t1", "b", NOW), ("t1", "c", NOW), ("t1", "e", NOW), ("t2", "d", NOW), ("t2", "x", old))])
    t1 = AssembledTrace("t1", [SimpleNamespace(span_id="a", dialect="genai"),  # type: ignore[list-item]
                               SimpleNamespace(span_id="c", dialect="openinference"),
                               SimpleNamespace(span_id="b", dialect="genai")], {"a": "s1", "c": "s2", "b": "s1"})
    t2 = AssembledTrace("t2", [SimpleNamespace(span_id="d", dialect="genai"),  # type: ignore[list-item]
                               SimpleNamespace(span_id="x", dialect="genai")], {"d": None, "x": None})
    stamps = span_stamps([t1, t2])
    assert stamps == [
        {"trace_id": "t1", "session_id": "s1", "dialect": "genai", "span_ids": ["a", "b"]},
        {"trace_id": "t1", "session_id": "s2", "dialect": "openinference", "span_ids": ["c"]},
        {"trace_id": "t2", "session_id": None, "dialect": "genai", "span_ids": ["d", "x"]}]
    LocalSessionTables().write_assembled(con, datetime(2026, 1, 1), stamps, [])
    assert con.execute("SELECT trace_id, span_id, session_id, dialect FROM spans ORDER BY ALL").fetchall() == [
        ("t1", "a", "s1", "genai"), ("t1", "b", "s1", "genai"), ("t1", "c", "s2", "openinference"),
        ("t1", "e", None, None), ("t2", "d", None, "genai"), ("t2", "x", None, None)]


def test_a_jobs_own_calls_are_written_with_their_steps_and_only_calls_stored_before_are_updated(con):
    """A job's calls go in once, after its scores, with the steps and schema checks their sessions' scores gave
    (``with_steps``); the scoring's update reaches the calls stored before it, a span id the session's traces
    repeat included (one call of the session, as its score reads it). A call of a session not scored here
    (another writer's, or one whose scoring failed) is written without."""
    tables = LocalSessionTables()
    early, late = datetime(2026, 11, 1), datetime(2026, 11, 20)
    tables.write_assembled(con, early, [], [{"trace_id": "t1", "first_received": early, "session_ids": ["s"]}])
    tables.write_tool_calls(con, early, [{"session_id": "s", "trace_id": "t1", "span_id": sp, "tool_name": "search"}
                                         for sp in ("a", "x")])
    tables.write_assembled(con, late, [], [{"trace_id": "t2", "first_received": late, "session_ids": ["s", "u"]}])
    fresh = [{"session_id": "s", "trace_id": "t2", "span_id": "b", "tool_name": "cart"},
             {"session_id": "s", "trace_id": "t2", "span_id": "x", "tool_name": "cart"},
             {"session_id": "u", "trace_id": "t2", "span_id": "c", "tool_name": "pay"}]
    steps = [{"session_id": "s", "span_id": sp, "step": step, "args_valid": valid}
             for sp, step, valid in (("a", "search", True), ("b", "cart", False), ("x", "cart", None))]
    tables.replace_sessions(con, ["s"], [], steps, [], [], fresh_traces={"t2"})
    tables.write_tool_calls(con, late, with_steps(fresh, steps))
    assert con.execute("SELECT trace_id, span_id, step, args_valid, first_received FROM tool_calls "
                       "ORDER BY span_id, trace_id").fetchall() == [
        ("t1", "a", "search", True, early), ("t2", "b", "cart", False, late), ("t2", "c", None, None, late),
        ("t1", "x", "cart", None, early), ("t2", "x", "cart", None, late)]


def test_the_migration_gives_stored_calls_their_traces_first_received_row_for_row(tmp_path):
    con = connect(tmp_path / "old.duckdb")
    migrate(con, [m for m in MIGRATIONS if m[0] < "0018"])
    con.execute("INSERT INTO trace_index (trace_id, first_received, session_ids) VALUES ('t1', TIMESTAMP '2026-11-01', "
                "['s']), ('t2', TIMESTAMP '2026-11-02', ['s'])")
    con.execute("INSERT INTO tool_calls (session_id, trace_id, span_id, tool_name, arguments, step, args_valid, "
                "start_time) VALUES ('s', 't1', 'a', 'search', '{\"q\": 1}', 'search', true, TIMESTAMP '2026-11-01'), "
                "('s', 't2', 'b', 'cart', NULL, NULL, false, NULL), ('s', 't3', 'c', 'pay', NULL, 'purchase', NULL, NULL)")
    before = con.execute("SELECT * FROM tool_calls ORDER BY span_id").fetchall()
    assert migrate(con) == ["0018_tool_call_first_received"]
    after = con.execute("SELECT * EXCLUDE (first_received) FROM tool_calls ORDER BY span_id").fetchall()
    assert after == before
    assert con.execute("SELECT span_id, first_received FROM tool_calls ORDER BY span_id").fetchall() == [
        ("a", datetime(2026, 11, 1)), ("b", datetime(2026, 11, 2)), ("c", None)]  # t3: no index row to take it from


def test_a_sessions_call_steps_reach_every_trace_of_it_and_no_other_calls(con):
    """Calls are written with their job's first_received; a re-scoring sets the steps of its sessions' calls
    from the earliest of their traces on, and leaves other sessions' calls as they were."""
    tables = LocalSessionTables()
    early, late = datetime(2026, 11, 1), datetime(2026, 11, 20)
    for tid, since, calls in (("t1", early, [("s", "a"), ("other", "o")]), ("t2", late, [("s", "b")])):
        tables.write_assembled(con, since, [], [{"trace_id": tid, "first_received": since,
                                                 "session_ids": sorted({c[0] for c in calls})}])
        tables.write_tool_calls(con, since, [{"session_id": sid, "trace_id": tid, "span_id": sp, "tool_name": "search"}
                                             for sid, sp in calls])
    assert con.execute("SELECT trace_id, first_received FROM tool_calls ORDER BY span_id").fetchall() == [
        ("t1", early), ("t2", late), ("t1", early)]
    steps = [{"session_id": "s", "span_id": sp, "step": st, "args_valid": True} for sp, st in (("a", "search"), ("b", "cart"))]
    tables.replace_sessions(con, ["s"], [], steps + [{"session_id": "s", "span_id": "o", "step": "x", "args_valid": True}],
                            [], [])
    assert con.execute("SELECT span_id, step, args_valid FROM tool_calls ORDER BY span_id").fetchall() == [
        ("a", "search", True), ("b", "cart", True), ("o", None, None)]


def test_a_tables_columns_are_read_once_per_connection(tmp_path):
    """Each insert used to DESCRIBE its table first, a statement as costly as a small insert; the columns are
    kept per connection now (a new connection reads them again: it may be a file at another migration)."""
    tables = LocalSessionTables()
    rows = [{"variant": "shop", "step": "search", "step_index": 0}]
    for path in (tmp_path / "a.duckdb", tmp_path / "b.duckdb"):
        con = connect(path)
        migrate(con)
        con.execute("CALL enable_logging('QueryLog')")
        for _ in range(3):
            tables.start(con, rows)
        logged = [m for (m,) in con.execute("SELECT message FROM duckdb_logs WHERE type = 'QueryLog'").fetchall()]
        assert sum(m.startswith("DESCRIBE") for m in logged) == 1, logged
        assert con.execute("SELECT count(*) FROM funnel_steps").fetchone()[0] == 1  # replaced each time
        con.close()


# ---------------------------------------------------------------------------- append-only session rows

def _write(tables: LocalSessionTables, con, scoring, version: int, case_run: dict | None = None, **changes) -> str:
    """One job's writes of the fixture's session at ``version`` (its row changed by ``changes``)."""
    x = scoring.written[0]
    sid = x.score.session_id
    evaluated = Evaluated(True, None, None, None, {**case_run, "session_id": sid}) if case_run else None
    rows = pass_rows(type(scoring)([ScoredSession(x.session, x.score, version, evaluated)], [], [sid]), NOW)
    sessions = [{**r, **changes} for r in rows.sessions]
    tables.replace_sessions(con, rows.replaced, sessions, rows.call_steps, rows.case_runs, rows.cased,
                            stored=list(tables.lookup(con, [sid]).versions))
    return sid


class _Counting:
    """A connection that counts the statements run through it."""

    def __init__(self, con) -> None:
        self.con, self.statements = con, 0

    def execute(self, *args):
        self.statements += 1
        return self.con.execute(*args)

    def __getattr__(self, name):
        return getattr(self.con, name)


def test_a_sessions_rows_are_appended_and_the_views_show_the_newest_before_and_after_compaction(con):
    tables = LocalSessionTables()
    _, scoring = _scored()
    sid = _write(tables, con, scoring, 1, {"case_id": "c", "passed": False}, outcome="first")
    _write(tables, con, scoring, 2, {"case_id": "c", "passed": True}, outcome="second")
    assert con.execute("SELECT count(*) FROM session_rows").fetchone() == (2,)  # nothing deleted by the job
    assert con.execute("SELECT session_id, version, outcome FROM sessions").fetchall() == [(sid, 2, "second")]
    assert con.execute("SELECT passed FROM case_runs").fetchall() == [(True,)]
    assert _columns(con, "sessions") == _columns(con, "session_rows") - {"row_seq", "removed"}
    assert _columns(con, "sessions") == _columns(con, "session_rows_compacted")

    assert tables.compact(con) == 4  # two session rows and two case-run rows, folded into one of each
    assert con.execute("SELECT count(*) FROM session_rows").fetchone() == (0,)
    assert con.execute("SELECT count(*) FROM session_rows_compacted").fetchone() == (1,)
    assert con.execute("SELECT session_id, version, outcome FROM sessions").fetchall() == [(sid, 2, "second")]
    assert con.execute("SELECT passed FROM case_runs").fetchall() == [(True,)]
    _write(tables, con, scoring, 3, outcome="third")  # appended over a compacted row: the newer one shows
    assert con.execute("SELECT version, outcome FROM sessions").fetchall() == [(3, "third")]

    gone = pass_rows(type(scoring)([], [], [sid]), NOW)  # found in no trace any more: the session is removed
    tables.replace_sessions(con, gone.replaced, gone.sessions, gone.call_steps, gone.case_runs, gone.cased)
    assert con.execute("SELECT count(*) FROM sessions").fetchone() == (0,)
    assert tables.lookup(con, [sid]).versions == {}
    assert tables.compact(con) == 2  # its third version and the removal
    assert con.execute("SELECT (SELECT count(*) FROM session_rows) + (SELECT count(*) FROM session_rows_compacted)"
                       ).fetchone() == (0,)
    _write(tables, con, scoring, 1, outcome="back")  # and it may come back
    assert con.execute("SELECT version, outcome FROM sessions").fetchall() == [(1, "back")]


def _stages(sid: str, **states: str) -> list[dict]:
    return [{"session_id": sid, "stage": stage, "stage_order": 10 * i, "state": state, "scored": True}
            for i, (stage, state) in enumerate(states.items(), 1)]


def test_a_case_runs_stage_rows_are_appended_and_its_newest_scorings_show_before_and_after_compaction(con):
    """Stage rows are appended with their run's row, under its row_seq: ``stage_results`` (and the ``case_runs``
    and ``stage_funnel`` views over it) shows the newest scoring's stages only, even when it has fewer."""
    tables = LocalSessionTables()
    _, scoring = _scored()
    sid = scoring.written[0].score.session_id
    _write(tables, con, scoring, 1, {"case_id": "c", "experiment": "e", "passed": False,
                                     "stages": _stages(sid, discovery="passed", completion="failed")})
    _write(tables, con, scoring, 2, {"case_id": "c", "experiment": "e", "passed": True,
                                     "stages": _stages(sid, discovery="passed", selection="passed")})
    shown = "SELECT stage, state FROM stage_results ORDER BY stage_order"
    newest = [("discovery", "passed"), ("selection", "passed")]
    assert con.execute("SELECT count(*) FROM stage_result_rows").fetchone() == (4,)  # nothing deleted by the job
    assert con.execute(shown).fetchall() == newest
    wide = "SELECT passed, discovery, selection, completion FROM case_runs"
    assert con.execute(wide).fetchall() == [(True, "passed", "passed", None)]
    funnel = con.execute("SELECT stage, runs, passed FROM stage_funnel ORDER BY stage_index").fetchall()
    assert funnel == [("discovery", 1, 1), ("selection", 1, 1)]

    assert tables.compact(con) == 8  # two rows each of the session and the run, and four stage rows
    assert con.execute("SELECT count(*) FROM stage_result_rows").fetchone() == (0,)
    assert con.execute("SELECT count(*) FROM stage_result_rows_compacted").fetchone() == (2,)
    assert con.execute(shown).fetchall() == newest
    assert con.execute(wide).fetchall() == [(True, "passed", "passed", None)]
    _write(tables, con, scoring, 3, {"case_id": "c", "experiment": "e", "passed": False,
                                     "stages": _stages(sid, discovery="failed")})  # over compacted rows
    assert con.execute(shown).fetchall() == [("discovery", "failed")]

    x = scoring.written[0]  # evaluated without a case run: the run and its stages are removed
    rows = pass_rows(type(scoring)([ScoredSession(x.session, x.score, 4, Evaluated(None, None, None, None, {}))],
                                   [], [sid]), NOW)
    tables.replace_sessions(con, rows.replaced, rows.sessions, rows.call_steps, rows.case_runs, rows.cased)
    assert con.execute("SELECT (SELECT count(*) FROM stage_results) + (SELECT count(*) FROM case_runs)"
                       ).fetchone() == (0,)
    tables.compact(con)
    assert con.execute("SELECT (SELECT count(*) FROM stage_result_rows_compacted) + "
                       "(SELECT count(*) FROM case_run_rows_compacted)").fetchone() == (0,)


def test_stored_versions_are_answered_from_memory_and_looked_up_once_forgotten(con):
    forgotten: list[int] = []
    tables = LocalSessionTables(versions_remembered=1, forgotten=forgotten.append)
    _, scoring = _scored()
    sid = _write(tables, con, scoring, 1)
    counted = _Counting(con)
    assert tables._stored_versions(counted, [sid, "never-stored"]) == {sid: 1}
    assert counted.statements == 1  # remembered: only the unknown session looked up (a second file's memory is read)
    counted.statements = 0
    assert tables._stored_versions(counted, [sid]) == {sid: 1}
    assert counted.statements == 0
    con.execute("INSERT INTO session_rows_compacted (session_id, version) VALUES ('other', 4)")
    fresh = LocalSessionTables(versions_remembered=1, forgotten=forgotten.append)
    assert fresh.lookup(con, [sid, "other"]).versions == {sid: 1, "other": 4}  # two stored: more than it remembers
    _write(fresh, con, scoring, 2)
    fresh._remembered({"third": 1})
    assert forgotten == [1]  # past the bound, counted
    assert fresh.lookup(con, [sid, "other"]).versions == {sid: 2, "other": 4}  # the forgotten one looked up


def test_the_migration_moves_stored_sessions_and_case_runs_into_their_rows(tmp_path):
    con = connect(tmp_path / "old.duckdb")
    before = [m for m in MIGRATIONS if m[0] < "0017"]
    migrate(con, before)
    con.execute("INSERT INTO sessions (session_id, version, status, user_id, outcome) VALUES "
                "('a', 3, 'closed', 'jane', 'purchase_completed'), ('b', 1, 'open', NULL, NULL)")
    con.execute("INSERT INTO case_run_results (session_id, case_id, passed) VALUES ('a', 'c1', true)")
    con.execute("INSERT INTO stage_results (session_id, stage, stage_order, state, scored) VALUES "
                "('a', 'discovery', 10, 'passed', true), ('a', 'completion', 70, 'failed', true)")
    columns = {t: [c[:2] for c in con.execute(f"DESCRIBE {t}").fetchall()]  # names and types
               for t in ("sessions", "case_run_results", "stage_results", "case_runs")}
    stages = con.execute("SELECT * FROM stage_results ORDER BY stage_order").fetchall()
    funnel = con.execute("SELECT * FROM stage_funnel ORDER BY stage_index").fetchall()
    outcome_mix = con.execute("SELECT * FROM outcome_mix ORDER BY ALL").fetchall()
    assert migrate(con)[0] == "0017_append_only_sessions"
    for table, before_columns in columns.items():  # the same, in the same order
        assert [c[:2] for c in con.execute(f"DESCRIBE {table}").fetchall()] == before_columns, table
    assert con.execute("SELECT * FROM stage_results ORDER BY stage_order").fetchall() == stages
    assert con.execute("SELECT * FROM stage_funnel ORDER BY stage_index").fetchall() == funnel
    assert con.execute("SELECT session_id, version, status, user_id FROM sessions ORDER BY 1").fetchall() == [
        ("a", 3, "closed", "jane"), ("b", 1, "open", None)]
    assert con.execute("SELECT session_id, case_id, passed FROM case_runs").fetchall() == [("a", "c1", True)]
    assert con.execute("SELECT * FROM outcome_mix ORDER BY ALL").fetchall() == outcome_mix
    tables = LocalSessionTables()
    assert tables.lookup(con, ["a", "b", "c"]).versions == {"a": 3, "b": 1}
    con.close()


def test_deleting_a_user_removes_every_version_of_their_sessions(con):
    """A re-score that no longer names the user (or says something else) leaves the older rows naming them in
    ``session_rows``: deletion finds the session by any of its versions and removes them all."""
    tables = LocalSessionTables()
    _, scoring = _scored()
    sid = scoring.written[0].score.session_id
    _write(tables, con, scoring, 1, {"case_id": "c", "stages": _stages(sid, discovery="failed")},
           user_id="jane", final_answer="jane's address is 1 Main St")
    tables.compact(con)
    _write(tables, con, scoring, 2, user_id=None)
    _write(tables, con, scoring, 3, {"case_id": "c", "stages": _stages(sid, discovery="passed", completion="passed")},
           user_id="jane", final_answer="jane's address is 1 Main St")
    _write(tables, con, scoring, 4, user_id=None)  # compacted, and appended twice since, the newest not naming her
    assert con.execute("SELECT count(*) FROM sessions WHERE user_id = 'jane'").fetchone() == (0,)
    done = delete_rows(con, ["jane"], [])
    assert done.sessions == [sid]
    # as the views counted them: the newest run's two stages, counted before the run's rows went
    assert (done.removed["sessions"], done.removed["case_run_results"], done.removed["stage_results"]) == (1, 1, 2)
    for table in ("case_run_rows", "case_run_rows_compacted", "stage_result_rows", "stage_result_rows_compacted"):
        assert con.execute(f"SELECT count(*) FROM {table}").fetchone() == (0,), table
    for table in ("session_rows", "session_rows_compacted"):
        assert con.execute(f"SELECT count(*) FROM {table} WHERE session_id = ? OR user_id = 'jane' "
                           "OR final_answer LIKE '%Main St%'", [sid]).fetchone() == (0,)


def test_pruning_an_old_session_removes_every_row_of_its_case_run_and_stages(con):
    """The time-to-live goes through the views (what they show old) and removes the rows beneath, every version."""
    tables = LocalSessionTables()
    _, scoring = _scored()
    sid = scoring.written[0].score.session_id
    old = datetime(2020, 1, 1)
    _write(tables, con, scoring, 1, {"case_id": "c", "stages": _stages(sid, discovery="failed")}, last_seen=old)
    tables.compact(con)
    _write(tables, con, scoring, 2, {"case_id": "c", "stages": _stages(sid, discovery="passed", completion="passed")},
           last_seen=old)
    pruned = {t: prune_chunk(con, t, datetime(2021, 1, 1), 100) for t in OLDER_THAN
              if t in ("stage_results", "case_run_results", "sessions")}
    assert pruned == {"stage_results": 2, "case_run_results": 1, "sessions": 1}  # as the views showed them
    for table in ("case_run_rows", "case_run_rows_compacted", "stage_result_rows", "stage_result_rows_compacted",
                  "session_rows", "session_rows_compacted"):
        assert con.execute(f"SELECT count(*) FROM {table}").fetchone() == (0,), table
