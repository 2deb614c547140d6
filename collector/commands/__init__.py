"""The ``agentfunnel`` commands: one module each, in ``COMMANDS``, the order ``agentfunnel --help`` lists them.

A command module has ``register(subparsers)``, which adds its parser and sets ``func`` to its
``run(args) -> int`` (the exit status), and imports what the commands share from ``common``
(settings, the ``--db`` option and its checks, error lines). ``judge audit`` is in ``audit``, under
``judge``; ``data`` is the path ``prune``, ``delete``, ``export`` and ``snapshot`` share. To add a
command, write its module and put it in ``COMMANDS``; ``docs/cli.md`` is generated from the parser.

Every command module is imported to build the parser, so each call of ``agentfunnel`` pays for all
their module-level imports: what is slow to import and only some commands use (rich, gRPC, aiohttp,
the report) is imported in the function that needs it, marked ``start-up time``.
"""

from __future__ import annotations

import argparse
import difflib
import logging
import sys
from types import ModuleType

from ..config import ConfigError
from ..query import UntrustedSidecar
from ..store.guard import StoreUnusable
from . import (cases, compare, delete, demo, eval as evaluate, export, ingest, judge, monitors, prune, report, rescore,
               serve, snapshot, sql, ui)
from .common import DbUnusable

COMMANDS: tuple[ModuleType, ...] = (serve, ingest, sql, report, ui, demo, cases, judge, compare, rescore, evaluate,
                                    prune, delete, export, snapshot, monitors)


class _Parser(argparse.ArgumentParser):
    """Every (sub)command's parser: an unknown option is reported by the command it was given to,
    with that command's usage and the closest option it has (``did you mean --grpc-port?``)."""

    def parse_known_args(self, args=None, namespace=None):  # type: ignore[override]
        self._given = list(sys.argv[1:] if args is None else args)
        namespace, extras = super().parse_known_args(args, namespace)
        if extras:  # a subcommand's parser: nothing after it could take them, so they are errors here
            self.error(f"unrecognized arguments: {' '.join(extras)}")
        return namespace, extras

    def error(self, message: str):  # type: ignore[override]
        unknown = self._unknown_options()
        if unknown:  # also when argparse saw a misspelt required option as missing: name the misspelling
            message = f"unrecognized arguments: {' '.join(unknown)}"
            hints = [(u, difflib.get_close_matches(u, self._long_options(), n=1, cutoff=0.6)) for u in unknown]
            found = [(u, m[0]) for u, m in hints if m]
            if len(found) == 1:
                message += f"; did you mean {found[0][1]}?"
            elif found:
                message += "; did you mean " + ", ".join(f"{m} (for {u})" for u, m in found) + "?"
        super().error(message)

    def _long_options(self) -> list[str]:
        return [o for a in self._actions for o in a.option_strings if o.startswith("--")]

    def _unknown_options(self) -> list[str]:
        """The option-like arguments this parser was given that name none of its options, in order."""
        known = {o for a in self._actions for o in a.option_strings}
        commands = {c for a in self._actions if isinstance(a, argparse._SubParsersAction) for c in a.choices}
        unknown = []
        for arg in getattr(self, "_given", ()):
            if arg == "--" or arg in commands:  # the rest belongs to positionals, or to a subcommand
                break
            if not arg.startswith("-") or arg == "-" or self._negative_number_matcher.match(arg):
                continue
            name = arg.split("=", 1)[0]
            if name in known or (name.startswith("--") and any(o.startswith(name) for o in known)):
                continue  # an abbreviation argparse resolves (or reports as ambiguous itself)
            if not name.startswith("--") and len(name) > 2 and name[:2] in known:
                continue  # -vvalue: a short option with its value attached
            unknown.append(name)
        return unknown


def build_parser() -> argparse.ArgumentParser:
    """The whole command line: each command of ``COMMANDS`` registered in order (subparsers are ``_Parser`` too)."""
    parser = _Parser(prog="agentfunnel", description="agentfunnel: OpenTelemetry traces of AI agents as sessions, "
                     "funnels and scores in DuckDB")
    parser.add_argument("-v", "--verbose", action="store_true", help="log debug detail to stderr")
    sub = parser.add_subparsers(dest="command", required=True)
    for command in COMMANDS:
        command.register(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Parse, then run the command; what the user can fix (config, the database file) is one line on stderr, 2."""
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=logging.DEBUG if args.verbose else logging.WARNING,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        return args.func(args)
    except ConfigError as exc:
        print(f"agentfunnel: {exc}", file=sys.stderr)
        return 2
    except UntrustedSidecar as exc:
        print(f"agentfunnel: not following the server's sidecar: {exc}", file=sys.stderr)
        return 2
    except (DbUnusable, StoreUnusable) as exc:
        print(f"{args.prog}: {exc}", file=sys.stderr)
        return 2
