"""Redaction: what users typed and tools returned, scrubbed before it is stored, judged or forwarded (SPEC §10).

Pure: ``PrivacySettings`` in, a ``Redactor`` out, whose ``redact`` rewrites a decoded batch in place
(spans, log records or metric points: their JSON text columns and their views). It is applied once,
in ``Pipeline.decode``, which every request of every receiver and ``agentfunnel ingest`` passes
before its commit; the store, the session stage (tool calls, answers, inputs: derived from the stored
attributes), the judge (fed by the session stage) and the forwarder (which re-sends the committed
batch) only ever see the redacted form.

What it does to each attribute map (span, resource, event, link, log record, metric point), in order:
``drop_keys`` are removed, ``hash_keys`` replaced by an HMAC-SHA256 of their value (truncated hex,
so a user id stays joinable), content keys dropped or stripped to their structure when
``capture_content`` is off, and every remaining string value (nested ones, JSON held in strings,
log bodies, span names and status messages, metric names, descriptions and units too) run through the
user's patterns, then the built-in detectors. JSON held in a string is scrubbed as what it decodes to
(its ``\\u`` escapes undone, as are those of a plain text that matches once they are); an integer
that is a valid card number (13 to 19 digits, Luhn) is replaced like one written as text; a bytes
value (base64 text once decoded) that decodes to UTF-8 text is scrubbed as that text and encoded
again. Other numbers and keys are left as they are.

Cost: off, nothing (the pipeline holds no redactor). On, a batch's texts are searched at once for
each detector's hints (``_scan``: one C search per hint over the joined texts, never missing a
match) and for the key rules' ``"key":``; only a text with a hint is parsed, scrubbed by the
detectors it hinted at, and dumped again when something changed. A ``\\u`` escape (which may spell
any character of a match) calls every detector; base64 text is looked for only in a batch whose
decoder met bytes values. Without content capture, or with
user patterns (which have no hints), every text is parsed. ``bench/redaction.py`` measures it.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import ipaddress
import json
import re
from bisect import bisect_right
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from itertools import accumulate
from typing import Any, get_args

from .batches import LogBatch, SpanBatch
from .decoded import from_json, to_json
from ..scoring.regex import linear
from .config import DetectorName, PrivacySettings
from .metric_batches import MetricBatch

# ---------------------------------------------------------------------------- validators


def luhn_ok(digits: str) -> bool:
    """The payment card checksum (ISO/IEC 7812): double every second digit from the right."""
    total = 0
    for i, ch in enumerate(reversed(digits)):
        d = ord(ch) - 48
        if i % 2:
            d = d * 2 - 9 if d > 4 else d * 2
        total += d
    return total % 10 == 0


def _card(match: str) -> bool:
    digits = match.replace(" ", "").replace("-", "")
    return 13 <= len(digits) <= 19 and len(set(digits)) > 1 and luhn_ok(digits)


def _card_int(value: int) -> bool:
    """An integer written where a card number was: 13 to 19 digits passing the card checks."""
    return 10**12 <= value < 10**19 and _card(str(value))


# ISO 13616 lengths of the countries that issue IBANs (a candidate from elsewhere is left alone).
IBAN_LENGTHS = {
    "AD": 24, "AE": 23, "AL": 28, "AT": 20, "AZ": 28, "BA": 20, "BE": 16, "BG": 22, "BH": 22, "BI": 27, "BR": 29,
    "BY": 28, "CH": 21, "CR": 22, "CY": 28, "CZ": 24, "DE": 22, "DJ": 27, "DK": 18, "DO": 28, "EE": 20, "EG": 29,
    "ES": 24, "FI": 18, "FK": 18, "FO": 18, "FR": 27, "GB": 22, "GE": 22, "GI": 23, "GL": 18, "GR": 27, "GT": 28,
    "HR": 21, "HU": 28, "IE": 22, "IL": 23, "IQ": 23, "IS": 26, "IT": 27, "JO": 30, "KW": 30, "KZ": 20, "LB": 28,
    "LC": 32, "LI": 21, "LT": 20, "LU": 20, "LV": 21, "LY": 25, "MC": 27, "MD": 24, "ME": 22, "MK": 19, "MN": 20,
    "MR": 27, "MT": 31, "MU": 30, "NI": 28, "NL": 18, "NO": 15, "OM": 23, "PK": 24, "PL": 28, "PS": 29, "PT": 25,
    "QA": 29, "RO": 24, "RS": 22, "RU": 33, "SA": 24, "SC": 31, "SD": 18, "SE": 24, "SI": 19, "SK": 24, "SM": 27,
    "SO": 23, "ST": 25, "SV": 28, "TL": 23, "TN": 24, "TR": 26, "UA": 29, "VA": 22, "VG": 24, "XK": 20, "YE": 30,
}


def iban_ok(text: str) -> bool:
    """ISO 13616: the country's length, and the number mod 97 is 1 with the first four characters moved to the end."""
    iban = text.replace(" ", "")
    if IBAN_LENGTHS.get(iban[:2]) != len(iban):
        return False
    moved = iban[4:] + iban[:4]
    return int("".join(str(int(ch, 36)) for ch in moved)) % 97 == 1


