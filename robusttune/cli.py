"""The robusttune command line (typer): run, sweep, breakdown, calibrate, report.

Bad input is one line on stderr naming the key and the allowed values, exit status 2, and no
result folder is created for it."""

from __future__ import annotations

import functools
import math
import sys
import time
from datetime import datetime
from pathlib import Path
from typing import Any, Callable, Optional

import typer
import yaml

from robusttune.registry import SpecError

app = typer.Typer(add_completion=False, no_args_is_help=True,
                  help="Map where Byzantine-robust federated learning breaks.")

EXIT_BAD_INPUT = 2


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


def load_run_values(spec_file: Optional[Path], assignments: list[str]) -> dict[str, Any]:
    """RunSpec values from an optional YAML file (a mapping of RunSpec keys, or a search space
    whose `run:` section is used) overridden by ``--set key=value`` pairs."""
    from robusttune.config import parse_assignment

    values: dict[str, Any] = {}
    if spec_file is not None:
        if not spec_file.exists():
            raise SpecError(f"spec file {str(spec_file)!r} does not exist")
        try:
            loaded = yaml.safe_load(spec_file.read_text()) or {}
        except yaml.YAMLError as error:
            raise SpecError(f"{spec_file}: not valid YAML ({str(error).splitlines()[0]})") from None
        if not isinstance(loaded, dict):
            raise SpecError(f"{spec_file}: expected a mapping of RunSpec keys")
        values.update(loaded.get("run", loaded) if "run" in loaded else loaded)
    for text in assignments:
        key, value = parse_assignment(text)
        values[key] = value
    return values


def _default_run_folder(spec: Any) -> Path:
    stamp = datetime.now().strftime("%Y%m%d-%H%M%S")
    name = (f"{spec.method}-{spec.dataset}-{spec.attack}-b{spec.byzantine_fraction:g}"
            f"-p{spec.participation:g}-s{spec.seed}-{stamp}")
    return Path("results") / "runs" / name


@app.command()
@bad_input_exits
def run(
    spec_file: Optional[Path] = typer.Argument(None, help="YAML of RunSpec keys (or a search space's run: section)."),
    set_: list[str] = typer.Option([], "--set", help="key=value, repeatable; overrides the file."),
    out: Optional[Path] = typer.Option(None, "--out", help="Run folder (default results/runs/NAME)."),
    quiet: bool = typer.Option(False, "--quiet", help="No progress bar."),
) -> None:
    """Run one federated training and write its run folder (rounds.csv, summary.json, TensorBoard)."""
    from rich.console import Console
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn
    from rich.table import Table

    from robusttune.config import RunSpec
    from robusttune.recording import RunWriter
    from robusttune.simulation import Simulation

    spec = RunSpec.from_dict(load_run_values(spec_file, set_))
    folder = out or _default_run_folder(spec)
    if (folder / "summary.json").exists():
        raise SpecError(f"--out {folder} already holds a finished run; choose another folder")
    started = time.perf_counter()
    simulation = Simulation(spec)  # loads data first: a missing dataset fails before any folder
    writer = RunWriter(folder, spec)
    console = Console(stderr=True)
    with Progress(TextColumn("[bold]{task.description}"), BarColumn(),
                  TextColumn("round {task.completed}/{task.total}"), TextColumn("{task.fields[status]}"),
                  TimeElapsedColumn(), console=console, disable=quiet) as progress:
        task = progress.add_task(spec.method, total=spec.rounds, status="")
        for record in simulation:
            writer.write(record)
            status = "" if math.isnan(record.accuracy) else f"acc {record.accuracy:.3f}"
            progress.update(task, completed=record.round, status=status)
    summary = simulation.summary(time.perf_counter() - started)
    writer.close(summary)

    table = Table(title=f"{spec.method} on {spec.dataset}", show_header=False)
    for key in ("final_accuracy", "final_loss", "collapsed", "rounds_run",
                "byzantine_majority_rounds", "seconds"):
        value = summary[key]
        table.add_row(key, f"{value:.4f}" if isinstance(value, float) else str(value))
    table.add_row("folder", str(folder))
    Console().print(table)


def main() -> None:  # pragma: no cover - console entry point
    app()


if __name__ == "__main__":  # pragma: no cover
    sys.exit(app())
