"""The body of ``robusttune sweep`` (cli.py wires it to typer; bad input raises SpecError, which
the CLI prints as one line with exit status 2).

    robusttune sweep SPACE.yaml [--name N] [--storage PATH] [--address ADDR] [--num-samples N]
        [--max-concurrent K] [--cpus-per-trial C] [--gpus-per-trial G] [--set key=value]
        [--resume] [--dry-run]

``--dry-run`` prints the trial count and the configurations without importing Ray.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable, Optional

from robusttune.registry import SpecError
from robusttune.sweep.space import SweepSpec, load_sweep
from robusttune.terminal import table_text

# Exit status of a sweep whose trials did not all finish: 1 when some errored, 130 (the shell's
# Ctrl-C status) when it was interrupted and can be resumed.
EXIT_ERRORED = 1
EXIT_INTERRUPTED = 130


def sweep_command(
    space: Path,
    *,
    name: Optional[str] = None,
    storage: str = "./results",
    address: Optional[str] = None,
    num_samples: Optional[int] = None,
    max_concurrent: Optional[int] = None,
    cpus_per_trial: Optional[float] = None,
    gpus_per_trial: Optional[float] = None,
    assignments: Optional[list[str]] = None,
    resume: bool = False,
    dry_run: bool = False,
    num_cpus: Optional[int] = None,
    echo: Callable[[str], None] = print,
) -> int:
    """Run ``robusttune sweep``; returns the exit status (0: every trial finished)."""
    spec = prepare_spec(space, name=name, num_samples=num_samples, max_concurrent=max_concurrent,
                        cpus_per_trial=cpus_per_trial, gpus_per_trial=gpus_per_trial,
                        assignments=assignments or [])
    if dry_run:
        if resume:
            raise SpecError("--dry-run and --resume exclude each other; allowed: one of them")
        echo(dry_run_report(spec))
        return 0

    from robusttune.sweep.runner import run_sweep  # imports ray: only when a sweep really runs

    outcome = run_sweep(spec, storage=storage, address=address, resume=resume, num_cpus=num_cpus,
                        verbose=0, announce=echo, progress=True)
    echo(best_trials_report(outcome.table, spec))
    echo(f"results: {outcome.path}  (tensorboard --logdir {outcome.path})")
    echo(f"trials: {outcome.finished} finished, {outcome.errored} errored, "
         f"{outcome.unfinished} unfinished")
    if outcome.unfinished or outcome.errored:
        again = f"robusttune sweep {space} --name {spec.name} --storage {storage} --resume"
        if address:
            again += f" --address {address}"
        echo(f"continue with: {again}")
        return EXIT_INTERRUPTED if outcome.unfinished else EXIT_ERRORED
    return 0


def prepare_spec(space: Path, *, name: Optional[str], num_samples: Optional[int],
                 max_concurrent: Optional[int], cpus_per_trial: Optional[float],
                 gpus_per_trial: Optional[float], assignments: list[str]) -> SweepSpec:
    """Load SPACE and apply the command-line overrides (validated like the file)."""
    from robusttune.yaml_input import parse_assignments

    spec = load_sweep(space)
    run = parse_assignments(assignments)
    if any(v is not None for v in (name, num_samples, max_concurrent, cpus_per_trial, gpus_per_trial)) or run:
        spec = spec.with_overrides(name=name, num_samples=num_samples, max_concurrent=max_concurrent,
                                   cpu=cpus_per_trial, gpu=gpus_per_trial, run=run or None)
    return spec


def dry_run_report(spec: SweepSpec) -> str:
    """Trial count, what constraints dropped, and the configurations table."""
    lines = []
    if spec.search.algorithm == "grid":
        expansion = spec.expand()
        lines.append(f"{spec.name}: {len(expansion.points)} trials (grid of {expansion.combinations} "
                     f"combinations, {expansion.dropped_total} dropped)")
        for reason, count in expansion.dropped.most_common():
            lines.append(f"  dropped {count}: {reason}")
    else:
        lines.append(f"{spec.name}: {spec.search.num_samples} trials (optuna, sampler "
                     f"{spec.search.sampler}, seed {spec.search.seed})")
    metric = ", ".join(f"{m} ({mode})" for m, mode in zip(spec.search.metrics, spec.search.modes))
    lines.append(f"metric: {metric}; scheduler: {spec.scheduler.kind}; resources per trial: "
                 f"cpu {spec.resources.cpu:g}, gpu {spec.resources.gpu:g}; max_concurrent: "
                 f"{spec.max_concurrent or 'as resources allow'}")
    lines.append(table_text(spec.configurations(), index=True))
    lines.append("(dry run: Ray not started)")
    return "\n".join(lines)


def best_trials_report(table: Any, spec: SweepSpec, top: int = 10) -> str:
    """The best ``top`` trials as a text table (the table is sorted best first)."""
    if table is None or len(table) == 0:
        return "no trial reported a result"
    columns = [c for c in table.columns if c != "path"]
    title = f"best {min(top, len(table))} of {len(table)} trials by " + \
        ", ".join(f"{m} ({mode})" for m, mode in zip(spec.search.metrics, spec.search.modes))
    return table_text(table[columns].head(top), title=title)
