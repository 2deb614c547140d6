"""Evaluation cases (SPEC §6): the contract a run is scored against, loaded from YAML or TOML.

A suite is edited by people, so every problem is reported with the case it belongs to and the
field that is wrong, e.g. ``cases[2] (id "fx-rate").argument_expectations.get_rate[0].pointer:
must start with "/"``. A suite can live behind a URL (a dataset kept on a shared platform); an
unreachable URL falls back to the local copy, and the result says which one was used.

A URL is someone else's server, so fetching it is bounded: one deadline for the whole fetch, a
size cap, redirects only within the same host, and a suite from a URL may not make this server
run a command or import code unless that is allowed. YAML aliases may not blow a small file up
into a huge document, wherever the file comes from.
"""

from __future__ import annotations

import codecs
import datetime as _dt
import functools
import hashlib
import http.client
import io
import json
import re
import socket
import time
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
                          RequiredField, SelectionSpec, Suite, ToolArgumentSource, ValidatorSpec, case_sha256,
                          split_server, tool_matches, _schema_ok)
from .results import SessionScore
from .run_view import build_view, parse_json_text
from .stages.registry import REGISTRY, StageRegistry

__all__ = ["ArgumentExpectation", "ArtifactSource", "ArtifactSpec", "Case", "CaseFileError", "DiscoverySpec",
           "LoadedSuite", "Party", "RequiredField", "SelectionSpec", "Suite", "ToolArgumentSource", "ValidatorSpec",
           "case_from_session",
           "case_sha256", "format_validation_error", "load_suite", "parse_suite", "render_case_yaml", "split_server",
           "tool_matches"]

FETCH_TIMEOUT_SECONDS = 5.0
MAX_SUITE_BYTES = 4 * 1024 * 1024
MAX_REDIRECTS = 5
MAX_ALIAS_NODES = 100_000  # nodes YAML aliases may add to a document once expanded


class CaseFileError(ValueError):
    """A suite that cannot be used; ``problems`` holds one line per field."""

    def __init__(self, origin: str, problems: list[str]) -> None:
        self.origin = origin
        self.problems = problems
        super().__init__(f"{origin}: " + ("\n  ".join(problems) if len(problems) > 1 else problems[0])
                         if problems else origin)


# --------------------------------------------------------------------------- reading files

class _AliasLimit(yaml.YAMLError):
    """A document whose aliases expand it far beyond what was written (a "billion laughs" bomb)."""


def _children(node: yaml.Node) -> list[yaml.Node]:
    if isinstance(node, yaml.SequenceNode):
        return node.value
    if isinstance(node, yaml.MappingNode):
        return [n for pair in node.value for n in pair]
    return []


def _check_aliases(root: yaml.Node) -> None:
    """Refuse a document that aliases would expand by more than MAX_ALIAS_NODES nodes.

    An alias is the same node object as its anchor, so the expanded size of every distinct node is
    computed once (bottom-up, no recursion) and the bomb is never built.
    """
    sizes: dict[int, int] = {}
    open_nodes: set[int] = set()
    stack: list[tuple[yaml.Node, bool]] = [(root, False)]
    while stack:
        node, children_done = stack.pop()
        key = id(node)
        if children_done:
            open_nodes.discard(key)
            sizes[key] = 1 + sum(sizes[id(c)] for c in _children(node))
        elif key not in sizes:
            if key in open_nodes:
                raise _AliasLimit(f"an alias refers to a node that contains it ({node.start_mark.line + 1}:"
                                  f"{node.start_mark.column + 1}): a suite cannot be recursive")
            open_nodes.add(key)
            stack.append((node, True))
            stack.extend((c, False) for c in _children(node))
    added = sizes[id(root)] - len(sizes)
    if added > MAX_ALIAS_NODES:
        raise _AliasLimit(f"YAML aliases expand the document by {added} nodes, more than the {MAX_ALIAS_NODES} "
                          "allowed (an alias bomb?)")


class _YamlLoader(yaml.SafeLoader):
    """Dates stay strings: ``equals: 2026-01-15`` must compare equal to the argument ``"2026-01-15"``.

    Aliases are checked before anything is built from the document (see ``_check_aliases``).
    """

    def compose_document(self) -> yaml.Node:
        node = super().compose_document()
        _check_aliases(node)
        return node


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
    try:
        return _parse_any(text, fmt, origin)
    except RecursionError:
        raise CaseFileError(origin, ["nested too deeply to be a suite"]) from None


def _parse_any(text: str, fmt: str | None, origin: str) -> Any:
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
        return yaml.load(text, Loader=_YamlLoader)  # noqa: S506 (a SafeLoader)
    except _AliasLimit as e:
        raise CaseFileError(origin, [str(e)]) from None
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
        suite = Suite.model_validate(data)
    except ValidationError as e:
        raise CaseFileError(origin, format_validation_error(e, data)) from None
    check_stages(suite, origin)
    return suite


