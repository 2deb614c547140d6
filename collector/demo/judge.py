"""The demo's scripted judge: a local endpoint that speaks the Anthropic Messages API and grades by rules.

``agentfunnel demo`` has no model to ask, and its funnel cases need a judge, so it starts this one
on loopback and points ``settings.judge`` at it: judgments then go the way every judgment goes
(the anthropic SDK, the verdict tool, the checks, the ``judgments`` table), with provenance that
says what graded them (model ``demo-scripted-judge``, a ``127.0.0.1`` base URL).

It grades the story, not the artifact, in the way an LLM judge reading a long spec tends to, and
it does so the same way every time, from the prompt alone:

- no artifact (or one without a list of steps): nothing to grade, every criterion missing, score 0;
- a criterion that states a number of steps ("Three steps", "six-step") is met when the spec has
  that many steps, and contradicted otherwise;
- a criterion that quotes a word ('written for a "dental" clinic') is met when the word appears
  somewhere in the spec's text (its name, titles, labels);
- any other criterion is taken as told: field types, routing and the graph are never checked.

Score: 1.0 when every criterion is met, else 0.5 when at least half are, else 0.25.
"""

from __future__ import annotations

import hashlib
import json
import re
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from ...scoring.judge import JudgeSettings
from ...scoring.judge.rubric import FENCE_TAG, VERDICT_TOOL

MODEL = "demo-scripted-judge"
API_KEY = "demo-scripted-judge"  # not a secret: the SDK needs a key to send, and this endpoint reads none
MAX_BODY_BYTES = 4 * 1024 * 1024  # a judge prompt is a few kB; anything far larger is not one
_NUMBERS = {w: i for i, w in enumerate(("zero one two three four five six seven eight nine ten eleven twelve").split())}
_STEP_COUNT = re.compile(r"\b(\d+|" + "|".join(_NUMBERS) + r")[ -]steps?\b", re.IGNORECASE)
_QUOTED = re.compile(r'"([^"]+)"')
_BLOCK = re.compile(rf'<{FENCE_TAG} name="([^"]+)">\n(.*?)\n</{FENCE_TAG}>', re.S)
_CRITERIA = re.compile(r"<criteria>\n(.*?)\n</criteria>", re.S)


def read_prompt(user: str) -> tuple[dict[str, Any], list[str]]:
    """The fenced blocks (name → value) and the criteria of a judge prompt built by ``rubric.build_prompt``."""
    blocks: dict[str, Any] = {}
    for name, line in _BLOCK.findall(user):
        try:
            blocks[name] = json.loads(line)
        except ValueError:
            blocks[name] = line
    criteria: list[str] = []
    found = _CRITERIA.search(user)
    for line in (found.group(1).splitlines() if found else []):
        number, _, rest = line.partition(". ")
        if number.isdigit():
            try:
                criteria.append(str(json.loads(rest)))
            except ValueError:
                criteria.append(rest)
    return blocks, criteria


def _texts(value: Any) -> list[str]:
    if isinstance(value, str):
        return [value]
    if isinstance(value, dict):
        return [t for v in value.values() for t in _texts(v)]
    if isinstance(value, list):
        return [t for v in value for t in _texts(v)]
    return []


def _assess(criterion: str, steps: list[Any], text: str) -> tuple[str, str]:
    """(status, evidence) of one criterion, by the rules in the module docstring."""
    count = _STEP_COUNT.search(criterion)
    if count:
        word = count.group(1).lower()
        wanted = int(word) if word.isdigit() else _NUMBERS[word]
        if len(steps) != wanted:
            return "contradicted", f"the spec has {len(steps)} steps, the task asks for {wanted}"
        return "satisfied", f"the spec has {len(steps)} steps"
    quoted = _QUOTED.findall(criterion)
    if quoted:
        absent = [q for q in quoted if q.lower() not in text]
        if absent:
            return "missing", f"the spec never mentions {', '.join(repr(a) for a in absent)}"
        return "satisfied", f"the spec mentions {', '.join(repr(q) for q in quoted)}"
    return "satisfied", "the spec reads as the task describes"


