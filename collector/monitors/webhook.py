"""Posting a firing to a Slack-compatible incoming webhook: ``{"text": ..., "blocks": [...]}``.

The URL comes from the configuration only. Text that may come from telemetry (agent versions,
session ids) is escaped for Slack's mrkdwn (``&``, ``<``, ``>``, so nothing becomes a link or a
mention) and cut to a bound. Each attempt has a time bound; a timeout, a connection error, 429 or
5xx is retried ``retries`` times with doubling waits, each retry counted (monitor_webhook_retries),
and the outcome counted (monitor_webhook_sends by result).
"""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from .settings import WebhookSettings

MAX_TEXT = 2900  # Slack's section text limit is 3000 characters
MAX_SESSIONS_LISTED = 5


def mrkdwn(value: Any, limit: int = 300) -> str:
    """``value`` as inert Slack mrkdwn text: control characters dropped, ``& < >`` escaped, cut to ``limit``."""
    text = "".join(ch for ch in str(value) if ch >= " " or ch == "\n")
    if len(text) > limit:
        text = text[: limit - 1] + "…"
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def slack_body(row: dict[str, Any], ui_base: str | None = None) -> dict[str, Any]:
    """The JSON a firing is posted as."""
    title = f"agentfunnel monitor {mrkdwn(row['monitor'], 80)} fired"
    detail = mrkdwn(row["message"], 1500)
    lines = [f"*{title}*", detail]
    if row.get("session_ids"):
        shown = ", ".join(f"`{mrkdwn(s, 120)}`" for s in row["session_ids"][:MAX_SESSIONS_LISTED])
        lines.append(f"Sessions behind it: {shown}" + (" …" if len(row["session_ids"]) > MAX_SESSIONS_LISTED else ""))
    if ui_base:
        lines.append(f"<{ui_base}monitors/{row['firing_id']}|Open in agentfunnel>")
    text = "\n".join(lines)[:MAX_TEXT]
    return {"text": f"{title}: {detail}"[:MAX_TEXT],
            "blocks": [{"type": "section", "text": {"type": "mrkdwn", "text": text}}]}


@dataclass(frozen=True)
class Delivery:
    delivered: bool
    attempts: int
    error: str | None = None


def post(settings: WebhookSettings, body: dict[str, Any], count: Callable[[str, str], None],
         sleep: Callable[[float], None] = time.sleep) -> Delivery:
    """POST ``body``; retry what may pass on a later try; never raises."""
    data = json.dumps(body).encode()
    url = settings.url.get_secret_value()
    attempts, error = 0, None
    for attempt in range(settings.retries + 1):
        if attempt:
            count("monitor_webhook_retries", "")
            sleep(settings.backoff_seconds * 2 ** (attempt - 1))
        attempts += 1
        req = urllib.request.Request(url, data=data, method="POST",
                                     headers={"Content-Type": "application/json", "User-Agent": "agentfunnel"})
        try:
            with urllib.request.urlopen(req, timeout=settings.timeout_seconds) as resp:
                resp.read(65536)
            count("monitor_webhook_sends", "delivered")
            return Delivery(True, attempts)
        except urllib.error.HTTPError as exc:
            error = f"HTTP {exc.code}"
            if exc.code != 429 and exc.code < 500:
                count("monitor_webhook_sends", "refused")
                return Delivery(False, attempts, error)
        except (urllib.error.URLError, TimeoutError, OSError) as exc:
            reason = getattr(exc, "reason", exc)
            error = "timed out" if isinstance(reason, TimeoutError) or "timed out" in str(reason) else \
                f"cannot connect ({type(reason).__name__})"
    count("monitor_webhook_sends", "failed")
    return Delivery(False, attempts, error)