def check_stages(suite: Suite, origin: str, registry: StageRegistry = REGISTRY) -> None:
    """Every stage a case scores is a registered one (the registry, not the case model, knows the stages)."""
    keys = registry.keys()
    known = ", ".join(repr(k) for k in keys[:-1]) + f" or {keys[-1]!r}" if len(keys) > 1 else repr(keys[0])
    problems = [f'cases[{i}] (id "{case.id}").scored_stages[{j}]: Input should be {known}'
                for i, case in enumerate(suite.cases) for j, key in enumerate(case.scored_stages or ())
                if registry.get(key) is None]
    if problems:
        raise CaseFileError(origin, problems)


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


def _decode(raw: bytes, charset: str) -> str:
    """Text in ``charset`` (a UTF-8 byte-order mark dropped); ValueError names what is wrong."""
    try:
        codec = "utf-8-sig" if codecs.lookup(charset).name == "utf-8" else charset
        return raw.decode(codec)
    except LookupError:
        raise ValueError(f"unknown charset {charset!r}") from None
    except UnicodeDecodeError as e:
        raise ValueError(f"not valid {charset} text ({e.reason} at byte {e.start})") from None


def _read_path(path: Path, max_bytes: int = MAX_SUITE_BYTES) -> tuple[str, str | None]:
    try:
        with path.open("rb") as f:
            raw = f.read(max_bytes + 1)
    except OSError as e:
        raise CaseFileError(str(path), [f"cannot read: {e.strerror or e}"]) from None
    if len(raw) > max_bytes:
        raise CaseFileError(str(path), [f"larger than {max_bytes} bytes (cases.max_suite_bytes)"])
    try:
        return _decode(raw, "utf-8"), _format_of(path.name)
    except ValueError as e:
        raise CaseFileError(str(path), [str(e)]) from None


class _FetchError(Exception):
    """A URL that did not give a usable suite body; like an unreachable URL, the fallback is used."""


class _Deadline:
    """One deadline for a whole fetch: connect, headers, body and redirects all spend from it."""

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds
        self.at = time.monotonic() + seconds

    def expired(self) -> bool:
        return time.monotonic() >= self.at

    def error(self) -> _FetchError:
        return _FetchError(f"took longer than {self.seconds:g} s in all (cases.fetch_timeout_seconds)")

    def left(self) -> float:
        if self.expired():
            raise self.error()
        return self.at - time.monotonic()


class _TimedReader(io.RawIOBase):
    """A socket's reads, each allowed only the time left, so trickled bytes cannot outlast the deadline."""

    def __init__(self, sock: socket.socket, deadline: _Deadline) -> None:
        super().__init__()
        self._sock = sock
        self._io = sock.makefile("rb", buffering=0)  # keeps the socket open after urllib closes its own handle
        self._deadline = deadline

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int | None:
        self._sock.settimeout(self._deadline.left())
        try:
            return self._io.readinto(buffer)
        except TimeoutError:
            raise self._deadline.error() from None

    def close(self) -> None:
        self._io.close()
        super().close()


class _TimedSocket:
    """What ``HTTPResponse`` reads the status line, headers and body from: a ``_TimedReader``."""

    def __init__(self, sock: socket.socket, deadline: _Deadline) -> None:
        self._sock = sock
        self._deadline = deadline

    def makefile(self, mode: str = "rb", *args: Any, **kwargs: Any) -> io.BufferedReader:
        return io.BufferedReader(_TimedReader(self._sock, self._deadline))


class _TimedConnection:
    """Connects within the time left and reads every response through the deadline."""

    def __init__(self, *args: Any, deadline: _Deadline, **kwargs: Any) -> None:
        super().__init__(*args, **{**kwargs, "timeout": deadline.left()})  # type: ignore[call-arg]
        self._deadline = deadline

    def response_class(self, sock: socket.socket, **kwargs: Any) -> http.client.HTTPResponse:
        return http.client.HTTPResponse(_TimedSocket(sock, self._deadline), **kwargs)  # type: ignore[arg-type]


# (response_class is a method here, an attribute holding a class in typeshed: both are called the same way)
class _TimedHTTPConnection(_TimedConnection, http.client.HTTPConnection):  # type: ignore[misc]
    pass


class _TimedHTTPSConnection(_TimedConnection, http.client.HTTPSConnection):  # type: ignore[misc]
    pass


class _TimedHTTPHandler(urllib.request.HTTPHandler):
    def __init__(self, deadline: _Deadline) -> None:
        super().__init__()
        self._deadline = deadline

    def http_open(self, req: urllib.request.Request) -> http.client.HTTPResponse:
        return self.do_open(functools.partial(_TimedHTTPConnection, deadline=self._deadline), req)


