"""Case files (SPEC §6): validation errors that name case and field, YAML and TOML, URLs with a
local fallback, the assertion vocabulary, and drafting a case from a failing session."""

from __future__ import annotations

import functools
import http.server
import itertools
import json
import socket
import textwrap
import threading

import pytest
import yaml

from agentfunnel.scoring import SessionScorer
from agentfunnel.scoring.assertions import AssertionSpec, evaluate_assertions, parse_path, select
from agentfunnel.scoring.cases import (TODO_TASK, CaseFileError, case_from_session, case_sha256, load_suite,
                                       parse_suite, render_case_yaml)
from agentfunnel.semconv import SpanRecord

FX = {
    "id": "fx-rate", "task": "Find the EUR-to-USD rate on 2026-01-15.",
    "intent_summary": "A historical rate for one day, stated with direction and date.",
    "target": {"name": "FXRates", "provider": "fxrates.example", "aliases": ["FX Rates"]},
    "competitors": [{"name": "XE", "aliases": ["xe.com"]}],
    "allowed_tools": ["get_rate"],
    "tool_schemas": {"get_rate": {"type": "object", "required": ["base", "quote", "date"],
                                  "properties": {"base": {"type": "string"}, "quote": {"type": "string"},
                                                 "date": {"type": "string"}}}},
    "argument_expectations": {"get_rate": [{"pointer": "/date", "equals": "2026-01-15"}]},
    "required_result_fields": [{"tool": "get_rate", "path": "$.rate", "type": "number"}],
    "completion_criteria": ["states the rate", "states the direction", "states the date"],
}


def suite_with(*cases, **top):
    return {**top, "cases": [dict(c) for c in cases]}


def other(i, **changes):
    return {**FX, "id": f"case-{i}", **changes}


def edited(path: str, value):
    """FX with one nested value replaced (dotted path, ints index lists)."""
    data = json.loads(json.dumps(FX))
    cur = data
    keys = [int(k) if k.isdigit() else k for k in path.split(".")]
    for k in keys[:-1]:
        cur = cur[k]
    if value is KeyError:
        del cur[keys[-1]]
    else:
        cur[keys[-1]] = value
    return data


