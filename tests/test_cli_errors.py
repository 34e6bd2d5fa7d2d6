"""Bad input on the command line: one line naming the key, the value and what is allowed, exit
status 2, no traceback, no result folder left behind (issue 11's list, tried as a new user would)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

from robusttune.commands.cli import app

SPACES = Path(__file__).resolve().parents[1] / "search_spaces"
TINY_BREAKDOWN = """
run: {dataset: synthetic, model: mlp, clients: 4, rounds: 1, local_epochs: 1, synthetic_samples: 200}
space:
  aggregator: {grid: [mean]}
  attack: {grid: [sign_flip]}
breakdown: {budget: %s}
"""


def one_line_exit_2(args: list[str], *words: str) -> str:
    result = CliRunner().invoke(app, args)
    lines = result.output.strip().splitlines()
    assert result.exit_code == 2, result.output
    assert len(lines) == 1 and "Traceback" not in result.output, result.output
    for word in words:
        assert word in lines[0], lines[0]
    return lines[0]


@pytest.mark.parametrize(
    ("option", "value", "allowed"),
    [
        ("--relative-threshold", "7", "(0, 1]"),
        ("--threshold", "1.5", "[0, 1]"),
        ("--max-fraction", "1", "(0, 1)"),
        ("--on-non-monotone", "ignore", "flag, scan"),
    ],
)
def test_breakdown_options_out_of_range(tmp_path, option, value, allowed):
    space = tmp_path / "b.yaml"
    space.write_text(TINY_BREAKDOWN % 4)
    out = tmp_path / "out"
    key = option.removeprefix("--").replace("-", "_")
    one_line_exit_2(
        [
            "breakdown",
            str(space),
            "--local",
            "--storage",
            str(tmp_path),
            "--name",
            "out",
            option,
            value,
        ],
        f"breakdown.{key}",
        value,
        allowed,
    )
    assert not out.exists()


def test_a_fractional_budget_in_the_yaml_is_refused_not_truncated(tmp_path):
    space = tmp_path / "b.yaml"
    space.write_text(TINY_BREAKDOWN % 2.7)
    one_line_exit_2(
        ["breakdown", str(space), "--local", "--storage", str(tmp_path), "--name", "out"],
        "b.yaml",
        "breakdown.budget",
        "2.7",
        "integer",
    )


def test_run_on_cuda_without_a_gpu(tmp_path, monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)  # a GPU machine too
    out = tmp_path / "run"
    one_line_exit_2(
        ["run", "--set", "device=cuda", "--out", str(out), "--quiet"],
        "device 'cuda'",
        "allowed: cpu, auto",
    )
    assert not out.exists()


def test_run_on_a_malformed_device(tmp_path):
    one_line_exit_2(
        ["run", "--set", "device=cuda:x", "--out", str(tmp_path / "run")],
        "device",
        "'cuda:x'",
        "cuda:N",
    )


def test_run_a_method_with_a_conflicting_rule(tmp_path):
    one_line_exit_2(
        [
            "run",
            "--set",
            "method=krum",
            "--set",
            "aggregator=median",
            "--out",
            str(tmp_path / "run"),
        ],
        "method 'krum'",
        "'median'",
    )


def test_calibrate_a_majority_fraction(tmp_path):
    one_line_exit_2(
        [
            "calibrate",
            "--clients",
            "20",
            "--participation",
            "0.5",
            "--byzantine",
            "0.6",
            "--rounds",
            "10",
            "--local",
            "--out",
            str(tmp_path / "c"),
        ],
        "--byzantine 0.6",
        "[0, 0.5)",
    )
    # the sampling law alone is defined at any fraction
    result = CliRunner().invoke(
        app,
        [
            "calibrate",
            "--clients",
            "20",
            "--participation",
            "0.5",
            "--byzantine",
            "0.6",
            "--rounds",
            "10",
            "--analytic-only",
            "--json",
        ],
    )
    assert result.exit_code == 0, result.output


def test_report_on_a_folder_without_finished_runs(tmp_path):
    empty = tmp_path / "empty"
    empty.mkdir()
    one_line_exit_2(["report", str(empty)], "no finished run", str(empty))
    errored = tmp_path / "errored" / "trial_0"
    errored.mkdir(parents=True)
    (errored / "rounds.csv").write_text("round,accuracy\n1,0.5\n")  # a trial that died: no summary
    one_line_exit_2(["report", str(tmp_path / "errored")], "no finished run")
    assert not (tmp_path / "errored" / "report").exists()


@pytest.mark.parametrize(
    ("option", "value", "words"),
    [
        ("--num-samples", "0", "search.num_samples must be an integer >= 1; got 0"),
        ("--max-concurrent", "-1", "max_concurrent must be an integer >= 0; got -1"),
    ],
)
def test_a_bad_command_line_override_is_named_as_typed(option, value, words):
    line = one_line_exit_2(
        ["sweep", str(SPACES / "quickstart.yaml"), "--dry-run", option, value], words
    )
    assert f"with {option} {value}:" in line  # not blamed on the YAML


@pytest.mark.parametrize(
    ("args", "words"),
    [
        (
            ["breakdown", str(SPACES / "breakdown.yaml"), "--budget", "abc"],
            ("--budget", "integer", "'abc'"),
        ),
        (["breakdown", str(SPACES / "breakdown.yaml"), "--budget=abc"], ("--budget", "'abc'")),
        (["sweep", str(SPACES / "quickstart.yaml"), "--no-such-option"], ("--no-such-option",)),
        (["report"], ("results_dir",)),
    ],
)
def test_the_console_entry_point_turns_typer_usage_errors_into_one_line(capsys, args, words):
    """`robusttune` (cli.main), not typer's boxed usage panel: one line, the option, the value."""
    from robusttune.commands.cli import main

    with pytest.raises(SystemExit) as stop:
        main(args)
    captured = capsys.readouterr()
    lines = captured.err.strip().splitlines()
    assert stop.value.code == 2 and captured.out == ""
    assert len(lines) == 1 and lines[0].startswith("error: "), captured.err
    for word in words:
        assert word in lines[0], lines[0]


def test_the_console_entry_point_keeps_a_command_exit_status(capsys):
    from robusttune.commands.cli import main

    with pytest.raises(SystemExit) as stop:
        main(["run", "--set", "clients=0"])
    assert stop.value.code == 2
    assert "clients must be an integer >= 1; got 0" in capsys.readouterr().err


def test_the_console_entry_point_without_arguments_shows_the_commands(capsys):
    from robusttune.commands.cli import main

    with pytest.raises(SystemExit):
        main([])
    out = capsys.readouterr().out
    assert "Usage" in out and "breakdown" in out and "sweep" in out
