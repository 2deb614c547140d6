"""Display names for outcomes and steps, in English and Japanese, and the words for a criterion's result.
A stage's words (its name, what it asks, the evidence that answers it) are the stage's own
(``scoring.stages``: ``stage_label``, ``stage_question``, ``stage_check``).

Stored values and SQL filters never change with the language or variant: ``outcome`` holds the
value (``purchase_completed``), and these tables give what a person reads ("Booked" in a lodging
funnel, 「予約完了」 in Japanese).
"""

from __future__ import annotations

from .variants import outcome_labels as variant_outcome_labels

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

# Where a variant names an outcome its own way (lodging reads the shopping ladder in booking terms):
# from the variants' registry.
VARIANT_OUTCOME_LABELS: dict[str, dict[str, dict[str, str]]] = variant_outcome_labels()

READS_AS_LABELS = {
    "en": {"pass": "pass", "partial": "partial", "info": "info", "fail": "fail", "unknown": "unknown",
           "neutral": "neutral"},
    "ja": {"pass": "成功", "partial": "部分的", "info": "情報", "fail": "失敗", "unknown": "不明", "neutral": "中立"},
}

# What a person reads for a ``criterion_results.result``: the judge's per-criterion assessment
# (satisfied, missing, contradicted, unsupported), an assertion's outcome, or why nothing was assessed.
CRITERION_RESULTS = ("satisfied", "missing", "contradicted", "unsupported", "passed", "failed", "judge_missing",
                     "judge_error", "judge_pending", "not_assessed")
CRITERION_RESULT_LABELS = {
    "en": {"satisfied": "met", "missing": "not met", "contradicted": "contradicted", "unsupported": "unsupported",
           "passed": "passed", "failed": "failed", "judge_missing": "no judgment", "judge_error": "judge error",
           "judge_pending": "judgment pending", "not_assessed": "not assessed"},
    "ja": {"satisfied": "条件を満たす", "missing": "必要な情報が不足", "contradicted": "ツール結果と矛盾",
           "unsupported": "ツール結果で裏付けられない", "passed": "合格", "failed": "失敗", "judge_missing": "判定なし",
           "judge_error": "判定エラー", "judge_pending": "判定待ち", "not_assessed": "未評価"},
}


def outcome_label(outcome: str, variant: str | None = None, lang: str = "en") -> str:
    """What a person reads for a stored outcome value."""
    lang = lang if lang in LANGUAGES else "en"
    override = VARIANT_OUTCOME_LABELS.get(variant or "", {}).get(lang, {})
    return override.get(outcome) or OUTCOME_LABELS[lang].get(outcome, outcome)


def criterion_result_label(result: str, lang: str = "en") -> str:
    """A ``criterion_results.result`` as a person reads it; an unknown value is shown as stored."""
    return CRITERION_RESULT_LABELS[lang if lang in LANGUAGES else "en"].get(result, result)
