"""The UI's words in English and Japanese; words the report already has come from ``report_text``."""

from __future__ import annotations

from typing import Any

from ..report_text import TEXT as REPORT_TEXT
from ..report_text import lang_of

WORDS: dict[str, dict[str, str]] = {
    "en": {
        "ui_title": "agentfunnel", "overview": "Overview", "session_list": "Sessions", "experiments": "Experiments",
        "compare": "Compare", "skip": "Skip to content", "search": "Search", "search_ph": "inputs, answers, tool data…",
        "apply": "Apply", "clear": "Clear all", "any": "any", "remove_filter": "Remove filter",
        "open_now": "Open sessions now", "none_open": "No session is open.", "ingest": "Ingest health",
        "offline": "Reading a database file (agentfunnel ui): nothing is being ingested here.",
        "spans_received": "Spans received", "spans_committed": "Spans committed", "spans_duplicate": "Duplicates",
        "spans_rejected": "Spans refused", "pushed_back": "Requests pushed back", "commit_errors": "Commit errors",
        "open_traces": "Open traces", "queue_bytes": "Bytes in flight", "uptime": "Uptime",
        "metrics_link": "All counters (/metrics)", "recent_experiments": "Recent experiments",
        "no_experiments": "No evaluation runs are stored.", "view_all": "View all",
        "results": "{n} sessions", "results_one": "{n} session", "results_more": "{n}+ sessions", "page": "Page {n}", "prev": "← Newer",
        "next": "Older →", "prev_page": "← Previous", "next_page": "Next →",
        "searched_back": "Searched sessions active since {t} (newest first).", "search_older": "Search older sessions",
        "search_capped": "Showing the newest {n} matching sessions; narrow the search or the time range for more.",
        "no_match": "No sessions match.", "since": "Active since", "until": "Started before",
        "status": "Status", "user": "User", "agent_version": "Agent version", "reached": "Reached step",
        "drop_reason": "Drop-off reason", "duration": "Duration", "cost": "Cost", "tools": "Tool calls",
        "errors": "Errors", "tokens": "Tokens", "last_seen": "Last seen", "first_seen": "First seen",
        "conversation": "Conversation", "waterfall": "Trace waterfall", "tool_calls": "Tool calls", "tool_call": "Tool call",
        "evidence": "Evidence behind the outcome", "diagnosis": "Drop-off diagnosis", "usage": "Tokens and cost",
        "case_run": "Case run: seven stages", "judge": "Judge verdict", "provenance": "Provenance",
        "user_msg": "User", "assistant_msg": "Model", "final_answer": "Final answer", "calls_tools": "calls",
        "arguments": "Arguments", "result": "Result", "error": "Error", "funnel_step": "Funnel step",
        "counted": "Counted", "counted_yes": "counted at its step", "counted_no": "not counted",
        "counted_error": "errored: feeds the drop-off diagnosis", "counted_repeat": "repeat: counted once",
        "counted_none": "matches no step", "counted_other": "not a step of this funnel", "also_reached": "its result confirms it", "args_valid": "Arguments valid", "server": "Server",
        "not_found": "Not found", "no_session": "No session {id!r} is stored.", "no_experiment": "No experiment {name!r} has case runs.",
        "live": "Open: this page updates while the session is open.", "closed_now": "Closed.",
        "spans_shown": "{shown} of {total} spans shown", "no_spans": "No spans are stored for this session.",
        "no_messages": "No message content was captured (content capture off?). Tool calls and the final answer are below.",
        "no_calls": "No tool calls.", "proof": "A tool result shows it.", "shows": "its result shows", "proves": "proves the outcome", "steps_proof": "The steps reached are the evidence (no result carried more).",
        "answer_proof": "The final answer, with no commerce step reached.", "error_proof": "An error stopped the session.",
        "nothing_proof": "No tool activity and no answer.", "input_tokens": "Input tokens", "output_tokens": "Output tokens",
        "llm_calls": "Model calls", "cycles": "Model→tool cycles", "invalid_calls": "Invalid tool calls",
        "wasted": "Wasted steps", "hit_cap": "Hit the step cap", "trace_count": "Traces", "stage_state": "State",
        "first_failed": "First failing stage", "failure_class": "Failure class", "fix_hint": "Look at",
        "criterion": "Criterion", "assessment": "Assessment", "score": "Score", "status_col": "Status",
        "no_judgment": "No judgment is stored for this run.", "evidence_col": "Evidence",
        "missing_reqs": "Missing requirements", "unsupported": "Unsupported claims",
        "cases": "Cases", "runs": "Runs", "reliable": "Reliable (pass^k)", "recoverable": "Recoverable (pass@k)",
        "pass_rate": "Pass rate", "stage_funnel": "Stage funnel", "failure_mix": "Failure mix",
        "cost_tails": "Cost and latency tails", "p50": "p50", "p95": "p95", "max": "max", "costliest": "Costliest runs",
        "missed": "Criteria and assertions missed", "compare_with": "Compare with", "pick_compare": "Compare two experiments",
        "baseline": "A (baseline)", "candidate": "B (candidate)", "regressions": "Regressions",
        "no_regressions": "No case regressed.", "passing_a": "A passing run", "failing_b": "B failing run",
        "change": "Change", "all_cases": "All cases", "latency": "Latency", "gap": "Gap", "run_list": "Runs of this experiment",
        "login": "Sign in", "token": "Admin token", "login_note": "This server asks for its admin token "
        "(admin.token; the agents' ingest token does not read data). It is kept in a cookie for this site only.",
        "bad_token": "That token is not right.", "too_many": "Too many sign-in attempts; try again in a minute.",
        "payload_part": "This session's payloads (span attributes and events, tool arguments and results, log bodies) "
        "are more than one page holds: this page shows part {n} of them; spans and calls without theirs are in "
        "another part.", "payload_too_big": "{n} payload(s) are too large for any page: read them with agentfunnel sql.",
        "payload_more": "Next part", "payload_prev": "Previous part",
        "lang_other": "日本語", "kind": "Kind", "span": "Span", "start": "Start", "duration_ms": "ms",
        "experiment_col": "Experiment", "case_col": "Case", "passed_col": "Passed", "yes": "yes", "no": "no",
        "controls": "Negative controls: {abstained} of {controls} abstained correctly.",
        "failed_runs": "failed runs", "stage": "Stage", "examples": "Examples", "open_session": "Open session",
        "reads": "reads as", "count_note": "Bars: sessions reaching each step or a later one. Click a bar, an outcome "
        "or a drop-off reason to list its sessions.",
        "overview_note": "", "agent_ver_note": "", "prev_step": "from previous", "of_all": "of all",
        "bad_filter": "Bad filter", "variant_col": "Variant",
    },
    "ja": {
        "ui_title": "agentfunnel", "overview": "概要", "session_list": "セッション", "experiments": "実験",
        "compare": "比較", "skip": "本文へ移動", "search": "検索", "search_ph": "入力・回答・ツールのデータ…",
        "apply": "適用", "clear": "すべて解除", "any": "すべて", "remove_filter": "条件を外す",
        "open_now": "進行中のセッション", "none_open": "進行中のセッションはありません。", "ingest": "取り込みの状態",
        "offline": "データベースファイルを表示しています (agentfunnel ui): ここでは取り込みは行われていません。",
        "spans_received": "受信スパン", "spans_committed": "保存スパン", "spans_duplicate": "重複",
        "spans_rejected": "拒否スパン", "pushed_back": "差し戻したリクエスト", "commit_errors": "保存エラー",
        "open_traces": "未完了トレース", "queue_bytes": "処理中バイト", "uptime": "稼働時間",
        "metrics_link": "すべてのカウンタ (/metrics)", "recent_experiments": "最近の実験",
        "no_experiments": "評価ランは保存されていません。", "view_all": "すべて表示",
        "results": "{n} セッション", "results_more": "{n} 件以上", "page": "{n} ページ", "prev": "← 新しい順",
        "next": "古い順 →", "prev_page": "← 前へ", "next_page": "次へ →",
        "searched_back": "{t} 以降に活動したセッションを検索しました (新しい順)。", "search_older": "さらに古いセッションを検索",
        "search_capped": "一致した新しいセッション {n} 件を表示しています。検索語や期間を絞り込んでください。",
        "no_match": "一致するセッションはありません。", "since": "活動開始以降", "until": "開始が次より前",
        "status": "状態", "user": "ユーザー", "agent_version": "エージェントのバージョン", "reached": "到達ステップ",
        "drop_reason": "離脱理由", "duration": "所要時間", "cost": "コスト", "tools": "ツール呼び出し",
        "errors": "エラー", "tokens": "トークン", "last_seen": "最終活動", "first_seen": "開始",
        "conversation": "会話", "waterfall": "トレースのウォーターフォール", "tool_calls": "ツール呼び出し", "tool_call": "ツール呼び出し",
        "evidence": "結果の根拠", "diagnosis": "離脱の診断", "usage": "トークンとコスト",
        "case_run": "ケースラン: 7 段階", "judge": "判定", "provenance": "判定の出所",
        "user_msg": "ユーザー", "assistant_msg": "モデル", "final_answer": "最終回答", "calls_tools": "呼び出し",
        "arguments": "引数", "result": "結果", "error": "エラー", "funnel_step": "ファネルのステップ",
        "counted": "集計", "counted_yes": "ステップに集計", "counted_no": "集計なし",
        "counted_error": "エラー: 離脱の診断に使用", "counted_repeat": "繰り返し: 1 回だけ集計",
        "counted_none": "どのステップにも該当しない", "counted_other": "このファネルのステップではない", "also_reached": "結果で確認", "args_valid": "引数の妥当性", "server": "サーバー",
        "not_found": "見つかりません", "no_session": "セッション {id!r} は保存されていません。",
        "no_experiment": "実験 {name!r} のケースランはありません。",
        "live": "進行中: セッションが終わるまでこのページは更新されます。", "closed_now": "終了しました。",
        "spans_shown": "{total} 件中 {shown} 件のスパンを表示", "no_spans": "このセッションのスパンは保存されていません。",
        "no_messages": "メッセージの内容は記録されていません。ツール呼び出しと最終回答は下にあります。",
        "no_calls": "ツール呼び出しはありません。", "proof": "ツールの結果が示しています。", "shows": "結果が示すもの", "proves": "結果の根拠",
        "steps_proof": "到達したステップが根拠です (結果にそれ以上の情報はありません)。",
        "answer_proof": "取引のステップに到達せず、回答のみ。", "error_proof": "エラーでセッションが止まりました。",
        "nothing_proof": "ツールの活動も回答もありません。", "input_tokens": "入力トークン", "output_tokens": "出力トークン",
        "llm_calls": "モデル呼び出し", "cycles": "モデル→ツールの往復", "invalid_calls": "不正なツール呼び出し",
        "wasted": "無駄なステップ", "hit_cap": "ステップ上限に到達", "trace_count": "トレース", "stage_state": "状態",
        "first_failed": "最初に失敗した段階", "failure_class": "失敗の分類", "fix_hint": "確認箇所",
        "criterion": "基準", "assessment": "評価", "score": "スコア", "status_col": "状態",
        "no_judgment": "このランの判定は保存されていません。", "evidence_col": "根拠",
        "missing_reqs": "不足している要件", "unsupported": "根拠のない主張",
        "cases": "ケース", "runs": "ラン", "reliable": "常に成功 (pass^k)", "recoverable": "いずれか成功 (pass@k)",
        "pass_rate": "合格率", "stage_funnel": "段階ファネル", "failure_mix": "失敗の内訳",
        "cost_tails": "コストと所要時間の裾", "p50": "p50", "p95": "p95", "max": "最大", "costliest": "コストの高いラン",
        "missed": "満たされなかった基準とアサーション", "compare_with": "比較対象", "pick_compare": "2 つの実験を比較",
        "baseline": "A (基準)", "candidate": "B (候補)", "regressions": "悪化したケース",
        "no_regressions": "悪化したケースはありません。", "passing_a": "A の合格ラン", "failing_b": "B の不合格ラン",
        "change": "変化", "all_cases": "全ケース", "latency": "所要時間", "gap": "差", "run_list": "この実験のラン",
        "login": "サインイン", "token": "管理トークン", "login_note": "このサーバーは管理トークン "
        "(admin.token。エージェントのインジェスト用トークンではデータを読めません) を求めます。このサイト専用の Cookie に保存されます。",
        "bad_token": "トークンが違います。", "too_many": "サインインの試行が多すぎます。1 分後にもう一度お試しください。",
        "payload_part": "このセッションのペイロード (スパンの属性とイベント、ツールの引数と結果、ログ本文) は 1 ページに収まりません。"
        "このページはその {n} 番目の部分を表示しています。表示されていないスパンや呼び出しのペイロードは別の部分にあります。",
        "payload_too_big": "{n} 件のペイロードはどのページにも収まりません。agentfunnel sql で読んでください。",
        "payload_more": "次の部分", "payload_prev": "前の部分",
        "lang_other": "English", "kind": "種類", "span": "スパン", "start": "開始", "duration_ms": "ms",
        "experiment_col": "実験", "case_col": "ケース", "passed_col": "合格", "yes": "はい", "no": "いいえ",
        "controls": "ネガティブコントロール: {controls} 件中 {abstained} 件が正しく見送り。",
        "failed_runs": "不合格ラン", "stage": "段階", "examples": "例", "open_session": "セッションを開く",
        "reads": "評価", "count_note": "バー: 各ステップまたはその先に到達したセッション。バー・結果・離脱理由を"
        "クリックすると該当するセッションを一覧します。",
        "overview_note": "", "agent_ver_note": "", "prev_step": "前ステップから", "of_all": "全体比",
        "bad_filter": "条件が正しくありません", "variant_col": "種別",
    },
}


def t(key: str, lang: str, **kw: Any) -> str:
    """A UI word, else a report word, formatted with ``kw`` (with ``n == 1``, its singular form)."""
    lang = lang_of(lang)
    if kw.get("n") == 1 and (f"{key}_one" in WORDS[lang] or f"{key}_one" in REPORT_TEXT[lang]):
        key = f"{key}_one"  # the singular, where the language has one
    s = WORDS[lang].get(key) or REPORT_TEXT[lang].get(key) or WORDS["en"].get(key) or REPORT_TEXT["en"].get(key, key)
    return s.format(**kw) if kw else s
