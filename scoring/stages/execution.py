"""Execution: does the operation succeed on the declared path? (SPEC §6)"""

from __future__ import annotations

from typing import Any

from ..config import matches
from .base import Context, StageSpec
from .reading import short


def check(ctx: Context) -> tuple[str, dict[str, Any]]:
    case = ctx.case
    calls = ctx.plan_calls
    if not calls:
        return "not_applicable", {"reason": "no tool call to execute"}
    effective = ctx.judged_calls
    failed = [{"tool": c.name, "error": short(c.error), "status": c.record.status_code}
              for c in effective.values() if not c.ok]
    recovered = [{"tool": c.name, "error": short(c.error)} for c in calls if not c.ok and effective[c.name] is not c
                 and effective[c.name].ok]
    ev: dict[str, Any] = {"calls": [{"tool": c.name, "ok": c.ok, "servers": list(c.servers)}
                                    for c in effective.values()],
                          "errors": failed, "recovered": recovered}
    if case.expected_server:
        expected = (case.expected_server.lower(),)
        wrong = [{"tool": c.name, "ran_on": list(c.servers)} for c in effective.values()
                 if c.servers and not any(matches(s.lower(), expected) for s in c.servers)]
        unknown = [c.name for c in effective.values() if not c.servers]
        ev.update(expected_server=case.expected_server, wrong_server=wrong, server_unknown=unknown)
        if not failed and not wrong and unknown:
            return "missing", {**ev, "reason": "the trace does not show which server the call ran on"}
        failed = failed + wrong
    return ("failed" if failed else "passed"), ev


STAGE = StageSpec(
    key="execution", order=50,
    label={"en": "Execution", "ja": "実行"},
    question={"en": "Does the operation succeed on the declared path?", "ja": "設定した実行経路で操作が成功するか？"},
    evidence={"en": "the tool call's status, error and server",
              "ja": "設定したツール環境での実行記録"},
    fix={"en": "the tool's error and the server the call ran on",
         "ja": "ツールのエラーと呼び出しが実行されたサーバー"},
    run=check)
