"""The body of ``robusttune breakdown`` (cli.py wires it to typer and chooses the runner; bad
input raises SpecError, which the CLI prints as one line with exit status 2).

    robusttune breakdown SPACE.yaml [--name N] [--storage PATH] [--set key=value] [--resume]
        [--dry-run] [--address ADDR] [--cpus-per-trial C] [--gpus-per-trial G]
        [--max-concurrent K] [--local] [--verbose] [--threshold ...]

The options mean what they mean to ``robusttune sweep``: the map lives in STORAGE/NAME (default
``results/`` and the plan's name), ``--set`` overrides the ``run:`` section. The folder keeps the
plan and every finished run (`robusttune.experiments.breakdown.store`), so ``--resume`` continues a killed
map without running a finished run again. ``--dry-run`` prints the cells, their lattices, the
adversary variants and the trial counts, and starts nothing.
"""

from __future__ import annotations

import shlex
from collections.abc import Callable, Mapping, Sequence
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any

from rich.console import Console

from robusttune.core.plugins import declared
from robusttune.core.registry import SpecError
from robusttune.display.terminal import print_table
from robusttune.experiments.breakdown.bisection import Cell
from robusttune.experiments.breakdown.evaluate import spec_evaluator
from robusttune.experiments.breakdown.plan import (
    BreakdownPlan,
    load_plan,
    plan_costs,
    replicate_costs,
)
from robusttune.experiments.breakdown.prior import prior_starts, read_prior
from robusttune.experiments.breakdown.progress import MapProgress
from robusttune.experiments.breakdown.replicates import ReplicatedMap, bisect_replicates
from robusttune.experiments.breakdown.store import StoredRunner, open_stored_runner
from robusttune.methods.adversary import Adversary

__all__ = [
    "DEFAULT_STORAGE",
    "EXIT_INTERRUPTED",
    "command_line",
    "dry_run_report",
    "map_folder",
    "plan_starts",
    "prepare_plan",
    "run_map",
    "runner_flags",
]

DEFAULT_STORAGE = "results"
EXIT_INTERRUPTED = 130  # the shell's Ctrl-C status, as for an interrupted sweep


def prepare_plan(
    space: Path,
    *,
    name: str | None = None,
    assignments: Sequence[str] = (),
    cpus_per_trial: float | None = None,
    gpus_per_trial: float | str | None = None,
    max_concurrent: int | None = None,
    **section: Any,
) -> BreakdownPlan:
    """Load SPACE with the command line written in (validated with the file, so a flag may settle
    what the file alone leaves wrong; a bad value is named as typed)."""
    return load_plan(
        space,
        assignments,
        name=name,
        cpu=cpus_per_trial,
        gpu=gpus_per_trial,
        max_concurrent=max_concurrent,
        **section,
    )


def map_folder(storage: str, name: str) -> Path:
    """STORAGE/NAME, as for a sweep. The map's own files (plan, runs, report) are written here
    by this process, so STORAGE is a local folder or one shared by the cluster's nodes."""
    from robusttune.experiments.sweep.storage import experiment_path, is_local

    if not is_local(storage):
        raise SpecError(
            f"--storage {storage}: a breakdown map keeps its plan, runs and report in "
            f"a folder this machine writes; allowed: a local path or a folder shared "
            f"by the cluster's nodes (e.g. an NFS or bucket mount)"
        )
    return Path(experiment_path(storage, name))


def dry_run_report(
    plan: BreakdownPlan,
    folder: Path,
    console: Console | None = None,
    *,
    starts: Mapping[Cell, int] | None,
) -> None:
    """The cells with their lattices, adversary variants and trial counts, and how many cells
    ``starts`` (`plan_starts`) gives an earlier answer; runs nothing."""
    console = console or Console()
    costs = plan_costs(plan)
    rows = []
    for cost in costs:
        variants = " | ".join(
            " ".join(f"{k}={v}" for k, v in variant.items()) or "as set"
            for variant in cost.variants
        )
        rows.append(
            {
                **{k: str(v) for k, v in cost.cell.as_dict().items()},
                "N": cost.cell.clients,
                "lattice": cost.lattice,
                "variants per attacked point": f"{len(cost.variants)}: {variants}"
                + (f" + up to {plan.adaptive} searched" if plan.adaptive else ""),
                "points (bisection)": cost.points,
                "points (lattice)": cost.seeds * (cost.k_max + 1),
                "trials (bisection)": cost.expected,
                "trials (bound)": cost.bound,
            }
        )
    tuning = (
        f"budget {plan.budget} Optuna trials per point for {', '.join(plan.tune)}"
        if plan.tune
        else "no tuned knob"
    )
    print_table(
        rows,
        console=console,
        title=f"{plan.name}: {len(costs)} cells, {len(plan.seeds)} seed(s), {tuning}",
    )
    bound = sum(c.bound for c in costs)
    expected = sum(c.expected for c in costs)
    later = (
        "; each later seed starts from the first seed's answer b1: 1 clean point, b1 and "
        "b1 + 1 where it holds"
        if len(plan.seeds) > 1
        else ""
    )
    console.print(
        f"trials: about {expected} by bisection (first seed: 1 clean point, "
        f"ceil(log2(k_max + 1)) midpoints and up to {2 * plan.verify_radius} "
        f"verification points per cell{later}), "
        f"at most {bound} (the full lattice x seeds x variants x budget)",
        markup=False,
        highlight=False,
        soft_wrap=True,
    )
    if starts is not None:
        console.print(
            f"started from {plan.start_from}: {len(starts)} of {len(costs)} cells have "
            f"an earlier answer (the others bisect from scratch)",
            markup=False,
            highlight=False,
            soft_wrap=True,
        )
    console.print(
        f"folder: {folder} (dry run: nothing started, nothing written)",
        markup=False,
        highlight=False,
        soft_wrap=True,
    )