def _phone(match: str) -> bool:
    digits = sum(ch.isdigit() for ch in match)
    return 8 <= digits <= 15 if match.startswith("+") else digits == 10


def _ip(match: str) -> bool:
    if ":" not in match:
        return True  # the IPv4 pattern checks its octets itself
    try:
        ipaddress.IPv6Address(match)
    except ValueError:
        return False
    return any(ch in "123456789" for ch in match)  # not "::" alone, nor a::b (a C++ or Rust path)


# ---------------------------------------------------------------------------- detectors
# Each detector has a pattern, run on decoded strings, and hints: substrings of which a text holding
# a match must contain one, searched over a whole batch at once (``Redactor._scan``) in the raw UTF-8
# text or in its shape (``SHAPE``: digits 0, capitals A, separators folded). A match consists of
# characters the store's JSON never escapes, so it is in the column's text as it is in the string, and
# so are its hints. JSON the client wrote inside a string may escape any character (``bob\u0040x.io``),
# and is scrubbed as what it decodes to: a ``\u`` in a text (``ESCAPED``) calls every detector.

_SHAPE = bytearray(range(256))
for _c in b"0123456789":
    _SHAPE[_c] = ord("0")
for _c in b"ABCDEFGHIJKLMNOPQRSTUVWXYZ":
    _SHAPE[_c] = ord("A")
_SHAPE[ord(" ")] = _SHAPE[ord("-")] = 2  # the separators of card and phone numbers
_SHAPE[ord(".")] = 1
_SHAPE[ord("(")] = _SHAPE[ord(")")] = 3
SHAPE = bytes(_SHAPE)


Hint = bytes | re.Pattern[bytes]  # a substring, or a regex with a literal start (searched as fast)


@dataclass(frozen=True, eq=False)  # compared and hashed by identity: one object per detector
class Detector:
    """A pattern run on decoded strings, its hints (see above), and a validator of what it matched."""

    name: str
    pattern: re.Pattern[str]
    raw: tuple[Hint, ...] = ()  # in the UTF-8 text
    shaped: tuple[Hint, ...] = ()  # in its shape
    valid: Callable[[str], bool] | None = None
    shortest: int = 1  # no shorter string holds a match (checked before the pattern runs on each string)
    needs: str = ""  # a character every match holds


_EMAIL = r"[A-Za-z0-9._%+-]+@[A-Za-z0-9](?:[A-Za-z0-9-]*[A-Za-z0-9])?(?:\.[A-Za-z0-9](?:[A-Za-z0-9-]*[A-Za-z0-9])?)*\.[A-Za-z]{2,}"
# 13 to 19 digits: in one run, or in groups after a first group of four (4-4-4-4, 4-6-5 ...), one space or dash apart
_CARD = r"(?<![0-9])[2-6](?:[0-9]{12,18}|[0-9]{3}(?:[ -][0-9]{3,6}){2,4})(?![0-9])"
_IBAN = r"(?<![A-Za-z0-9])[A-Z]{2}[0-9]{2}(?: ?[A-Z0-9]{4}){2,7}(?: ?[A-Z0-9]{1,4})?(?![A-Za-z0-9])"
_PHONE = (r"(?<![0-9A-Za-z_+])(?:\+[1-9][0-9]{0,2}[ .-]?(?:\([0-9]{1,4}\)[ .-]?)?[0-9]{1,4}(?:[ .-]?[0-9]{1,4}){1,5}"
          r"|\(?[0-9]{3}\)?[ .-]?[0-9]{3}[ .-][0-9]{4})(?![0-9A-Za-z_])")
