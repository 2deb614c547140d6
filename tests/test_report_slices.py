"""Slicing (SPEC §10): sessions carry their agent version, provider and MCP servers, and the report and the views
cut by agent, agent version, model, provider, server, experiment and time bucket. Ingested in this process."""

from __future__ import annotations

import datetime as dt
import os
from pathlib import Path

import duckdb
import pytest

from agentfunnel.collector.config import load_settings
from agentfunnel.collector.ingest import ingest_files
from agentfunnel.collector.report import Filters, load_report
from agentfunnel.collector.report.html import render_html
from agentfunnel.collector.report.terminal import render_terminal
from otlp_build import trace_request

DAY1 = int(dt.datetime(2026, 3, 1, 9, tzinfo=dt.timezone.utc).timestamp()) * 10**9
DAY2 = DAY1 + 86_400 * 10**9


def _session(conv: str, agent: str, provider: str, model: str, tools: list[str], start: int,
             experiment: str | None = None) -> list[dict]:
    tid, root = os.urandom(16), os.urandom(8)
    tags = {"agentfunnel.experiment": experiment} if experiment else {}
    spans = [{"trace_id": tid, "span_id": root, "name": f"invoke_agent {agent}", "start": start, "end": start + 10**9,
              "attributes": {"gen_ai.operation.name": "invoke_agent", "gen_ai.agent.name": agent,
                             "gen_ai.conversation.id": conv, **tags}},
             {"trace_id": tid, "span_id": os.urandom(8), "parent_span_id": root, "name": "chat", "start": start + 1,
              "end": start + 2, "attributes": {"gen_ai.operation.name": "chat", "gen_ai.provider.name": provider,
                                               "gen_ai.request.model": model}}]
    for i, tool in enumerate(tools):
        spans.append({"trace_id": tid, "span_id": os.urandom(8), "parent_span_id": root, "name": f"execute_tool {tool}",
                      "start": start + 10 + i, "end": start + 20 + i,
                      "attributes": {"gen_ai.operation.name": "execute_tool", "gen_ai.tool.name": tool,
                                     "gen_ai.tool.call.arguments": "{}", "gen_ai.tool.call.result": '{"ok": true}'}})
    return spans


@pytest.fixture(scope="module")
def db(tmp_path_factory) -> Path:
    tmp = tmp_path_factory.mktemp("slices")
    files = []
    for version, sessions in (("1.0.0", [("s1", "shop", "anthropic", "claude-x", ["mcp__shopify__search_products"],
                                          DAY1, None)]),
                              ("2.0.0", [("s2", "shop", "openai", "gpt-y", ["search_products", "add_to_cart"], DAY1, "exp-a"),
                                         ("s3", "shop", "anthropic", "claude-x", ["mcp__shopify__search_products",
                                                                                  "github__create_issue"], DAY2, "exp-b"),
                                         ("s4", "helper", "openai", "gpt-y", [], DAY2, None)])):
        spans = [s for args in sessions for s in _session(*args)]
        path = tmp / f"v{version}.binpb"
        path.write_bytes(trace_request(spans, resource={"service.name": "shop-svc", "service.version": version})
                         .SerializeToString())
        files.append(path)
    settings = load_settings(overrides={("store", "path"): tmp / "slices.duckdb"}, environ={})
    report = ingest_files(files, settings)
    assert not report.errors and report.traces_assembled == 4
    return tmp / "slices.duckdb"


def test_sessions_carry_their_agent_version_provider_and_servers(db):
    con = duckdb.connect(str(db), read_only=True)
    rows = {r[0]: r[1:] for r in con.execute(
        "SELECT session_id, agent_version, provider, servers FROM sessions ORDER BY 1").fetchall()}
    assert rows == {"s1": ("1.0.0", "anthropic", ["shopify"]), "s2": ("2.0.0", "openai", []),
                    "s3": ("2.0.0", "anthropic", ["github", "shopify"]), "s4": ("2.0.0", "openai", [])}
    # the views, over any slice: funnel_conversion_of(NULL) is the view itself
    assert con.execute("SELECT * FROM funnel_conversion_of(NULL) ORDER BY ALL").fetchall() == con.execute(
        "SELECT * FROM funnel_conversion ORDER BY ALL").fetchall()
    sliced = dict(con.execute("SELECT step, sessions FROM funnel_conversion_of((SELECT list(session_id) FROM sessions "
                              "WHERE agent_version = '2.0.0')) WHERE variant = 'shopping'").fetchall())
    assert sliced["search"] == 2 and sliced["cart"] == 1
    for day in ("2026-03-01", "2026-03-02"):  # a time bucket is a slice like any other
        mix = con.execute("SELECT sum(sessions) FROM outcome_mix_of((SELECT list(session_id) FROM sessions "
                          "WHERE first_seen::DATE = ?::DATE))", [day]).fetchall()
        assert mix[0][0] == 2
    con.close()


@pytest.mark.parametrize("slices, expected", [
    ({"agent_version": "2.0.0"}, {"s2", "s3", "s4"}),
    ({"provider": "anthropic"}, {"s1", "s3"}),
    ({"server": "shopify"}, {"s1", "s3"}),
    ({"model": "gpt-y"}, {"s2", "s4"}),
    ({"experiment": "exp-*"}, {"s2", "s3"}),
    ({"until": "2026-03-02"}, {"s1", "s2"}),
    ({"agent_version": "2.0.0", "provider": "openai"}, {"s2", "s4"}),
])
def test_the_report_cuts_by_each_slice(db, slices, expected):
    data = load_report(db, Filters.parse(**slices))
    assert {r.session_id for r in data.latest} == expected
    assert data.summary.sessions == len(expected)
    assert all(k in dict(data.filters.describe()) for k in slices)


def test_the_report_shows_sessions_by_day_or_hour(db):
    data = load_report(db, Filters.parse(bucket="day"))
    assert [(b.start[:10], b.sessions) for b in data.buckets] == [("2026-03-01", 2), ("2026-03-02", 2)]
    assert "Sessions by day" in render_terminal(data, width=100) and "2026-03-02" in render_terminal(data, width=100)
    assert "Sessions by day" in render_html(data)
    hours = load_report(db, Filters.parse(bucket="hour", agent="helper")).buckets
    assert [(b.start, b.sessions) for b in hours] == [("2026-03-02T09:00:00", 1)]
    with pytest.raises(ValueError, match="--bucket 'week'"):
        Filters.parse(bucket="week")
    with pytest.raises(ValueError, match="--until"):
        Filters.parse(until="tomorrow")
