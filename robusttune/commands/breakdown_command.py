"""`robusttune breakdown`: its options and its steps in order (the steps themselves, which
need torch, are robusttune.commands.breakdown; this module stays light, so the command line
starts without them). robusttune.commands.cli registers it."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import typer

from robusttune.commands.options import (
    ADDRESS,
    CPUS_PER_TRIAL,
    GPUS_PER_TRIAL,
    LOCAL,
    MAX_CONCURRENT,
    SET_BASE,
)
from robusttune.core.registry import SpecError

__all__ = ["breakdown"]


def breakdown(
    space: Path = typer.Argument(
        ...,
        help="Breakdown YAML: run, space (grid axes = cells, drawn "
        "axes = defence knobs tuned per point), breakdown.",
    ),
    name: str | None = typer.Option(
        None, "--name", help="Map name (default: the YAML's name or file name)."
    ),
    storage: str = typer.Option(
        "results",
        "--storage",
        help="Results root, a local or shared folder; the map goes to STORAGE/NAME.",
    ),
    set_: list[str] = SET_BASE,
    resume: bool = typer.Option(
        False, "--resume", help="Continue a killed map without re-running finished runs."
    ),
    dry_run: bool = typer.Option(
        False, "--dry-run", help="Print the cells, lattices and trial counts; start nothing."
    ),
    address: str | None = ADDRESS,
    cpus_per_trial: float | None = CPUS_PER_TRIAL,
    gpus_per_trial: str | None = GPUS_PER_TRIAL,
    max_concurrent: int | None = MAX_CONCURRENT,
    threshold: float | None = typer.Option(
        None, "--threshold", help="Absolute accuracy a point must reach."
    ),
    relative_threshold: float | None = typer.Option(
        None, "--relative-threshold", help="Fraction of the cell's clean accuracy (default 0.5)."
    ),
    budget: int | None = typer.Option(
        None, "--budget", help="Optuna trials per lattice point for the drawn knobs."
    ),
    max_fraction: float | None = typer.Option(
        None, "--max-fraction", help="Top of the lattice (default 0.5)."
    ),
    on_non_monotone: str | None = typer.Option(None, "--on-non-monotone", help="flag | scan."),
    verify_radius: int | None = typer.Option(
        None,
        "--verify-radius",
        help="Also evaluate b-R .. b+1+R around each boundary b (default 1).",
    ),
    start_from: str | None = typer.Option(
        None,
        "--start-from",
        help="An earlier map of the same cells (folder or breakdown.csv): each cell "
        "tries its answer b0 and b0+1 first (rounds and N may differ).",
    ),
    local: bool = LOCAL,
    verbose: bool = typer.Option(
        False, "--verbose", help="Ray Tune's own output, besides the progress line."
    ),
    out: Path | None = typer.Option(
        None,
        "--out",
        hidden=True,
        help="The results folder itself (--storage OUT's parent, --name its name).",
    ),
) -> Any:
    """Largest surviving Byzantine fraction per cell, by parallel bisection over {0, 1/N, ...}.

    Writes breakdown.csv, breakdown_points.csv (the trials behind each number), breakdown.md and
    breakdown.png (aggregator x p heatmap, one panel per attack) under STORAGE/NAME, beside
    plan.yaml (the plan as run) and runs.jsonl (every finished run, what --resume keeps)."""
    from robusttune.commands.breakdown import (
        EXIT_INTERRUPTED,
        command_line,
        dry_run_report,
        map_folder,
        plan_starts,
        prepare_plan,
        run_map,
        runner_flags,
    )
    from robusttune.commands.trial_runner import choose_runner, ray_or_nothing
    from robusttune.core.numerics import pin
    from robusttune.experiments.breakdown import write_breakdown
    from robusttune.experiments.breakdown.store import interrupted_lines

    if out is not None:  # the older spelling: the folder itself
        if name is not None:
            raise SpecError("--out and --name exclude each other; allowed: --storage and --name")
        storage, name = str(out.parent), out.name
    plan = prepare_plan(
        space,
        name=name,
        assignments=set_,
        cpus_per_trial=cpus_per_trial,
        gpus_per_trial=gpus_per_trial,
        max_concurrent=max_concurrent,
        threshold=threshold,
        relative_threshold=relative_threshold,
        budget=budget,
        max_fraction=max_fraction,
        on_non_monotone=on_non_monotone,
        verify_radius=verify_radius,
        start_from=start_from,
    )
    starts = plan_starts(plan)  # a bad start_from is one line before any folder is made
    folder = map_folder(storage, plan.name)
    if not dry_run:
        from robusttune.core.schema import default_numerics

        # before this process computes: --local trains here, a local Ray inherits the pin
        pin(plan.base.get("numerics") or default_numerics())
    if dry_run:
        if resume:
            raise SpecError("--dry-run and --resume exclude each other; allowed: one of them")
        dry_run_report(plan, folder, starts=starts)
        return
    command = command_line(space, plan, storage, runner_flags(local, address))
    runner = choose_runner(
        folder if local else folder / "trials",
        local,
        plan.resources,
        max_concurrent=plan.max_concurrent,
        notes=verbose,
        tune_verbose=1 if verbose else 0,
    )  # the progress line replaces both
    try:
        result, stored = run_map(
            plan,
            folder,
            runner,
            resume=resume,
            local=local,
            session=ray_or_nothing(local, address),
            starts=starts,
            command=command,
        )
    except KeyboardInterrupt:
        for line in interrupted_lines(folder, command):
            typer.echo(line, err=True)
        raise typer.Exit(EXIT_INTERRUPTED) from None
    path = write_breakdown(result, folder, title=f"Breakdown map: {plan.name}", base=plan.base)
    from robusttune.display.terminal import print_table
    from robusttune.experiments.breakdown.answer import breakdown_table

    table = breakdown_table(result, plan.base)
    shown = [
        c
        for c in table.columns
        if c
        in (
            *plan.cells[0].as_dict(),
            "breakdown",
            "broken_by",
            "theory_fraction",
            "p_majority_run",
            "clean_accuracy",
            "trials",
        )
    ]
    print_table(table[shown], floatfmt=".3g")
    typer.echo(f"cost: {result.cost_line()}")
    if resume:
        typer.echo(
            f"resumed: {stored.reused} runs kept from before ({folder / 'runs.jsonl'}), "
            f"{stored.ran} new"
        )
    typer.echo(f"report: {path}")
    return folder
