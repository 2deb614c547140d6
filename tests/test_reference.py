"""docs/settings.md and docs/cli.md are what the code defines: a new setting, command or flag fails here until documented."""

from __future__ import annotations

from pathlib import Path

from agentfunnel.collector import reference

DOCS = Path(__file__).resolve().parent.parent / "docs"
REGENERATE = "run `python -m agentfunnel.collector.reference` and commit docs/"


def test_every_setting_says_what_it_does():
    assert reference.undocumented_settings() == [], "give each setting a description= in its model"


def test_every_command_and_flag_says_what_it_does():
    assert reference.undocumented_flags() == [], "give each command and flag a help= text"


def test_the_settings_reference_is_the_codes():
    assert (DOCS / "settings.md").read_text() == reference.settings_reference(), REGENERATE


def test_the_cli_reference_is_the_codes():
    assert (DOCS / "cli.md").read_text() == reference.cli_reference(), REGENERATE


def test_the_references_name_what_a_user_looks_up():
    settings, cli = reference.settings_reference(), reference.cli_reference()
    for key in ("`[sql]`", "`memory_limit_mb`", "`[[privacy.patterns]]`", "`[scoring.funnel.variants.<name>]`",
                "AGENTFUNNEL_BEARER_TOKEN"):
        assert key in settings, key
    for key in ("`agentfunnel serve`", "`agentfunnel cases add`", "`agentfunnel eval run`", "`--html`"):
        assert key in cli, key