ERRORS = [
    ("pointer without slash", edited("argument_expectations.get_rate.0.pointer", "date"),
     'cases[2] (id "fx-rate").argument_expectations.get_rate[0].pointer: must start with "/"'),
    ("two checks in one expectation", edited("argument_expectations.get_rate.0", {"pointer": "/d", "equals": 1, "pattern": "x"}),
     'cases[2] (id "fx-rate").argument_expectations.get_rate[0]: give exactly one of equals, one_of, pattern, present'),
    ("missing task", edited("task", KeyError), 'cases[2] (id "fx-rate").task: required'),
    ("misspelt field", {**FX, "complettion_criteria": []}, 'cases[2] (id "fx-rate").complettion_criteria: unknown field'),
    ("threshold above 1", {**FX, "judge_threshold": 1.5}, 'cases[2] (id "fx-rate").judge_threshold: '),
    ("expectation for a tool outside the plan", edited("argument_expectations", {"get_ratez": [{"pointer": "/a", "present": True}]}),
     'cases[2] (id "fx-rate").argument_expectations.get_ratez: not in the allowed tool plan'),
    ("bad JSON path", edited("required_result_fields.0.path", "rate"),
     'cases[2] (id "fx-rate").required_result_fields[0].path: must start with "$" (JSON path) or "/" (JSON pointer)'),
    ("bad path segment", edited("required_result_fields.0.path", "$.rate[x]"),
     'cases[2] (id "fx-rate").required_result_fields[0].path: cannot read the path at position 6'),
    ("bad schema", edited("tool_schemas.get_rate", {"type": "objekt"}),
     'cases[2] (id "fx-rate").tool_schemas.get_rate: not a valid JSON Schema'),
    ("unknown assertion kind", {**FX, "artifact": {"assertions": [{"kind": "min_steps", "path": "$.steps"}]}},
     'cases[2] (id "fx-rate").artifact.assertions[0].kind: unknown assertion kind \'min_steps\''),
    ("count without a number", {**FX, "artifact": {"assertions": [{"kind": "count_min", "path": "$.steps"}]}},
     'cases[2] (id "fx-rate").artifact.assertions[0].value: required for count_min'),
    ("artifact source", {**FX, "artifact": {"source": "the answer"}},
     'cases[2] (id "fx-rate").artifact.source: must be "final_answer"'),
    ("validator with both", {**FX, "artifact": {"validator": {"entry_point": "m:f", "command": ["x"]}}},
     'cases[2] (id "fx-rate").artifact.validator: give exactly one of entry_point, command'),
    ("unknown stage", {**FX, "scored_stages": ["discovery", "invokation"]},
     'cases[2] (id "fx-rate").scored_stages[1]: Input should be \'discovery\''),
    ("stage twice", {**FX, "scored_stages": ["execution", "execution"]},
     'cases[2] (id "fx-rate").scored_stages: lists \'execution\' twice'),
    ("reporting tool without its argument", {**FX, "discovery": {"tool": "report_candidates"}},
     'cases[2] (id "fx-rate").discovery: give both discovery.tool and discovery.argument, or neither'),
    ("selection as free text", {**FX, "selection": "the first one"},
     'cases[2] (id "fx-rate").selection: must be "none" or {tool, argument} or {}'),
    ("helper in the plan", {**FX, "helper_tools": ["get_rate"]},
     'cases[2] (id "fx-rate").helper_tools[0]: \'get_rate\' is in allowed_tools'),
    ("negative control without a choice", {**FX, "fit": False, "selection": "none"},
     'cases[2] (id "fx-rate").selection: a negative control (fit: false) is decided at Selection'),
    ("pattern with a backreference", edited("argument_expectations.get_rate.0", {"pointer": "/d", "pattern": "(a)\\1"}),
     'cases[2] (id "fx-rate").argument_expectations.get_rate[0].pattern: \'(a)\\\\1\' cannot be matched in linear time'),
    ("assertion pattern with a lookahead", {**FX, "artifact": {"assertions": [
        {"kind": "name_like", "path": "$.a", "pattern": "x(?=y)", "regex": True}]}},
     'cases[2] (id "fx-rate").artifact.assertions[0].pattern: \'x(?=y)\' cannot be matched in linear time'),
    ("reporting tool in the plan", {**FX, "discovery": {"tool": "get_rate", "argument": "candidates"}},
     'cases[2] (id "fx-rate").discovery.tool: \'get_rate\' is in allowed_tools'),
]


def _write(tmp_path, data, fmt):
    path = tmp_path / f"suite.{fmt}"
    if fmt == "yaml":
        path.write_text(yaml.safe_dump(data, sort_keys=False))
    else:
        path.write_text(_toml(data))
    return path


def _toml_value(v) -> str:
    if isinstance(v, dict):
        return "{" + ", ".join(f"{json.dumps(k)} = {_toml_value(x)}" for k, x in v.items()) + "}"
    if isinstance(v, list):
        return "[" + ", ".join(_toml_value(x) for x in v) + "]"
    if isinstance(v, bool):
        return "true" if v else "false"
    return json.dumps(v)


def _toml(data) -> str:
    """A tiny TOML writer for the tests (inline tables only), so no new dependency is needed."""
    lines = [f"{k} = {_toml_value(v)}" for k, v in data.items() if k != "cases"]
    for case in data["cases"]:
        lines.append("[[cases]]")
        lines += [f"{json.dumps(k)} = {_toml_value(v)}" for k, v in case.items()]
    return "\n".join(lines) + "\n"


@pytest.mark.parametrize("name,bad,expected", ERRORS, ids=[e[0] for e in ERRORS])
@pytest.mark.parametrize("fmt", ["yaml", "toml"])
def test_validation_errors_name_case_and_field(tmp_path, fmt, name, bad, expected):
    path = _write(tmp_path, suite_with(other(0), other(1), bad), fmt)
    with pytest.raises(CaseFileError) as err:
        load_suite(path)
    assert any(line.startswith(expected) for line in err.value.problems), err.value.problems
    assert str(path) in str(err.value)