_OCTET = r"(?:25[0-5]|2[0-4][0-9]|1[0-9]{2}|[1-9]?[0-9])"
_IP = (rf"(?<![0-9])(?<![0-9]\.)(?:{_OCTET}\.){{3}}{_OCTET}(?!\.?[0-9])"
       r"|(?<![0-9A-Za-z:])(?:[0-9A-Fa-f]{0,4}:){2,7}[0-9A-Fa-f]{0,4}(?![0-9A-Za-z:])")
_KEYS = (r"(?<![A-Za-z0-9_-])(?:sk-(?:ant-|proj-|svcacct-)?[A-Za-z0-9_-]{20,}|(?:sk|pk|rk)_(?:live|test)_[0-9A-Za-z]{16,}"
         r"|(?:AKIA|ASIA)[0-9A-Z]{16}|gh[pousr]_[A-Za-z0-9]{36,}|github_pat_[A-Za-z0-9_]{22,}|glpat-[0-9A-Za-z_-]{20,}"
         r"|xox[abposr]-[0-9A-Za-z-]{10,}|AIza[0-9A-Za-z_-]{35}"
         r"|eyJ[A-Za-z0-9_-]{8,}\.eyJ[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]{8,})"
         r"|-----BEGIN[A-Z ]*PRIVATE KEY-----[\s\S]*?-----END[A-Z ]*PRIVATE KEY-----")

# In the order they run: keys and tokens before the digit patterns (a key holds digits), email before phone.
DETECTORS: dict[str, Detector] = {d.name: d for d in (
    Detector("api_key", re.compile(_KEYS), raw=(
        b"sk-", b"xox", b"eyJ", b"PRIVATE KEY-----", re.compile(rb"A(?:[KS]IA|Iza)"), re.compile(rb"k_(?:live|test)_"),
        re.compile(rb"g(?:h[pousr]_|ithub_pat_|lpat-)")), shortest=15),
    Detector("bearer_token", re.compile(r"\b(?:[Bb]earer|BEARER)\s+(?=[A-Za-z._~+/=-]*[0-9])[A-Za-z0-9._~+/=-]{16,}"),
             raw=(b"earer", b"EARER"), shortest=23),
    Detector("email", re.compile(_EMAIL), raw=(b"@",), shortest=6, needs="@"),
    Detector("iban", re.compile(_IBAN), shaped=(b"AA00",), valid=iban_ok, shortest=15),
    Detector("payment_card", re.compile(_CARD), shaped=(b"0" * 13, b"0000\x02000"), valid=_card, shortest=13),
    Detector("phone", re.compile(_PHONE), shaped=(b"+0", b"000\x020000", b"000\x010000"), valid=_phone, shortest=8),
    Detector("ip_address", re.compile(_IP), raw=(b"::",),
             shaped=(re.compile(rb"0\x010{1,3}\x010{1,3}\x010"), re.compile(rb":[0-9a-fA]{1,4}:[0-9a-fA]{1,4}:")),
             valid=_ip, shortest=3),
)}
assert set(DETECTORS) == set(get_args(DetectorName)), "config.DetectorName and DETECTORS name the same detectors"

ESCAPED = Detector("escaped", re.compile(r"\\u"), raw=(b"\\u",))  # a hint that calls every detector
# Bytes values, which decoders write as base64 text: a quoted run of base64 long enough to hold a match
# (8 characters: 6 bytes, the shortest email). Looked for only in a batch that holds bytes values.
BYTES = Detector("bytes", re.compile(r"(?:[A-Za-z0-9+/]{4})+(?:[A-Za-z0-9+/]{2}==|[A-Za-z0-9+/]{3}=)?"),
                 raw=(re.compile(rb'"(?:[A-Za-z0-9+/]{4}){2,}(?:[A-Za-z0-9+/]{2}==|[A-Za-z0-9+/]{3}=)?"'),), shortest=8)

_CARD_DETECTOR = DETECTORS["payment_card"]
_U_ESCAPE = re.compile(r"\\u([0-9A-Fa-f]{4})")


def _unescape(m: re.Match[str]) -> str:
    code = int(m.group(1), 16)
    return m.group() if 0xD800 <= code < 0xE000 else chr(code)  # a lone surrogate is no character to match


