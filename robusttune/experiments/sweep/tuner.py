"""The Ray Tune objects of a sweep: trial folder names, the search algorithm, the scheduler, the
trainable with its resources, and the Tuner itself (a fresh one, or one restored by ``--resume``).

Grid search: the grid is expanded by `SweepSpec.expand` (constraints applied) and fed to Tune's
BasicVariantGenerator as ``points_to_evaluate``, one point per trial; drawn axes are sampled by
Tune with ``search.seed``. Optuna: `OptunaSearch` over the space's domains with the chosen sampler
seeded by ``search.seed``; with ``max_concurrent: 1`` the study is reproducible.
"""

from __future__ import annotations

import contextlib
import os
import re
from collections.abc import Callable, Iterator, Sequence
from typing import Any

from robusttune.experiments.sweep.domains import key_values
from robusttune.experiments.sweep.gpu_share import GpuNode, resolve_gpu
from robusttune.experiments.sweep.progress import ProgressCallback, TimelineCallback
from robusttune.experiments.sweep.ray_compat import quiet_tune_logs, restored_run_config
from robusttune.experiments.sweep.space import SweepSpec, format_value
from robusttune.experiments.sweep.storage import is_local, storage_path

__all__ = [
    "TrialDirname",
    "make_sampler",
    "make_scheduler",
    "make_search",
    "make_trainable",
    "new_tuner",
    "restored_tuner",
    "tune_environment",
]


class TrialDirname:
    """Trial folder names that say what the trial is: ``00012_1a2b3_krum_alie-0.2_p0.5_s42``
    (strings as they are, numbers after the initials of their key; joint values joined by '-')."""

    def __init__(self, spec: SweepSpec) -> None:
        self.parts: list[tuple[str, dict[str, str] | None]] = []
        for axis in spec.axes:
            labels = None
            if axis.groups is not None:
                labels = {
                    label: "-".join(format_value(v) for v in group.values())
                    for label, group in axis.groups.items()
                }
            self.parts.append((axis.name, labels))

    def __call__(self, trial: Any) -> str:
        # Tune numbers trials in the order it creates them (the experiment tag starts with that
        # number) while Optuna trials get random ids: lead with the number so folders sort in
        # proposal order, then the id's first part for uniqueness.
        number = str(trial.experiment_tag).split("_", 1)[0]
        pieces = [f"{int(number):05d}" if number.isdigit() else "", trial.trial_id.split("_")[0]]
        pieces = [p for p in pieces if p]
        for name, labels in self.parts:
            if name not in trial.config:
                continue
            value = trial.config[name]
            if labels is not None:
                pieces.append(labels.get(value, str(value)))
            elif isinstance(value, str):
                pieces.append(value)
            else:
                initials = "".join(part[:1] for part in name.split("_"))
                pieces.append(
                    f"{initials}{value:.4g}" if isinstance(value, float) else f"{initials}{value}"
                )
        text = re.sub(r"[^A-Za-z0-9._=+-]", "", "_".join(pieces))
        return text[:120]


def make_sampler(spec: SweepSpec) -> Any:
    """The Optuna sampler named by ``search.sampler``, seeded by ``search.seed``."""
    import optuna

    seed = spec.search.seed
    samplers = {
        "tpe": lambda: optuna.samplers.TPESampler(seed=seed),
        "gp": lambda: optuna.samplers.GPSampler(seed=seed),
        "nsga2": lambda: optuna.samplers.NSGAIISampler(seed=seed),
        "cmaes": lambda: optuna.samplers.CmaEsSampler(seed=seed),
    }
    return samplers[spec.search.sampler]()


def make_search(spec: SweepSpec) -> tuple[Any, int]:
    """(search algorithm, num_samples) for the TuneConfig."""
    if spec.search.algorithm == "grid":
        from ray.tune.search.basic_variant import BasicVariantGenerator

        points = spec.expand().points
        # BasicVariantGenerator is not a Searcher, so TuneConfig.max_concurrent_trials would be
        # ignored for it: the limit goes to the generator itself.
        generator = BasicVariantGenerator(
            points_to_evaluate=points,
            max_concurrent=spec.max_concurrent,
            random_state=spec.search.seed,
        )
        return generator, len(points)

    from ray.tune.search import ConcurrencyLimiter, Searcher
    from ray.tune.search.optuna import OptunaSearch

    searcher: Searcher
    if spec.search.multi_objective:
        searcher = OptunaSearch(
            sampler=make_sampler(spec),
            metric=list(spec.search.metrics),
            mode=list(spec.search.modes),
        )
    else:  # metric and mode come from the TuneConfig
        searcher = OptunaSearch(sampler=make_sampler(spec))
    if spec.max_concurrent:
        searcher = ConcurrencyLimiter(searcher, max_concurrent=spec.max_concurrent)
    return searcher, spec.search.num_samples


def make_scheduler(spec: SweepSpec) -> Any:
    if spec.scheduler.kind != "asha":
        return None
    from ray.tune.schedulers import ASHAScheduler

    return ASHAScheduler(
        time_attr="training_iteration",
        max_t=spec.scheduler.max_t or spec.max_rounds(),
        grace_period=spec.scheduler.grace_period,
        reduction_factor=spec.scheduler.reduction_factor,
    )


