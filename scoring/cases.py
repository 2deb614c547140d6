"""Evaluation cases (SPEC §6): the contract a run is scored against, loaded from YAML or TOML.

A suite is edited by people, so every problem is reported with the case it belongs to and the
field that is wrong, e.g. ``cases[2] (id "fx-rate").argument_expectations.get_rate[0].pointer:
must start with "/"``. A suite can live behind a URL (a dataset kept on a shared platform); an
unreachable URL falls back to the local copy, and the result says which one was used.
"""

from __future__ import annotations

import datetime as _dt
import hashlib
import json
import re
import tomllib
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import ValidationError

from ..semconv import SpanRecord
from .case_models import (ArgumentExpectation, ArtifactSource, ArtifactSpec, Case, DiscoverySpec, Party,
                          RequiredField, Suite, ToolArgumentSource, ValidatorSpec, case_sha256, split_server,
                          tool_matches, _schema_ok)
from .results import SessionScore
from .run_view import build_view, parse_json_text

__all__ = ["ArgumentExpectation", "ArtifactSource", "ArtifactSpec", "Case", "CaseFileError", "DiscoverySpec",
           "LoadedSuite", "Party", "RequiredField", "Suite", "ToolArgumentSource", "ValidatorSpec", "case_from_session",
           "case_sha256", "format_validation_error", "load_suite", "parse_suite", "render_case_yaml", "split_server",
           "tool_matches"]

MAX_SUITE_BYTES = 16 * 1024 * 1024


class CaseFileError(ValueError):
    """A suite that cannot be used; ``problems`` holds one line per field."""

    def __init__(self, origin: str, problems: list[str]) -> None:
        self.origin = origin
        self.problems = problems
        super().__init__(f"{origin}: " + ("\n  ".join(problems) if len(problems) > 1 else problems[0])
                         if problems else origin)


# --------------------------------------------------------------------------- reading files

class _YamlLoader(yaml.SafeLoader):
    """Dates stay strings: ``equals: 2026-01-15`` must compare equal to the argument ``"2026-01-15"``."""


_YamlLoader.yaml_implicit_resolvers = {
    k: [(tag, rx) for tag, rx in v if tag != "tag:yaml.org,2002:timestamp"]
    for k, v in yaml.SafeLoader.yaml_implicit_resolvers.items()}


def _plain(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_plain(v) for v in value]
    if isinstance(value, (_dt.date, _dt.time)):  # TOML dates and times, as the text they were
        return value.isoformat()
    return value


def _parse_text(text: str, fmt: str | None, origin: str) -> Any:
    if fmt == "json":
        try:
            return json.loads(text)
        except ValueError as e:
            raise CaseFileError(origin, [f"not valid JSON: {e}"]) from None
    if fmt == "toml":
        try:
            return _plain(tomllib.loads(text))
        except tomllib.TOMLDecodeError as e:
            raise CaseFileError(origin, [f"not valid TOML: {e}"]) from None
    try:
        return yaml.load(text, Loader=_YamlLoader)
    except yaml.YAMLError as e:
        if fmt is None:  # unknown extension: TOML is the other format a suite may be in
            try:
                return _plain(tomllib.loads(text))
            except tomllib.TOMLDecodeError:
                pass
        raise CaseFileError(origin, [f"not valid YAML: {e}"]) from None


def _format_of(name: str, content_type: str = "") -> str | None:
    suffix = Path(urllib.parse.urlparse(name).path if "://" in name else name).suffix.lower()
    if suffix in (".toml",) or "toml" in content_type:
        return "toml"
    if suffix in (".yaml", ".yml") or "yaml" in content_type:
        return "yaml"
    if suffix == ".json" or "json" in content_type:
        return "json"
    return None


def _loc_text(loc: tuple[Any, ...], data: Any) -> str:
    out = ""
    for i, part in enumerate(loc):
        if isinstance(part, int):
            out += f"[{part}]"
            if i == 1 and loc[0] == "cases" and isinstance(data, dict):
                raw = data.get("cases")
                item = raw[part] if isinstance(raw, list) and part < len(raw) else None
                if isinstance(item, dict) and isinstance(item.get("id"), str):
                    out += f' (id "{item["id"]}")'
        elif re.fullmatch(r"[A-Za-z_][\w-]*", str(part)):
            out += f".{part}" if out else str(part)
        else:
            out += f"[{json.dumps(str(part))}]"
    return out


_MSG_FIELD = re.compile(r"^((?:[A-Za-z_][\w]*)(?:\.[\w-]+|\[\d+\])*): (.*)$", re.S)


