"""Display names for outcomes, steps and stages, in English and Japanese.

Stored values and SQL filters never change with the language or variant: ``outcome`` holds the
value (``purchase_completed``), and these tables give what a person reads ("Booked" in a lodging
funnel, 「予約完了」 in Japanese).
"""

from __future__ import annotations

LANGUAGES = ("en", "ja")

OUTCOME_READS_AS = {
    "purchase_completed": "pass",
    "checkout_reached": "pass",
    "cart_created": "partial",
    "po_submitted": "pass",
    "quote_received": "partial",
    "rfq_submitted": "partial",
    "search_only": "partial",
    "info_provided": "info",
    "failed": "fail",
    "abandoned": "unknown",
    "action_taken": "pass",
    "read_only": "partial",
    "no_activity": "neutral",
}

OUTCOME_LABELS: dict[str, dict[str, str]] = {
    "en": {
        "purchase_completed": "Purchase Completed",
        "checkout_reached": "Checkout Reached",
        "cart_created": "Cart Created",
        "po_submitted": "PO Submitted",
        "quote_received": "Quote Received",
        "rfq_submitted": "RFQ Submitted",
        "search_only": "Search Only",
        "info_provided": "Info Provided",
        "failed": "Failed",
        "abandoned": "Abandoned",
        "action_taken": "Action Taken",
        "read_only": "Read Only",
        "no_activity": "No Activity",
    },
    "ja": {
        "purchase_completed": "購入完了",
        "checkout_reached": "チェックアウト到達",
        "cart_created": "カート作成",
        "po_submitted": "発注書提出",
        "quote_received": "見積受領",
        "rfq_submitted": "見積依頼送信",
        "search_only": "検索のみ",
        "info_provided": "情報提供",
        "failed": "失敗",
        "abandoned": "離脱",
        "action_taken": "操作実行",
        "read_only": "参照のみ",
        "no_activity": "操作なし",
    },
}

# Lodging reads the shopping ladder in booking terms.
VARIANT_OUTCOME_LABELS: dict[str, dict[str, dict[str, str]]] = {
    "lodging": {
        "en": {"purchase_completed": "Booked", "checkout_reached": "Booking Attempted", "cart_created": "Room Held"},
        "ja": {"purchase_completed": "予約完了", "checkout_reached": "予約手続き到達", "cart_created": "部屋確保"},
    },
}

READS_AS_LABELS = {
    "en": {"pass": "pass", "partial": "partial", "info": "info", "fail": "fail", "unknown": "unknown",
           "neutral": "neutral"},
    "ja": {"pass": "成功", "partial": "部分的", "info": "情報", "fail": "失敗", "unknown": "不明", "neutral": "中立"},
}

STAGES = ("discovery", "selection", "tool_resolution", "invocation", "execution", "result_usability", "completion")
STAGE_LABELS = {
    "en": {"discovery": "Discovery", "selection": "Selection", "tool_resolution": "Tool Resolution",
           "invocation": "Invocation", "execution": "Execution", "result_usability": "Result Usability",
           "completion": "Completion"},
    "ja": {"discovery": "発見", "selection": "選択", "tool_resolution": "ツール解決", "invocation": "呼び出し",
           "execution": "実行", "result_usability": "結果の有用性", "completion": "完了"},
}


def outcome_label(outcome: str, variant: str | None = None, lang: str = "en") -> str:
    """What a person reads for a stored outcome value."""
    lang = lang if lang in LANGUAGES else "en"
    override = VARIANT_OUTCOME_LABELS.get(variant or "", {}).get(lang, {})
    return override.get(outcome) or OUTCOME_LABELS[lang].get(outcome, outcome)


def stage_label(stage: str, lang: str = "en") -> str:
    return STAGE_LABELS.get(lang if lang in LANGUAGES else "en", {}).get(stage, stage)