def make_trainable(
    spec: SweepSpec, trainable: Callable[..., Any] | None = None, gpu_nodes: Sequence[GpuNode] = ()
) -> Any:
    """The trainable with the spec bound and the trial's resources attached: ``resources`` as
    given, or under ``gpu: auto`` each trial's share of a GPU from its run's size on the
    cluster's ``gpu_nodes`` (`gpu_share.resolve_gpu`; none without GPU nodes)."""
    from ray import tune

    from robusttune.experiments.sweep.trainable import federated_trainable

    function = trainable or federated_trainable
    bound = tune.with_parameters(function, sweep=spec)
    devices = [
        (where, str(device)) for where, device in key_values("device", spec.run, spec.axes, "auto")
    ]
    resources = resolve_gpu(
        spec.resources.gpu, spec.resources.cpu, devices, gpu_nodes, spec.run_spec
    )
    return tune.with_resources(bound, resources)


@contextlib.contextmanager
def _environment(**values: str) -> Iterator[None]:
    saved = {k: os.environ.get(k) for k in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


@contextlib.contextmanager
def tune_environment(
    quiet: bool = True,
    on_interrupt: Callable[[], None] | None = None,
    extra: dict[str, str] | None = None,
) -> Iterator[None]:
    """The Tune settings of a sweep's ``fit``, as environment variables (and, when ``quiet``,
    log filters) for its duration.

    The trial folder's TensorBoard files are the RunWriter's; Tune's own TBX logger would show
    every curve twice, so the default loggers are replaced by JSON and CSV only (`new_tuner`).
    Checkpoints are kept one per trial (num_to_keep=1), which makes Tune snapshot the experiment
    state at each checkpoint; cheap here, so its warning about it is silenced.

    ``quiet`` (the command without ``--verbose``): the sweep's own progress display is the only
    one. Ray's newer output engine prints its experiment box even at verbose=0, so the older one
    (``RAY_AIR_NEW_OUTPUT=0``), silent at 0, is used; a failed trial's traceback is in its
    error.txt, which the display names, rather than on the terminal
    (``TUNE_PRINT_ALL_TRIAL_ERRORS=0``); Tune's end-of-fit notices, among them its
    ``Tuner.restore(...)`` hint, are dropped (`ray_compat.quiet_tune_logs`), and ``on_interrupt``
    replaces its Ctrl-C notice. ``extra``: more Tune settings for this experiment."""
    values = {
        "TUNE_DISABLE_AUTO_CALLBACK_LOGGERS": "1",
        "TUNE_WARN_EXCESSIVE_EXPERIMENT_CHECKPOINT_SYNC_THRESHOLD_S": "0",
        **(extra or {}),
    }
    if not quiet:
        with _environment(**values):
            yield
        return
    values.update(RAY_AIR_NEW_OUTPUT="0", TUNE_PRINT_ALL_TRIAL_ERRORS="0")
    with _environment(**values), quiet_tune_logs(on_interrupt):
        yield


def new_tuner(
    spec: SweepSpec,
    bound: Any,
    *,
    storage: str,
    callbacks: list[Any],
    max_failures: int,
    verbose: int,
) -> tuple[Any, int]:
    """(Tuner, num_samples) of a fresh sweep stored under ``STORAGE/spec.name``; ``callbacks``
    run after Tune's JSON and CSV loggers."""
    from ray import tune
    from ray.tune.logger import CSVLoggerCallback, JsonLoggerCallback

    search, num_samples = make_search(spec)
    single = not spec.search.multi_objective or spec.search.algorithm == "grid"
    tuner = tune.Tuner(
        bound,
        param_space=spec.param_space(),
        tune_config=tune.TuneConfig(
            search_alg=search,
            scheduler=make_scheduler(spec),
            num_samples=num_samples,
            metric=spec.search.metric if single else None,
            mode=spec.search.mode if single else None,
            trial_dirname_creator=TrialDirname(spec),
            # One worker process per concurrent slot, reused across trials:
            # a fresh process per trial costs seconds of imports.
            reuse_actors=True,
        ),
        run_config=tune.RunConfig(
            name=spec.name,
            storage_path=storage_path(storage),
            callbacks=[JsonLoggerCallback(), CSVLoggerCallback(), *callbacks],
            checkpoint_config=tune.CheckpointConfig(num_to_keep=1),
            failure_config=tune.FailureConfig(max_failures=max_failures),
            sync_config=tune.SyncConfig(sync_artifacts=not is_local(storage)),
            verbose=verbose,
        ),
    )
    return tuner, num_samples


def restored_tuner(path: str, bound: Any, *, callbacks: list[Any], verbose: int) -> Any:
    """The Tuner of the interrupted sweep at ``path``: finished trials are kept, unfinished ones
    continue from their last checkpoint, errored ones start again (a trial that ended on a
    configuration error ended normally for Tune, so it stays as it is). ``callbacks`` are this run's
    (a timeline and progress callback among them)."""
    from ray import tune

    tuner = tune.Tuner.restore(path, trainable=bound, resume_unfinished=True, restart_errored=True)
    # Tuner.restore brings back the stored run config and its callbacks: replace the stored
    # timeline and progress by this run's, and add this run's extra callbacks.
    run_config = restored_run_config(tuner)
    run_config.callbacks = [
        c
        for c in (run_config.callbacks or [])
        if not isinstance(c, (TimelineCallback, ProgressCallback))
    ]
    run_config.callbacks += callbacks
    run_config.verbose = verbose
    return tuner
