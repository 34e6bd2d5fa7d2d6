"""A sweep a researcher can start, watch, fix and resume without surprises (issue 15):

- a configuration error every trial would hit is one line and exit status 2 from the pre-flight,
  within seconds and before Ray is even imported; one that a trial meets anyway is not retried;
- ``--resume`` with a flag that would change the sweep is refused in one line saying what to do;
- the terminal shows one progress display (finished/total, errored, best, elapsed, left), the
  total known on resume too, and none of Ray's notices (its ``Tuner.restore`` hint, its
  experiment box, its "Failed to fetch metrics" blocks).
Tiny runs: synthetic data, an MLP, 4 clients."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
from rich.console import Console
from typer.testing import CliRunner

from robusttune.commands.cli import app
from robusttune.core.registry import SpecError
from robusttune.experiments.sweep.preflight import preflight, preflight_specs
from robusttune.experiments.sweep.space import parse_sweep

ROOT = Path(__file__).resolve().parents[1]
ENV = {**os.environ, "PYTHONPATH": str(ROOT)}
TINY = {
    "dataset": "synthetic",
    "model": "mlp",
    "clients": 4,
    "participation": 1.0,
    "synthetic_samples": 240,
    "synthetic_shape": "16",
    "local_epochs": 1,
    "rounds": 2,
}


def write_space(folder: Path, run: dict, space: dict | None = None, **extra) -> Path:
    import yaml

    path = folder / "space.yaml"
    path.write_text(yaml.safe_dump({"name": "trust", "run": run, "space": space or {}, **extra}))
    return path


# -- pre-flight ---------------------------------------------------------------------------------
def test_a_missing_dataset_is_one_line_and_exit_2_before_ray(tmp_path):
    """The issue's first case: cifar10 from an empty folder. One line, exit 2, seconds, no Ray
    imported (so certainly none started), no result folder."""
    empty = tmp_path / "empty"
    empty.mkdir()
    space = write_space(
        tmp_path,
        {**TINY, "dataset": "cifar10", "data_root": str(empty)},
        {"seed": {"grid": [1, 2, 3]}},
    )
    script = textwrap.dedent(f"""
        import json, sys
        from typer.testing import CliRunner
        from robusttune.commands.cli import app
        result = CliRunner().invoke(app, ["sweep", {str(space)!r}, "--storage", {str(tmp_path / "results")!r}])
        print(json.dumps({{"code": result.exit_code, "output": result.output,
                          "ray": "ray" in sys.modules}}))
    """)
    started = time.perf_counter()
    done = subprocess.run(
        [sys.executable, "-c", script],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env=ENV,
        timeout=300,
        check=False,
    )
    seconds = time.perf_counter() - started
    answer = json.loads(done.stdout.strip().splitlines()[-1])
    lines = answer["output"].strip().splitlines()
    assert answer["code"] == 2 and len(lines) == 1, answer["output"]
    assert "pre-flight" in lines[0] and "cifar10" in lines[0] and str(empty) in lines[0]
    assert not answer["ray"]
    assert seconds < 60  # Python, torch and the CLI's imports on a loaded 2-core machine
    assert not (tmp_path / "results").exists()


def test_preflight_builds_each_distinct_data_setting_and_rule_once():
    images = {**TINY, "synthetic_shape": "1x8x8"}
    spec = parse_sweep(
        {
            "run": images,
            "space": {
                "model": {"grid": ["mlp", "cnn2"]},
                "seed": {"grid": [1, 2, 3]},
                "aggregator": {"grid": ["mean", "median"]},
            },
        }
    )
    data, rules = preflight_specs(spec)  # 12 trials: 2 data settings, 2 rules (seeds alike)
    assert sorted(r.model for r in data) == ["cnn2", "mlp"]
    assert sorted(r.aggregator for r in rules) == ["mean", "median"]
    assert preflight(spec) == 4

    flat = parse_sweep(
        {"run": TINY, "space": {"model": {"grid": ["mlp", "cnn2"]}}}, source="f.yaml"
    )
    with pytest.raises(SpecError, match=r"^f.yaml: pre-flight \(dataset=synthetic, .*model=cnn2\)"):
        preflight(flat)  # a 16-vector is no image for a CNN

    optuna = parse_sweep(
        {
            "run": TINY,
            "space": {"model": {"choice": ["mlp", "cnn2"]}, "lr": {"loguniform": [0.01, 0.1]}},
            "search": {"algorithm": "optuna", "num_samples": 2},
        }
    )
    assert {r.model for r in preflight_specs(optuna)[0]} == {"mlp", "cnn2"}


def test_preflight_names_the_setting_that_fails(tmp_path):
    spec = parse_sweep(
        {
            "run": {**TINY, "data_root": str(tmp_path)},
            "space": {"dataset": {"grid": ["synthetic", "mnist"]}},
        },
        source="s.yaml",
    )
    with pytest.raises(
        SpecError,
        match=r"^s.yaml: pre-flight \(dataset=mnist, data_root=.*"
        r"dataset 'mnist' not found",
    ):
        preflight(spec)
    notes: list[str] = []  # joined to a cluster: the data may live on its nodes only
    preflight(spec, joined=True, announce=notes.append)
    assert len(notes) == 1 and notes[0].startswith("note: pre-flight (dataset=mnist")


# -- --resume with changes --------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("flags", "named"),
    [
        (["--set", "data_root=/other"], "--set data_root=/other"),
        (["--set", "lr=0.1", "--max-concurrent", "2"], "--set lr=0.1, --max-concurrent 2"),
    ],
)
def test_resume_with_a_change_is_refused_in_one_line(tmp_path, flags, named):
    space = write_space(tmp_path, TINY)
    result = CliRunner().invoke(
        app, ["sweep", str(space), "--storage", str(tmp_path / "r"), "--resume", *flags]
    )
    lines = result.output.strip().splitlines()
    assert result.exit_code == 2 and len(lines) == 1, result.output
    assert named in lines[0] and "--resume runs the stored sweep" in lines[0]
    assert "start a new sweep with --name (e.g. --name trust-2)" in lines[0]
    assert not (tmp_path / "r").exists()


def test_a_space_file_changed_since_the_stored_sweep_is_noted_on_resume(tmp_path):
    from robusttune.commands.sweep import differences

    stored = parse_sweep({"run": TINY, "space": {"seed": {"grid": [1, 2]}}})
    assert differences(stored, stored) == []
    edited = parse_sweep(
        {"run": {**TINY, "lr": 0.3}, "space": {"seed": {"grid": [1, 2, 3]}}, "max_concurrent": 2}
    )
    assert differences(edited, stored) == ["run.lr", "space", "max_concurrent"]


# -- the progress display -------------------------------------------------------------------------
class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def fake_trial(number: int, status: str = "RUNNING", **result) -> SimpleNamespace:
    return SimpleNamespace(
        trial_id=f"t_{number:05d}",
        path=f"/r/{number:05d}_s{number}",
        status=status,
        last_result=result,
    )


def test_progress_off_a_terminal_is_one_line_per_trial_with_the_summary():
    from robusttune.experiments.sweep.progress import ProgressCallback

    out = io.StringIO()
    clock = Clock()
    progress = ProgressCallback(
        "accuracy",
        4,
        mode="max",
        name="grid",
        console=Console(file=out, force_terminal=False, width=80),
        clock=clock,
    )
    progress.on_step_begin(0, [])
    clock.now += 30
    progress.on_trial_complete(1, [], fake_trial(1, accuracy=0.5, training_iteration=3))
    clock.now += 30
    progress.on_trial_complete(2, [], fake_trial(2, accuracy=0.75, training_iteration=3))
    progress.on_trial_complete(2, [], fake_trial(3, accuracy=float("nan"), config_error="bad x"))
    lines = out.getvalue().splitlines()
    assert len(lines) == 3
    assert lines[0] == (
        "[1/4] 00001_s1: accuracy 0.5000 after 3 rounds | grid: 1/4 finished, "
        "0 errored, best accuracy 0.5000, elapsed 30s, left ~1m30s"
    )
    assert lines[1].endswith(
        "grid: 2/4 finished, 0 errored, best accuracy 0.7500, elapsed 1m00s, left ~1m00s"
    )
    assert "[3/4] 00003_s3: ERROR (configuration): bad x" in lines[2]
    assert "2/4 finished, 1 errored" in lines[2]


def test_progress_of_a_resumed_sweep_counts_the_kept_trials_against_the_stored_total():
    from robusttune.experiments.sweep.progress import ProgressCallback

    out = io.StringIO()
    clock = Clock()
    progress = ProgressCallback(
        "loss",
        3,
        mode="min",
        name="again",
        console=Console(file=out, force_terminal=False),
        clock=clock,
    )
    kept = fake_trial(0, "TERMINATED", loss=0.4)
    progress.on_step_begin(0, [kept, fake_trial(1, "PENDING")])
    clock.now += 10
    progress.on_trial_complete(1, [], fake_trial(1, loss=0.9, training_iteration=2))
    assert (
        out.getvalue()
        .strip()
        .endswith(
            "again: 2/3 finished (1 kept), 0 errored, best loss 0.4000, elapsed 10s, left ~10s"
        )
    )


def test_progress_on_a_terminal_is_one_live_line():
    from robusttune.experiments.sweep.progress import ProgressCallback

    out = io.StringIO()
    progress = ProgressCallback(
        "accuracy", 2, console=Console(file=out, force_terminal=True, width=120), clock=Clock()
    )
    progress.on_step_begin(0, [])
    progress.on_trial_complete(1, [], fake_trial(1, accuracy=0.5, training_iteration=3))
    progress.close()
    text = out.getvalue()
    assert "00001_s1" not in text  # finished trials are counted, not listed
    assert "1/2 finished" in text and "best accuracy 0.5000" in text


# -- on Ray -------------------------------------------------------------------------------------
def test_a_configuration_error_in_a_trial_is_not_retried(ray_session, tmp_path, capfd):
    """Past the pre-flight (a node without the data): each trial runs once, ends at once, and
    counts as errored, with the message in its error.txt and in the progress line."""
    from robusttune.experiments.sweep.ray_compat import grid_trials
    from robusttune.experiments.sweep.runner import run_sweep

    spec = parse_sweep(
        {
            "run": {**TINY, "dataset": "mnist", "data_root": str(tmp_path / "none")},
            "space": {"seed": {"grid": [1, 2]}},
        },
        name="nodata",
    )
    outcome = run_sweep(spec, storage=str(tmp_path), verbose=0, progress=True, max_failures=3)
    assert (outcome.finished, outcome.errored, outcome.unfinished) == (0, 2, 0)
    assert list(outcome.table["status"]) == ["ERROR", "ERROR"]
    assert list(outcome.table["rounds_done"]) == [0, 0]
    for folder in map(Path, outcome.table["path"]):
        assert len((folder / "result.json").read_text().splitlines()) == 1  # ran once
        assert (
            "configuration error: dataset 'mnist' not found" in (folder / "error.txt").read_text()
        )
    for trial in grid_trials(outcome.result_grid):
        assert trial.run_metadata.num_failures == 0  # never handed to FailureConfig
    out = capfd.readouterr().out
    assert "ERROR (configuration): dataset 'mnist' not found" in out
    assert "Traceback" not in out


INTERRUPT_AND_RESUME = """
import os, signal, sys
from robusttune.experiments.sweep import progress, runner
from robusttune.commands.sweep import sweep_command