@pytest.mark.parametrize("data,expected", [
    (suite_with(other(0), {k: v for k, v in FX.items() if k != "id"}), "cases[1].id: required"),
    (suite_with(other(0), other(0)), 'cases[1] (id "case-0"): duplicate id, first used by cases[0]'),
    ({"cases": []}, "cases: List should have at least 1 item"),
    ({"universal_assertions": [{"kind": "exists", "path": "steps"}], "cases": [FX]},
     'universal_assertions[0].path: must start with "$"'),
    ({"case": [FX]}, "case: unknown field"),
])
def test_suite_level_errors(data, expected):
    with pytest.raises(CaseFileError) as err:
        parse_suite(data, "suite.yaml")
    assert any(line.startswith(expected) for line in err.value.problems), err.value.problems


@pytest.mark.parametrize("text,fragment", [
    ("cases: [\n", "not valid YAML"),
    ("- just\n- strings\n", "cases[0]: Input should be a valid dictionary"),
    ("42\n", "a suite is a mapping"),
])
def test_unreadable_files(tmp_path, text, fragment):
    path = tmp_path / "suite.yaml"
    path.write_text(text)
    with pytest.raises(CaseFileError) as err:
        load_suite(path)
    assert fragment in str(err.value)


def test_toml_syntax_error_names_the_file(tmp_path):
    path = tmp_path / "suite.toml"
    path.write_text("[[cases]]\nid = \n")
    with pytest.raises(CaseFileError, match="not valid TOML"):
        load_suite(path)


@pytest.mark.parametrize("fmt", ["yaml", "toml"])
def test_dates_stay_text_in_both_formats(tmp_path, fmt):
    """An unquoted date compares equal to the string argument a tool receives."""
    if fmt == "yaml":
        text = yaml.safe_dump(suite_with(FX), sort_keys=False).replace("equals: '2026-01-15'", "equals: 2026-01-15")
        assert "equals: 2026-01-15" in text
    else:
        text = _toml(suite_with(FX)).replace('"equals" = "2026-01-15"', '"equals" = 2026-01-15')
        text = text.replace('"equals": "2026-01-15"', '"equals" = 2026-01-15')
        assert "= 2026-01-15" in text
    path = tmp_path / f"suite.{fmt}"
    path.write_text(text)
    loaded = load_suite(path)
    assert loaded.origin == "path"
    assert loaded.cases[0].argument_expectations["get_rate"][0].equals == "2026-01-15"


def test_universal_assertions_and_catalog_reach_every_artifact_case():
    with_artifact = {**other(1), "artifact": {"source": "final_answer", "assertions": [
        {"kind": "count_min", "path": "$.steps[*]", "value": 1}]}}
    suite = parse_suite(suite_with(other(0), with_artifact, catalog=["list_currencies"], universal_assertions=[
        {"name": "renderable-steps", "kind": "type_in", "path": "$.steps[*]", "values": ["landing", "form"]}]))
    plain, art = suite.cases
    assert plain.artifact is None and plain.catalog == ["list_currencies"]
    assert [a.name for a in art.artifact.universal_assertions] == ["renderable-steps"]
    assert len(art.artifact.assertions) == 1


def test_case_sha256_is_canonical():
    a = parse_suite(suite_with(FX)).cases[0]
    b = parse_suite(suite_with(dict(reversed(list(FX.items()))))).cases[0]
    c = parse_suite(suite_with({**FX, "judge_threshold": 0.8})).cases[0]
    assert case_sha256(a) == case_sha256(b) != case_sha256(c)
    assert len(case_sha256(a)) == 64


# --------------------------------------------------------------------------- URL with a local fallback

@pytest.fixture
def served(tmp_path):
    (tmp_path / "suite.yaml").write_text(yaml.safe_dump(suite_with(FX)))
    (tmp_path / "broken.yaml").write_text(yaml.safe_dump(suite_with({**FX, "judge_threshold": 7})))
    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(tmp_path))
    handler.log_message = lambda *a, **k: None
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


def _dead_url() -> str:
    with socket.socket() as s:  # a port nobody listens on: bound, then released
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    return f"http://127.0.0.1:{port}/suite.yaml"


def test_url_is_loaded_when_reachable(served, tmp_path):
    local = tmp_path / "local.yaml"
    local.write_text(yaml.safe_dump(suite_with({**FX, "id": "local-copy"})))
    loaded = load_suite(f"{served}/suite.yaml", fallback=local)
    assert loaded.origin == "url" and loaded.location.endswith("/suite.yaml")
    assert loaded.cases[0].id == "fx-rate"
    assert "cases from http://127.0.0.1" in loaded.describe()