def _base64_text(value: str) -> str | None:
    """The UTF-8 text a base64 string (a bytes value) encodes; None when it is not one, or not text."""
    if len(value) < BYTES.shortest or len(value) % 4 or BYTES.pattern.fullmatch(value) is None:
        return None
    try:
        return base64.b64decode(value, validate=True).decode()
    except (binascii.Error, UnicodeDecodeError):
        return None


# ---------------------------------------------------------------------------- content keys
# Where instrumentations put message content and tool payloads, per convention (the names the
# semconv dialects read, and their neighbours); ``capture_content: false`` removes these values.

DROPPED_CONTENT_KEYS = frozenset({
    # OpenTelemetry GenAI
    "gen_ai.tool.call.arguments", "gen_ai.tool.call.result", "gen_ai.prompt", "gen_ai.completion",
    "gen_ai.event.content",
    # OpenInference
    "input.value", "output.value", "llm.prompts", "llm.prompt_template.variables",
    # OpenLLMetry / Traceloop
    "traceloop.entity.input", "traceloop.entity.output",
    # Vercel AI SDK
    "ai.prompt", "ai.toolCall.args", "ai.toolCall.result", "ai.response.text", "ai.response.object",
    "ai.response.reasoning", "ai.value", "ai.values",
    # Langfuse
    "langfuse.observation.input", "langfuse.observation.output", "langfuse.trace.input", "langfuse.trace.output",
    # Pydantic AI / Logfire
    "final_result", "tool_arguments", "tool_response",
    # Google ADK
    "gcp.vertex.agent.tool_call_args", "gcp.vertex.agent.tool_response", "gcp.vertex.agent.llm_request",
    "gcp.vertex.agent.llm_response",
    # MCP
    "mcp.request.argument", "mcp.response.value",
})
# Message lists: their structure stays (roles, part types, tool call names and ids), their text goes.
STRIPPED_CONTENT_KEYS = frozenset({
    "gen_ai.input.messages", "gen_ai.output.messages", "gen_ai.system_instructions", "llm.input_messages",
    "llm.output_messages", "ai.prompt.messages", "ai.response.toolCalls", "all_messages_events",
    "pydantic_ai.all_messages",
})
# Flattened message lists (``gen_ai.prompt.0.content``, ``llm.output_messages.0.message.content``): a key under
# one of these prefixes whose last segment is a content field is dropped.
FLATTENED_CONTENT_PREFIXES = ("gen_ai.prompt.", "gen_ai.completion.", "llm.input_messages.", "llm.output_messages.",
                              "retrieval.documents.", "reranker.input_documents.", "reranker.output_documents.",
                              "embedding.embeddings.")
# Inside a message structure: fields holding what was said or passed (dropped whatever their type) ...
PAYLOAD_FIELDS = frozenset({"arguments", "args", "input", "output", "result", "response", "tool_arguments",
                            "tool_response", "image_url", "data"})
# ... and fields holding text (dropped when a string; a list or object under them is stripped in turn).
TEXT_FIELDS = frozenset({"content", "text", "message", "value", "body", "reasoning", "thinking", "parts_text"})
CONTENT_EVENT_PREFIX = "gen_ai."  # span events and log records named gen_ai.*: their attributes and bodies are messages


def _flattened_content(key: str) -> bool:
    if not key.startswith(FLATTENED_CONTENT_PREFIXES):
        return False
    last = key.rsplit(".", 1)[-1]
    return last in TEXT_FIELDS or last in PAYLOAD_FIELDS


_scan_json = json.JSONDecoder().scan_once  # type: ignore[attr-defined]  # set in JSONDecoder.__init__, not in typeshed


def _parsed(text: str) -> Any:
    """A string holding one JSON object or array, parsed; ``None`` otherwise (or past the recursion limit)."""
    if text[:1] not in ("{", "[") and not text[:1].isspace():
        return None
    s = text.strip()
    if s[:1] not in ("{", "["):
        return None
    try:
        value, end = _scan_json(s, 0)
    except (StopIteration, ValueError, RecursionError):
        return None
    return value if end == len(s) else None


