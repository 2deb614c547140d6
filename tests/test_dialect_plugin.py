"""A dialect added from outside: an installed package declares it under the ``agentfunnel.dialects`` entry point
group, and its spans form sessions, score and show their conversation, with nothing of agentfunnel changed.

tests/fixtures/dialect_package holds that package as installed (its module, one file, and its ``.dist-info``
with the entry point) and a recording of its spans; the server finds it on its ``PYTHONPATH``. Lenient
normalization's counts of what it passes over are here too: a dialect that misspells a field is made in the test.
"""

from __future__ import annotations

import html
import logging
import os
import re
import sys
import urllib.request
from pathlib import Path

import pytest
from agentfunnel.collector.decode import decode_traces_json
from agentfunnel.collector.telemetry import Metrics
from agentfunnel.semconv.dialects import installed, read_messages
from agentfunnel.semconv.dialects.base import Marks
from agentfunnel.semconv.dropped import DROPPED
from agentfunnel.semconv.normalize import normalize
from agentfunnel.semconv.records import SpanView
from conftest import FIXTURES, read_db, run_cli

PACKAGE = FIXTURES / "dialect_package"
RECORDING = PACKAGE / "shop_purchase.traces.json"
ANSWER = "Done: order ord_555 is confirmed."


def _env(*paths: Path) -> dict[str, str]:
    return {"PYTHONPATH": os.pathsep.join([*(str(p) for p in paths), os.environ.get("PYTHONPATH", "")])}


def _views() -> list[SpanView]:
    b = decode_traces_json(RECORDING.read_bytes())
    return [SpanView(b.trace_id[i], b.span_id[i], b.parent_span_id[i], b.name[i], b.attrs[i], b.resource_attrs[i],
                     list(b.event_list[i] or []), b.kind[i], b.status_code[i], b.status_message[i], b.scope_name[i],
                     b.start_ns[i], b.end_ns[i]) for i in range(len(b))]


@pytest.fixture
def with_package(monkeypatch):
    monkeypatch.syspath_prepend(str(PACKAGE))
    yield installed()
    sys.modules.pop("tinyagent_dialect", None)


def test_the_installed_package_is_asked_first_and_reads_every_span_strictly(with_package):
    registry = with_package
    assert registry[0].name == "tinyagent" and "otel_genai" in [d.name for d in registry]
    views = _views()
    records = [normalize(v, registry, strict=True) for v in views]
    assert {r.dialect for r in records} == {"tinyagent"}
    assert [r.tool_name for r in records if r.is_tool_call] == [
        "search_products", "get_product_details", "add_to_cart", "complete_checkout"]
    chat = read_messages(views[-1], registry)
    assert [(m.role, m.text, [c.name for c in m.tool_calls], m.output) for m in chat][:2] == [
        ("user", "Buy the Trail Runner 2 in size 42.", [], False), ("assistant", "", ["search_products"], False)]
    assert (chat[-1].text, chat[-1].output) == (ANSWER, True)
    assert read_messages(views[-1]) == []  # the built-in dialects alone read nothing of it: the UI showed a blank


def _conversation(page: str) -> str:
    section = re.search(r'<section class="card" id="conversation".*?</section>', page, re.DOTALL)
    assert section, page[:2000]
    return html.unescape(re.sub(r"\s+", " ", re.sub(r"<[^>]+>", " ", section.group(0))))


def test_its_spans_form_a_session_that_scores_and_shows_its_conversation(server_factory, tmp_path):
    db = tmp_path / "tiny.duckdb"
    srv = server_factory(db=db, env=_env(PACKAGE))
    out = run_cli("ingest", "--db", str(db), str(RECORDING))
    assert "into the running server" in out.stdout and "0 refused" in out.stdout, out.stdout
    srv.admin_post("/flush")
    with urllib.request.urlopen(srv.http_url + "/ui/sessions/tiny-shop-1", timeout=30) as resp:
        page = resp.read().decode()
    assert srv.stop() == 0
    [session] = read_db(db, "SELECT * FROM sessions")
    assert (session["session_id"], session["outcome"], session["agent_name"], session["model"]) == (
        "tiny-shop-1", "purchase_completed", "shopper", "tiny-1")
    assert list(session["steps"]) == ["search", "details", "cart", "checkout"] and session["final_answer"] == ANSWER
    assert {r["dialect"] for r in read_db(db, "SELECT DISTINCT dialect FROM spans")} == {"tinyagent"}
    said = _conversation(page)
    assert "No message content was captured" not in said
    assert re.search(r"User \S+ \S+ Buy the Trail Runner 2 in size 42\. Model \S+ \S+ calls: search_products "
                     r"Tool call search_products", said), said
    assert said.count("calls: ") == 4 and f"Final answer {session['last_seen']:%Y-%m-%d}" in said, said
    assert 'data-role="user"' in page and "Buy the Trail Runner 2" in page.split('id="waterfall"')[1]  # a model call's