class _TimedHTTPSHandler(urllib.request.HTTPSHandler):
    def __init__(self, deadline: _Deadline) -> None:
        super().__init__()
        self._deadline = deadline

    def https_open(self, req: urllib.request.Request) -> http.client.HTTPResponse:
        return self.do_open(functools.partial(_TimedHTTPSConnection, deadline=self._deadline), req,
                            context=self._context)  # type: ignore[attr-defined]  # HTTPSHandler's, not in typeshed


def _origin(url: str) -> tuple[str, str, int | None]:
    parts = urllib.parse.urlsplit(url)
    scheme = parts.scheme.lower()
    try:
        port = parts.port or {"http": 80, "https": 443}.get(scheme)
    except ValueError:  # a port that is not a number
        port = None
    return scheme, (parts.hostname or "").lower(), port


def _same_host(current: str, target: str) -> bool:
    """The same scheme, host and port, or the https upgrade of an http URL on the same host."""
    (scheme, host, port), (new_scheme, new_host, new_port) = _origin(current), _origin(target)
    if new_scheme not in ("http", "https") or not new_host or new_host != host or new_port is None:
        return False
    return (new_scheme, new_port) == (scheme, port) or (scheme, new_scheme) == ("http", "https")


class _SameHostRedirects(urllib.request.HTTPRedirectHandler):
    """Redirects stay on the suite's host: another host or scheme could hand over any suite at all."""

    max_repeats = max_redirections = MAX_REDIRECTS + 1  # the limit below is the one that applies

    def http_error_302(self, req: urllib.request.Request, fp: Any, code: int, msg: str, headers: Any) -> Any:
        location = headers.get("Location") or headers.get("URI")
        problem = None
        if location:
            target = urllib.parse.urljoin(req.full_url, location)
            if not _same_host(req.full_url, target):
                problem = (f"redirected from {req.full_url} to {target}: only redirects to http(s) on the same host "
                           "are followed")
            elif sum(getattr(req, "redirect_dict", {}).values()) >= MAX_REDIRECTS:
                problem = f"more than {MAX_REDIRECTS} redirects (last to {target})"
        if problem:
            fp.close()
            raise _FetchError(problem)
        return super().http_error_302(req, fp, code, msg, headers)

    http_error_301 = http_error_303 = http_error_307 = http_error_308 = http_error_302


def _opener(deadline: _Deadline) -> urllib.request.OpenerDirector:
    """``urlopen``'s handlers (proxies from the environment included) for http(s) only, under ``deadline``."""
    opener = urllib.request.OpenerDirector()
    for handler in (urllib.request.ProxyHandler(), urllib.request.UnknownHandler(), _TimedHTTPHandler(deadline),
                    _TimedHTTPSHandler(deadline), urllib.request.HTTPDefaultErrorHandler(), _SameHostRedirects(),
                    urllib.request.HTTPErrorProcessor()):
        opener.add_handler(handler)
    return opener


def _fetch(url: str, timeout: float = FETCH_TIMEOUT_SECONDS,
           max_bytes: int = MAX_SUITE_BYTES) -> tuple[str, str | None]:
    """The body of ``url`` as text; every way it can fail short of a usable body is a fetch error."""
    deadline = _Deadline(timeout)
    request = urllib.request.Request(url, headers={"Accept": "application/yaml, application/toml, text/plain, */*"})
    try:
        with _opener(deadline).open(request, timeout=deadline.left()) as response:
            length = response.headers.get("Content-Length", "")
            if length.strip().isdigit() and int(length) > max_bytes:
                raise _FetchError(f"Content-Length {int(length)} is larger than {max_bytes} bytes "
                                  "(cases.max_suite_bytes)")
            chunks, size = [], 0
            while chunk := response.read(64 * 1024):
                size += len(chunk)
                if size > max_bytes:
                    raise _FetchError(f"larger than {max_bytes} bytes (cases.max_suite_bytes)")
                chunks.append(chunk)
            charset = response.headers.get_content_charset() or "utf-8"
            content_type = response.headers.get("Content-Type", "")
    except (OSError, http.client.HTTPException) as e:
        # every socket timeout is the time left, so a timeout (wrapped in URLError on connect) is the deadline
        if deadline.expired() or isinstance(getattr(e, "reason", e), TimeoutError):
            raise deadline.error() from None
        raise
    try:
        return _decode(b"".join(chunks), charset), _format_of(url, content_type)
    except ValueError as e:
        raise _FetchError(f"{e} (Content-Type {content_type!r})" if content_type else str(e)) from None


