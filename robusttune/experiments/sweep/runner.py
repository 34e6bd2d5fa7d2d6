"""Run the Ray Tune experiment of a SweepSpec, or resume an interrupted one: `run_sweep`, in
named steps. The pieces live beside it: `storage` (where results go, sweep.yaml and trials.csv),
`cluster` (the Ray session and its resources), `tuner` (search, scheduler, trainable, the Tuner),
`progress` (driver-side callbacks) and `trials` (the per-trial table).

Default: a local Ray started and stopped here; ``address`` joins a running cluster (``ray up
cluster.yaml``) instead and leaves it running; a trial whose node dies there is retried from its
last checkpoint on another node (``FailureConfig(max_failures=MAX_FAILURES)``). Results go to
``STORAGE/NAME`` (default ``./results/NAME``): one folder per trial with the run folder files
(rounds.csv, summary.json, TensorBoard events), Tune's result.json/progress.csv and the latest
checkpoint; ``sweep.yaml`` (the space as run, so ``--resume`` rebuilds the same sweep) and
``trials.csv`` (one row per trial) beside them.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import yaml

from robusttune.core.plugins import declared
from robusttune.core.registry import SpecError
from robusttune.engine.recording import declare_experiment
from robusttune.experiments.sweep.cluster import check_cluster, ray_session
from robusttune.experiments.sweep.gpu_share import AUTO, cluster_gpu_nodes
from robusttune.experiments.sweep.preflight import with_absolute_data_root
from robusttune.experiments.sweep.progress import ProgressCallback, Timeline, TimelineCallback
from robusttune.experiments.sweep.space import SweepSpec
from robusttune.experiments.sweep.storage import (
    DEFAULT_STORAGE,
    SWEEP_FILE,
    TRIALS_FILE,
    experiment_path,
    is_local,
    read_text,
    restorable,
    stored_sweep,
    write_text,
)
from robusttune.experiments.sweep.trials import saved_statuses, trials_table

# Names that lived in this module before it was split, kept importable from here: other code
# imports them from here, and a stored experiment state (tuner.pkl) names the pickled
# TrialDirname and callbacks by this module.
from robusttune.experiments.sweep.tuner import (  # noqa: F401
    TrialDirname,
    make_sampler,
    make_scheduler,
    make_search,
    make_trainable,
    new_tuner,
    restored_tuner,
    tune_environment,
)

__all__ = ["MAX_FAILURES", "SweepOutcome", "run_sweep"]

# Retries per trial (FailureConfig): a trial whose node dies (a spot instance reclaimed, a
# machine lost) starts again on another node from its last checkpoint. Tune counts every failure
# here, an exception in the trial too, so a trial with a bug runs 1 + MAX_FAILURES times; a
# configuration error (SpecError) is not raised to Tune, so it runs once (trainable.py).
MAX_FAILURES = 3


@dataclass
class SweepOutcome:
    """What a sweep left: where, the per-trial table (sorted best first), trial counts and the
    fixed-cost timeline (seconds since the command started)."""

    path: str
    table: Any  # pandas.DataFrame
    finished: int
    errored: int
    unfinished: int
    timeline: dict[str, float] = field(default_factory=dict)
    result_grid: Any = None


def run_sweep(
    spec: SweepSpec,
    *,
    storage: str = DEFAULT_STORAGE,
    address: str | None = None,
    resume: bool = False,
    num_cpus: int | None = None,
    verbose: int = 1,
    callbacks: list[Any] | None = None,
    trainable: Callable[..., Any] | None = None,
    announce: Callable[[str], None] | None = None,
    progress: bool = False,
    max_failures: int = MAX_FAILURES,
) -> SweepOutcome:
    """Run (or with ``resume`` continue) the sweep ``spec`` under ``STORAGE/spec.name``.

    ``trainable`` replaces the federated trainable (same signature: ``(config, sweep)``; a
    resumed sweep needs the same one); ``callbacks`` are extra Tune
    callbacks; ``announce`` receives one-line notes and ``progress`` shows the one progress
    display (the command uses both with ``verbose=0``, which also keeps Ray's own notices off
    the terminal: `tune_environment`); ``max_failures`` retries of a failed trial from its
    last checkpoint (a lost node; a configuration error is never retried, see
    `trainable.report_config_error`). The command runs `preflight.preflight` before this."""
    say = announce or (lambda text: None)
    timeline = Timeline()
    path = experiment_path(storage, spec.name)
    spec = dataclasses.replace(_sweep_to_run(spec, path, resume), plugins=declared())
    with ray_session(address, num_cpus):
        timeline.mark("ray_ready")
        joined = address is not None
        check_cluster(spec, joined=joined, announce=say)
        if resume and not restorable(path):
            raise SpecError(
                f"--resume: {path} holds no Tune state yet; run it again without --resume"
            )
        # before anything is written: `auto` on device cuda without a GPU is refused here
        gpu_nodes = cluster_gpu_nodes(joined) if spec.resources.gpu == AUTO else []
        bound = make_trainable(spec, trainable, gpu_nodes)
        if not resume:  # a resumed sweep runs what sweep.yaml already says
            write_text(
                path, SWEEP_FILE, yaml.safe_dump({"name": spec.name, **spec.raw}, sort_keys=False)
            )
            _declare_hparams(spec, path, say)
        extra = [*(callbacks or [])]
        display = None
        if progress:
            # the total is the stored sweep's on --resume too (spec is then the stored one)
            display = ProgressCallback(
                spec.search.metric, spec.trial_count(), mode=spec.search.mode, name=spec.name
            )
            extra.append(display)
        with tune_environment(
            quiet=verbose == 0, on_interrupt=display.interrupted if display else None
        ):
            tuner = _tuner(
                spec,
                path,
                bound,
                resume=resume,
                storage=storage,
                say=say,
                callbacks=[TimelineCallback(timeline), *extra],
                max_failures=max_failures,
                verbose=verbose,
            )
            timeline.mark("fit_start")
            try:
                grid = tuner.fit()
            finally:
                if display is not None:
                    display.close()
            timeline.mark("fit_end")
        statuses = saved_statuses(path, grid)
        table = trials_table(grid, spec, statuses)
        write_text(path, TRIALS_FILE, table.to_csv(index=False))
    timeline.mark("exit")
    return _outcome(path, table, statuses, timeline, grid, total=spec.trial_count())


def _declare_hparams(spec: SweepSpec, path: str, say: Callable[[str], None]) -> None:
    """The sweep's HParams experiment in its folder (swept keys first, shown by default)."""
    if not is_local(path):
        say("note: TensorBoard's HParams columns are inferred from the trials on remote storage")
        return
    example = spec.run_spec(spec.example_point()).to_dict()
    declare_experiment(path, example, [k for k in spec.varied_keys if k in example])