def run_map(
    plan: BreakdownPlan,
    folder: Path,
    runner: Callable[..., Any],
    *,
    resume: bool,
    local: bool,
    session: AbstractContextManager[Any],
    starts: Mapping[Cell, int] | None,
    command: str = "",
    console: Console | None = None,
) -> tuple[ReplicatedMap, StoredRunner]:
    """Bisect ``plan``'s cells at each of its seeds (`bisect_replicates`) with ``runner`` inside
    ``session`` (a Ray session, or nothing),
    every finished run kept in ``folder`` and, with ``resume``, the kept ones not run again.
    ``starts``: the cells' earlier answers (`plan_starts`). A Ctrl-C (KeyboardInterrupt)
    propagates; what finished before it is kept."""
    console = console or Console(stderr=True)
    # in process the runs go one after another anyway: the lock-step waves keep the run folders'
    # order; a streaming runner (Ray) gets every cell's next runs as soon as each cell asks
    concurrent = hasattr(runner, "drive")
    progress = MapProgress(replicate_costs(plan), console=console, concurrent=concurrent)
    stored = open_stored_runner(
        folder,
        plan,
        runner,
        resume=resume,
        local=local,
        command=command,
        say=lambda line: console.print(line, markup=False, highlight=False, soft_wrap=True),
        on_runs=progress.runs,
    )
    evaluate = spec_evaluator(
        plan.base,
        stored,
        seeds=plan.seeds,
        tune=plan.tune or None,
        budget=plan.budget if plan.tune else 1,
        adversary=Adversary.of(plan.adversary or None, plan.adaptive),
        sampler_seed=plan.sampler_seed,
        survival=(plan.threshold, plan.relative_threshold),
        clean_margin=plan.clean_margin,
    )
    from robusttune.engine.runners import drive

    options = {
        "max_fraction": plan.max_fraction,
        "threshold": plan.threshold,
        "relative_threshold": plan.relative_threshold,
        "verify_radius": plan.verify_radius,
        "on_non_monotone": plan.on_non_monotone,
        "clean_margin": plan.clean_margin,
    }

    def bisect() -> ReplicatedMap:
        return bisect_replicates(
            plan.cells,
            plan.seeds,
            progress.watch(evaluate),
            starts=starts,
            concurrent=concurrent,
            on_replicate_done=lambda done: progress.cell_done(done.cell),
            **options,
        )

    with session, progress:
        result = drive(stored, bisect)
        progress.finish()
    return result, stored


def plan_starts(plan: BreakdownPlan) -> dict[Cell, int] | None:
    """The cells' earlier answers from ``breakdown.start_from`` (None without it); a missing or
    foreign file is a SpecError before anything is written."""
    if plan.start_from is None:
        return None
    return prior_starts(read_prior(plan.start_from), plan.cells, plan.max_fraction)


def runner_flags(local: bool, address: str | None) -> list[str]:
    """How a command ran, as its flags: ``--local`` (in process), ``--address A`` or none (a
    local Ray); part of the command line a map, measurement or study records for --resume."""
    return ["--local"] if local else (["--address", address] if address else [])


def command_line(space: Path, plan: BreakdownPlan, storage: str, extra: Sequence[str] = ()) -> str:
    """The command that ran this map: the YAML, its overrides as typed, the storage and
    ``extra`` (how it ran: ``--local``, ``--address``); add ``--resume`` to continue it."""
    words = ["robusttune", "breakdown", str(space)]
    for given in plan.given:
        words += given.split(" ", 1)
    if "--name" not in words:
        words += ["--name", plan.name]
    words += ["--storage", storage, *extra]
    for plugin in declared():  # a resume must know the same names (--plugin ones included)
        if plugin.kind in ("file", "module"):
            words += ["--plugin", plugin.reference]
    return " ".join(shlex.quote(w) for w in words)
