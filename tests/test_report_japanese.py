"""The Japanese report: the seven stage names as the project's Japanese documentation writes them, every label
table complete in Japanese, the judge's per-criterion results in words, and the stage table's question and
evidence columns; the English report keeps its words.
"""

from __future__ import annotations

import datetime as dt
import html.parser
import json
import re
import string
from pathlib import Path

import pytest

from agentfunnel.collector.report import experiments
from agentfunnel.collector.report import text as report_text
from agentfunnel.collector.report import (CriterionMiss, ExperimentRuns, Filters, ReportData, StageRow, Summary,
                                          load_report)
from agentfunnel.collector.report.html import render_html
from agentfunnel.collector.report.terminal import render_terminal
from agentfunnel.collector.store.schema import migrate
from agentfunnel.collector.store.writer import connect
from agentfunnel.scoring import dropoff, labels, stages
from conftest import run_cli, shared_demo

# The stage names, questions and checks exactly as the Japanese documentation's stage table gives them.
SEED_STAGES = ("発見", "選択", "操作の特定", "呼び出し", "実行", "結果の利用可能性", "完了")
SEED_QUESTIONS = ("明示的な候補集合に対象が現れるか？", "エージェントは対象を選ぶか？", "許可された操作を選ぶか？",
                  "引数の構造と意味は正しいか？", "設定した実行経路で操作が成功するか？",
                  "タスクに必要なデータが結果に含まれるか？", "最終回答がタスクの要件を満たすか？")
SEED_CHECKS = ("候補の識別、存在、回答中の順位", "選択したプロバイダー、競合の選択、選択の見送り",
               "ケースで許可した計画とツールの識別情報との一致", "入力スキーマと、タスク固有の引数の期待値",
               "設定したツール環境での実行記録", "必須フィールドの存在、型、非null、定義した期待値",
               "固定した基準と返された事実に照らした回答評価")

# What a Japanese label may spell in ASCII letters: commands and SQL in backticks or double quotes, format
# fields, SQL names (snake_case), and names that stay as they are (the tool's name, units, ids, pass^k).
ALLOWED = re.compile(r"`[^`]*`|\"[^\"]*\"|\{[a-z_]+\}|(?<![A-Za-z])(?:[a-z]+(?:_[a-z0-9]+)+|agentfunnel|sql|SQL|UTC|"
                     r"HTML|JSON|URL|ID|UI|USD|p50|p95|p99|ms|pass\^k|pass@k|null|k|n)(?![A-Za-z])")
ASCII_WORD = re.compile(r"[A-Za-z]{2,}")
CJK = re.compile(r"[\u3040-\u30ff\u3400-\u9fff\uff00-\uffef]")


def english_words(s: str) -> list[str]:
    return ASCII_WORD.findall(ALLOWED.sub(" ", s))


def fields(s: str) -> set[str]:
    return {name for _, name, _, _ in string.Formatter().parse(s) if name is not None}


STAGE_WORDS = ("label", "question", "evidence", "fix")


def lang_tables() -> dict[str, dict[str, dict[str, str]]]:
    """Every ``{lang: {key: text}}`` table of the label modules, found by its shape, so a table added later is
    walked too (``labels.VARIANT_OUTCOME_LABELS`` nests one per variant)."""
    found: dict[str, dict[str, dict[str, str]]] = {}

    def walk(name: str, value: object) -> None:
        if not isinstance(value, dict) or not value:
            return
        if set(value) <= set(labels.LANGUAGES) and "ja" in value and all(isinstance(v, dict) for v in value.values()):
            found[name] = value  # type: ignore[assignment]
            return
        for key, inner in value.items():
            walk(f"{name}[{key!r}]", inner)

    for module in (report_text, labels):
        for attr, value in vars(module).items():
            if attr.isupper():
                walk(f"{module.__name__.rsplit('.', 1)[-1]}.{attr}", value)
    for part in STAGE_WORDS:  # each stage's own words, as one table per kind across the registered stages
        found[f"stages.{part}"] = {lang: {s.key: getattr(s, part)[lang] for s in stages.REGISTRY
                                          if lang in getattr(s, part)} for lang in labels.LANGUAGES}
    return found


TABLES = lang_tables()


def english_labels(min_len: int = 8) -> set[str]:
    """The English tables' text, cut at format fields, the longer pieces only; less any piece a Japanese label
    also holds (a shared command or unit) and single lower-case words (they read as the stored codes a report
    shows as they are: ``assertion``, ``sessions``)."""
    japanese = [v for t in TABLES.values() for v in t["ja"].values()]
    pieces = set()
    for table in TABLES.values():
        for value in table.get("en", {}).values():
            for piece in re.split(r"\{[a-z_]*\}", value):
                piece = piece.strip(" :·()")
                if (len(piece) >= min_len and ASCII_WORD.search(piece) and (" " in piece or not piece.islower())
                        and not any(piece in j for j in japanese)):
                    pieces.add(piece)
    return pieces


# ---------------------------------------------------------------------------- the tables