class _Faulty:
    """A dialect with the faults lenient normalization passes over: a misspelled field, and an extract that raises."""

    name = "faulty"
    marks = Marks(keys=frozenset({"faulty.kind"}))

    def extract(self, span: SpanView):
        if span.name == "boom":
            raise KeyError("tool")
        return {"kind": "tool", "tool_name": "search", "argumnets": {"q": 1}}

    def messages(self, span: SpanView):
        raise TypeError("no chat here")


def test_lenient_normalize_counts_what_it_passes_over_by_dialect_and_reason_and_logs_each_field_once(caplog):
    ok = SpanView("a" * 32, "b" * 16, None, "search", {"faulty.kind": 1})
    boom = SpanView("a" * 32, "c" * 16, None, "boom", {"faulty.kind": 1})
    before = DROPPED.counts()
    with caplog.at_level(logging.WARNING, logger="agentfunnel.semconv"):
        for _ in range(3):
            record = normalize(ok, (_Faulty(),))
            assert (record.tool_name, record.arguments) == ("search", None)  # the misspelled field is dropped
            assert normalize(boom, (_Faulty(),)).dialect == "unknown"  # its reading is passed over
            assert read_messages(ok, (_Faulty(),)) == []
    counts = DROPPED.counts()
    assert {k: counts[k] - before.get(k, 0) for k in counts if k.startswith("faulty:")} == {
        "faulty:unknown_field": 3, "faulty:extract_error": 3, "faulty:messages_error": 3}
    logged = [r.getMessage() for r in caplog.records if "dialect faulty" in r.getMessage()]
    assert len(logged) == 3, logged  # once per dialect and field (or exception type), not per span
    assert any("'argumnets'" in line and "bbbb" in line for line in logged)
    assert any("KeyError" in line and "'boom'" in line for line in logged)
    metrics = Metrics()
    assert metrics.get("dialect_reads_dropped", "faulty:unknown_field") == counts["faulty:unknown_field"]
    assert f'agentfunnel_dialect_reads_dropped_total{{reason="faulty:extract_error"}} {counts["faulty:extract_error"]}' \
        in metrics.prometheus()
    assert metrics.snapshot()["dialect_reads_dropped"]["faulty:messages_error"] == counts["faulty:messages_error"]


FAULTY_MODULE = '''
from agentfunnel.semconv.dialects.base import Marks


class Faulty:
    name = "faulty"
    marks = Marks(keys=frozenset({"tiny.step"}))

    def extract(self, span):
        return {"agent_nmae": "shopper"}

    def messages(self, span):
        return None
'''


def test_a_served_dialects_dropped_field_is_counted_in_metrics_and_logged_once(server_factory, tmp_path):
    """An installed dialect that misspells a field, beside the example one: the session still forms (the fields
    read right are kept) and /metrics counts each drop; the server's log names the field once."""
    (tmp_path / "faulty_dialect.py").write_text(FAULTY_MODULE)
    info = tmp_path / "faulty_dialect-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: faulty-dialect\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text("[agentfunnel.dialects]\nfaulty = faulty_dialect:Faulty\n")
    db = tmp_path / "faulty.duckdb"
    srv = server_factory(db=db, env=_env(tmp_path, PACKAGE))
    run_cli("ingest", "--db", str(db), str(RECORDING))
    srv.admin_post("/flush")
    with urllib.request.urlopen(srv.http_url + "/metrics", timeout=30) as resp:
        metrics = resp.read().decode()
    assert srv.stop() == 0
    counted = re.search(r'agentfunnel_dialect_reads_dropped_total\{reason="faulty:unknown_field"\} (\d+)', metrics)
    assert counted and int(counted.group(1)) >= 10, metrics[-3000:]  # every span, at least once
    assert srv.logs().count("'agent_nmae'") == 1, srv.logs()[-3000:]
    assert read_db(db, "SELECT outcome FROM sessions")[0]["outcome"] == "purchase_completed"


def test_what_is_logged_once_is_remembered_within_a_bound_and_counting_goes_on_past_it(caplog):
    """A faulty dialect whose returned keys came from telemetry would make every field new: the memory of what was
    logged stays bounded, and every drop is still counted."""
    from agentfunnel.semconv.dropped import MAX_LOGGED, UNKNOWN_FIELD, Dropped

    dropped = Dropped()
    with caplog.at_level(logging.WARNING, logger="agentfunnel.semconv"):
        for n in range(MAX_LOGGED + 50):
            dropped.add("leaky", UNKNOWN_FIELD, f"attr_{n}", f"returned the field 'attr_{n}'")
    assert dropped.counts() == {"leaky:unknown_field": MAX_LOGGED + 50}
    assert len([r for r in caplog.records if "dialect leaky" in r.getMessage()]) == MAX_LOGGED