def strip_content(value: Any, counts: Counter[str]) -> Any:
    """A message structure without its content: payload fields dropped, text fields dropped when strings.

    JSON held in a string is stripped as what it holds and dumped again; other strings (roles,
    types, names, ids) are structure and stay.
    """
    if isinstance(value, dict):
        out = {}
        for k, v in value.items():
            if k in PAYLOAD_FIELDS or (k in TEXT_FIELDS and not isinstance(v, (dict, list)) and _parsed_or_none(v) is None):
                counts["content"] += 1
                continue
            out[k] = strip_content(v, counts)
        return out
    if isinstance(value, list):
        return [strip_content(v, counts) for v in value]
    if isinstance(value, str):
        inner = _parsed(value)
        if inner is not None:
            return json.dumps(strip_content(inner, counts), ensure_ascii=False)
    return value


def _parsed_or_none(value: Any) -> Any:
    return _parsed(value) if isinstance(value, str) else None


# ---------------------------------------------------------------------------- key rules


class KeyRule:
    """Attribute keys, exact or with ``*`` wildcards: ``matches(key)``, and hints for JSON text (``"key":``)."""

    def __init__(self, keys: Iterable[str]) -> None:
        keys = list(keys)
        self.exact = frozenset(k for k in keys if "*" not in k)
        globs = [k for k in keys if "*" in k]
        self._glob = re.compile("|".join(".*".join(map(re.escape, g.split("*"))) for g in globs)) if globs else None
        self.needles = tuple(json.dumps(k, ensure_ascii=False).encode() + b":" for k in sorted(self.exact))
        self.regex = re.compile(b"|".join(
            b'"' + b'[^"\\\\]*'.join(re.escape(part.encode()) for part in g.split("*")) + b'":' for g in globs)
        ) if globs else None

    def __bool__(self) -> bool:
        return bool(self.exact) or self._glob is not None

    def matches(self, key: str) -> bool:
        return key in self.exact or (self._glob is not None and self._glob.fullmatch(key) is not None)


# ---------------------------------------------------------------------------- the redactor

Active = tuple[Detector, ...]  # the detectors a text's hints call for, in DETECTORS order
KEYS_ONLY: Active = ()  # a text to parse for its keys (drop, hash, content) and no detector


