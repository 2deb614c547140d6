"""Feedback beside the proven outcome and the judge, drawn for the terminal, the HTML report and the UI.

Every value from telemetry (comments, labels, session ids, user ids) is escaped for where it goes:
``data_text`` for the terminal (no markup, controls made visible), ``esc`` for HTML.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from rich import box
from rich.console import RenderableType
from rich.table import Table
from rich.text import Text

from ..phrasing import plural
from .text import clip_width, drop_reason_name, lang_of, pct, variant_name
from ..terminal import data_text
from ..feedback.analysis import FeedbackView, Row, session_verdict, we_say

WORDS: dict[str, dict[str, str]] = {
    "en": {
        "title": "User feedback", "items": "{n} on {s}.", "item": "feedback item", "session_noun": "session",
        "pending": "{n} not joined to a session yet (its session has not arrived).",
        "agreement": "Users agree with the proven outcome on {p} of the sessions both call.",
        "matrix": "Proven outcome against users", "we_say": "We call it", "users": "Users",
        "success": "success", "failure": "failure", "no_call": "no call", "positive": "happy", "negative": "unhappy",
        "neutral": "neutral", "unhappy_on_success": "unhappy, we say success",
        "happy_on_failure": "happy, we say failure", "by_step": "By furthest step reached",
        "by_reason": "By drop-off reason", "step": "Step", "reason": "Drop-off reason", "sessions": "Sessions",
        "judge_mean": "Judge (mean)", "disagreements": "Sessions where users and the proven outcome disagree",
        "session": "Session", "outcome": "Outcome", "judge": "Judge", "comment": "Comment",
        "none_session": "No feedback on this session.", "time": "Time", "source": "Source", "user": "User",
        "score": "Score", "label": "Label", "said": "Said", "joined_by": "Joined by",
        "verdict": "Users say {u}; the proven outcome says {w}", "judge_is": "judge {j}",
        "disagree": "Users and the proven outcome disagree.", "cut": "cut",
        "no_step": "(no step)",
    },
    "ja": {
        "title": "ユーザーフィードバック", "items": "{s} セッションに {n} 件のフィードバック", "item": "",
        "session_noun": "",
        "pending": "{n} 件はまだセッションに結び付いていません(セッションが未着)",
        "agreement": "両方が判定したセッションのうち {p} でユーザーと実証済みの結果が一致",
        "matrix": "実証済みの結果とユーザー", "we_say": "判定", "users": "ユーザー",
        "success": "成功", "failure": "失敗", "no_call": "判定なし", "positive": "満足", "negative": "不満",
        "neutral": "中立", "unhappy_on_success": "成功と判定・ユーザー不満",
        "happy_on_failure": "失敗と判定・ユーザー満足", "by_step": "到達した最終ステップ別",
        "by_reason": "離脱理由別", "step": "ステップ", "reason": "離脱理由", "sessions": "セッション",
        "judge_mean": "ジャッジ(平均)", "disagreements": "ユーザーと実証済みの結果が食い違うセッション",
        "session": "セッション", "outcome": "結果", "judge": "ジャッジ", "comment": "コメント",
        "none_session": "このセッションへのフィードバックはありません。", "time": "時刻", "source": "経路",
        "user": "ユーザー", "score": "スコア", "label": "ラベル", "said": "評価", "joined_by": "結合キー",
        "verdict": "ユーザー: {u}/実証済みの結果: {w}", "judge_is": "ジャッジ {j}",
        "disagree": "ユーザーと実証済みの結果が食い違っています。", "cut": "切り詰め",
        "no_step": "(ステップなし)",
    },
}


COMMENT_UNITS = 200  # of a comment the report and the overview show (the session page shows it whole)


def w(key: str, lang: str, **kw: Any) -> str:
    return WORDS[lang_of(lang)][key].format(**kw)


def _n(row: Row, key: str) -> int:
    return int(row.get(key) or 0)


def _judge(value: Any) -> str:
    return "—" if value is None else f"{float(value):.2f}"


def summary_lines(view: FeedbackView, lang: str) -> list[str]:
    s = view.summary
    items, sessions = _n(s, "items"), _n(s, "sessions")
    if lang_of(lang) == "en":
        out = [w("items", lang, n=plural(items, w("item", lang)), s=plural(sessions, w("session_noun", lang)))]
    else:
        out = [w("items", lang, n=items, s=sessions)]
    if _n(s, "pending"):
        out.append(w("pending", lang, n=_n(s, "pending")))
    if view.agreement is not None:
        out.append(w("agreement", lang, p=pct(view.agreement)))
    return out


def _matrix(view: FeedbackView) -> list[tuple[str, int, int]]:
    """(our call, happy users, unhappy users) for the sessions we call a success and a failure."""
    s = view.summary
    return [("success", _n(s, "happy_on_success"), _n(s, "unhappy_on_success")),
            ("failure", _n(s, "happy_on_failure"), _n(s, "unhappy_on_failure"))]


StepName = Callable[[str | None, str | None], str]


def _group_label(row: Row, key: str, lang: str, step_name: StepName | None = None) -> str:
    if key == "last_step":
        step = row.get("last_step")
        shown = (step_name(row.get("variant"), step) if step_name and step else step) or w("no_step", lang)
        return f"{variant_name(row.get('variant'), lang)} · {shown}"
    return f"{variant_name(row.get('variant'), lang)} · {drop_reason_name(row.get('drop_reason') or 'unknown', lang)}"


_COUNT_KEYS = ("sessions", "positive", "negative", "unhappy_on_success", "happy_on_failure")


# ---------------------------------------------------------------------------- terminal


def terminal_renderables(view: FeedbackView | None, lang: str, width: int,
                         step_name: StepName | None = None) -> list[RenderableType]:
    """The report's section; nothing when no feedback is stored (the rest of the report is unchanged).
    ``step_name`` names a variant's step in the report's language (the key when not given)."""
    if view is None:
        return []
    lang = lang_of(lang)
    out: list[RenderableType] = [Text(), Text(w("title", lang), style="bold underline")]
    out += [Text(line) for line in summary_lines(view, lang)]
    m = Table(title=w("matrix", lang), title_justify="left", title_style="bold", box=box.SIMPLE_HEAD,
              show_edge=False, pad_edge=False)
    for col in (w("we_say", lang), w("positive", lang), w("negative", lang)):
        m.add_column(col, justify="left" if col == w("we_say", lang) else "right")
    for call, happy, unhappy in _matrix(view):
        m.add_row(w(call, lang), str(happy), str(unhappy))
    out.append(m)
    for title, rows, key in (("by_step", view.by_step, "last_step"), ("by_reason", view.by_reason, "drop_reason")):
        if not rows:
            continue
        t = Table(title=w(title, lang), title_justify="left", title_style="bold", box=box.SIMPLE_HEAD,
                  show_edge=False, pad_edge=False)
        t.add_column(w("step" if key == "last_step" else "reason", lang), overflow="fold")
        for k in (*_COUNT_KEYS, "judge_mean"):
            t.add_column(w(k, lang), justify="right", overflow="fold")
        for r in rows:
            t.add_row(data_text(_group_label(r, key, lang, step_name)), *(str(_n(r, k)) for k in _COUNT_KEYS),
                      _judge(r.get("judge_mean")))
        out.append(t)
    if view.disagreements:
        out.append(Text(w("disagreements", lang), style="bold"))
        for r in view.disagreements:
            line = Text.assemble(("  ", ""), data_text(clip_width(r["session_id"], 36)),
                                 f"  {w(r['we_say'], lang)} ({r['outcome'] or '—'}) · "
                                 f"{w('judge', lang)} {_judge(r['judge_score'])} · {w(r['user_says'], lang)}")
            out.append(line)
            if r.get("comment"):  # on a line of its own, wrapped rather than cut to the width
                out.append(Text.assemble("    “", data_text(clip_width(r["comment"], COMMENT_UNITS)), "”"))
    return out


# ---------------------------------------------------------------------------- HTML (report and UI)


def esc(value: object) -> str:
    from html import escape

    return escape("" if value is None else str(value), quote=True)


def _cap(word: str) -> str:
    return word[:1].upper() + word[1:]


def _table(heads: list[str], rows: list[list[str]], cls: str, numeric: bool = True) -> str:
    """Cells are HTML already escaped; with ``numeric`` every column after the first is right-aligned. On a phone
    the UI stacks each row as a card whose cells are named by their column (``stack``, ``data-label``)."""
    num = lambda i: " class=num" if numeric and i else ""  # noqa: E731
    label = lambda i: f' data-label="{esc(heads[i])}"' if i else ' class="lead"'  # noqa: E731
    head = "".join(f"<th{num(i)}>{esc(_cap(h))}</th>" for i, h in enumerate(heads))
    body = "".join("<tr>" + "".join(f"<td{num(i) if i else ''}{label(i)}>{c}</td>" for i, c in enumerate(r))
                   + "</tr>" for r in rows)
    return f'<div class="scroll"><table class="data stack {cls}"><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table></div>'


def section_html(view: FeedbackView | None, lang: str, session_link: Any = None, section_id: str = "feedback",
                 step_name: StepName | None = None) -> str:
    """The report's (and the overview's) block; empty when no feedback is stored."""
    if view is None:
        return ""
    lang = lang_of(lang)
    link = session_link or (lambda sid: f"<code>{esc(clip_width(sid, 36))}</code>")
    parts = [f'<section class="card" id="{section_id}" aria-labelledby="{section_id}-h">'
             f'<h2 id="{section_id}-h">{esc(w("title", lang))}</h2>']
    parts += [f"<p>{esc(line)}</p>" for line in summary_lines(view, lang)]
    parts.append(f"<h3>{esc(w('matrix', lang))}</h3>" + _table(
        [w("we_say", lang), w("positive", lang), w("negative", lang)],
        [[esc(w(call, lang)), str(h), str(u)] for call, h, u in _matrix(view)], "fb-matrix"))
    for title, rows, key in (("by_step", view.by_step, "last_step"), ("by_reason", view.by_reason, "drop_reason")):
        if rows:
            parts.append(f"<h3>{esc(w(title, lang))}</h3>" + _table(
                [w("step" if key == "last_step" else "reason", lang), *(w(k, lang) for k in _COUNT_KEYS),
                 w("judge_mean", lang)],
                [[esc(_group_label(r, key, lang, step_name)), *(str(_n(r, k)) for k in _COUNT_KEYS), _judge(r.get("judge_mean"))]
                 for r in rows], f"fb-{key}"))
    if view.disagreements:
        parts.append(f"<h3>{esc(w('disagreements', lang))}</h3>" + _table(
            [w("session", lang), w("we_say", lang), w("judge", lang), w("users", lang), w("comment", lang)],
            [[link(r["session_id"]), esc(f"{w(r['we_say'], lang)} ({r['outcome'] or '—'})"),
              _judge(r["judge_score"]), esc(w(r["user_says"], lang)), esc(clip_width(r.get("comment"), COMMENT_UNITS))]
             for r in view.disagreements], "fb-disagree", numeric=False))
    return "".join(parts) + "</section>"


def session_block_html(items: list[Row], session: Row, lang: str) -> str:
    """The session page's block: each item, and the users' verdict beside the proven outcome and the judge."""
    lang = lang_of(lang)
    head = f'<section class="card" id="feedback" aria-labelledby="feedback-h"><h2 id="feedback-h">{esc(w("title", lang))}'
    if not items:
        return head + f' <span class="badge">0</span></h2><p class="muted">{esc(w("none_session", lang))}</p></section>'
    said = session_verdict(items) or "neutral"
    ours = we_say(session.get("outcome_reads_as"))
    verdict = w("verdict", lang, u=w(said, lang), w=f"{w(ours, lang)} ({session.get('outcome') or '—'})")
    verdict += " · " + w("judge_is", lang, j=_judge(session.get("judge_score")))
    disagree = (ours == "success" and said == "negative") or (ours == "failure" and said == "positive")
    pill = {"positive": "pass", "negative": "fail"}.get(said, "neutral")
    rows = []
    for i in items:
        score = "—" if i.get("score") is None else f"{float(i['score']):g}" + (
            f"/{float(i['score_max']):g}" if i.get("score_max") else "")
        s = i.get("sentiment") or "neutral"
        comment = esc(i.get("comment"))
        if i.get("truncated"):
            comment += f' <span class="muted small">({esc(w("cut", lang))})</span>'
        rows.append([esc(str(i.get("time") or i.get("received_at") or "")[:19]),
                     f'<span class="pill ra-{ {"positive": "pass", "negative": "fail"}.get(s, "neutral")}">'
                     f'{esc(w(s, lang))}</span>',
                     esc(score), esc(i.get("label") or "—"), comment or "—", esc(i.get("user_id") or "—"),
                     esc(f"{i.get('source')} · {i.get('joined_by') or ''}")])
    table = _table([w("time", lang), w("said", lang), w("score", lang), w("label", lang), w("comment", lang),
                    w("user", lang), w("source", lang)], rows, "fb-items", numeric=False)
    note = f'<p class="fb-disagree"><strong>{esc(w("disagree", lang))}</strong></p>' if disagree else ""
    return (head + f' <span class="badge">{len(items)}</span></h2>'
            f'<p class="fb-verdict" data-users="{said}" data-we="{ours}"><span class="pill ra-{pill}">'
            f'{esc(w(said, lang))}</span> {esc(verdict)}</p>{note}{table}</section>')
