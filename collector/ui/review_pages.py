"""The UI's review pages: the queue (``collector.review_queue``) with the audit's agreement figures above it, and
a session page's review block (its judge calls to label, and "add as a case"). The forms post to the writes in
``writes``; they are drawn only where a write can succeed (``ctx.extra["writes"]``), each with the CSRF token."""

from __future__ import annotations

from typing import Any

from ...scoring.judge_audit import VERDICT
from ..judge_audit import audit_report
from ..review_queue import build_queue, session_items
from .pages import Context, _render
from .queries import Reader

WORDS = {
    "en": {"title": "Review", "agreement": "Judge vs people", "labels": "labels", "agree": "agree", "kappa": "kappa",
           "no_labels": "No labels yet: label the judge's calls below (or import them with agentfunnel judge audit "
           "import) and the agreement shows here.", "criterion": "Criterion", "verdict": "verdict (the run's completion)",
           "overall": "overall", "queue": "Judge calls to label", "session": "Session", "source": "From",
           "sample": "audit sample", "judge": "Judge said", "yours": "Label", "met": "met", "not_met": "not met",
           "labeler": "Your name", "note": "Note", "empty": "Nothing to label: no stored verdict of the judge in the "
           "experiments {glob} (ui.review_experiments), and no firing's session with one.",
           "unjudged": "Behind monitor firings, without a judgment: read them, draft a case from them",
           "read_only": "Labels and drafts are written by agentfunnel serve with admin.token set (sign in with it); "
           "this UI only reads.", "monitor": "monitor {m}", "add_case": "Add as a case", "case_id": "Case id",
           "suite": "Drafts the case agentfunnel cases add --from-session drafts into {suite}.",
           "no_suite": "Set cases.suite to a YAML file to add this session as a case.",
           "drafted": "Case {id} was added to the suite: review its task, intent and criteria there.",
           "labelled": "Label stored.", "review_block": "Review", "nothing": "No judge's verdict to label on this session."},
    "ja": {"title": "レビュー", "agreement": "判定者と人の一致", "labels": "件のラベル", "agree": "一致率", "kappa": "カッパ",
           "no_labels": "ラベルはまだありません。下の判定にラベルを付ける (または agentfunnel judge audit import で取り込む) "
           "と一致率がここに出ます。", "criterion": "基準", "verdict": "判定 (実行の完了)", "overall": "全体",
           "queue": "ラベル付けする判定", "session": "セッション", "source": "出所", "sample": "監査の標本",
           "judge": "判定者", "yours": "ラベル", "met": "満たす", "not_met": "満たさない", "labeler": "名前", "note": "メモ",
           "empty": "ラベル付けするものはありません: 実験 {glob} (ui.review_experiments) に保存された判定も、"
           "判定のある発火のセッションもありません。",
           "unjudged": "モニターの発火の背後にある判定のないセッション: 読んで、ケースにできます",
           "read_only": "ラベルとケースの下書きは admin.token を設定した agentfunnel serve が書きます (そのトークンで"
           "サインイン)。この UI は読むだけです。", "monitor": "モニター {m}", "add_case": "ケースとして追加",
           "case_id": "ケース ID", "suite": "agentfunnel cases add --from-session と同じ下書きを {suite} に追加します。",
           "no_suite": "このセッションをケースにするには cases.suite に YAML ファイルを設定してください。",
           "drafted": "ケース {id} をスイートに追加しました。タスク、意図、基準を確認してください。",
           "labelled": "ラベルを保存しました。", "review_block": "レビュー",
           "nothing": "このセッションにはラベル付けする判定がありません。"},
}


def _words(ctx: Context) -> Any:
    table = WORDS.get(ctx.lang, WORDS["en"])
    return lambda key, **kw: table[key].format(**kw)


def review_page(reader: Reader, settings: Any, ctx: Context) -> str:
    """The queue of ``settings`` (config.UISettings) and the agreement over every stored label."""
    queue = build_queue(reader, settings.review_experiments, settings.review_sample, settings.review_firings,
                        settings.review_firing_sessions)
    report = audit_report(reader)
    return _render("review.html", ctx, queue=queue, report=report, verdict=VERDICT, rw=_words(ctx),
                   glob=settings.review_experiments)


def session_block(reader: Reader, session: dict[str, Any], ctx: Context, suite: str | None) -> str:
    """A session page's review block: its judge calls to label and the "add as a case" form."""
    items = session_items(reader, session["session_id"])
    default_id = session.get("case_id") or f"from-{session['session_id']}"
    return _render("review_block.html", ctx, items=items, s=session, verdict=VERDICT, rw=_words(ctx), suite=suite,
                   default_id=default_id[:200])
