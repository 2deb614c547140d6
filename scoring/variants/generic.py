"""Generic: any session no commerce service or tool claims; its steps are kinds of activity (a tool
listing or any call discovers, read tools read, state-changing tools act), read from MCP tool
annotations where present, else from the configured action name patterns."""

from __future__ import annotations

from .base import Activity, Proof, Reading, Step, Variant


def activity_rung(r: Reading) -> str | None:
    if not r.steps:
        return None if r.stopped_by_error else "no_activity"
    return "action_taken" if "action" in r.steps else "read_only"


def discovered(a: Activity) -> frozenset[str]:
    return frozenset({"discover"}) if a.listed or a.worked else frozenset()


VARIANT = Variant(
    key="generic",
    names={"en": "Generic", "ja": "汎用"},
    steps=(Step("discover", "Discover Tools", "ツール探索"), Step("read", "Read / Query", "参照・検索"),
           Step("action", "Action", "操作")),
    ladder=activity_rung,
    rungs=("action_taken", "read_only", "no_activity"),
    proofs={"action_taken": Proof(steps=("action",)), "read_only": Proof(steps=("read", "discover"))},
    dropoff=None,
    reach=discovered,
    by_activity=True,
    fallback=True,
    priority=1000,
)
