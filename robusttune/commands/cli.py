"""The robusttune command line (typer): run, sweep, calibrate, breakdown, report, list, tune,
horizon (calibrate, tune and horizon have modules of their own; the shared options are
`robusttune.commands.options`, the help texts' examples `robusttune.commands.help`).

Bad input is one line on stderr naming the key and the allowed values, exit status 2, and no
result folder is created for it."""

from __future__ import annotations

import atexit
import functools
import gc
import inspect
import math
import sys
from collections.abc import Callable
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

import typer

from robusttune.commands.calibrate import calibrate as calibrate_command
from robusttune.commands.help import EXAMPLES, readable_help
from robusttune.commands.options import (
    ADDRESS,
    CPUS_PER_TRIAL,
    GPUS_PER_TRIAL,
    MAX_CONCURRENT,
    SET_BASE,
    takes_plugins,
)
from robusttune.core.registry import SpecError

if TYPE_CHECKING:
    from typer._click.exceptions import UsageError as _ClickUsageError

app = typer.Typer(
    add_completion=False,
    no_args_is_help=True,
    help="Map where Byzantine-robust federated learning breaks.",
)

EXIT_BAD_INPUT = 2
EXIT_INTERRUPTED = 130  # the shell's Ctrl-C status


def fail(message: str) -> None:
    """Print one line and exit with status 2 (bad input)."""
    typer.echo(f"error: {message}", err=True)
    raise typer.Exit(EXIT_BAD_INPUT)


def bad_input_exits(command: Callable[..., Any]) -> Callable[..., Any]:
    """Turn a SpecError raised anywhere in a command into one line and exit status 2."""

    @functools.wraps(command)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return command(*args, **kwargs)
        except SpecError as error:
            fail(str(error))

    return wrapper


def load_run_values(spec_file: Path | None, assignments: list[str]) -> dict[str, Any]:
    """RunSpec values from an optional YAML file (a mapping of RunSpec keys, or a search space
    whose `run:` section is used) overridden by ``--set key=value`` pairs."""
    from robusttune.core.plugins import declare_plugins
    from robusttune.core.yaml_input import parse_assignments, read_yaml

    values: dict[str, Any] = {}
    if spec_file is not None:
        loaded = read_yaml(spec_file, "spec file") or {}
        if isinstance(loaded, dict) and "plugins" in loaded:
            declare_plugins(loaded, spec_file.name)
            loaded.pop("plugins")
        if isinstance(loaded, dict) and "run" in loaded:
            loaded = loaded["run"] or {}
        if not isinstance(loaded, dict):
            raise SpecError(f"{spec_file}: expected a mapping of RunSpec keys")
        values.update(loaded)
    values.update(parse_assignments(assignments))
    return values


def _default_run_folder(spec: Any) -> Path:
    stamp = datetime.now().strftime("%Y%m%d-%H%M%S")
    name = (
        f"{spec.method}-{spec.dataset}-{spec.attack}-b{spec.byzantine_fraction:g}"
        f"-p{spec.participation:g}-s{spec.seed}-{stamp}"
    )
    return Path("results") / "runs" / name


@app.command()
@bad_input_exits
@takes_plugins
def run(
    spec_file: Path | None = typer.Argument(
        None, help="YAML of RunSpec keys (or a search space's run: section)."
    ),
    set_: list[str] = typer.Option([], "--set", help="key=value, repeatable; overrides the file."),
    out: Path | None = typer.Option(None, "--out", help="Run folder (default results/runs/NAME)."),
    quiet: bool = typer.Option(False, "--quiet", help="No progress bar."),
) -> Any:
    """Run one federated training and write its run folder (rounds.csv, summary.json, TensorBoard)."""
    from rich.console import Console
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

    from robusttune.core.runspec import RunSpec
    from robusttune.display.terminal import print_table
    from robusttune.engine.recording import run_to_folder

    spec = RunSpec.from_dict(load_run_values(spec_file, set_))
    folder = out or _default_run_folder(spec)
    if (folder / "summary.json").exists():
        raise SpecError(f"--out {folder} already holds a finished run; choose another folder")
    console = Console(stderr=True)
    with Progress(
        TextColumn("[bold]{task.description}"),
        BarColumn(),
        TextColumn("round {task.completed}/{task.total}"),
        TextColumn("{task.fields[status]}"),
        TimeElapsedColumn(),
        console=console,
        disable=quiet,
    ) as progress:
        assert spec.method is not None  # a built RunSpec names its method (the label of what runs)
        task = progress.add_task(spec.method, total=spec.rounds, status="")

        def show(record: Any) -> None:
            status = "" if math.isnan(record.accuracy) else f"acc {record.accuracy:.3f}"
            progress.update(task, completed=record.round, status=status)

        summary = run_to_folder(spec, folder, on_record=show)

    rows = []
    for key in (
        "final_accuracy",
        "final_validation_accuracy",
        "final_loss",
        "collapsed",
        "rounds_run",
        "byzantine_majority_rounds",
        "seconds",
    ):
        value = getattr(summary, key)
        rows.append(
            {"key": key, "value": f"{value:.4f}" if isinstance(value, float) else str(value)}
        )
    rows.append({"key": "folder", "value": str(folder)})
    print_table(rows, title=f"{spec.method} on {spec.dataset}", show_header=False)
    return folder, summary


