"""The settings and command-line references in docs/, written from the code so they cannot drift.

``python -m agentfunnel.collector.reference`` rewrites docs/settings.md and docs/cli.md; a test
fails when either differs from what the code defines, so a setting, command or flag cannot be added
without its line in the docs.
"""

from __future__ import annotations

import argparse
import sys
import types
import typing
from pathlib import Path
from typing import Any, Iterator

from pydantic import BaseModel
from pydantic.fields import FieldInfo
from pydantic_core import PydanticUndefined

from .commands import build_parser
from .config import ENV_VARS, Settings

SETTINGS_HEADER = """# Settings

Every setting `agentfunnel serve`, `ingest` and `demo` read, generated from the code
(`python -m agentfunnel.collector.reference`). Pass a TOML or YAML file with `--config`; unknown
keys are errors that name the key. Sections are the headings below (`[receivers]`, `[sql]`, ...);
a nested section is written with a dot (`[store.lake]`). Environment variables override the file:
{env}.
"""

CLI_HEADER = """# Command line

Every command and flag of `agentfunnel`, generated from the code
(`python -m agentfunnel.collector.reference`). `agentfunnel COMMAND --help` prints the same.
"""


def _models_in(annotation: Any) -> list[type[BaseModel]]:
    """The settings models a field's type holds (``X | None``, ``list[X]``, ``dict[str, X]``)."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return [annotation]
    found: list[type[BaseModel]] = []
    for arg in typing.get_args(annotation):
        found += _models_in(arg)
    return found


def _type_name(annotation: Any) -> str:
    if isinstance(annotation, type):
        if annotation is type(None):
            return "unset"
        return annotation.__name__.removesuffix("Settings") if issubclass(annotation, BaseModel) else annotation.__name__
    if isinstance(annotation, types.UnionType) or typing.get_origin(annotation) is typing.Union:
        return " or ".join(_type_name(a) for a in typing.get_args(annotation))
    origin = typing.get_origin(annotation)
    if origin is typing.Literal:
        return " / ".join(repr(a) for a in typing.get_args(annotation))
    if origin is not None:
        inner = ", ".join(_type_name(a) for a in typing.get_args(annotation))
        return f"{getattr(origin, '__name__', str(origin))}[{inner}]"
    return str(annotation).replace("typing.", "")


def _default(field: FieldInfo) -> str:
    if field.default is PydanticUndefined and field.default_factory is None:
        return "required"
    value = field.default_factory() if field.default_factory is not None else field.default  # type: ignore[call-arg]
    if isinstance(value, BaseModel):
        return "(section)"
    text = repr(value) if not isinstance(value, Path) else repr(str(value))
    return "`" + text.replace("|", "\\|") + "`"


def _cell(text: str) -> str:
    return " ".join(text.split()).replace("|", "\\|")


def _container(annotation: Any) -> str:
    """How a nested model is written: a table, a table per key (``dict``), or an array of tables (``list``)."""
    for arg in (annotation, *typing.get_args(annotation)):
        origin = typing.get_origin(arg)
        if origin is dict:
            return "dict"
        if origin is list:
            return "list"
    return "table"


def _sections(model: type[BaseModel], path: str, seen: set[type[BaseModel]], about: str = "") -> Iterator[str]:
    plain = [(name, f) for name, f in model.model_fields.items() if not _models_in(f.annotation)]
    if path:
        doc = _cell(" ".join(p for p in (about, (model.__doc__ or "").strip().split("\n\n")[0]) if p))
        yield f"\n## `{path}`\n\n{doc}\n"
        if plain:
            yield "| setting | type | default | what it does |\n|---|---|---|---|"
        for name, field in plain:
            yield (f"| `{name}` | {_cell(_type_name(field.annotation))} | {_default(field)} | "
                   f"{_cell(field.description or '')} |")
    for name, field in model.model_fields.items():
        for sub in _models_in(field.annotation):
            if sub in seen:
                continue
            inner = f"{path.strip('[]')}.{name}" if path else name
            kind = _container(field.annotation)
            sub_path = {"dict": f"[{inner}.<name>]", "list": f"[[{inner}]]"}.get(kind, f"[{inner}]")
            yield from _sections(sub, sub_path, seen | {sub}, field.description or "")


def settings_reference() -> str:
    env = ", ".join(f"`{var}` (`{'.'.join(path)}`)" for var, path in ENV_VARS.items())
    return SETTINGS_HEADER.format(env=env) + "\n".join(_sections(Settings, "", {Settings})) + "\n"


def undocumented_settings() -> list[str]:
    """Settings without a description: each must say what it does."""
    missing: list[str] = []

    def walk(model: type[BaseModel], prefix: str, seen: set[type[BaseModel]]) -> None:
        for name, field in model.model_fields.items():
            subs = _models_in(field.annotation)
            if not subs and not field.description:
                missing.append(f"{prefix}.{name}" if prefix else name)
            for sub in subs:
                if sub not in seen:
                    walk(sub, f"{prefix}.{name}" if prefix else name, seen | {sub})

    walk(Settings, "", {Settings})
    return missing


def _subcommands(parser: argparse.ArgumentParser) -> list[tuple[str, argparse.ArgumentParser, str]]:
    found = []
    for action in parser._actions:  # noqa: SLF001 - argparse keeps its subcommands here only
        if isinstance(action, argparse._SubParsersAction):  # noqa: SLF001
            helps = {a.dest: a.help or "" for a in action._choices_actions}  # noqa: SLF001
            for name, sub in action.choices.items():
                found.append((name, sub, helps.get(name, "")))
    return found


def _flag_rows(parser: argparse.ArgumentParser) -> Iterator[str]:
    for action in parser._actions:  # noqa: SLF001
        if isinstance(action, (argparse._HelpAction, argparse._SubParsersAction)):  # noqa: SLF001
            continue
        names = ", ".join(f"`{o}`" for o in action.option_strings) or f"`{action.metavar or action.dest}`"
        default = "" if action.default in (None, argparse.SUPPRESS, False, []) else f"`{action.default}`"
        yield f"| {names} | {default} | {_cell(action.help or '')} |"


def _commands(parser: argparse.ArgumentParser, path: str) -> Iterator[str]:
    for name, sub, summary in _subcommands(parser):
        full = f"{path} {name}"
        yield f"\n## `{full}`\n\n{_cell(summary or sub.description or '')}\n"
        rows = list(_flag_rows(sub))
        if rows:
            yield "| flag or argument | default | what it does |\n|---|---|---|"
            yield from rows
        yield from _commands(sub, full)


def cli_reference() -> str:
    return CLI_HEADER + "\n".join(_commands(build_parser(), "agentfunnel")) + "\n"


def undocumented_flags() -> list[str]:
    """Commands and flags without help text."""
    missing: list[str] = []

    def walk(parser: argparse.ArgumentParser, path: str) -> None:
        for name, sub, summary in _subcommands(parser):
            full = f"{path} {name}"
            if not (summary or sub.description):
                missing.append(full)
            for action in sub._actions:  # noqa: SLF001
                if isinstance(action, (argparse._HelpAction, argparse._SubParsersAction)):  # noqa: SLF001
                    continue
                if not action.help or action.help == argparse.SUPPRESS:
                    missing.append(f"{full} {'/'.join(action.option_strings) or action.dest}")
            walk(sub, full)

    walk(build_parser(), "agentfunnel")
    return missing


def write(docs: Path) -> None:
    (docs / "settings.md").write_text(settings_reference())
    (docs / "cli.md").write_text(cli_reference())


if __name__ == "__main__":
    write(Path(sys.argv[1]) if len(sys.argv) > 1 else Path(__file__).resolve().parent.parent / "docs")