def test_the_walk_finds_every_label_table():
    names = set(TABLES)
    for expected in ("text.TEXT", "text.VARIANT_NAMES", "text.DROP_REASON_NAMES",
                     "stages.fix", "text.DROP_FIX_TEXT", "text.FAILURE_CLASS_NAMES",
                     "labels.OUTCOME_LABELS", "labels.READS_AS_LABELS", "stages.label", "stages.question",
                     "stages.evidence", "labels.CRITERION_RESULT_LABELS", "labels.VARIANT_OUTCOME_LABELS['lodging']"):
        assert expected in names, f"{expected} is not walked: {sorted(names)}"


@pytest.mark.parametrize("name", sorted(TABLES))
def test_every_japanese_label_exists_and_is_japanese(name):
    table = TABLES[name]
    ja = table["ja"]
    for key, en in table.get("en", {}).items():
        if key.endswith("_one") and key.removesuffix("_one") in ja:
            continue  # a singular form: Japanese has no grammatical number, the count's own form serves
        assert key in ja, f"{name}: {key!r} has no Japanese"
        assert bool(ja[key]) == bool(en), f"{name}[{key!r}]: empty in one language only"
        assert fields(ja[key]) == fields(en), f"{name}[{key!r}]: the Japanese fills other fields than {en!r}"
    for key, value in ja.items():
        assert not english_words(value), f"{name}[{key!r}] = {value!r} reads as English: {english_words(value)}"


def test_the_walk_would_catch_an_english_or_missing_entry():
    assert english_words("Suggested fix") == ["Suggested", "fix"]
    assert english_words("ファネル (Funnel)") == ["Funnel"]
    assert not english_words('表示していない {n} 件: agentfunnel sql "select * from stage_funnel"')
    assert not english_words("`agentfunnel serve` に送る · p95 · 非null · pass^k · ID · stage_funnel ビュー")


def test_tables_cover_what_they_name():
    keys = set(stages.REGISTRY.keys())
    for part in STAGE_WORDS:
        table = TABLES[f"stages.{part}"]
        assert set(table["en"]) == set(table["ja"]) == keys
    assert set(labels.CRITERION_RESULT_LABELS["ja"]) == set(labels.CRITERION_RESULTS)
    assert set(report_text.DROP_FIX_TEXT["ja"]) == set(dropoff.FIXES)
    assert set(dropoff.FIXES) | {"tool_error"} <= set(report_text.DROP_REASON_NAMES["ja"])
    assert set(experiments.FAILURE_ORDER) <= set(report_text.FAILURE_CLASS_NAMES["ja"])


def test_stage_names_questions_and_checks_are_the_documentations():
    assert tuple(stages.stage_label(s, "ja") for s in stages.REGISTRY.keys()) == SEED_STAGES
    assert tuple(stages.stage_question(s, "ja") for s in stages.REGISTRY.keys()) == SEED_QUESTIONS
    assert tuple(stages.stage_check(s, "ja") for s in stages.REGISTRY.keys()) == SEED_CHECKS
    words = labels.CRITERION_RESULT_LABELS["ja"]
    assert (words["satisfied"], words["missing"]) == ("条件を満たす", "必要な情報が不足")
    assert (words["contradicted"], words["unsupported"]) == ("ツール結果と矛盾", "ツール結果で裏付けられない")


# ---------------------------------------------------------------------------- a real demo's report


@pytest.fixture(scope="module")
def demo(tmp_path_factory) -> Path:
    return shared_demo(tmp_path_factory, "ja").db


class _Shown(html.parser.HTMLParser):
    """What a reader of the page sees: its text and its titles and labels (CSS and markup aside)."""

    def __init__(self) -> None:
        super().__init__()
        self.parts: list[str] = []
        self._skip = 0

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self._skip += tag == "style"
        self.parts += [v for k, v in attrs if k in ("title", "aria-label", "alt") and v]

    def handle_endtag(self, tag: str) -> None:
        self._skip -= tag == "style"

    def handle_data(self, data: str) -> None:
        if not self._skip:
            self.parts.append(data)


def _page(demo: Path, tmp_path: Path, lang: str) -> str:
    page = tmp_path / f"report-{lang}.html"
    run_cli("report", "--db", str(demo), "--lang", lang, "--html", str(page))
    shown = _Shown()
    shown.feed(page.read_text(encoding="utf-8"))
    return "\n".join(shown.parts)


def test_japanese_reports_of_the_demo_use_the_stage_names_and_no_english_label(demo, tmp_path):
    terminal = run_cli("report", "--db", str(demo), "--lang", "ja", "--stage-questions").stdout
    page = _page(demo, tmp_path, "ja")
    assert load_report(demo, Filters()).experiments, "the demo must give the report its evaluation sections"
    english = english_labels()
    assert "Where runs fail first" in english and "Include a checkout link in cart responses." in english
    for name, out in (("terminal", terminal), ("HTML", page)):
        for stage in SEED_STAGES:
            assert stage in out, f"{name}: no {stage}"
        assert "ツール解決" not in out and "結果の有用性" not in out
        leaked = sorted(e for e in english if e in out)
        assert not leaked, f"the Japanese {name} report shows English labels: {leaked}"
        for question, check in zip(SEED_QUESTIONS, SEED_CHECKS):
            assert question in out and check in out, name
    assert "確認する問い" in page and "証拠・チェック" in page
    # the demo's drop-offs: the fix by its reason code, in Japanese
    assert report_text.DROP_FIX_TEXT["ja"]["cart_no_checkout_url"] in terminal
    assert report_text.DROP_FIX_TEXT["ja"]["cart_no_checkout_url"] in page