# =============================================================================================
# sweep (issue 5). The body lives in robusttune.commands.sweep; Ray is imported only when a
# sweep really runs (never for --dry-run).
# =============================================================================================
@app.command()
@bad_input_exits
@takes_plugins
def sweep(
    space: Path = typer.Argument(
        ..., help="Search-space YAML (run, space, search, scheduler, resources)."
    ),
    name: str | None = typer.Option(
        None, "--name", help="Sweep name (default: the YAML's name or file name)."
    ),
    storage: str = typer.Option(
        "./results",
        "--storage",
        help="Results root, a local, shared or cloud path; the sweep goes to STORAGE/NAME.",
    ),
    address: str | None = ADDRESS,
    num_samples: int | None = typer.Option(
        None, "--num-samples", help="Optuna: trials; grid: repeats of the grid."
    ),
    max_concurrent: int | None = MAX_CONCURRENT,
    cpus_per_trial: float | None = CPUS_PER_TRIAL,
    gpus_per_trial: str | None = GPUS_PER_TRIAL,
    set_: list[str] = SET_BASE,
    resume: bool = typer.Option(
        False,
        "--resume",
        help="Continue an interrupted sweep as stored, without re-running finished trials (no --set: start a new --name to change it).",
    ),
    dry_run: bool = typer.Option(
        False, "--dry-run", help="Print the trial count and configurations; start nothing."
    ),
    verbose: bool = typer.Option(
        False,
        "--verbose",
        help="Ray's own output (trial tables, notices) instead of the one progress line.",
    ),
) -> None:
    """Run a search space as a Ray Tune sweep: one federated run per trial, Optuna or a grid."""
    from robusttune.commands.sweep import sweep_command

    status = sweep_command(
        space,
        name=name,
        storage=storage,
        address=address,
        num_samples=num_samples,
        max_concurrent=max_concurrent,
        cpus_per_trial=cpus_per_trial,
        gpus_per_trial=gpus_per_trial,
        assignments=set_,
        resume=resume,
        dry_run=dry_run,
        verbose=verbose,
        echo=typer.echo,
    )
    if status:
        raise typer.Exit(status)


# =============================================================================================
# calibrate, breakdown, report (issue 6). Logic lives in robusttune.experiments.calibration, .breakdown and
# .results; these commands parse options, choose a runner and print. calibrate's body is
# robusttune.commands.calibrate.
# =============================================================================================
calibrate = app.command(name="calibrate")(bad_input_exits(takes_plugins(calibrate_command)))


def _register_breakdown() -> None:
    """`robusttune breakdown` (the map) lives in robusttune.commands.breakdown_command."""
    from robusttune.commands.breakdown_command import breakdown

    app.command(name="breakdown")(bad_input_exits(takes_plugins(breakdown)))


_register_breakdown()