class InterruptAfterFirst(progress.ProgressCallback):
    def on_trial_complete(self, iteration, trials, trial, **info):
        super().on_trial_complete(iteration, trials, trial, **info)
        if not os.path.exists(MARK):
            open(MARK, "w").close()
            os.kill(os.getpid(), signal.SIGINT)

MARK = sys.argv[3]
runner.ProgressCallback = InterruptAfterFirst
code = sweep_command(sys.argv[1], storage=sys.argv[2], num_cpus=1, echo=print)
print("EXIT", code, flush=True)
runner.ProgressCallback = progress.ProgressCallback
code = sweep_command(sys.argv[1], storage=sys.argv[2], num_cpus=1, resume=True, echo=print)
print("EXIT", code, flush=True)
"""


def test_interrupted_and_resumed_sweep_shows_only_its_own_output(tmp_path):
    """Ctrl-C after the first trial, then --resume, as the command prints them (stdout and
    stderr together, Ray's logs included): the tool's lines, none of Ray's."""
    space = write_space(
        tmp_path,
        {**TINY, "rounds": 40, "checkpoint_every": 5},
        {"seed": {"grid": [1, 2, 3]}},
        max_concurrent=1,
    )
    done = subprocess.run(
        [
            sys.executable,
            "-c",
            INTERRUPT_AND_RESUME,
            str(space),
            str(tmp_path / "results"),
            str(tmp_path / "fired"),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        cwd=ROOT,
        env={**ENV, "RAY_AUTH_MODE": "disabled"},
        timeout=400,
        check=False,
    )
    text = done.stdout
    first, _, second = text.partition("EXIT 130")
    assert second, text
    for noise in (
        "Tuner.restore",
        "Failed to fetch metrics",
        "Configuration for experiment",
        "View detailed results",
        "Stop signal received",
        "Traceback",
        "differs from the stored sweep",
    ):
        assert noise not in text, (noise, text)
    assert "[1/3] " in first and "Ctrl-C: stopping the trials" in first
    assert "continue with: robusttune sweep" in first and "--resume" in first
    assert "EXIT 0" in second and "trials: 3 finished, 0 errored, 0 unfinished" in second
    assert "(1 kept)" in second and "3/3 finished" in second
