"""The demo's end users: thumbs, stars and comments on some of its production sessions, a few disagreeing with
the proven outcome, sent the two ways an application would send them (``POST /v1/feedback`` with the ingest
token, and OTLP log records through the SDK's exporter)."""

from __future__ import annotations

import json
import random
import urllib.request
import zlib
from datetime import datetime, timedelta
from typing import Any

SHARE = 0.4  # of production sessions that get feedback
DISAGREE = 0.25  # of those, the user's verdict goes against the proven outcome
EPOCH = datetime(1970, 1, 1)
COMMENTS = {
    "positive": ["Found exactly what I wanted.", "Quick and easy.", "Helpful, thanks!", "Good suggestions."],
    "negative": ["It never showed me the checkout.", "Could not pick my size.", "The results were not what I asked for.",
                 "Too slow, I gave up."],
}


def plan(sessions: list[tuple[str, str | None, str | None, datetime | None]], seed: int) -> list[dict[str, Any]]:
    """Feedback items for (session_id, outcome_reads_as, user_id, last_seen) rows, the same for the same seed. A
    user answers 30 s to 5 min after their session's last span, so stored times keep their order with the
    sessions' however fast the demo runs."""
    rng = random.Random(seed * 7919 + 45)
    items = []
    contrary: set[bool] = set()  # the first session we call a success, and a failure, always disagree
    for sid, reads_as, user, last_seen in sorted(sessions, key=lambda row: row[0]):
        if rng.random() >= SHARE:
            continue
        good = reads_as in ("pass", "info")
        called = reads_as in ("pass", "fail", "partial", "unknown")
        if called and (good not in contrary or rng.random() < DISAGREE):
            contrary.add(good)
            good = not good
        said = "positive" if good else "negative"
        item: dict[str, Any] = {"id": f"demo-{sid}", "session_id": sid, "comment": rng.choice(COMMENTS[said])}
        if rng.random() < 0.5:
            item["thumbs"] = "up" if good else "down"
        else:
            item |= {"score": rng.choice([4, 5]) if good else rng.choice([1, 2]), "score_max": 5}
        if user:
            item["user_id"] = user
        if last_seen is not None:
            item["time"] = (last_seen + timedelta(seconds=30 + zlib.crc32(sid.encode()) % 270)).isoformat() + "Z"
        items.append(item)
    return items


def send(http_url: str, token: str | None, items: list[dict[str, Any]]) -> int:
    """Every other item over the endpoint, the rest as OTLP log records; how many were sent."""
    by_http, by_otlp = items[::2], items[1::2]
    if by_http:
        req = urllib.request.Request(http_url + "/v1/feedback", data=json.dumps({"feedback": by_http}).encode(),
                                     headers={"Content-Type": "application/json",
                                              **({"Authorization": f"Bearer {token}"} if token else {})})
        with urllib.request.urlopen(req, timeout=60) as resp:
            resp.read()
    if by_otlp:
        _send_logs(http_url, token, by_otlp)
    return len(items)


def _send_logs(http_url: str, token: str | None, items: list[dict[str, Any]]) -> None:
    from opentelemetry.exporter.otlp.proto.http._log_exporter import OTLPLogExporter
    from opentelemetry.sdk._logs import LoggerProvider
    from opentelemetry.sdk._logs.export import SimpleLogRecordProcessor
    from opentelemetry.sdk.resources import Resource

    provider = LoggerProvider(resource=Resource.create({"service.name": "demo-shop-frontend"}))
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    provider.add_log_record_processor(SimpleLogRecordProcessor(OTLPLogExporter(endpoint=http_url + "/v1/logs",
                                                                              headers=headers)))
    logger = provider.get_logger("demo.feedback")
    for item in items:
        attrs: dict[str, Any] = {"gen_ai.evaluation.name": "user_feedback", "gen_ai.conversation.id": item["session_id"],
                                 "gen_ai.evaluation.explanation": item["comment"], "agentfunnel.feedback.id": item["id"]}
        if "thumbs" in item:
            attrs["gen_ai.evaluation.score.label"] = item["thumbs"]
        else:
            attrs |= {"gen_ai.evaluation.score.value": float(item["score"]),
                      "agentfunnel.feedback.score.max": float(item["score_max"])}
        if item.get("user_id"):
            attrs["user.id"] = item["user_id"]
        when = datetime.fromisoformat(item["time"].removesuffix("Z")) if item.get("time") else None
        logger.emit(event_name="gen_ai.evaluation.result", attributes=attrs,
                    timestamp=round((when - EPOCH).total_seconds() * 1e9) if when else None)
    provider.shutdown()


def send_demo_feedback(server: Any, http_url: str, seed: int) -> int:
    """Feedback on the demo's closed production sessions, committed before this returns."""
    with server.store.reader() as cur:
        rows = cur.execute("SELECT session_id, outcome_reads_as, user_id, last_seen FROM sessions "
                           "WHERE case_id IS NULL AND status = 'closed'").fetchall()
    sent = send(http_url, server.settings.receivers.bearer_token, plan([tuple(r) for r in rows], seed))
    server.store.submit_job(lambda con: None).result(timeout=60)  # after the log records' feedback jobs
    return sent
