"""The command line is a registry: each command a module of collector/commands, listed once in COMMANDS, and
``agentfunnel --help`` (the installed console script) lists them in that order."""

from __future__ import annotations

import pkgutil
import re
import subprocess
import sys
from pathlib import Path

from agentfunnel.collector import commands
from agentfunnel.collector.commands import COMMANDS, build_parser

SHARED = {"common", "data", "audit"}  # what the commands share, and judge's audit subcommand


def _names() -> list[str]:
    return [m.__name__.rsplit(".", 1)[1] for m in COMMANDS]


def test_the_registry_holds_every_command_module_once():
    names = _names()
    assert len(names) == len(set(names)), names
    assert set(names) == {m.name for m in pkgutil.iter_modules(commands.__path__)} - SHARED
    for module in COMMANDS:
        assert callable(module.register) and callable(module.run), module.__name__


def test_each_command_parses_to_its_own_run():
    sub = next(a for a in build_parser()._actions if a.dest == "command")
    assert list(sub.choices) == _names()
    for module in COMMANDS:
        name = module.__name__.rsplit(".", 1)[1]
        defaults = sub.choices[name]._defaults
        if "func" in defaults:  # a command with subcommands sets func on each of them
            assert defaults["func"] is module.run, name


def test_agentfunnel_help_lists_the_commands_in_the_registry_order():
    script = Path(sys.executable).with_name("agentfunnel")  # the console script: agentfunnel.collector.cli:main
    out = subprocess.run([str(script), "--help"], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    listed = re.findall(r"^    (\w+) ", out.stdout, flags=re.MULTILINE)
    assert listed == _names()