def format_validation_error(err: ValidationError, data: Any) -> list[str]:
    """One line per problem: ``cases[2] (id "x").field.sub: message``."""
    lines = []
    for e in err.errors():
        loc = tuple(e["loc"])
        msg = e["msg"]
        for prefix in ("Value error, ", "Assertion failed, "):
            if msg.startswith(prefix):
                msg = msg[len(prefix):]
        if e["type"] == "missing":
            msg = "required"
        elif e["type"] == "extra_forbidden":
            msg = "unknown field"
        m = _MSG_FIELD.match(msg) if e["type"] == "value_error" else None
        if m:  # a model-level check that names its own field: join it onto the location
            where = _loc_text(loc, data)
            sub = m.group(1)
            lines.append(f"{where}.{sub}: {m.group(2)}" if where else f"{sub}: {m.group(2)}")
            continue
        where = _loc_text(loc, data)
        lines.append(f"{where}: {msg}" if where else msg)
    return lines


def parse_suite(data: Any, origin: str = "<suite>") -> Suite:
    """Validate already-parsed data (a mapping with ``cases``, or a bare list of cases)."""
    if isinstance(data, list):
        data = {"cases": data}
    if not isinstance(data, dict):
        raise CaseFileError(origin, ["a suite is a mapping with a 'cases' list"])
    try:
        return Suite.model_validate(data)
    except ValidationError as e:
        raise CaseFileError(origin, format_validation_error(e, data)) from None


@dataclass(frozen=True)
class LoadedSuite:
    """A suite and where it came from: ``origin`` is path, url or fallback."""

    suite: Suite
    origin: Literal["path", "url", "fallback"]
    location: str
    sha256: str
    note: str | None = None  # why the URL was not used

    @property
    def cases(self) -> list[Case]:
        return self.suite.cases

    def describe(self) -> str:
        if self.origin == "fallback":
            return f"cases from the local copy {self.location} ({self.note})"
        return f"cases from {self.location}"


def _read_path(path: Path) -> tuple[str, str | None]:
    try:
        raw = path.read_bytes()
    except OSError as e:
        raise CaseFileError(str(path), [f"cannot read: {e.strerror or e}"]) from None
    if len(raw) > MAX_SUITE_BYTES:
        raise CaseFileError(str(path), [f"larger than {MAX_SUITE_BYTES} bytes"])
    return raw.decode("utf-8-sig"), _format_of(path.name)


def _fetch(url: str, timeout: float) -> tuple[str, str | None]:
    request = urllib.request.Request(url, headers={"Accept": "application/yaml, application/toml, text/plain, */*"})
    with urllib.request.urlopen(request, timeout=timeout) as response:  # noqa: S310 (http(s) only, checked)
        raw = response.read(MAX_SUITE_BYTES + 1)
        if len(raw) > MAX_SUITE_BYTES:
            raise ValueError(f"larger than {MAX_SUITE_BYTES} bytes")
        charset = response.headers.get_content_charset() or "utf-8"
        return raw.decode(charset), _format_of(url, response.headers.get("Content-Type", ""))


