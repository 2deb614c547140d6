"""``agentfunnel judge audit export | import | report``: the command side of ``collector.judge_audit``."""

from __future__ import annotations

import argparse
import datetime as dt
import json
from pathlib import Path

from ...scoring.judge_audit import VERDICT, Agreement
from ..judge_audit import (audit_report, default_labeler, export_rows, family_warnings, latest_judgments,
                           read_labels, store_labels, write_sample)
from ..phrasing import fixed
from ..query import QueryError
from .common import database, database_options, fail, settings_for


def _say(prog: str, message: str) -> None:
    fail(f"judge audit {prog}", message, escape=True)


def run(args: argparse.Namespace) -> int:
    return {"export": export, "import": import_labels, "report": report}[args.audit_command](args)


def export(args: argparse.Namespace) -> int:
    try:
        judgments = latest_judgments(database(settings_for(args)), args.experiment)
        rows = export_rows(judgments, args.sample, args.seed)
    except (QueryError, ValueError) as exc:
        _say("export", str(exc))
        return 2
    if not rows:
        _say("export", f"no stored verdicts for experiment {args.experiment!r} (is the judge configured?)")
        return 1
    try:
        write_sample(args.out, rows)
    except OSError as exc:
        _say("export", f"cannot write {args.out}: {exc.strerror or exc}")
        return 1
    strata = len({(r["criterion"], r["judge_met"]) for r in rows})
    print(f"wrote {len(rows)} item(s) from {len({r['session_id'] for r in rows})} judgment(s) over {strata} "
          f"stratum(s) (criterion x the judge's call) to {args.out}: fill in label (met / not_met), labeler, note")
    return 0


def import_labels(args: argparse.Namespace) -> int:
    settings = settings_for(args)
    if settings.store.lake is not None:
        _say("import", "labels are stored in a database file, not a lake")
        return 2
    try:
        rows, problems = read_labels(args.file, args.labeler or default_labeler(),
                                     dt.datetime.now(dt.timezone.utc).replace(tzinfo=None))
    except (OSError, UnicodeDecodeError) as exc:
        _say("import", f"cannot read {args.file}: {exc}")
        return 2
    if problems:  # all or nothing: a half-imported file is hard to fix
        for p in problems[:20]:
            _say("import", f"{args.file}: {p}")
        _say("import", f"nothing stored: {len(problems)} line(s) refused")
        return 1
    if not rows:
        _say("import", f"{args.file} has no labels yet (the label column is blank)")
        return 1
    try:
        where = store_labels(settings.store.path, rows)
    except QueryError as exc:
        _say("import", str(exc))
        return 1
    labelers = sorted({r["labeler"] for r in rows})
    print(f"stored {len(rows)} label(s) by {', '.join(labelers)} in {where}")
    return 0


def _row(name: str, a: Agreement) -> list[str]:
    pct = "—" if a.percent is None else f"{a.percent * 100:.0f}%"
    kappa = "—" if a.kappa is None else fixed(a.kappa)
    return [name, str(a.n), pct, kappa, str(a.tp), str(a.fp), str(a.fn), str(a.tn)]


def report(args: argparse.Namespace) -> int:
    # start-up time: rich
    from rich.table import Table
    from rich.text import Text

    from ..terminal import data_text, output_console

    try:
        rep = audit_report(database(settings_for(args)), args.experiment)
    except (QueryError, ValueError) as exc:
        _say("report", str(exc))
        return 1
    warnings = family_warnings(rep.families)
    if args.format == "json":
        doc = {"labels": rep.labels, "labelers": list(rep.labelers), "judges": list(rep.judges),
               "criteria": {k: {**a.__dict__, "n": a.n, "percent": a.percent, "kappa": a.kappa}
                            for k, a in rep.by_criterion.items()},
               "overall": {**rep.overall.__dict__, "n": rep.overall.n, "percent": rep.overall.percent,
                           "kappa": rep.overall.kappa},
               "pass_rates": {k: (v.__dict__ if v else None) for k, v in rep.experiments.items()},
               "warnings": warnings}
        print(json.dumps(doc, indent=2, default=str))
        return 0
    console = output_console(markup=False, emoji=False, highlight=False)
    if not rep.labels:
        console.print("No labels yet: agentfunnel judge audit export --experiment NAME --sample N --out FILE, label it, "
                      "then agentfunnel judge audit import FILE")
    else:
        t = Table(title=f"Judge vs people: {rep.labels} label(s) by {', '.join(rep.labelers)}", title_justify="left")
        for col in ("criterion", "n", "agree", "kappa", "both met", "judge only", "human only", "neither"):
            t.add_column(col, justify="left" if col == "criterion" else "right", overflow="fold")
        for name, a in rep.by_criterion.items():
            t.add_row(*[data_text(c) for c in _row("verdict (the run's completion)" if name == VERDICT else name, a)])
        t.add_row(*[Text(c, style="bold") for c in _row("overall", rep.overall)])
        console.print(t)
        for name, b in rep.experiments.items():
            if b is not None:
                console.print(data_text(f"pass rate of {name}: {b.stored * 100:.0f}% as judged; with the judge's calls "
                                        f"corrected by the audit {b.estimate * 100:.0f}% "
                                        f"(95% from {b.low * 100:.0f}% to {b.high * 100:.0f}%)"))
    for w in warnings:
        console.print(Text.assemble(("warning: ", "bold yellow"), data_text(w)))
    return 0


def register(judge: argparse.ArgumentParser) -> None:
    """``audit`` under the ``judge`` command's parser (``commands.judge``)."""
    audit = judge.add_subparsers(dest="judge_command", required=False).add_parser(
        "audit", help="label a sample of the judge's calls and measure agreement").add_subparsers(
        dest="audit_command", required=True)
    p = audit.add_parser("export", help="write a stratified sample of an experiment's judge calls to label")
    database_options(p, "read")
    p.add_argument("--experiment", required=True, metavar="NAME", help="the experiment (or glob)")
    p.add_argument("--sample", required=True, type=int, metavar="N", help="items to sample")
    p.add_argument("--out", required=True, type=Path, metavar="FILE", help=".csv, or .jsonl")
    p.add_argument("--seed", type=int, default=0, help="the sample's seed (default 0)")
    p.set_defaults(func=run)
    p = audit.add_parser("import", help="store the labels of a sample file, with who and when")
    database_options(p, "update")
    p.add_argument("file", type=Path, help="the sample file with its label column filled in")
    p.add_argument("--labeler", default=None, help="who labelled rows that name no labeler (default: your user name)")
    p.set_defaults(func=run)
    p = audit.add_parser("report", help="agreement per criterion and overall, kappa, and the pass rate's error bar")
    database_options(p, "read")
    p.add_argument("--experiment", default=None, metavar="NAME", help="only labels of this experiment (or glob)")
    p.add_argument("--format", choices=["table", "json"], default="table", help="a table, or JSON for scripts")
    p.set_defaults(func=run)
