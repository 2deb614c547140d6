"""Running the rules: every ``monitors.interval_seconds`` in ``serve``, or once (``agentfunnel monitors check``,
the admin endpoint's ``/monitors/check``). Each firing is posted to the webhook and stored with how its
delivery went; the last evaluation of each rule is exposed on ``/metrics``.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import logging
import threading
from collections.abc import Callable
from typing import Any

from .engine import Evaluation, evaluate, is_repeat, rule_hash
from .measures import Rows
from .settings import MonitorSettings
from .table import PREVIOUS_SQL, firing_row, insert
from .webhook import post, slack_body

log = logging.getLogger(__name__)


def utcnow() -> dt.datetime:
    return dt.datetime.now(dt.timezone.utc).replace(tzinfo=None)


class MonitorService:
    """Evaluates every rule over ``rows`` and stores firings through ``store`` (a callable taking the rows)."""

    def __init__(self, settings: MonitorSettings, rows: Rows, store: Callable[[list[dict[str, Any]]], Any],
                 count: Callable[[str, str], None], ui_base: Callable[[], str | None] = lambda: None) -> None:
        self.settings = settings
        self._rows = rows
        self._store = store
        self._count = count
        self._ui_base = ui_base
        self._lock = threading.Lock()
        self.last: dict[str, Evaluation] = {}
        self.fired: dict[str, int] = {r.name: 0 for r in settings.rules}

    def check(self, now: dt.datetime | None = None) -> list[dict[str, Any]]:
        """Evaluate every rule once; return the firings stored (a rule that fails is logged and counted)."""
        now = now or utcnow()
        stored = []
        with self._lock:
            for rule in self.settings.rules:
                try:
                    ev = evaluate(rule, now, self._rows, self.settings)
                except Exception as exc:  # noqa: BLE001 - one rule's failure never stops the others
                    self._count("monitor_evaluations", "error")
                    log.warning("monitor %s could not be evaluated: %s", rule.name, exc)
                    continue
                self.last[rule.name] = ev
                if ev.fires:
                    previous = self._rows(PREVIOUS_SQL, {"monitor": rule.name, "rule_hash": rule_hash(rule)})
                    if is_repeat(ev, previous):
                        self._count("monitor_evaluations", "repeat")
                        continue
                self._count("monitor_evaluations", ev.result)
                if not ev.fires:
                    continue
                row = firing_row(ev, now)
                if self.settings.webhook is not None:
                    sent = post(self.settings.webhook, slack_body(row, self._ui_base()), self._count)
                    row.update(delivered=sent.delivered, delivery_attempts=sent.attempts, delivery_error=sent.error)
                self._store([row])
                self.fired[rule.name] = self.fired.get(rule.name, 0) + 1
                stored.append(row)
        return stored

    async def run(self) -> None:
        """Check every ``interval_seconds`` until cancelled, in a thread (the statements and the webhook block)."""
        loop = asyncio.get_running_loop()
        while True:
            await asyncio.sleep(self.settings.interval_seconds)
            try:
                await loop.run_in_executor(None, self.check)
            except Exception:  # noqa: BLE001 - logged; the next round tries again
                log.exception("monitors could not be checked")

    def prometheus(self) -> list[str]:
        """Per monitor: its last value and p-value, whether its last evaluation fired, and its firings so far."""
        if not self.settings.rules:
            return []
        out: list[str] = []
        series = (
            ("agentfunnel_monitor_value", "gauge", "The measure's value in the monitor's last evaluated window.",
             lambda ev: ev.value),
            ("agentfunnel_monitor_p_value", "gauge", "The p-value of the monitor's last test (absent: not tested).",
             lambda ev: ev.p_value),
            ("agentfunnel_monitor_sample", "gauge", "Sessions (runs, labels) the monitor's last window held.",
             lambda ev: ev.n),
            ("agentfunnel_monitor_firing", "gauge", "1 when the monitor's last evaluation found a significant "
             "change (fired now or already reported for this window), else 0.", lambda ev: 1 if ev.fires else 0),
        )
        for metric, kind, help_text, read in series:
            out += [f"# HELP {metric} {help_text}", f"# TYPE {metric} {kind}"]
            for name, ev in sorted(self.last.items()):
                value = read(ev)
                if value is not None:
                    out.append(f'{metric}{{monitor="{name}"}} {float(value):g}')
        metric = "agentfunnel_monitor_firings_total"
        out += [f"# HELP {metric} Firings stored by this process, per monitor.", f"# TYPE {metric} counter"]
        out += [f'{metric}{{monitor="{name}"}} {n}' for name, n in sorted(self.fired.items())]
        return out


def for_store(settings: MonitorSettings, rows: Rows, store: Any, metrics: Any,
              ui_base: Callable[[], str | None] = lambda: None) -> MonitorService:
    """The service of a running server: reads through ``rows`` (the server's reader, within the ``sql``
    bounds), firings written in the store writer's transaction, counters and per-monitor series in ``metrics``."""

    def write(found: list[dict[str, Any]]) -> None:
        store.submit_job(lambda con: insert(con, found)).result(timeout=120)

    service = MonitorService(settings, rows, write,
                             lambda name, label: metrics.inc(name, label=label), ui_base)
    metrics.exposition(service.prometheus)
    return service