class Redactor:
    """Compiled once from the settings; ``redact(batch)`` scrubs a decoded batch in place and counts what it did."""

    def __init__(self, settings: PrivacySettings, count: Callable[[str, int], None] | None = None) -> None:
        self.settings = settings
        self.count = count  # (counter label, n): the redactions counter, by detector or rule
        self.detectors: Active = tuple(DETECTORS[name] for name in DETECTORS if name in settings.detectors)
        self.replacements = {d.name: settings.replacement.format(name=d.name) for d in self.detectors}
        self.patterns = [(f"pattern:{p.name}", linear(p.regex, capture=True),
                          p.replacement if p.replacement is not None else settings.replacement.format(name=p.name))
                         for p in settings.patterns]
        self.drop = KeyRule(settings.drop_keys)
        self.hash = KeyRule(settings.hash_keys)
        self.capture_content = settings.capture_content
        self._key = settings.hash_key.get_secret_value().encode() if settings.hash_key is not None else b""
        self._hash_len = settings.hash_length
        # hints, each with the detector it stands for (None: a key rule's, the text is parsed for its keys)
        # without content capture (or with patterns of the user's, which have no hints) every text is parsed:
        # the content keys are too many to look for one by one, and most spans of an agent hold one
        self._every_row = bool(self.patterns) or not self.capture_content
        key_needles = [*self.drop.needles, *self.hash.needles]
        self._raw: list[tuple[Hint, Detector | None]] = [(n, None) for n in key_needles]
        self._raw += [(r.regex, None) for r in (self.drop, self.hash) if r.regex is not None]
        self._raw += [(h, d) for d in self.detectors for h in d.raw]
        if self.detectors:
            self._raw.append((ESCAPED.raw[0], ESCAPED))
        self._shaped: list[tuple[Hint, Detector | None]] = [(h, d) for d in self.detectors for h in d.shaped]

    # ------------------------------------------------------------------ hints
    def _scan(self, texts: list[str | None], bytes_values: int | None = 0) -> dict[int, Active]:
        """The rows of ``texts`` that may need redacting, with the detectors their hints call for.

        All rows are searched at once: joined into one text, each hint is looked for with one C
        search over it, and a hit is mapped back to its row (and the search resumes at the next).
        Without content capture, or with user patterns, every row is looked at (the hints still say
        which detectors each needs). With ``bytes_values`` (0: the batch has none; None: not known),
        base64 text is looked for too: a row holding some is scrubbed by every detector, its base64
        strings decoded (``BYTES`` ends its active detectors).
        """
        if not texts:
            return {}
        joined = "\x00".join(t or "" for t in texts)
        if joined.isascii():
            raw = joined.encode("ascii")
            lengths = map(len, texts) if all(texts) else (len(t or "") for t in texts)  # type: ignore[arg-type]  # all(texts): no None
        else:
            encoded = [(t or "").encode() for t in texts]
            raw = b"\x00".join(encoded)
            lengths = map(len, encoded)
        starts = list(accumulate(map((1).__add__, lengths), initial=0))  # starts[i]: where row i begins
        found: dict[int, set[Detector | None]] = {}

        def hits(hay: bytes, needle: Hint, what: Detector | None) -> None:
            if isinstance(needle, bytes):
                pos = hay.find(needle)
                while pos >= 0:
                    row = bisect_right(starts, pos) - 1
                    found.setdefault(row, set()).add(what)
                    pos = hay.find(needle, starts[row + 1])
            else:
                m = needle.search(hay)
                while m is not None:
                    row = bisect_right(starts, m.start()) - 1
                    found.setdefault(row, set()).add(what)
                    m = needle.search(hay, starts[row + 1])

        for needle, what in self._raw:
            hits(raw, needle, what)
        if bytes_values != 0 and self.detectors:
            hits(raw, BYTES.raw[0], BYTES)  # type: ignore[arg-type]
        if self._shaped:
            shaped = raw.translate(SHAPE)
            for needle, what in self._shaped:
                hits(shaped, needle, what)
        hinted = {row: self._active(kinds) for row, kinds in found.items()}
        if self._every_row:
            for i, t in enumerate(texts):
                if t:
                    hinted.setdefault(i, KEYS_ONLY)
        return hinted

    def _active(self, kinds: set[Detector | None]) -> Active:
        if BYTES in kinds:
            return (*self.detectors, BYTES)
        if ESCAPED in kinds:
            return self.detectors
        return tuple(d for d in self.detectors if d in kinds)

    # ------------------------------------------------------------------ values
    def hash_value(self, value: Any) -> str:
        """The keyed hash a ``hash_keys`` value becomes (strings as they are, other values as their JSON)."""
        text = value if isinstance(value, str) else to_json(value)
        return hmac.new(self._key, text.encode(), hashlib.sha256).hexdigest()[:self._hash_len]

    def text(self, value: str, counts: Counter[str], active: Active | None = None) -> str:
        """A string scrubbed: JSON it holds as what it holds, else the user's patterns and the ``active`` detectors."""
        active = self.detectors if active is None else active
        if active and active[-1] is BYTES:
            active = active[:-1]
            decoded = _base64_text(value)
            if decoded is not None:
                scrubbed = self.text(decoded, counts, active)
                return value if scrubbed == decoded else base64.b64encode(scrubbed.encode()).decode()
        inner = _parsed(value)
        if inner is not None:
            found: Counter[str] = Counter()
            try:
                scrubbed = self.value(inner, found, active)
            except RecursionError:  # nested past what Python walks: scrubbed as plain text below
                pass
            else:
                if not found:
                    return value
                counts.update(found)
                return json.dumps(scrubbed, ensure_ascii=False)
        if "\\u" in value:  # escapes written in plain text (a unit, a repr of JSON): scrubbed as what they spell
            unescaped = _U_ESCAPE.sub(_unescape, value)
            if unescaped != value:
                hits: Counter[str] = Counter()
                scrubbed = self.text(unescaped, hits, active)
                if hits:
                    counts.update(hits)
                    return scrubbed
        for label, pattern, replacement in self.patterns:
            value, n = pattern.subn(replacement, value)
            if n:
                counts[label] += n
        n = len(value)
        for d in active:
            if n >= d.shortest and (not d.needs or d.needs in value):
                value = self._detect(d, value, counts)
        return value

    def _detect(self, d: Detector, value: str, counts: Counter[str]) -> str:
        replacement = self.replacements[d.name]
        if d.valid is None:
            value, n = d.pattern.subn(replacement, value)
            if n:
                counts[d.name] += n
            return value
        valid = d.valid
        hits = 0

        def sub(m: re.Match[str]) -> str:
            nonlocal hits
            if valid(m.group()):
                hits += 1
                return replacement
            return m.group()

        value = d.pattern.sub(sub, value)
        if hits:
            counts[d.name] += hits
        return value

    def value(self, value: Any, counts: Counter[str], active: Active | None = None) -> Any:
        """Every string in a JSON-shaped value scrubbed (keys and numbers stay)."""
        if isinstance(value, str):
            return self.text(value, counts, active)
        if isinstance(value, dict):
            return {k: self.value(v, counts, active) for k, v in value.items()}
        if isinstance(value, list):
            return [self.value(v, counts, active) for v in value]
        if (type(value) is int and value >= 10**12 and _CARD_DETECTOR in (self.detectors if active is None else active)
                and _card_int(value)):
            counts["payment_card"] += 1
            return self.replacements["payment_card"]
        return value

    def attributes(self, attrs: dict[str, Any], counts: Counter[str], active: Active | None = None,
                   content_event: bool = False) -> dict[str, Any]:
        """One attribute map: keys dropped or hashed, content removed (``capture_content`` off), strings scrubbed
        (by the ``active`` detectors: all of them when not given)."""
        active = self.detectors if active is None else active
        out: dict[str, Any] = {}
        for k, v in attrs.items():
            if self.drop and self.drop.matches(k):
                counts["drop_key"] += 1
                continue
            if self.hash and self.hash.matches(k):
                counts["hash_key"] += 1
                out[k] = self.hash_value(v)
                continue
            if not self.capture_content:
                if k in DROPPED_CONTENT_KEYS or _flattened_content(k):
                    counts["content"] += 1
                    continue
                if k in STRIPPED_CONTENT_KEYS or content_event:
                    if k in TEXT_FIELDS and not isinstance(v, (dict, list)) and _parsed_or_none(v) is None:
                        counts["content"] += 1
                        continue
                    v = strip_content(v, counts)
            out[k] = self.value(v, counts, active) if active or self.patterns else v
        return out

    # ------------------------------------------------------------------ JSON text
    def _attributes_text(self, text: str, counts: Counter[str], active: Active,
                         content_event: bool = False) -> tuple[str, Any]:
        """An attribute map as JSON text: the text (the same object when unchanged) and its new value (or None)."""
        before = counts.total()
        new = self.attributes(from_json(text), counts, active, content_event)
        return (to_json(new), new) if counts.total() != before else (text, None)

    def _events_text(self, text: str, counts: Counter[str], active: Active) -> tuple[str, Any]:
        """A span's events (or links) as JSON text: each one's attributes as an attribute map."""
        before = counts.total()
        events = from_json(text)
        for e in events:
            if isinstance(e, dict) and isinstance(e.get("attributes"), dict):
                named = isinstance(e.get("name"), str) and e["name"].startswith(CONTENT_EVENT_PREFIX)
                e["attributes"] = self.attributes(e["attributes"], counts, active, not self.capture_content and named)
        return (to_json(events), events) if counts.total() != before else (text, None)

    def _body_text(self, text: str, counts: Counter[str], active: Active,
                   content_event: bool = False) -> tuple[str | None, Any]:
        """A log record's body as JSON text: the text (the same object when unchanged, None when removed) and value."""
        before = counts.total()
        body = from_json(text)
        if content_event:
            if isinstance(body, str) and _parsed(body) is None:  # a message's text, nothing of its structure
                counts["content"] += 1
                return None, None
            body = strip_content(body, counts)
        body = self.value(body, counts, active)
        return (to_json(body), body) if counts.total() != before else (text, None)

    # ------------------------------------------------------------------ batches
    def redact(self, batch: SpanBatch | LogBatch | MetricBatch) -> int:
        """Scrub a decoded batch in place (its views follow); returns how many values changed, counted by label."""
        counts: Counter[str] = Counter()
        if isinstance(batch, SpanBatch):
            self._spans(batch, counts)
        elif isinstance(batch, LogBatch):
            self._logs(batch, counts)
        else:
            self._metrics(batch, counts)
        if self.count is not None:
            for label, n in counts.items():
                self.count(label, n)
        return counts.total()

    def _maps(self, column: list[Any], counts: Counter[str], view: list[Any] | None = None,
              content_events: set[int] = frozenset(), bytes_values: int | None = 0) -> bool:  # type: ignore[assignment]
        """A column of attribute maps as JSON text, rewritten where redacted (and its view with it)."""
        hinted = self._scan(column, bytes_values)
        for i in content_events:
            hinted.setdefault(i, KEYS_ONLY)
        changed = False
        for i, active in hinted.items():
            text = column[i]
            if text is None:
                continue
            new, value = self._attributes_text(text, counts, active, i in content_events)
            if value is not None:
                column[i] = new
                changed = True
                if view is not None:
                    view[i] = value
        return changed

    def _resources(self, column: list[str], counts: Counter[str], bytes_values: int | None = 0) -> bool:
        """Resource attributes: the spans of one resource share one text, looked at once."""
        distinct = list(dict.fromkeys(column))
        before = list(distinct)
        if not self._maps(distinct, counts, bytes_values=bytes_values):
            return False
        new = {old: text for old, text in zip(before, distinct) if text is not old}
        for i, text in enumerate(column):
            if text in new:
                column[i] = new[text]
        return True

    def _plain(self, column: list[str | None], counts: Counter[str]) -> None:
        """A column of plain text (names, messages, descriptions), each distinct text looked at once."""
        if not (self.detectors or self.patterns):
            return
        distinct = list(dict.fromkeys(column))
        new = {}
        for i, active in self._scan(distinct).items():
            text = distinct[i]
            if text is not None and (active or self.patterns):
                scrubbed = self.text(text, counts, active)
                if scrubbed != text:
                    new[text] = scrubbed
        if new:
            for i, text in enumerate(column):
                if text in new:
                    column[i] = new[text]

    def _spans(self, batch: SpanBatch, counts: Counter[str]) -> None:
        # the views ``add`` keeps are updated row by row; those of the compiled decoder are not made yet
        nb = batch.bytes_values
        self._maps(batch.attributes, counts, batch._attrs or None, bytes_values=nb)
        for column, view in ((batch.events, batch._event_list or None), (batch.links, None)):
            for i, active in self._scan(column, nb).items():
                text = column[i]
                if text is not None:
                    new, value = self._events_text(text, counts, active)
                    if value is not None:
                        column[i] = new
                        if view is not None:
                            view[i] = value
        if self._resources(batch.resource_attributes, counts, nb):
            batch._resource_attrs = None  # parsed again, one dict per resource, when first read
        self._plain(batch.name, counts)  # type: ignore[arg-type]
        self._plain(batch.status_message, counts)

    def _logs(self, batch: LogBatch, counts: Counter[str]) -> None:
        nb = batch.bytes_values
        named = set() if self.capture_content else {
            i for i, name in enumerate(batch.event_name) if (name or "").startswith(CONTENT_EVENT_PREFIX)}
        self._maps(batch.attributes, counts, batch.attrs, named, nb)
        hinted = self._scan(batch.body, nb)
        for i in named:
            if batch.body[i] is not None:
                hinted.setdefault(i, KEYS_ONLY)
        for i, active in hinted.items():
            body = batch.body[i]
            if body is not None:
                new, value = self._body_text(body, counts, active, i in named)
                if new is not body:
                    batch.body[i] = new
                    batch.body_value[i] = value
        self._resources(batch.resource_attributes, counts, nb)

    def _metrics(self, batch: MetricBatch, counts: Counter[str]) -> None:
        columns, nb = batch.columns, batch.bytes_values
        self._maps(columns["attributes"], counts, bytes_values=nb)
        self._resources(columns["resource_attributes"], counts, nb)
        for name in ("metric_name", "description", "unit"):
            self._plain(columns[name], counts)
        exemplars = [e for es in columns["exemplars"] for e in es or ()]
        if exemplars:
            texts = [e["filtered_attributes"] for e in exemplars]
            if self._maps(texts, counts, bytes_values=nb):
                for e, text in zip(exemplars, texts):
                    e["filtered_attributes"] = text


def redactor_for(settings: PrivacySettings, count: Callable[[str, int], None] | None = None) -> Redactor | None:
    """The redactor of these settings, or None when they redact nothing (the pipeline then pays nothing)."""
    return Redactor(settings, count) if settings.enabled else None
