"""`robusttune horizon SPACE`: each cell's plateau round (`robusttune.experiments.breakdown.horizon`).

    robusttune horizon SPACE.yaml [--name N] [--storage PATH] [--set key=value] [--max-rounds R]
        [--eval-every E] [--window W] [--tolerance T] [--seed S ...] [--resume] [--address ADDR]
        [--cpus-per-trial C] [--max-concurrent K] [--local]

The options mean what they mean to ``robusttune breakdown``. Results in STORAGE/NAME (default
NAME: the map's name + ``_horizon``): horizon.csv, curves.csv (every evaluated point of every
clean curve), horizon.md, at_plateau.yaml (the map with each cell at its plateau round),
plan.yaml and runs.jsonl (``--resume`` runs only the missing clean runs) and the runs' folders
under trials/."""

from __future__ import annotations

import shlex
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import typer

from robusttune.commands.options import ADDRESS, CPUS_PER_TRIAL, MAX_CONCURRENT, SET_BASE

if TYPE_CHECKING:  # the command imports its layers when it runs, not when the CLI loads
    from robusttune.core.records import RunSummary
    from robusttune.core.runspec import RunSpec

__all__ = ["horizon"]


def horizon(
    space: Path = typer.Argument(..., help="Breakdown YAML: its cells' clean runs are measured."),
    name: str | None = typer.Option(
        None, "--name", help="Folder name (default: the map's name + _horizon)."
    ),
    storage: str = typer.Option(
        "results", "--storage", help="Results root; the measurement goes to STORAGE/NAME."
    ),
    set_: list[str] = SET_BASE,
    max_rounds: int = typer.Option(200, "--max-rounds", help="Rounds of each clean run."),
    eval_every: int = typer.Option(
        5, "--eval-every", help="Evaluate every E rounds (and at the last)."
    ),
    window: int = typer.Option(3, "--window", help="Trailing mean over W evaluations."),
    tolerance: float = typer.Option(
        0.02, "--tolerance", help="Plateau: within T of the best smoothed accuracy."
    ),
    seeds: list[int] = typer.Option(
        [], "--seed", help="Seeds, repeatable (default: the map's breakdown.seeds)."
    ),
    resume: bool = typer.Option(
        False, "--resume", help="Continue a killed measurement without re-running finished runs."
    ),
    address: str | None = ADDRESS,
    cpus_per_trial: float | None = CPUS_PER_TRIAL,
    max_concurrent: int | None = MAX_CONCURRENT,
    local: bool = typer.Option(
        False, "--local", help="Run the clean runs in this process, without Ray."
    ),
) -> None:
    """Each cell's horizon: the round its clean run stops learning, and the map at those rounds.

    A breakdown reads half the cell's clean margin above chance; read on an undertrained model
    the bar is low. Writes horizon.md (per cell: horizon, accuracy at the cell's rounds and at the horizon)
    and at_plateau.yaml, to run with ``robusttune breakdown``."""
    from robusttune.commands.breakdown import (
        EXIT_INTERRUPTED,
        map_folder,
        prepare_plan,
        runner_flags,
    )
    from robusttune.commands.trial_runner import choose_runner, ray_or_nothing
    from robusttune.core.numerics import pin
    from robusttune.core.schema import default_numerics
    from robusttune.engine.runners import drive
    from robusttune.experiments.breakdown.horizon import (
        HorizonPlan,
        cell_horizons,
        measure_horizon,
        write_horizon,
    )
    from robusttune.experiments.breakdown.store import interrupted_lines, open_stored_runner

    plan = prepare_plan(
        space, assignments=set_, cpus_per_trial=cpus_per_trial, max_concurrent=max_concurrent
    )
    measurement = HorizonPlan(
        plan,
        max_rounds=max_rounds,
        eval_every=eval_every,
        window=window,
        tolerance=tolerance,
        seeds=tuple(seeds),
        name=name or f"{plan.name}_horizon",
    )
    folder = map_folder(storage, measurement.name)
    pin(plan.base.get("numerics") or default_numerics())
    options = [
        f"--max-rounds={max_rounds}",
        f"--eval-every={eval_every}",
        f"--window={window}",
        f"--tolerance={tolerance:g}",
        *[f"--seed={s}" for s in seeds],
    ]
    command = shlex.join(
        [
            "robusttune",
            "horizon",
            str(space),
            "--storage",
            storage,
            "--name",
            measurement.name,
            *runner_flags(local, address),
            *[f"--set={a}" for a in set_],
            *options,
        ]
    )
    runner = choose_runner(
        folder if local else folder / "trials",
        local,
        plan.resources,
        max_concurrent=plan.max_concurrent,
        notes=False,
    )
    jobs = len(measurement.clean_specs())
    done = [0]

    def counted(specs: Sequence[RunSpec]) -> list[RunSummary]:
        summaries = runner(specs)
        done[0] += len(specs)
        typer.echo(f"[{done[0]}/{jobs}] clean runs done", err=True)
        return summaries

    stored = open_stored_runner(
        folder,
        measurement,
        counted,
        resume=resume,
        local=local,
        command=command,
        say=lambda line: typer.echo(line, err=True),
        kind="horizon measurement",
        result_file="horizon.csv",
    )
    typer.echo(
        f"{len(plan.cells)} cells x {len(measurement.seeds)} seeds = {jobs} clean runs of "
        f"{max_rounds} rounds",
        err=True,
    )
    try:
        with ray_or_nothing(local, address):
            rows, curves = drive(runner, lambda: measure_horizon(measurement, stored))
    except KeyboardInterrupt:
        for line in interrupted_lines(folder, command):
            typer.echo(line, err=True)
        raise typer.Exit(EXIT_INTERRUPTED) from None
    path = write_horizon(measurement, rows, curves, folder, command=command)
    found = [h for h in cell_horizons(rows).values() if h is not None]
    unreached = sorted({row["cell"] for row in rows if not row["plateau_reached"]})
    span = f"{min(found)} to {max(found)} rounds" if found else "none (every clean run diverged)"
    typer.echo(
        f"horizons: {span}; {len(unreached)} of {len(plan.cells)} cells not at a plateau "
        f"within {max_rounds} rounds{' (raise --max-rounds)' if unreached else ''}"
    )
    if resume:
        typer.echo(f"resumed: {stored.reused} runs kept from before, {stored.ran} new")
    typer.echo(f"report: {folder / 'horizon.md'}")
    typer.echo(f"map at the plateau: robusttune breakdown {path}")
