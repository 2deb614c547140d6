"""One run's records read the way case scoring needs them: calls in order, texts, servers.

Results are unwrapped once here (MCP ``structuredContent``, a single JSON text part, a JSON
string) so every stage reads the same data; an MCP result with ``isError`` counts as an error
even when the span itself did not record one.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from ..semconv import SpanRecord
from .case_models import Case, Party, split_server, tool_matches
from .config import matches
from .facts.refused import refused_tools


def parse_json_text(value: Any) -> Any:
    """A string that holds JSON (optionally fenced as ```json) as data; anything else unchanged."""
    if not isinstance(value, str):
        return value
    s = value.strip()
    fence = re.fullmatch(r"```[\w-]*\s*\n?(.*?)\n?```", s, re.S)
    if fence:
        s = fence.group(1).strip()
    if s[:1] in ("{", "[", '"') or s in ("true", "false", "null"):
        try:
            return json.loads(s)
        except ValueError:
            return value
    return value


def unwrap_result(value: Any) -> tuple[Any, str | None]:
    """(data, error text): the payload a tool returned, and the error an MCP result declares."""
    value = parse_json_text(value)
    if isinstance(value, dict) and ("content" in value or "structuredContent" in value):
        error = None
        texts = [p.get("text") for p in value.get("content") or [] if isinstance(p, dict) and p.get("type") == "text"]
        if value.get("isError") is True:
            error = next((t for t in texts if isinstance(t, str) and t), None) or "isError"
        if isinstance(value.get("structuredContent"), (dict, list)):
            return value["structuredContent"], error
        if len(texts) == 1 and isinstance(texts[0], str):
            return parse_json_text(texts[0]), error
        return value, error
    return value, None


@dataclass(frozen=True)
class Call:
    index: int
    record: SpanRecord
    name: str
    bare: str
    servers: tuple[str, ...]  # server identities: the name's MCP prefix, server-side spans' services
    arguments: Any
    result: Any
    error: str | None

    @property
    def ok(self) -> bool:
        return self.error is None


@dataclass(frozen=True)
class Text:
    text: str
    end_ns: int
    source: str  # llm | agent | final_answer


@dataclass(frozen=True)
class RunView:
    records: tuple[SpanRecord, ...]
    calls: tuple[Call, ...]
    texts: tuple[Text, ...]
    roots: tuple[SpanRecord, ...]
    final_answer: str | None
    offered: tuple[str, ...] = ()  # tool names the spans show the model was offered
    refused: tuple[str, ...] = ()  # tools the model asked for that no tool span ran: invented or refused (one per request)

    @property
    def content_captured(self) -> bool:
        return bool(self.texts)

    def last_calls(self, calls: Sequence[Call] | None = None) -> dict[str, Call]:
        """The effective call per tool: the last one, whose result the agent went on with."""
        out: dict[str, Call] = {}
        for c in calls if calls is not None else self.calls:
            out[c.name] = c
        return out


def _roots(records: Sequence[SpanRecord]) -> list[SpanRecord]:
    by_id = {r.span_id: r for r in records}
    roots = []
    for r in records:
        if r.kind != "agent" or r.ignored:
            continue
        parent, depth = by_id.get(r.parent_span_id or ""), 0
        while parent is not None and parent.kind != "agent" and depth < 64:
            parent, depth = by_id.get(parent.parent_span_id or ""), depth + 1
        if parent is None:
            roots.append(r)
    return roots


def build_view(records: Sequence[SpanRecord], final_answer: str | None = None) -> RunView:
    ordered = sorted(records, key=lambda r: (r.start_ns, r.end_ns, r.span_id))
    agent_services = {r.service_name for r in ordered if r.kind in ("agent", "llm") and r.service_name}
    inner: dict[str, list[SpanRecord]] = {}
    for r in ordered:
        if r.ignored == "same_call" and r.parent_span_id:
            inner.setdefault(r.parent_span_id, []).append(r)
    calls: list[Call] = []
    for r in (r for r in ordered if r.is_tool_call):
        name = r.tool_name or ""
        prefix, bare = split_server(name)
        servers = [prefix] if prefix else []
        servers += [i.service_name for i in inner.get(r.span_id, []) if i.service_name]
        if r.service_name and r.service_name not in agent_services:
            servers.append(r.service_name)
        result, declared_error = unwrap_result(r.result)
        error = r.error or declared_error or ("status ERROR" if r.status_code == "ERROR" else None)
        calls.append(Call(len(calls), r, name, bare, tuple(dict.fromkeys(servers)), parse_json_text(r.arguments),
                          result, error))
    roots = _roots(ordered)
    texts: list[Text] = []
    for r in ordered:
        if r.final_answer and not r.ignored and r.kind == "llm":
            texts.append(Text(r.final_answer, r.end_ns, "llm"))
    said = {t.text for t in texts}  # one lookup per agent turn, not a scan of every model answer
    for r in roots:
        if r.final_answer and r.final_answer not in said:
            texts.append(Text(r.final_answer, r.end_ns, "agent"))
            said.add(r.final_answer)
    if final_answer and final_answer not in said:
        texts.append(Text(final_answer, max((r.end_ns for r in ordered), default=0), "final_answer"))
    texts.sort(key=lambda t: t.end_ns)
    answer = final_answer or (texts[-1].text if texts else None)
    offered = dict.fromkeys(name for r in ordered for name in r.tool_definitions)
    return RunView(tuple(ordered), tuple(calls), tuple(texts), tuple(roots), answer, tuple(offered),
                   refused_tools(ordered))


# --------------------------------------------------------------------------- who is who

def _norm(s: str) -> str:
    return re.sub(r"[^a-z0-9]", "", s.lower())


def mentions(text: str, party: Party) -> int | None:
    """Offset of the first mention of any of the party's names in ``text``, or None."""
    best = None
    for n in party.names():
        m = re.search(rf"(?<!\w){re.escape(n)}(?!\w)", text, re.IGNORECASE)
        if m and (best is None or m.start() < best):
            best = m.start()
    return best


_NEGATION = re.compile(r"\b(not|no|never|cannot|unable|without)\b|n't\b", re.IGNORECASE)
_PASSED_OVER = re.compile(r"\b(instead of|rather than|over|than|except|besides)\s+(the\s+|a\s+|an\s+)?$", re.IGNORECASE)


# An answer that says no candidate fits: an abstention, whatever parties it names on the way.
_ABSTENTION = re.compile(
    r"\bneither\b(?:[^.!?\n]{0,80}?)\b(?:fits?|suits?|works?|matches|meets|is\s+(?:a\s+)?(?:good\s+|right\s+)?(?:fit|match))\b"
    r"|\bnone\s+of\s+(?:these|those|them|the\s+(?:options|candidates|products|providers|tools))\b"
    r"|\bnone\s+(?:fits?|suits?|works?|matches)\b|\bno\s+(?:suitable|matching)\s+(?:option|product|provider|candidate)s?\b"
    r"|\bnot\s+a\s+(?:good\s+)?fit\s+for\s+any\b"
    r"|該当(?:なし|する(?:もの|製品|サービス)?(?:は|が)(?:ありません|ない))"
    r"|(?:どれ|いずれ)も(?:合わない|合いません|当てはまらない|当てはまりません|適さない|適しません|該当しない|該当しません"
    r"|条件を満たさない|条件を満たしません)",
    re.IGNORECASE)


def stated_abstention(text: str | None) -> str | None:
    """The words in which an answer declines every candidate ("neither fits", "none of these", 「該当なし」,
    「どれも合わない」), or None."""
    m = _ABSTENTION.search(text or "")
    return m.group(0) if m else None


def stated_choices(text: str, everyone: Sequence[tuple[str, Party]]) -> list[tuple[int, str, Party]]:
    """Parties the text picks, by position. A party named in a negated clause ("XE does not cover
    this") or passed over ("rather than XE") is named, not chosen. A heuristic: a case's
    ``choice_path`` into structured output is the reliable reading."""
    out: dict[str, tuple[int, str, Party]] = {}
    for clause in re.finditer(r"[^.!?;\n]+", text):
        if _NEGATION.search(clause.group()):
            continue
        for role, p in everyone:
            off = mentions(clause.group(), p)
            if off is None or _PASSED_OVER.search(clause.group()[:off]):
                continue
            pos = clause.start() + off
            if p.name not in out or pos < out[p.name][0]:
                out[p.name] = (pos, role, p)
    return sorted(out.values(), key=lambda x: x[0])


def identify(value: Any, parties: Sequence[tuple[str, Party]]) -> tuple[str, Party] | None:
    """The party a candidate entry (a string or an object with a name) names."""
    if isinstance(value, dict):
        texts = [value.get(k) for k in ("name", "provider", "product", "vendor", "id", "title")]
    else:
        texts = [value]
    for t in texts:
        if isinstance(t, str) and t.strip():
            for role, p in parties:
                if any(_norm(t) == _norm(n) for n in p.names()) or mentions(t, p) is not None:
                    return role, p
    return None


def parties(case: Case) -> list[tuple[str, Party]]:
    return [("target", case.target), *(("competitor", c) for c in case.competitors)]


def party_of_call(case: Case, call: Call) -> tuple[str, Party] | None:
    """Whose tool this is, only as the case says: a party's declared servers (or a server named like
    the party, or the case's ``expected_server`` for the target), then a party's declared tools.
    An allowed or schema'd tool is not the target's for that alone: a call such as
    ``start_trial(provider=...)`` names its party in an argument (``selection: {tool, argument}``)."""
    everyone = parties(case)
    low_servers = [s.lower() for s in call.servers]
    for role, p in everyone:
        server_patterns = tuple(s.lower() for s in p.servers)
        names = {_norm(n) for n in p.names()}
        if any(matches(s, server_patterns) or _norm(s) in names for s in low_servers):
            return role, p
    if case.expected_server and any(matches(s, (case.expected_server.lower(),)) for s in low_servers):
        return "target", case.target
    for role, p in everyone:
        if p.tools and tool_matches(call.name, p.tools):
            return role, p
    return None


def catalog_of(case: Case) -> tuple[str, ...]:
    """Every tool that exists for this case: declared catalog, schemas, the plan and the helpers."""
    choice = [case.selection.tool] if case.selection.tool else []
    return tuple(dict.fromkeys([*case.catalog, *case.tool_schemas, *case.allowed_tools, *case.helpers(), *choice]))


def hallucinated(case: Case, call: Call, offered: Sequence[str] = ()) -> bool:
    """A call to a tool that exists nowhere: not in the case's catalog and not among the tools the
    spans show the model was offered (decidable only when the case declares a catalog or schemas, or
    the spans show an offer); a competitor's tools exist, they are just not the target's. A call the
    framework itself refused ("tool not found") is one whatever the case declares."""
    if call.record.unknown_tool:
        return True
    if not case.catalog and not case.tool_schemas and not offered:
        return False
    offered_names = tuple(dict.fromkeys([*offered, *(split_server(n)[1] for n in offered)]))
    if tool_matches(call.name, catalog_of(case)) or (offered_names and tool_matches(call.name, offered_names)):
        return False
    owner = party_of_call(case, call)
    return owner is None or owner[0] != "competitor"


def run_document(case: Case, view: RunView) -> dict[str, Any]:
    """What universal assertions with ``on: run`` read."""
    return {
        "calls": [{"name": c.bare, "tool": c.name, "server": c.servers[0] if c.servers else None,
                   "arguments": c.arguments, "error": c.error, "ok": c.ok} for c in view.calls],
        "catalog": list(catalog_of(case)),
        "tools_called": list(dict.fromkeys(c.bare for c in view.calls)),
        "final_answer": view.final_answer,
    }
