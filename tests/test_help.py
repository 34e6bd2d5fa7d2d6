"""`--help` that reads well: each paragraph of a command's docstring is one paragraph the
terminal wraps (not the docstring's own line breaks), and every command shows examples."""

from __future__ import annotations

import inspect

import pytest
from typer.testing import CliRunner

from robusttune.commands.cli import app
from robusttune.commands.help import EXAMPLES, readable_help

COMMANDS = sorted(info.name or info.callback.__name__ for info in app.registered_commands)


def test_every_command_has_examples():
    assert sorted(EXAMPLES) == COMMANDS


@pytest.mark.parametrize("command", COMMANDS)
def test_help_paragraphs_follow_the_terminal_width(command):
    info = next(i for i in app.registered_commands if (i.name or i.callback.__name__) == command)
    doc = inspect.getdoc(info.callback)
    wide = (
        CliRunner()
        .invoke(app, [command, "--help"], terminal_width=2000, env={"COLUMNS": "2000"})
        .output
    )
    # at 2000 columns every prose paragraph is one line: the docstring's breaks are gone
    for paragraph in doc.split("\n\n"):
        assert " ".join(paragraph.split()) in wide, paragraph
    for example in EXAMPLES[command]:
        assert f"$ {example}" in wide
    narrow = (
        CliRunner()
        .invoke(app, [command, "--help"], terminal_width=60, env={"COLUMNS": "60"})
        .output
    )
    assert max(len(line) for line in narrow.splitlines()) <= 60


def test_readable_help_joins_lines_within_paragraphs_only():
    text = readable_help("First line\n    goes on.\n\n    Second\n    paragraph.", ("a --b",))
    assert text == "First line goes on.\n\nSecond paragraph.\n\nExamples:\n  $ a --b"