@app.command()
@bad_input_exits
@takes_plugins
def report(
    results_dir: Path = typer.Argument(
        ..., help="A sweep, breakdown, tuning study or runs folder."
    ),
    out: Path | None = typer.Option(
        None, "--out", help="Where report.md goes (default RESULTS_DIR/report)."
    ),
    runs: list[str] = typer.Option(
        [], "--run", help="Run id (or unique part) to draw per round, repeatable."
    ),
    gain_from: int = typer.Option(10, "--gain-from", help="Table IV: from this round."),
    gain_to: int = typer.Option(25, "--gain-to", help="Table IV: to this round."),
) -> Any:
    """report.md with the SWB-DM paper's tables (CSV beside them) and PNG figures."""
    from robusttune.core.plugins import load_plugins
    from robusttune.core.yaml_input import stored_plugins
    from robusttune.reports.results import report as write_report

    if not results_dir.is_dir():
        raise SpecError(f"results folder {str(results_dir)!r} does not exist")
    # the folder's rules may be a plugin's (their theory, their presets): load what it names
    load_plugins(stored_plugins(results_dir))
    if not 1 <= gain_from < gain_to:
        raise SpecError(f"--gain-from must be >= 1 and below --gain-to; got {gain_from}, {gain_to}")
    path = write_report(
        results_dir, out=out, curve_runs=runs or None, gain_rounds=(gain_from, gain_to)
    )
    from robusttune.display.terminal import print_table
    from robusttune.reports.paper_tables import attack_spread_table
    from robusttune.reports.runs import load_runs

    print_table(
        attack_spread_table(load_runs(results_dir)).reset_index(),
        floatfmt=".1f",
        title="final accuracy (%) by attack: mean ± sd over seeds",
    )
    typer.echo(f"report: {path}")
    return path


# ============================================================================ end of issue 6 ==


@app.command(name="list")
@bad_input_exits
@takes_plugins
def list_entries(
    concept: str | None = typer.Argument(
        None, help="Only this concept: aggregator, attack, method, algorithm, dataset or model."
    ),
) -> None:
    """Every rule, attack, method, algorithm, dataset and model the tool can run: one line
    each, with the first line of its docstring and where it came from (built-in, or the plugin
    that registered it; --plugin adds yours)."""
    from robusttune.display.terminal import print_table
    from robusttune.reports.catalogue import catalogue

    rows = catalogue(concept)
    print_table(rows, title=None)


# typer vendors click: its usage errors (BadParameter, NoSuchOption, MissingParameter, ...) share
# the base class of the public typer.BadParameter
UsageError = cast("type[_ClickUsageError]", typer.BadParameter.__mro__[1])


def _given_value(argv: list[str], param: Any) -> str | None:
    """The command-line value a rejected option was given (``--budget abc`` -> "abc"), if any."""
    for flag in getattr(param, "opts", None) or ():
        for i, token in enumerate(argv):
            if token == flag and i + 1 < len(argv):
                return argv[i + 1]
            if token.startswith(flag + "="):
                return token[len(flag) + 1 :]
    return None


def _register_tune() -> None:
    """`robusttune tune` (robust tuning) lives in robusttune.commands.tune."""
    from robusttune.commands.tune import tune

    app.command(name="tune")(bad_input_exits(takes_plugins(tune)))


_register_tune()


def _register_horizon() -> None:
    """`robusttune horizon` (a map's plateau rounds) lives in robusttune.commands.horizon."""
    from robusttune.commands.horizon import horizon

    app.command(name="horizon")(bad_input_exits(takes_plugins(horizon)))


_register_horizon()


def _readable_helps() -> None:
    for info in app.registered_commands:
        assert info.callback is not None  # every command was registered with its function
        name = info.name or info.callback.__name__
        info.help = readable_help(inspect.getdoc(info.callback) or "", EXAMPLES.get(name, ()))


_readable_helps()


def main(argv: list[str] | None = None) -> None:
    """The console entry point: typer's own usage errors (``--budget abc``, an unknown option)
    become one line and exit status 2 like every other bad input, not a boxed usage panel."""
    if argv is None:
        # This process ends with the command: at exit, Python's last garbage collections over
        # torch's, pandas' and Ray's objects took 0.9 of the 1.2 s between a map's report and
        # the shell prompt. Frozen objects are skipped by them; files are closed by then.
        atexit.register(gc.freeze)
    argv = sys.argv[1:] if argv is None else argv
    try:
        status = app(args=argv, standalone_mode=False)
    except UsageError as error:
        ctx = error.ctx  # every UsageError has one (None where no command context)
        where = f"{ctx.command_path}: " if ctx else ""
        message = " ".join(error.format_message().split())
        if not message and ctx:  # no_args_is_help: the help is the answer
            typer.echo(ctx.get_help())
            sys.exit(EXIT_BAD_INPUT)
        given = _given_value(argv, getattr(error, "param", None))
        typer.echo(
            f"error: {where}{message}{'' if given is None else f'; got {given!r}'}", err=True
        )
        sys.exit(EXIT_BAD_INPUT)
    except typer.Abort:
        typer.echo("interrupted", err=True)
        sys.exit(EXIT_INTERRUPTED)
    sys.exit(status if isinstance(status, int) else 0)


if __name__ == "__main__":  # pragma: no cover
    main()