def test_dead_url_falls_back_to_the_local_copy_and_says_so(tmp_path):
    local = tmp_path / "local.yaml"
    local.write_text(yaml.safe_dump(suite_with({**FX, "id": "local-copy"})))
    url = _dead_url()
    loaded = load_suite(url, fallback=local, timeout=2)
    assert loaded.origin == "fallback" and loaded.cases[0].id == "local-copy"
    assert url in loaded.note and "could not be fetched" in loaded.note
    assert "local copy" in loaded.describe()


def test_missing_file_on_the_server_falls_back_too(served, tmp_path):
    local = tmp_path / "local.yaml"
    local.write_text(yaml.safe_dump(suite_with(FX)))
    loaded = load_suite(f"{served}/nope.yaml", fallback=local)
    assert loaded.origin == "fallback" and "404" in loaded.note


def test_dead_url_without_fallback_is_an_error():
    with pytest.raises(CaseFileError, match="could not be fetched|Connection refused|refused"):
        load_suite(_dead_url(), timeout=2)


def test_a_fetched_but_invalid_suite_is_an_error_not_a_fallback(served, tmp_path):
    local = tmp_path / "local.yaml"
    local.write_text(yaml.safe_dump(suite_with(FX)))
    with pytest.raises(CaseFileError) as err:
        load_suite(f"{served}/broken.yaml", fallback=local)
    assert 'cases[0] (id "fx-rate").judge_threshold' in str(err.value)


# --------------------------------------------------------------------------- assertion vocabulary

DOC = {"steps": [{"type": "landing", "fields": []},
                 {"type": "form", "fields": [{"name": "work_email", "type": "email"},
                                             {"name": "company_name", "type": "text"}]},
                 {"type": "thank_you"}],
       "routing": {"type": "linear"}, "weird key": 1}


@pytest.mark.parametrize("path,expected", [
    ("$", [DOC]),
    ("$.routing.type", ["linear"]),
    ("$.steps[*].type", ["landing", "form", "thank_you"]),
    ("$.steps[1].fields[*].name", ["work_email", "company_name"]),
    ("$.steps[-1].type", ["thank_you"]),
    ("$.steps.*.type", ["landing", "form", "thank_you"]),
    ("$['weird key']", [1]),
    ("$.nope", []),
    ("$.steps[9]", []),
    ("/steps/1/type", ["form"]),
    ("/steps/7", []),
])
def test_json_path_subset(path, expected):
    assert [v for _, v in select(DOC, path)] == expected


@pytest.mark.parametrize("bad", ["steps", "$.a[", "$.a[?(@.x)]", "$..a"])
def test_unsupported_paths_say_where(bad):
    with pytest.raises(ValueError):
        parse_path(bad)


@pytest.mark.parametrize("spec,passed,found", [
    ({"kind": "count_min", "path": "$.steps[*]", "value": 3}, True, 3),
    ({"kind": "count_min", "path": "$.steps[*]", "value": 4}, False, 3),
    ({"kind": "count_max", "path": "$.steps[*]", "value": 3}, True, 3),
    ({"kind": "count_max", "path": "$.steps[*]", "value": 2}, False, 3),
    ({"kind": "exists", "path": "$.steps[*].type", "value": "landing"}, True, None),
    ({"kind": "exists", "path": "$.steps[*].fields[*]", "field": "type", "value": "select"}, False, ["email", "text"]),
    ({"kind": "exists", "path": "$.routing"}, True, 1),
    ({"kind": "type_in", "path": "$.steps[*]", "values": ["landing", "form", "thank_you"]}, True, {}),
    ({"kind": "type_in", "path": "$.steps[*].type", "values": ["landing", "form"]}, False, {"$.steps[2].type": "thank_you"}),
    ({"kind": "name_like", "path": "$.steps[*].fields[*]", "pattern": "*company*"}, True, None),
    ({"kind": "name_like", "path": "$.steps[*].fields[*]", "pattern": "^full.?name$", "regex": True}, False, None),
    ({"kind": "name_like", "path": "$.steps[*].fields[*]", "pattern": "*_*", "every": True}, True, None),
    ({"kind": "equals", "path": "$.routing.type", "value": "linear"}, True, ["linear"]),
    ({"kind": "equals", "path": "$.routing.kind", "value": "linear"}, False, []),
])
def test_assertion_kinds(spec, passed, found):
    [result] = evaluate_assertions([AssertionSpec(**spec)], DOC, {})
    assert result.passed is passed
    if found is not None:
        assert result.found == found
    assert result.name and result.path == spec["path"]