def grade(user: str) -> dict[str, Any]:
    """The verdict for one judge prompt: the ``record_verdict`` input, consistent by construction."""
    blocks, criteria = read_prompt(user)
    artifact = blocks.get("artifact")
    spec = artifact.get("value") if isinstance(artifact, dict) else None
    steps = spec.get("steps") if isinstance(spec, dict) else None
    if not isinstance(steps, list):
        return {"status": "incomplete", "score": 0.0, "missing_requirements": ["a saved funnel spec"],
                "unsupported_claims": [],
                "criteria": [{"criterion": c, "status": "missing", "evidence": "no spec was produced"}
                             for c in criteria],
                "explanation": "There is no funnel spec to grade."}
    text = " ".join(_texts(spec)).lower()
    assessed = [(c, *_assess(c, steps, text)) for c in criteria]
    met = sum(1 for _, status, _ in assessed if status == "satisfied")
    complete = met == len(assessed)
    score = 1.0 if complete else 0.5 if met * 2 >= len(assessed) else 0.25
    return {"status": "complete" if complete else "incomplete", "score": score,
            "missing_requirements": [c for c, status, _ in assessed if status != "satisfied"],
            "unsupported_claims": [],
            "criteria": [{"criterion": c, "status": status, "evidence": evidence} for c, status, evidence in assessed],
            "explanation": (f"The {len(steps)}-step spec matches the funnel the task describes." if complete else
                            f"The {len(steps)}-step spec meets {met} of {len(assessed)} criteria.")}


def _message(body: dict[str, Any]) -> dict[str, Any]:
    messages = body.get("messages") or [{}]
    content = messages[0].get("content", "") if isinstance(messages[0], dict) else ""
    user = content if isinstance(content, str) else " ".join(
        b.get("text", "") for b in content if isinstance(b, dict))
    digest = hashlib.sha256(user.encode()).hexdigest()
    return {"id": f"msg_demo_{digest[:24]}", "type": "message", "role": "assistant", "model": MODEL,
            "content": [{"type": "tool_use", "id": f"toolu_demo_{digest[24:44]}", "name": VERDICT_TOOL,
                         "input": grade(user)}],
            "stop_reason": "tool_use", "stop_sequence": None,
            "usage": {"input_tokens": len(user) // 4, "output_tokens": 160}}


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *args: Any) -> None:
        pass  # the demo prints its report, not an access log

    def _send(self, status: int, doc: dict[str, Any]) -> None:
        data = json.dumps(doc).encode()
        self.send_response(status)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _error(self, status: int, kind: str, message: str) -> None:
        self._send(status, {"type": "error", "error": {"type": kind, "message": message}})

    def do_POST(self) -> None:  # noqa: N802 - the http.server hook
        if self.path.split("?", 1)[0].rstrip("/") != "/v1/messages":
            return self._error(404, "not_found_error", f"no such endpoint: {self.path[:200]}")
        try:
            length = int(self.headers.get("content-length", "0"))
        except ValueError:
            length = -1
        if not 0 < length <= MAX_BODY_BYTES:
            self.close_connection = True
            return self._error(400, "invalid_request_error", f"the body must be 1 to {MAX_BODY_BYTES} bytes")
        try:
            body = json.loads(self.rfile.read(length))
            if not isinstance(body, dict):
                raise ValueError("not an object")
        except ValueError as exc:
            return self._error(400, "invalid_request_error", f"the body is not a JSON object: {exc}")
        self._send(200, _message(body))


class DemoJudge:
    """The scripted judge on a free loopback port, in a thread; a context manager."""

    def __init__(self) -> None:
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self._thread = threading.Thread(target=self.server.serve_forever, name="agentfunnel-demo-judge", daemon=True)

    def settings(self, base: JudgeSettings) -> JudgeSettings:
        """``base`` pointed at this judge: its model name and URL, free, and not paced like a paid API."""
        return base.model_copy(update={"model": MODEL, "api_key": API_KEY, "base_url": self.url,
                                       "input_price_per_mtok": 0.0, "output_price_per_mtok": 0.0,
                                       "requests_per_minute": 60_000, "timeout_seconds": 30.0})

    def __enter__(self) -> "DemoJudge":
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.shutdown()
        self.server.server_close()
        self._thread.join(timeout=10)
