"""The body of ``robusttune sweep`` (cli.py wires it to typer; bad input raises SpecError, which
the CLI prints as one line with exit status 2).

    robusttune sweep SPACE.yaml [--name N] [--storage PATH] [--address ADDR] [--num-samples N]
        [--max-concurrent K] [--cpus-per-trial C] [--gpus-per-trial G] [--set key=value]
        [--resume] [--dry-run] [--verbose]

``--dry-run`` prints the trial count and the configurations without importing Ray. Before Ray
starts, the pre-flight (`preflight.preflight`) builds each distinct setting's data, model, rule
and attack, so an error every trial would hit is one line and exit status 2. ``--resume`` runs
the stored sweep as it is: with a flag that would change it (``--set``, ``--num-samples``, ...)
it is refused in one line that says how to proceed. ``--verbose`` gives Ray's own output back
in place of the one progress display.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from robusttune.core.registry import SpecError
from robusttune.display.terminal import table_text
from robusttune.experiments.sweep.metrics import test_metric_note
from robusttune.experiments.sweep.preflight import preflight, with_absolute_data_root
from robusttune.experiments.sweep.space import SweepSpec, format_value, load_sweep
from robusttune.experiments.sweep.storage import experiment_path, stored_sweep

# Exit status of a sweep whose trials did not all finish: 1 when some errored, 130 (the shell's
# Ctrl-C status) when it was interrupted and can be resumed.
EXIT_ERRORED = 1
EXIT_INTERRUPTED = 130


def sweep_command(
    space: Path,
    *,
    name: str | None = None,
    storage: str = "./results",
    address: str | None = None,
    num_samples: int | None = None,
    max_concurrent: int | None = None,
    cpus_per_trial: float | None = None,
    gpus_per_trial: float | str | None = None,
    assignments: list[str] | None = None,
    resume: bool = False,
    dry_run: bool = False,
    num_cpus: int | None = None,
    verbose: bool = False,
    echo: Callable[[str], None] = print,
) -> int:
    """Run ``robusttune sweep``; returns the exit status (0: every trial finished)."""
    if resume:
        refuse_changes_on_resume(
            name=name,
            storage=storage,
            space=space,
            num_samples=num_samples,
            max_concurrent=max_concurrent,
            cpus_per_trial=cpus_per_trial,
            gpus_per_trial=gpus_per_trial,
            assignments=assignments or [],
        )
    spec = prepare_spec(
        space,
        name=name,
        num_samples=num_samples,
        max_concurrent=max_concurrent,
        cpus_per_trial=cpus_per_trial,
        gpus_per_trial=gpus_per_trial,
        assignments=assignments or [],
    )
    note = test_metric_note(spec.search.metrics)
    if dry_run:
        if resume:
            raise SpecError("--dry-run and --resume exclude each other; allowed: one of them")
        echo(dry_run_report(spec))
        return 0
    if note:
        echo(note)
    # Before Ray (seconds to start) and before any trial: what every trial builds first.
    to_run = (
        stored_sweep(experiment_path(storage, spec.name))
        if resume
        else with_absolute_data_root(spec)
    )
    if to_run is not None:  # a --resume without a stored sweep is refused by run_sweep
        if resume:
            changed = differences(with_absolute_data_root(spec), to_run)
            if changed:
                echo(
                    f"note: {space} differs from the stored sweep ({', '.join(changed)}); --resume "
                    f"runs the stored one (start a new sweep with --name to run the file)"
                )
        preflight(to_run, joined=address is not None, announce=echo)

    from robusttune.experiments.sweep.runner import (
        run_sweep,  # imports ray: only when a sweep really runs
    )

    outcome = run_sweep(
        spec,
        storage=storage,
        address=address,
        resume=resume,
        num_cpus=num_cpus,
        verbose=2 if verbose else 0,
        announce=echo,
        progress=not verbose,
    )
    echo(best_trials_report(outcome.table, spec))
    echo(f"results: {outcome.path}  (tensorboard --logdir {outcome.path})")
    echo(
        f"trials: {outcome.finished} finished, {outcome.errored} errored, "
        f"{outcome.unfinished} unfinished"
    )
    from robusttune.experiments.sweep.trials import config_errors

    broken = config_errors(outcome.result_grid)
    if broken:
        trial, message = next(iter(broken.items()))
        echo(
            f"{len(broken)} trial(s) ended on a configuration error, e.g. {trial}: {message}; "
            f"--resume would run them as they are: fix the space and start a new sweep with "
            f"--name NEW"
        )
    retriable = outcome.errored - len(broken)
    if outcome.unfinished or retriable:
        again = f"robusttune sweep {space} --name {spec.name} --storage {storage} --resume"
        if address:
            again += f" --address {address}"
        echo(f"continue with: {again}")
    if outcome.unfinished:
        return EXIT_INTERRUPTED
    return EXIT_ERRORED if outcome.errored else 0


def differences(spec: SweepSpec, stored: SweepSpec) -> list[str]:
    """What differs between two sweeps: the ``run:`` keys by name, other sections by name."""
    changed = [
        f"run.{key}"
        for key in sorted(set(spec.run) | set(stored.run))
        if spec.run.get(key) != stored.run.get(key)
    ]
    for section in ("axes", "search", "scheduler", "resources", "max_concurrent", "constraints"):
        if getattr(spec, section) != getattr(stored, section):
            changed.append("space" if section == "axes" else section)
    return changed


def refuse_changes_on_resume(
    *,
    name: str | None,
    storage: str,
    space: Path,
    num_samples: int | None,
    max_concurrent: int | None,
    cpus_per_trial: float | None,
    gpus_per_trial: float | str | None,
    assignments: list[str],
) -> None:
    """``--resume`` continues the stored sweep (its trials, checkpoints and search state), so
    a flag that would change the sweep cannot apply to it: one line naming what was given and
    how to proceed, instead of silently running the stored sweep."""
    from robusttune.core.yaml_input import parse_assignments

    # (as typed, what it would change)
    given = [
        (f"--set {key}={format_value(value)}", key)
        for key, value in parse_assignments(assignments).items()
    ]
    flags = {
        "--num-samples": num_samples,
        "--max-concurrent": max_concurrent,
        "--cpus-per-trial": cpus_per_trial,
        "--gpus-per-trial": gpus_per_trial,
    }
    given += [
        (f"{flag} {format_value(value)}", flag)
        for flag, value in flags.items()
        if value is not None
    ]
    if not given:
        return
    typed, keys = ", ".join(g for g, _ in given), ", ".join(k for _, k in given)
    sweep_name = name or load_sweep(space).name  # the YAML's name: or the file's
    raise SpecError(
        f"--resume runs the stored sweep {experiment_path(storage, sweep_name)} as it "
        f"is and does not apply {typed}; to change {keys}, start "
        f"a new sweep with --name (e.g. --name {sweep_name}-2), or resume without them"
    )


def prepare_spec(
    space: Path,
    *,
    name: str | None,
    num_samples: int | None,
    max_concurrent: int | None,
    cpus_per_trial: float | None,
    gpus_per_trial: float | str | None,
    assignments: list[str],
) -> SweepSpec:
    """Load SPACE with the command-line overrides written in (validated with the file, so a flag
    may settle what the file alone leaves wrong)."""
    return load_sweep(
        space,
        assignments,
        name=name,
        num_samples=num_samples,
        max_concurrent=max_concurrent,
        cpu=cpus_per_trial,
        gpu=gpus_per_trial,
    )


def dry_run_report(spec: SweepSpec) -> str:
    """Trial count, what constraints dropped, and the configurations table."""
    lines = []
    if spec.search.algorithm == "grid":
        expansion = spec.expand()
        lines.append(
            f"{spec.name}: {len(expansion.points)} trials (grid of {expansion.combinations} "
            f"combinations, {expansion.dropped_total} dropped)"
        )
        for reason, count in expansion.dropped.most_common():
            lines.append(f"  dropped {count}: {reason}")
    else:
        lines.append(
            f"{spec.name}: {spec.search.num_samples} trials (optuna, sampler "
            f"{spec.search.sampler}, seed {spec.search.seed})"
        )
    metric = ", ".join(f"{m} ({mode})" for m, mode in zip(spec.search.metrics, spec.search.modes))
    lines.append(
        f"metric: {metric}; scheduler: {spec.scheduler.kind}; resources per trial: "
        f"cpu {spec.resources.cpu:g}, gpu {format_value(spec.resources.gpu)}; max_concurrent: "
        f"{spec.max_concurrent or 'as resources allow'}"
    )
    lines.append(table_text(spec.configurations(), index=True))
    note = test_metric_note(spec.search.metrics)
    if note:
        lines.append(note)
    lines.append("(dry run: Ray not started)")
    return "\n".join(lines)


def best_trials_report(table: Any, spec: SweepSpec, top: int = 10) -> str:
    """The best ``top`` trials as a text table (the table is sorted best first)."""
    if table is None or len(table) == 0:
        return "no trial reported a result"
    columns = [c for c in table.columns if c != "path"]
    title = f"best {min(top, len(table))} of {len(table)} trials by " + ", ".join(
        f"{m} ({mode})" for m, mode in zip(spec.search.metrics, spec.search.modes)
    )
    return table_text(table[columns].head(top), title=title)