def _refuse_remote_code(suite: Suite, origin: str) -> None:
    """A suite from a URL must not make this server run a command or import a module."""
    problems = []
    for i, case in enumerate(suite.cases):
        validator = case.artifact.validator if case.artifact else None
        if validator is not None:
            field = "command" if validator.command is not None else "entry_point"
            problems.append(f'cases[{i}] (id "{case.id}").artifact.validator.{field}: a suite fetched from a URL '
                            "may not run commands or import code on this server; set "
                            "cases.allow_remote_commands: true to allow it")
    if problems:
        raise CaseFileError(origin, problems)


def _sha(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def _suite_from_text(text: str, fmt: str | None, origin: str) -> Suite:
    return parse_suite(_parse_text(text, fmt, origin), origin)


def load_suite(source: str | Path, fallback: Path | None = None, timeout: float = FETCH_TIMEOUT_SECONDS, *,
               max_bytes: int = MAX_SUITE_BYTES, allow_remote_commands: bool = False) -> LoadedSuite:
    """A suite from a path or an http(s) URL; a URL that cannot be fetched falls back to ``fallback``.

    Only fetching falls back: a suite that was fetched but is invalid, or that declares validators
    (code this server would run) when remote ones are not allowed, is an error, so a broken or
    hostile shared dataset is never silently replaced by an older local copy. ``timeout`` is the
    total time for the fetch and ``max_bytes`` caps the suite, fetched or read.
    """
    text_source = str(source)
    if isinstance(source, str) and re.match(r"^https?://", source, re.I):
        try:
            text, fmt = _fetch(source, timeout, max_bytes)
        except (_FetchError, urllib.error.URLError, http.client.HTTPException, OSError, ValueError) as e:
            why = (f"HTTP {e.code} {e.reason}" if isinstance(e, urllib.error.HTTPError)
                   else getattr(e, "reason", None) or e)
            if fallback is None:
                raise CaseFileError(source, [f"could not be fetched: {why}"]) from None
            text, fmt = _read_path(Path(fallback), max_bytes)
            reason = f"{source} could not be fetched: {why}"
            return LoadedSuite(_suite_from_text(text, fmt, str(fallback)), "fallback", str(fallback), _sha(text), reason)
        suite = _suite_from_text(text, fmt, source)
        if not allow_remote_commands:
            _refuse_remote_code(suite, source)
        return LoadedSuite(suite, "url", source, _sha(text))
    if "://" in text_source:
        raise CaseFileError(text_source, ["only http(s) URLs and local paths can be loaded"])
    path = Path(source)
    text, fmt = _read_path(path, max_bytes)
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
    """The session's first user message: the ``input_message`` the dialects read (the earliest span
    that carries one), else, best effort, an agent or model span's input arguments."""
    for r in sorted(records, key=lambda r: (r.start_ns, r.end_ns, r.span_id)):
        text = getattr(r, "input_message", None)
        if isinstance(text, str) and text.strip():
            return text.strip()
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
    return Case(id=case_id, task=_first_user_message(view.records) or TODO_TASK, intent_summary=TODO_INTENT,
                target=Party(name=_target_of(allowed, servers, score), tools=allowed),
                discovery=DiscoverySpec(applies=False), selection=SelectionSpec(applies=False),
                allowed_tools=allowed, expected_server=servers[0] if servers else None,
                tool_schemas=schemas, required_result_fields=required)


def _target_of(tools: Sequence[str], servers: Sequence[str], score: SessionScore) -> str:
    """The party whose tools the session called: the server they ran on, else the prefix their names share
    (``mcp__fxrates__get_rate``: fxrates), else the first tool; never the agent's own service name (the agent
    is not the product it was asked to use). No tool called: the service name, for the user to replace."""
    if servers:
        return servers[0]
    for name in tools:
        server, _ = split_server(name)
        if server:
            return server
    return tools[0] if tools else (score.service_name or score.agent_name or "TODO-target")


def render_case_yaml(case: Case, session_id: str | None = None) -> str:
    """A one-case suite file, with the review items as comments (YAML keeps them for the editor)."""
    # exclude_unset, not exclude_defaults: ``equals: null`` is a check the user wrote
    data = {k: v for k, v in case.model_dump(mode="json", by_alias=True, exclude_unset=True).items()
            if v not in (None, [], {})}
    data.pop("completion_criteria", None)
    for stage in ("discovery", "selection"):  # a data lookup says so explicitly (SPEC §6): the shorthand
        if data.get(stage) == {"applies": False}:
            data[stage] = "none"
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
              "# called, wrong ones included) and the required result fields (the keys its results returned).",
              "# A data lookup (discovery: none, selection: none): when the agent chooses among products, name",
              "# the competitors and declare where its candidates and its choice are read."]
    return "\n".join(header) + "\ncases:\n" + item + "\n" + crit
