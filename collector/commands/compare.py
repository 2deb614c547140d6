"""``agentfunnel compare``: two experiments (or globs of them) case by case; exit 1 when a gate fails, for CI."""

from __future__ import annotations

import argparse
import html
from pathlib import Path

from ..judge_audit import judge_warnings, kappa_gate
from ..query import QueryError, one_reading
from ..regression import explain_regressions
from ..links import compare_url, experiment_url, ui_base
from .common import database, database_options, fail, gate_options, seconds, settings_for, wait_for_judgments


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("compare", help="compare two experiments (or globs of them) case by case; gate CI")
    database_options(p, "read")
    p.add_argument("a", help="baseline experiment (a glob pools reruns, e.g. 'base-*')")
    p.add_argument("b", help="candidate experiment (or glob)")
    gate_options(p, "B's")
    p.add_argument("--format", choices=["table", "json"], default="table", help="a table, or JSON for scripts")
    p.add_argument("--html", type=Path, default=None, metavar="FILE", help="also write the comparison as HTML")
    p.add_argument("--wait", type=seconds, default=0.0, metavar="SECONDS",
                   help="first wait up to this long for pending judgments; runs still pending fail the gate")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    """Two experiments case by case; exit 1 when a gate fails, so CI can gate on it."""
    # start-up time: rich
    from .. import compare as comparison
    from ..terminal import visible_controls

    db = database(settings_for(args))
    try:
        if args.wait > 0:
            wait_for_judgments("compare", db, [args.a, args.b], args.wait)
        with one_reading(db):  # a dozen statements: the file opened once
            result = comparison.compare(db, args.a, args.b, min_pass_hat_k=args.min_pass_hat_k,
                                        max_regressions=args.max_regressions, max_p95_cost=args.max_p95_cost,
                                        max_cost=args.max_cost, max_p99_cost=args.max_p99_cost)
            result.gates += kappa_gate(db, args.b, args.min_judge_kappa)
            warnings = judge_warnings(db, args.b)
            result.why = explain_regressions(db, args.a, args.b, result.rows)  # a failing B run by a passing A one
    except (QueryError, ValueError) as exc:
        return fail("compare", exc, 2, escape=True)
    base = ui_base(db)
    urls = [compare_url(base, args.a, args.b), experiment_url(base, args.a), experiment_url(base, args.b)] if base else []
    if args.format == "json":
        print(comparison.to_json_text(result))
    else:
        comparison.print_terminal(result)
        for w in warnings:
            print(f"warning: {visible_controls(w)}")
        for label, url in zip(("UI:", "  A:", "  B:"), urls):  # the running server's pages for these experiments
            print(f"{label} {url}")
    if args.html:
        page = comparison.render_html(result)
        if urls:
            links = " · ".join(f'<a href="{html.escape(u)}">{html.escape(u)}</a>' for u in urls)
            page = page.replace("</body>", f"<p>UI: {links}</p></body>", 1)
        args.html.write_text(page, encoding="utf-8")
    return 1 if result.gates else 0
