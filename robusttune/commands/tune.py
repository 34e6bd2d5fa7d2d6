"""`robusttune tune SPACE`: robust tuning (`robusttune.experiments.tuning`) from the command line.

    robusttune tune SPACE.yaml [--name N] [--storage PATH] [--set key=value] [--num-samples N]
        [--resume] [--dry-run] [--address ADDR] [--cpus-per-trial C] [--gpus-per-trial G]
        [--max-concurrent K] [--local] [--verbose]

The options mean what they mean to ``robusttune breakdown``. Results in STORAGE/NAME: plan.yaml
and runs.jsonl (kept as a breakdown map keeps them, so ``--resume`` runs only the missing runs;
it may change ``--num-samples``), tuning.csv, tuning.md and pareto.png; on Ray the trials' run
folders under trials/waveNNN, in process under trials/NNNNN-..."""

from __future__ import annotations

import shlex
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

__all__ = ["tune"]


def tune(
    space: Path = typer.Argument(
        ...,
        help="Tuning YAML: run (with byzantine_fraction), space (the "
        "defence's knobs), tuning (objectives, num_samples, adversary ...).",
    ),
    name: str | None = typer.Option(
        None, "--name", help="Study name (default: the YAML's name or file name)."
    ),
    storage: str = typer.Option(
        "results", "--storage", help="Results root; the study goes to STORAGE/NAME."
    ),
    set_: list[str] = SET_BASE,
    num_samples: int | None = typer.Option(
        None, "--num-samples", help="Proposals (tuning.num_samples)."
    ),
    resume: bool = typer.Option(
        False, "--resume", help="Continue a killed study without re-running finished runs."
    ),
    dry_run: bool = typer.Option(
        False, "--dry-run", help="Print the knobs, the adversary and the run bound; start nothing."
    ),
    address: str | None = ADDRESS,
    cpus_per_trial: float | None = CPUS_PER_TRIAL,
    gpus_per_trial: str | None = GPUS_PER_TRIAL,
    max_concurrent: int | None = MAX_CONCURRENT,
    local: bool = LOCAL,
    verbose: bool = typer.Option(
        False, "--verbose", help="Ray Tune's own output, besides the per-proposal lines."
    ),
) -> Any:
    """Tune a defence's knobs against the worst case: Optuna proposes knobs, each scored clean
    and against the shared adversary on validation accuracy (NSGA-II on both, or TPE on the worst
    case); prints the Pareto front and the recommended knobs with their test accuracy."""
    from robusttune.commands.breakdown import EXIT_INTERRUPTED, map_folder, runner_flags
    from robusttune.commands.trial_runner import choose_runner, ray_or_nothing
    from robusttune.core.numerics import pin
    from robusttune.core.schema import default_numerics
    from robusttune.display.terminal import print_table
    from robusttune.engine.runners import drive
    from robusttune.experiments.breakdown.store import interrupted_lines, open_stored_runner
    from robusttune.experiments.tuning import load_tuning, run_study, study_cost
    from robusttune.reports.tuning import front_table, write_tuning

    plan = load_tuning(
        space,
        assignments=set_,
        num_samples=num_samples,
        cpu=cpus_per_trial,
        gpu=gpus_per_trial,
        max_concurrent=max_concurrent,
    )
    if name is not None:
        plan.name = name
    folder = map_folder(storage, plan.name)
    if dry_run:
        if resume:
            raise SpecError("--dry-run and --resume exclude each other; allowed: one of them")
        typer.echo(study_cost(plan))
        typer.echo(f"folder: {folder} (dry run: nothing started, nothing written)")
        return
    # before the first computation, here or in a local Ray this process starts (as breakdown)
    pin(plan.base.get("numerics") or default_numerics())
    flags = [
        f"{flag}={value}"
        for flag, value in (
            ("--num-samples", num_samples),
            ("--cpus-per-trial", cpus_per_trial),
            ("--gpus-per-trial", gpus_per_trial),
            ("--max-concurrent", max_concurrent),
        )
        if value is not None
    ]
    command = shlex.join(
        [
            "robusttune",
            "tune",
            str(space),
            "--storage",
            storage,
            "--name",
            plan.name,
            *runner_flags(local, address),
            *[f"--set={a}" for a in set_],
            *flags,
        ]
    )
    runner = choose_runner(
        folder if local else folder / "trials",
        local,
        plan.resources,
        max_concurrent=plan.max_concurrent,
        notes=verbose,
        tune_verbose=1 if verbose else 0,
    )
    stored = open_stored_runner(
        folder,
        plan,
        runner,
        resume=resume,
        local=local,
        command=command,
        say=lambda line: typer.echo(line, err=True),
        kind="tuning study",
        result_file="tuning.csv",
    )
    done = [0]

    def report(wave: list[Any]) -> None:
        for proposal in wave:
            done[0] += 1
            row = proposal.row()
            knobs = " ".join(
                f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}"
                for k, v in proposal.knobs.items()
            )
            typer.echo(
                f"[{done[0]}/{plan.num_samples}] {knobs}: clean {row['clean_validation']:.3f}, "
                f"worst {row['worst_validation']:.3f} ({row['worst_attack'] or '-'})",
                err=True,
            )

    try:
        with ray_or_nothing(local, address):
            # on Ray a wave's variants run side by side, not one ladder step after another
            # (same outcomes, run_study); in process, where runs go one at a time, staged
            result = drive(runner, lambda: run_study(plan, stored, on_wave=report, staged=local))
    except KeyboardInterrupt:
        for line in interrupted_lines(folder, command):
            typer.echo(line, err=True)
        raise typer.Exit(EXIT_INTERRUPTED) from None
    path = write_tuning(result, plan, folder)
    table = result.frame()
    print_table(
        front_table(table),
        floatfmt=".3g",
        title="Pareto front: clean vs worst-case validation accuracy",
    )
    best = result.recommended
    typer.echo(
        f"recommended: {best.knobs}; worst-case validation {best.values[1]:.3f}, test "
        f"{best.worst.test_accuracy:.3f}; clean validation {best.values[0]:.3f}, test "
        f"{best.clean.test_accuracy:.3f}"
    )
    if resume:
        typer.echo(f"resumed: {stored.reused} runs kept from before, {stored.ran} new")
    typer.echo(f"report: {path}")
    return folder