def _tuner(
    spec: SweepSpec,
    path: str,
    bound: Any,
    *,
    resume: bool,
    storage: str,
    say: Callable[[str], None],
    callbacks: list[Any],
    max_failures: int,
    verbose: int,
) -> Any:
    """This run's Tuner, announced: the stored one restored with ``resume``, else a fresh one."""
    if resume:
        say(
            f"resuming {path} (finished trials are kept; unfinished ones continue from "
            f"their last checkpoint, errored ones start again but for configuration errors)"
        )
        return restored_tuner(path, bound, callbacks=callbacks, verbose=verbose)
    tuner, num_samples = new_tuner(
        spec,
        bound,
        storage=storage,
        callbacks=callbacks,
        max_failures=max_failures,
        verbose=verbose,
    )
    say(f"sweep {spec.name}: {num_samples} trials ({spec.search.algorithm}), results in {path}")
    return tuner


def _sweep_to_run(spec: SweepSpec, path: str, resume: bool) -> SweepSpec:
    """With ``resume`` the sweep stored at ``path``; else ``spec`` ready for its trials, unless
    ``path`` already holds a sweep that could be resumed."""
    if resume:
        stored = stored_sweep(path)
        if stored is None:
            raise SpecError(
                f"--resume: no sweep to resume at {path} (no {SWEEP_FILE}); allowed: "
                f"the --name and --storage of an earlier sweep"
            )
        return stored
    if read_text(path, SWEEP_FILE) is not None and restorable(path):
        raise SpecError(
            f"{path} already holds the sweep {spec.name!r}; use --resume to continue "
            f"it, or --name for a new one"
        )
    return _absolute_data_root(spec)


# a relative data_root made absolute at the driver: one home, in the ray-free pre-flight module
_absolute_data_root = with_absolute_data_root


def _outcome(
    path: str, table: Any, statuses: dict[str, str], timeline: Timeline, grid: Any, total: int
) -> SweepOutcome:
    """The SweepOutcome: trial counts from the saved statuses (what ``--resume`` acts on).
    Unfinished counts the trials Tune had not created yet when the sweep was interrupted too
    (``total``: the sweep's trial count), so a sweep stopped between two trials is not done."""
    counts = list(statuses.values())
    finished, errored = counts.count("TERMINATED"), counts.count("ERROR")
    unfinished = max(len(counts), total) - finished - errored
    return SweepOutcome(
        path=path,
        table=table,
        finished=finished,
        errored=errored,
        unfinished=unfinished,
        timeline=dict(timeline.marks),
        result_grid=grid,
    )