def test_the_english_reports_of_the_demo_keep_their_words(demo, tmp_path):
    terminal = run_cli("report", "--db", str(demo)).stdout
    page = _page(demo, tmp_path, "en")
    for out in (terminal, page):
        assert not CJK.search(out), CJK.findall(out)[:10]
        for stage in stages.REGISTRY.keys():
            assert stages.stage_label(stage) in out
        assert "Where runs fail first" in out and "Include a checkout link in cart responses." in out
    assert stages.stage_question("invocation") in page and stages.stage_question("invocation") not in terminal
    with_questions = run_cli("report", "--db", str(demo), "--stage-questions").stdout
    assert stages.stage_question("invocation") in with_questions
    assert stages.stage_check("invocation") in " ".join(with_questions.split())


# ---------------------------------------------------------------------------- criterion results


def _with_misses() -> ReportData:
    rows = [StageRow(s, 4, 4, 4, 0, 0, 1.0, None if i == 0 else 1.0) for i, s in enumerate(stages.REGISTRY.keys())]
    misses = [CriterionMiss("criterion", "states the date", 6, 6, 1.0, 4, 1, 0, "run-1",
                            {"missing": 1, "contradicted": 2, "unsupported": 1, "judge_pending": 1}),
              CriterionMiss("assertion", "every step renderable", 4, 2, 0.5, 2, 0, 0, "run-2", {"failed": 2})]
    data = ReportData(Summary(sessions=4, closed=4))
    data.variant_sessions = {None: 4}
    data.experiments = [ExperimentRuns("exp", 4, 0, 0, 0, rows, misses)]
    return data


def test_criterion_misses_are_explained_by_the_judges_result():
    data = _with_misses()
    ja = " ".join(render_terminal(data, "ja", width=160).split())
    en = " ".join(render_terminal(data, "en", width=160).split())
    for out in (ja, " ".join(render_html(data, "ja").split())):
        assert "判定: 必要な情報が不足 1" in out and "判定: ツール結果と矛盾 2" in out
        assert "判定: ツール結果で裏付けられない 1" in out and "判定待ち 1" in out and "判定なし 1" in out
        assert "失敗 2" in out and "判定で未達" not in out and "未評価" not in out
    for out in (en, " ".join(render_html(data, "en").split())):
        assert "judge: not met 1" in out and "judge: contradicted 2" in out and "judge: unsupported 1" in out
        assert "judgment pending 1" in out and "no judgment 1" in out and "failed 2" in out
        assert "not assessed" not in out


def test_the_report_reads_each_criterions_results_from_the_database(tmp_path):
    """Three runs judged incomplete on one criterion, each for another reason, and one with no judge."""
    db = tmp_path / "criteria.duckdb"
    con = connect(db)
    migrate(con)
    results = {"r1": "missing", "r2": "contradicted", "r3": "unsupported", "r4": None}
    for i, (run, result) in enumerate(results.items()):
        at = dt.datetime(2026, 1, 15, 9, i)
        con.execute("INSERT INTO session_rows (session_id, status, first_seen, last_seen, case_id, experiment, passed)"
                    " VALUES (?, 'closed', ?, ?, 'fx', 'exp', false)", [run, at, at])
        evidence = ({"status": "missing", "criteria": ["states the date"]} if result is None else
                    {"status": "incomplete", "criteria": ["states the date"],
                     "assessed": [{"name": "states the date", "assessment": result}]})
        con.execute("INSERT INTO case_run_rows_compacted (session_id, case_id, experiment, run_id, fit, probe, passed,"
                    " first_failed_stage) VALUES (?, 'fx', 'exp', ?, true, false, false, 'completion')", [run, run])
        con.execute("INSERT INTO stage_result_rows_compacted (session_id, stage, stage_order, state, evidence, scored)"
                    " VALUES (?, 'completion', 70, 'failed', ?, true)", [run, json.dumps(evidence)])
    con.close()
    [e] = load_report(db, Filters()).experiments
    [miss] = e.misses
    assert (miss.missed, miss.judged, miss.judge_missing) == (4, 3, 1)
    assert {k: v for k, v in miss.by_result.items() if v} == {"missing": 1, "contradicted": 1, "unsupported": 1}
    out = run_cli("report", "--db", str(db), "--lang", "ja").stdout
    assert "判定: ツール結果と矛盾 1" in out and "判定: ツール結果で裏付けられない 1" in out