def test_run_assertions_read_the_run_document():
    spec = AssertionSpec(name="tools-in-catalog", kind="type_in", on="run", path="$.calls[*].name",
                         values_from="$.catalog")
    run = {"calls": [{"name": "get_rate"}, {"name": "get_stock_price"}], "catalog": ["get_rate", "list_*"]}
    [r] = evaluate_assertions([spec], {}, run, universal=True)
    assert not r.passed and r.universal and r.found == {"$.calls[1].name": "get_stock_price"}
    assert "tools-in-catalog" in r.describe() and "get_stock_price" in r.describe()


# --------------------------------------------------------------------------- a failing session → a case

_ids = itertools.count(1)


def _rec(kind, **kw):
    n = next(_ids)
    base = dict(trace_id="t" * 32, span_id=f"{n:016x}", parent_span_id=None, name=kind, dialect="otel_genai",
                kind=kind, start_ns=n * 1000, end_ns=n * 1000 + 500)
    return SpanRecord(**{**base, **kw})


def _session(with_input: bool):
    args = {"messages": [{"role": "system", "content": "be brief"},
                         {"role": "user", "content": "EUR to USD on 2026-01-15?"}]} if with_input else None
    return [
        _rec("agent", agent_name="fx-agent", arguments=args, final_answer="1 EUR equals 1.10 USD."),
        _rec("tool", tool_name="mcp__fxrates__get_rate", arguments={"base": "EUR", "quote": "USD", "date": "2026-01-15"},
             result={"content": [{"type": "text", "text": json.dumps({"base": "EUR", "rate": 1.1, "note": None})}]}),
        _rec("tool", tool_name="mcp__fxrates__list_currencies", error="503 upstream"),
        _rec("llm", model="m", final_answer="1 EUR equals 1.10 USD.",
             tool_definitions={"get_rate": {"type": "object", "properties": {"base": {"type": "string"}}}}),
    ]


@pytest.mark.parametrize("with_input", [True, False])
def test_case_from_session_round_trips_through_yaml(tmp_path, with_input):
    records = _session(with_input)
    score = SessionScorer().score("s-42", records)
    case = case_from_session(records, score, "from-s-42")
    assert case.task == ("EUR to USD on 2026-01-15?" if with_input else TODO_TASK)
    assert case.allowed_tools == ["mcp__fxrates__get_rate", "mcp__fxrates__list_currencies"]
    assert case.target.name == "fxrates" and case.expected_server == "fxrates"
    assert not case.discovery.applies and not case.selection.applies  # a data lookup, never the agent's service name
    assert case.tool_schemas == {"mcp__fxrates__get_rate": {"type": "object", "properties": {"base": {"type": "string"}}}}
    fields = {(f.tool, f.path, f.non_null) for f in case.required_result_fields}
    assert fields == {("mcp__fxrates__get_rate", "$.base", True), ("mcp__fxrates__get_rate", "$.rate", True),
                      ("mcp__fxrates__get_rate", "$.note", False)}
    assert case.completion_criteria == []
    text = render_case_yaml(case, session_id="s-42")
    assert "# TODO: completion criteria" in text and "completion_criteria: []" in text and "s-42" in text
    assert "  discovery: none\n  selection: none\n" in text
    path = tmp_path / "drafted.yaml"
    path.write_text(text)
    assert load_suite(path).cases[0] == case


def test_rendered_criteria_are_kept():
    suite = parse_suite(suite_with({**FX, "argument_expectations": {"get_rate": [{"pointer": "/x", "equals": None}]}}))
    text = render_case_yaml(suite.cases[0])
    assert "TODO: completion criteria" not in text
    assert parse_suite(yaml.safe_load(text)).cases[0] == suite.cases[0]


def test_format_is_sniffed_without_an_extension(tmp_path):
    path = tmp_path / "suite"
    path.write_text(textwrap.dedent(_toml(suite_with(FX))))
    assert load_suite(path).cases[0].id == "fx-rate"