def _sha(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def _suite_from_text(text: str, fmt: str | None, origin: str) -> Suite:
    return parse_suite(_parse_text(text, fmt, origin), origin)


def load_suite(source: str | Path, fallback: Path | None = None, timeout: float = 5.0) -> LoadedSuite:
    """A suite from a path or an http(s) URL; an unreachable URL falls back to ``fallback``.

    Only fetching falls back: a suite that was fetched but is invalid is an error, so a broken
    shared dataset is never silently replaced by an older local copy.
    """
    text_source = str(source)
    if isinstance(source, str) and re.match(r"^https?://", source, re.I):
        try:
            text, fmt = _fetch(source, timeout)
        except (urllib.error.URLError, OSError, ValueError, TimeoutError) as e:
            why = (f"HTTP {e.code} {e.reason}" if isinstance(e, urllib.error.HTTPError)
                   else getattr(e, "reason", None) or e)
            reason = f"{source} could not be fetched: {why}"
            if fallback is None:
                raise CaseFileError(source, [reason.split(": ", 1)[1]]) from None
            text, fmt = _read_path(Path(fallback))
            return LoadedSuite(_suite_from_text(text, fmt, str(fallback)), "fallback", str(fallback), _sha(text), reason)
        return LoadedSuite(_suite_from_text(text, fmt, source), "url", source, _sha(text))
    if "://" in text_source:
        raise CaseFileError(text_source, ["only http(s) URLs and local paths can be loaded"])
    path = Path(source)
    text, fmt = _read_path(path)
    return LoadedSuite(_suite_from_text(text, fmt, str(path)), "path", str(path), _sha(text))


# --------------------------------------------------------------------------- a failing session → a case

TODO_TASK = "TODO: the user's request (the first user message was not captured in the spans)"
TODO_INTENT = "TODO: what the user actually wanted, in one or two sentences"


def _message_text(message: Any) -> str | None:
    if isinstance(message, str):
        return message
    if not isinstance(message, dict):
        return None
    content = message.get("content")
    if isinstance(content, str):
        return content
    parts = message.get("parts") if isinstance(message.get("parts"), list) else content
    if isinstance(parts, list):
        texts = [p.get("content") or p.get("text") for p in parts if isinstance(p, dict)]
        joined = "".join(t for t in texts if isinstance(t, str))
        return joined or None
    return None


def _first_user_message(records: Sequence[SpanRecord]) -> str | None:
    """Best effort: some dialects keep the agent's input on its span; most keep no user text."""
    for r in records:
        if r.kind not in ("agent", "llm") or r.arguments is None:
            continue
        value = parse_json_text(r.arguments)
        if isinstance(value, str) and value.strip():
            return value.strip()
        if isinstance(value, dict):
            for key in ("input", "prompt", "query", "question", "task", "user_input"):
                if isinstance(value.get(key), str) and value[key].strip():
                    return value[key].strip()
            value = value.get("messages")
        if isinstance(value, list):
            for m in value:
                if isinstance(m, dict) and m.get("role") in ("user", "human"):
                    text = _message_text(m)
                    if text and text.strip():
                        return text.strip()
    return None


def case_from_session(records: Sequence[SpanRecord], score: SessionScore, case_id: str) -> Case:
    """A draft case from a (failing) production session: every production failure becomes a row.

    The plan is every tool the session called (wrong ones included) and the required fields are
    the top-level keys its results returned: both are a starting point the user reviews.
    """
    view = build_view(records, score.final_answer)
    servers = [c.servers[0] for c in view.calls if c.servers]
    allowed = list(dict.fromkeys(c.name for c in view.calls))
    offered: dict[str, Any] = {}
    for r in view.records:
        offered.update({k: v for k, v in r.tool_definitions.items() if isinstance(v, dict)})
    schemas = {}
    for name in allowed:
        schema = offered.get(name) or offered.get(split_server(name)[1])
        try:
            if schema is not None:
                _schema_ok(schema)
                schemas[name] = schema
        except ValueError:
            continue
    required: list[RequiredField] = []
    for name, call in view.last_calls([c for c in view.calls if c.ok]).items():
        if isinstance(call.result, dict):
            for key, value in call.result.items():
                path = f"$.{key}" if re.fullmatch(r"[A-Za-z_][\w-]*", key) else f"$[{json.dumps(key)}]"
                required.append(RequiredField(tool=name, path=path, non_null=value is not None))
    target = servers[0] if servers else (score.service_name or score.agent_name or "TODO-target")
    return Case(id=case_id, task=_first_user_message(view.records) or TODO_TASK, intent_summary=TODO_INTENT,
                target=Party(name=target), allowed_tools=allowed, expected_server=servers[0] if servers else None,
                tool_schemas=schemas, required_result_fields=required)


def render_case_yaml(case: Case, session_id: str | None = None) -> str:
    """A one-case suite file, with the review items as comments (YAML keeps them for the editor)."""
    # exclude_unset, not exclude_defaults: ``equals: null`` is a check the user wrote
    data = {k: v for k, v in case.model_dump(mode="json", by_alias=True, exclude_unset=True).items()
            if v not in (None, [], {})}
    data.pop("completion_criteria", None)
    body = yaml.safe_dump(data, sort_keys=False, allow_unicode=True, width=100)
    item = "\n".join(("- " if i == 0 else "  ") + line if line else line
                     for i, line in enumerate(body.rstrip("\n").splitlines()))
    criteria = case.completion_criteria
    crit = ("  completion_criteria:\n" + "".join(f"  - {json.dumps(c, ensure_ascii=False)}\n" for c in criteria)
            if criteria else
            "  # TODO: completion criteria, one per fact the answer must state (e.g. the value, its unit, its date)\n"
            "  completion_criteria: []\n")
    header = ["# agentfunnel case" + (f" drafted from session {session_id}" if session_id else ""),
              "# Review before use: the task and intent summary, the allowed tools (every tool the session",
              "# called, wrong ones included) and the required result fields (the keys its results returned)."]
    return "\n".join(header) + "\ncases:\n" + item + "\n" + crit
