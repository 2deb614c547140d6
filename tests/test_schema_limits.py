"""A JSON Schema from telemetry or a suite costs only its own span: no fetch, no backtracking, bounded time.

In process, in milliseconds: a catastrophic pattern is matched in linear time, a remote ``$ref`` is
never fetched (a local listener records whether it was contacted), a pattern RE2 cannot match and a
schema that runs out of time give NULL, counted by reason. Then end to end against a real
``agentfunnel serve``: a span offering such schemas never delays another client's spans.
"""

from __future__ import annotations

import http.server
import json
import os
import threading
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest
import yaml

from agentfunnel.collector.config import ConfigError, load_settings
from agentfunnel.scoring.artifacts import schema_errors
from agentfunnel.scoring.config import ScoringConfig, SchemaLimits
from agentfunnel.scoring.schema_check import Unchecked, take_refusals
from agentfunnel.scoring.validity import ToolCatalog
from conftest import sql
from otlp_build import trace_request

REDOS = {"type": "object", "properties": {"q": {"type": "string", "pattern": "^(a+)+$"}}}
NOT_MATCHING = "a" * 40 + "!"  # with Python's re: 2^40 steps


@dataclass
class Call:
    tool_name: str
    arguments: Any


class Listener:
    """A local HTTP server that records every request it gets (and answers with a schema, as a host would)."""

    def __init__(self) -> None:
        self.requests: list[str] = []
        seen = self.requests

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                seen.append(self.path)
                body = json.dumps({"type": "string"}).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/schema+json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: Any) -> None:
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_port}"
        threading.Thread(target=self.server.serve_forever, args=(0.05,), daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def listener() -> Iterator[Listener]:
    found = Listener()
    yield found
    found.close()


def _within(seconds: float, run: Any, cpu: list[float] | None = None) -> tuple[Any, dict[str, int]]:
    """``run()``'s result and the refusals it counted (on its own thread), failing the test when it takes
    longer (it keeps running in the background then); the CPU time it took is appended to ``cpu``."""
    cpu = [] if cpu is None else cpu
    out: list[Any] = []

    def work() -> None:
        started = time.thread_time()
        found = run()
        cpu.append(time.thread_time() - started)
        out.append((found, take_refusals()))

    worker = threading.Thread(target=work, daemon=True)
    worker.start()
    worker.join(seconds)
    assert out, f"took longer than {seconds} s"
    return out[0]


def _catalog(schema: dict[str, Any], limits: SchemaLimits = SchemaLimits()) -> ToolCatalog:
    return ToolCatalog({"lookup": schema}, limits)


def test_a_catastrophic_pattern_is_matched_in_linear_time_and_others_as_before():
    catalog = _catalog(REDOS)
    started = time.perf_counter()
    assert _within(5, lambda: catalog.args_valid(Call("lookup", {"q": NOT_MATCHING}))) == (False, {})  # a verdict
    assert _within(5, lambda: catalog.args_valid(Call("lookup", {"q": "a" * 40}))) == (True, {})
    assert time.perf_counter() - started < 5
    # as JSON Schema writes patterns (ECMA-262 escapes), as Python's re read them before
    kana = _catalog({"type": "object", "properties": {"q": {"type": "string", "pattern": r"^[\u3040-\u30ff]+$"}}})
    assert kana.args_valid(Call("lookup", {"q": "ひらがな"})) is True
    assert kana.args_valid(Call("lookup", {"q": "kana"})) is False
    escaped = _catalog({"type": "object", "properties": {"q": {"type": "string", "pattern": r"^\\u0041$"}}})
    assert escaped.args_valid(Call("lookup", {"q": "\\u0041"})) is True  # an escaped backslash, then "u0041"


def test_a_remote_ref_is_never_fetched_and_gives_no_verdict_while_local_ones_resolve(listener):
    take_refusals()
    schema = {"type": "object", "properties": {"r": {"$ref": listener.url + "/string.json"}}}
    assert _catalog(schema).args_valid(Call("lookup", {"r": 1})) is None
    relative = {"$id": listener.url + "/root.json", "type": "object", "properties": {"r": {"$ref": "string.json"}}}
    assert _catalog(relative).args_valid(Call("lookup", {"r": 1})) is None
    assert listener.requests == []
    assert take_refusals() == {"unresolvable_ref": 2}
    schema = {"$defs": {"id": {"type": "integer"}}, "type": "object", "properties": {"id": {"$ref": "#/$defs/id"}}}
    catalog = _catalog(schema)
    assert catalog.args_valid(Call("lookup", {"id": 3})) is True
    assert catalog.args_valid(Call("lookup", {"id": "3"})) is False


def test_a_pattern_re2_cannot_match_is_never_run_by_a_backtracking_engine():
    take_refusals()
    backreference = {"type": "object", "properties": {"q": {"type": "string", "pattern": r"^(a+)+\1$"}}}
    lookahead = {"type": "object", "patternProperties": {"^(?=x)": {"type": "integer"}}}
    found = _within(5, lambda: _catalog(backreference).args_valid(Call("lookup", {"q": NOT_MATCHING})))
    assert found == (None, {"pattern_unsupported": 1})
    assert _catalog(lookahead).args_valid(Call("lookup", {"x": 1})) is None
    assert take_refusals() == {"pattern_unsupported": 1}


def test_a_schema_exponential_to_check_stops_at_its_cpu_time_and_is_not_tried_again():
    defs = {f"d{i}": {"anyOf": [{"$ref": f"#/$defs/d{i + 1}"}, {"$ref": f"#/$defs/d{i + 1}"}]} for i in range(40)}
    schema = {"$defs": {**defs, "d40": {"type": "string"}}, "type": "object", "properties": {"n": {"$ref": "#/$defs/d0"}}}
    catalog = _catalog(schema, SchemaLimits(max_seconds=0.02))
    cpu: list[float] = []
    found = _within(5, lambda: [catalog.args_valid(Call("lookup", {"n": i})) for i in range(20)], cpu)
    assert found == ([None] * 20, {"deadline": 20})
    assert cpu[0] < 0.02 * 5  # one deadline, not twenty


def test_a_schema_refused_for_its_cost_keeps_nothing_of_the_check_that_ran_out_of_time():
    """The refusal is kept (the schema is not tried again) and raised for every later call: it must not hold the
    stack of the check that ran out of time, nor the instance that check was reading, through its traceback."""
    import gc
    import weakref

    from agentfunnel.scoring.schema_check import SchemaCheck

    class Arguments(dict):  # a dict that can be watched for being let go
        pass

    defs = {f"d{i}": {"anyOf": [{"$ref": f"#/$defs/d{i + 1}"}, {"$ref": f"#/$defs/d{i + 1}"}]} for i in range(40)}
    schema = {"$defs": {**defs, "d40": {"type": "string"}}, "type": "object", "properties": {"n": {"$ref": "#/$defs/d0"}}}
    check = SchemaCheck(schema, SchemaLimits(max_seconds=0.02))
    instance = Arguments(n=1)
    watched = weakref.ref(instance)
    for _ in range(2):  # the check that runs out of time, then one refused at once
        with pytest.raises(Unchecked, match="deadline"):
            check.valid(instance)
    del instance
    gc.collect()
    assert watched() is None, "the kept refusal holds the instance its check was reading"
    with pytest.raises(Unchecked, match="deadline"):
        check.valid({"n": 2})


def test_sizes_and_nesting_past_the_limits_give_no_verdict():
    take_refusals()
    limits = SchemaLimits(max_schema_bytes=200, max_instance_bytes=100, max_depth=8)
    big = {"type": "object", "properties": {f"p{i}": {"type": "string"} for i in range(20)}}
    deep: dict[str, Any] = {"type": "integer"}
    for _ in range(10):
        deep = {"type": "array", "items": deep}
    assert _catalog(big, limits).args_valid(Call("lookup", {})) is None
    assert _catalog(deep, SchemaLimits(max_depth=8)).args_valid(Call("lookup", [])) is None
    assert _catalog({"type": "object"}, limits).args_valid(Call("lookup", {"x": "y" * 200})) is None
    assert _catalog({"$ref": "#"}, SchemaLimits()).args_valid(Call("lookup", {})) is None  # recursion without end
    assert take_refusals() == {"schema_too_large": 1, "schema_too_deep": 1, "instance_too_large": 1, "too_deep": 1}


def test_a_suites_schema_is_checked_the_same_way(listener):
    with pytest.raises(Unchecked, match="unresolvable_ref"):
        schema_errors({"$ref": listener.url + "/artifact.json"}, {"a": 1})
    assert listener.requests == []
    assert schema_errors(REDOS, {"q": NOT_MATCHING}) == [("/q", f"{NOT_MATCHING!r} does not match '^(a+)+$'")]


def test_a_case_whose_tool_schema_cannot_be_checked_has_invocation_missing_not_failed(listener):
    from test_stage_rules import TRIAL, case, run, trial_run

    remote = case(TRIAL, tool_schemas={"start_trial": {"$ref": listener.url + "/start_trial.json"}})
    invocation = run(remote, trial_run()).stages["invocation"]
    assert invocation.state == "missing"
    assert [(u["tool"], u["reason"]) for u in invocation.evidence["unchecked"]] == [("start_trial", "unresolvable_ref")]
    assert listener.requests == []
    take_refusals()


def test_the_limits_are_settings_and_a_bad_one_names_its_field(tmp_path):
    cfg = tmp_path / "agentfunnel.yaml"
    cfg.write_text(yaml.safe_dump({"scoring": {"schema_limits": {"max_seconds": 0}}}))
    with pytest.raises(ConfigError, match=r"scoring\.schema_limits\.max_seconds"):
        load_settings(cfg)
    cfg.write_text(yaml.safe_dump({"scoring": {"schema_limits": {"max_seconds": 0.5}}}))
    assert load_settings(cfg).scoring.schema_limits.max_seconds == 0.5
    assert ScoringConfig(schema_limits=SchemaLimits(max_seconds=0.5)).config_hash() != ScoringConfig().config_hash()


# ----------------------------------------------------------------------------- end to end

def _hostile_run(conversation: str, ref_url: str) -> bytes:
    """A chat offering two tools, one whose pattern backtracks catastrophically, one whose schema names a
    remote ``$ref``; then a call to each with arguments that would trigger both."""
    tid, root = os.urandom(16), os.urandom(8)
    tools = [{"type": "function", "name": "lookup", "parameters": REDOS},
             {"type": "function", "name": "fetch_it",
              "parameters": {"type": "object", "properties": {"r": {"$ref": ref_url}}}}]
    base = {"gen_ai.conversation.id": conversation}
    spans = [
        {"trace_id": tid, "span_id": root, "name": "invoke_agent a", "start": 1, "end": 10**9,
         "attributes": {**base, "gen_ai.operation.name": "invoke_agent", "gen_ai.agent.name": "a"}},
        {"trace_id": tid, "span_id": os.urandom(8), "parent_span_id": root, "name": "chat m", "start": 10, "end": 20,
         "attributes": {**base, "gen_ai.operation.name": "chat", "gen_ai.request.model": "m",
                        "gen_ai.tool.definitions": json.dumps(tools)}},
        *({"trace_id": tid, "span_id": os.urandom(8), "parent_span_id": root, "name": f"execute_tool {name}",
           "start": 30 + i, "end": 40 + i,
           "attributes": {**base, "gen_ai.operation.name": "execute_tool", "gen_ai.tool.name": name,
                          "gen_ai.tool.call.arguments": json.dumps(args)}}
          for i, (name, args) in enumerate([("lookup", {"q": NOT_MATCHING}), ("fetch_it", {"r": 1})])),
    ]
    return trace_request(spans, resource={"service.name": "hostile"}).SerializeToString()


def _plain_run(conversation: str) -> bytes:
    tid = os.urandom(16)
    spans = [{"trace_id": tid, "span_id": os.urandom(8), "name": "invoke_agent b", "start": 1, "end": 10**9,
              "attributes": {"gen_ai.operation.name": "invoke_agent", "gen_ai.agent.name": "b",
                             "gen_ai.conversation.id": conversation}}]
    return trace_request(spans, resource={"service.name": "other-client"}).SerializeToString()


def _post(srv, body: bytes, timeout: float) -> int:
    req = urllib.request.Request(srv.http_url + "/v1/traces", data=body, headers={"Content-Type": "application/x-protobuf"})
    with urllib.request.urlopen(req, timeout=timeout) as resp:
        return resp.status


def _metrics(srv) -> dict[str, Any]:
    return json.loads(urllib.request.urlopen(srv.http_url + "/metrics?format=json", timeout=10).read())


def _sessions(srv, until: float) -> set[str]:
    while True:
        ids = {r["session_id"] for r in sql(srv.db, "SELECT session_id FROM sessions")}
        if "other" in ids or time.monotonic() > until:
            return ids
        time.sleep(0.3)


def test_a_hostile_schema_in_one_span_delays_no_other_clients_ingest(server_factory, tmp_path, listener):
    cfg = tmp_path / "agentfunnel.yaml"
    cfg.write_text(yaml.safe_dump({"sessions": {"idle_timeout_seconds": 1, "check_interval_seconds": 0.2,
                                                "open_refresh_seconds": 0}}))
    srv = server_factory(["--config", str(cfg)])
    assert _post(srv, _hostile_run("hostile", listener.url + "/schema.json"), timeout=10) == 200
    deadline = time.monotonic() + 5  # the hostile trace goes idle and is scored meanwhile
    while time.monotonic() < deadline and not _metrics(srv).get("traces_assembled"):
        time.sleep(0.2)

    started = time.monotonic()
    assert _post(srv, _plain_run("other"), timeout=10) == 200  # acknowledged: its commit waited for nothing
    assert "other" in _sessions(srv, started + 15)  # and assembled
    calls = sql(srv.db, "SELECT tool_name, args_valid FROM tool_calls ORDER BY tool_name")
    assert calls == [{"tool_name": "fetch_it", "args_valid": None}, {"tool_name": "lookup", "args_valid": False}]
    assert listener.requests == []

    with urllib.request.urlopen(srv.admin + "/metrics", timeout=10) as resp:
        metrics = json.loads(resp.read())
    assert set(metrics["schema_validations_refused"]) == {"unresolvable_ref"}  # once per time the session is scored
    text = urllib.request.urlopen(srv.http_url + "/metrics", timeout=10).read().decode()
    assert 'agentfunnel_schema_validations_refused_total{reason="unresolvable_ref"}' in text
    srv.stop()
    assert "not checked against its JSON Schema (unresolvable_ref" in srv.logs()
