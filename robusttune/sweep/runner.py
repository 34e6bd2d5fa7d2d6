"""Build and run the Ray Tune experiment of a SweepSpec; resume an interrupted one.

Default: a local Ray started and stopped here (``ray.init(num_cpus=..., include_dashboard=False)``
with ``RAY_AUTH_MODE=disabled``); ``address`` joins a running cluster (``ray up cluster.yaml``)
instead and leaves it running; a trial whose node dies there is retried from its last
checkpoint on another node (``FailureConfig(max_failures=MAX_FAILURES)``). Results go to
``STORAGE/NAME`` (default ``./results/NAME``): one folder per trial with the run folder files
(rounds.csv, summary.json, TensorBoard events), Tune's result.json/progress.csv and the latest
checkpoint; ``sweep.yaml`` (the space as run, so ``--resume`` rebuilds the same sweep) and
``trials.csv`` (one row per trial) beside them.

Grid search: the grid is expanded by `SweepSpec.expand` (constraints applied) and fed to Tune's
BasicVariantGenerator as ``points_to_evaluate``, one point per trial; drawn axes are sampled by
Tune with ``search.seed``. Optuna: `OptunaSearch` over the space's domains with the chosen sampler
seeded by ``search.seed``; with ``max_concurrent: 1`` the study is reproducible.
"""

from __future__ import annotations

import contextlib
import math
import os
import re
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator

import yaml

from ray.tune import Callback

from robusttune.files import write_text_atomic
from robusttune.registry import SpecError
from robusttune.sweep.ray_compat import (autoscaling_ceiling, grid_trials,
                                         restored_run_config)
from robusttune.sweep.space import SweepSpec, format_value, parse_sweep
from robusttune.yaml_input import parse_yaml

SWEEP_FILE = "sweep.yaml"
TRIALS_FILE = "trials.csv"
DEFAULT_STORAGE = "./results"
# Retries per trial (FailureConfig): a trial whose node dies (a spot instance reclaimed, a
# machine lost) starts again on another node from its last checkpoint. Tune counts every failure
# here, an exception in the trial too, so a trial with a bug runs 1 + MAX_FAILURES times.
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


# ---------------------------------------------------------------------------------------------
# Tune pieces
# ---------------------------------------------------------------------------------------------
class TrialDirname:
    """Trial folder names that say what the trial is: ``00012_1a2b3_krum_alie-0.2_p0.5_s42``
    (strings as they are, numbers after the initials of their key; joint values joined by '-')."""

    def __init__(self, spec: SweepSpec) -> None:
        self.parts: list[tuple[str, dict[str, str] | None]] = []
        for axis in spec.axes:
            labels = None
            if axis.groups is not None:
                labels = {label: "-".join(format_value(v) for v in group.values())
                          for label, group in axis.groups.items()}
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
                pieces.append(f"{initials}{value:.4g}" if isinstance(value, float) else f"{initials}{value}")
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
        generator = BasicVariantGenerator(points_to_evaluate=points, max_concurrent=spec.max_concurrent,
                                          random_state=spec.search.seed)
        return generator, len(points)

    from ray.tune.search import ConcurrencyLimiter
    from ray.tune.search.optuna import OptunaSearch

    if spec.search.multi_objective:
        searcher = OptunaSearch(sampler=make_sampler(spec), metric=list(spec.search.metrics),
                                mode=list(spec.search.modes))
    else:  # metric and mode come from the TuneConfig
        searcher = OptunaSearch(sampler=make_sampler(spec))
    if spec.max_concurrent:
        searcher = ConcurrencyLimiter(searcher, max_concurrent=spec.max_concurrent)
    return searcher, spec.search.num_samples


def make_scheduler(spec: SweepSpec) -> Any:
    if spec.scheduler.kind != "asha":
        return None
    from ray.tune.schedulers import ASHAScheduler

    return ASHAScheduler(time_attr="training_iteration", max_t=spec.scheduler.max_t or spec.max_rounds(),
                         grace_period=spec.scheduler.grace_period,
                         reduction_factor=spec.scheduler.reduction_factor)


def make_trainable(spec: SweepSpec, trainable: Callable | None = None) -> Any:
    """The trainable with the spec bound and the trial's resources attached."""
    from ray import tune

    from robusttune.sweep.trainable import federated_trainable

    function = trainable or federated_trainable
    bound = tune.with_parameters(function, sweep=spec)
    return tune.with_resources(bound, spec.resources.as_tune())


class _Timeline:
    """Driver-side times (seconds since the command started) of the sweep's fixed costs."""

    def __init__(self) -> None:
        self.origin = time.perf_counter()
        self.marks: dict[str, float] = {}

    def mark(self, name: str, once: bool = False) -> None:
        if once and name in self.marks:
            return
        self.marks[name] = time.perf_counter() - self.origin


class TimelineCallback(Callback):
    """Marks when the first trial starts and the last one ends, on the driver. Not carried into
    a restored Tuner (its timeline belongs to one command run)."""

    def __init__(self, timeline: _Timeline | None = None) -> None:
        self.timeline = timeline or _Timeline()

    def on_trial_start(self, iteration, trials, trial, **info):  # noqa: ANN001
        self.timeline.mark("first_trial_start", once=True)

    def on_trial_result(self, iteration, trials, trial, result, **info):  # noqa: ANN001
        self.timeline.mark("first_result", once=True)

    def on_trial_complete(self, iteration, trials, trial, **info):  # noqa: ANN001
        self.timeline.mark("last_trial_end")

    def on_trial_error(self, iteration, trials, trial, **info):  # noqa: ANN001
        self.timeline.mark("last_trial_end")

    def __getstate__(self) -> dict[str, Any]:
        return {"timeline": None}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.timeline = _Timeline()


class ProgressCallback(Callback):
    """One line per finished or failed trial (Tune's own output is silenced by the command: its
    per-trial result boxes do not scale to hundreds of trials)."""

    def __init__(self, metric: str, total: int | None = None) -> None:
        self.metric, self.total, self.done = metric, total, 0

    def _line(self, trial: Any, verdict: str) -> None:
        self.done += 1
        count = f"{self.done}/{self.total}" if self.total else str(self.done)
        folder = Path(trial.path).name if trial.path else trial.trial_id
        print(f"[{count}] {folder}: {verdict}", flush=True)

    def on_trial_complete(self, iteration, trials, trial, **info):  # noqa: ANN001
        result = trial.last_result or {}
        value = result.get(self.metric, math.nan)
        shown = f"{value:.4f}" if isinstance(value, float) else str(value)
        collapsed = " collapsed" if result.get("collapsed") else ""
        self._line(trial, f"{self.metric} {shown}{collapsed} after "
                          f"{result.get('training_iteration', 0)} rounds")

    def on_trial_error(self, iteration, trials, trial, **info):  # noqa: ANN001
        self._line(trial, f"ERROR (see {trial.path}/error.txt)")


# ---------------------------------------------------------------------------------------------
# Ray session and storage
# ---------------------------------------------------------------------------------------------
@contextlib.contextmanager
def ray_session(address: str | None, num_cpus: int | None) -> Iterator[bool]:
    """Use the running Ray of this process, join ``address``, or start a local Ray (and stop it
    afterwards). Yields whether this call started Ray."""
    import ray

    if ray.is_initialized():
        yield False
        return
    # Warnings and errors from the trials reach the terminal; Ray's per-checkpoint INFO lines
    # would drown the one line per trial that the command prints.
    quiet = ray.LoggingConfig(log_level="WARNING")
    if address:
        try:
            ray.init(address=address, logging_config=quiet)
        except ConnectionError as error:
            raise SpecError(f"--address {address}: no Ray cluster reachable there "
                            f"({str(error).splitlines()[0]}); allowed: auto on a cluster node, "
                            f"or the head's HOST:PORT") from None
    else:
        # A laptop or CI machine has no cluster token: a local Ray needs no authentication.
        os.environ["RAY_AUTH_MODE"] = "disabled"
        ray.init(num_cpus=num_cpus or os.cpu_count(), include_dashboard=False,
                 configure_logging=True, logging_level="WARNING", logging_config=quiet)
    try:
        yield True
    finally:
        ray.shutdown()


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


def is_local(storage: str) -> bool:
    return "://" not in storage or storage.startswith("file://")


def experiment_path(storage: str, name: str) -> str:
    if is_local(storage):
        return str(Path(storage.removeprefix("file://")).expanduser().resolve() / name)
    # A URI's query (s3://bucket/results?region=us-west-2) stays at the end, after the name.
    base, mark, query = storage.partition("?")
    return f"{base.rstrip('/')}/{name}{mark}{query}"


def _write_text(folder: str, filename: str, text: str) -> None:
    """Write a file beside the results; locally through a temporary file and a rename, so an
    interrupted write never leaves half a sweep.yaml for ``--resume`` to misread (object stores
    publish a file only when its upload completes)."""
    if is_local(folder):
        Path(folder).mkdir(parents=True, exist_ok=True)
        write_text_atomic(Path(folder) / filename, text)
        return
    import pyarrow.fs

    filesystem, path = pyarrow.fs.FileSystem.from_uri(folder)
    filesystem.create_dir(path, recursive=True)
    with filesystem.open_output_stream(f"{path}/{filename}") as stream:
        stream.write(text.encode())


def _read_text(folder: str, filename: str) -> str | None:
    if is_local(folder):
        path = Path(folder) / filename
        return path.read_text() if path.exists() else None
    import pyarrow.fs

    filesystem, path = pyarrow.fs.FileSystem.from_uri(folder)
    try:
        with filesystem.open_input_stream(f"{path}/{filename}") as stream:
            return stream.read().decode()
    except (FileNotFoundError, OSError):
        return None


def check_cluster(spec: SweepSpec, *, joined: bool = False,
                  announce: Callable[[str], None] | None = None) -> None:
    """Fail with one line instead of leaving trials pending forever for resources that the
    cluster does not have. A joined cluster (``--address``) may autoscale from zero workers
    (cluster.yaml's GPU nodes start at 0): there the shortfall is an error only when the
    autoscaler's config cannot cover it either, and otherwise a note."""
    import ray

    available = ray.cluster_resources()
    wanted = {"GPU": spec.resources.gpu, "CPU": spec.resources.cpu}
    for resource, amount in wanted.items():
        have = available.get(resource, 0.0)
        if amount <= 0 or amount <= have:
            continue
        key = resource.lower()
        problem = (f"resources.{key} {format_value(amount)} per trial, but the Ray cluster has "
                   f"{format_value(have)} {resource}; allowed: ")
        problem += ("gpu 0 (--gpus-per-trial 0) or a cluster with GPUs (--address)" if key == "gpu"
                    else f"at most {format_value(have)}")
        ceiling = autoscaling_ceiling() if joined else None
        if not joined or (ceiling is not None and ceiling.get(resource, 0) < amount):
            raise SpecError(problem)
        (announce or print)(f"note: {problem} now; trials wait for the autoscaler to add nodes "
                            f"(Ctrl-C if this cluster does not autoscale)")
        return


def stored_sweep(path: str) -> SweepSpec | None:
    """The SweepSpec stored beside a sweep's results (what ``--resume`` runs)."""
    text = _read_text(path, SWEEP_FILE)
    if text is None:
        return None
    source = f"{path}/{SWEEP_FILE}"
    mapping = parse_yaml(text, source)
    name = mapping.get("name") if isinstance(mapping, dict) else None
    return parse_sweep(mapping, name=name or Path(path).name, source=source)


def _absolute_data_root(spec: SweepSpec) -> SweepSpec:
    """Trials run in their own working directories: a relative data_root is made absolute at the
    driver (on a cluster, give a data_root that exists on every node)."""
    if any("data_root" in axis.keys for axis in spec.axes):
        return spec
    root = str(spec.run.get("data_root", "./data"))
    if "://" in root or os.path.isabs(root):
        return spec
    return spec.with_overrides(run={"data_root": str(Path(root).resolve())})


# ---------------------------------------------------------------------------------------------
# the sweep
# ---------------------------------------------------------------------------------------------
def run_sweep(spec: SweepSpec, *, storage: str = DEFAULT_STORAGE, address: str | None = None,
              resume: bool = False, num_cpus: int | None = None, verbose: int = 1,
              callbacks: list[Any] | None = None, trainable: Callable | None = None,
              announce: Callable[[str], None] | None = None, progress: bool = False,
              max_failures: int = MAX_FAILURES) -> SweepOutcome:
    """Run (or with ``resume`` continue) the sweep ``spec`` under ``STORAGE/spec.name``.

    ``trainable`` replaces the federated trainable (same signature: ``(config, sweep)``; a
    resumed sweep needs the same one); ``callbacks`` are extra Tune
    callbacks; ``announce`` receives one-line notes and ``progress`` prints one line per trial
    (the command uses both with ``verbose=0``); ``max_failures`` retries of a failed trial
    from its last checkpoint (a lost node)."""
    say = announce or (lambda text: None)
    timeline = _Timeline()
    path = experiment_path(storage, spec.name)
    local = is_local(storage)
    storage_path = str(Path(storage.removeprefix("file://")).expanduser().resolve()) if local else storage

    if resume:
        stored = stored_sweep(path)
        if stored is None:
            raise SpecError(f"--resume: no sweep to resume at {path} (no {SWEEP_FILE}); allowed: "
                            f"the --name and --storage of an earlier sweep")
        spec = stored
    else:
        if _read_text(path, SWEEP_FILE) is not None and _restorable(path):
            raise SpecError(f"{path} already holds the sweep {spec.name!r}; use --resume to continue "
                            f"it, or --name for a new one")
        spec = _absolute_data_root(spec)

    with ray_session(address, num_cpus):
        timeline.mark("ray_ready")
        from ray import tune
        from ray.tune.logger import CSVLoggerCallback, JsonLoggerCallback

        check_cluster(spec, joined=address is not None, announce=say)
        if resume and not _restorable(path):
            raise SpecError(f"--resume: {path} holds no Tune state yet; run it again without --resume")
        if not resume:  # a resumed sweep runs what sweep.yaml already says
            _write_text(path, SWEEP_FILE, yaml.safe_dump({"name": spec.name, **spec.raw}, sort_keys=False))
        extra = [*(callbacks or [])]
        if progress:
            extra.append(ProgressCallback(spec.search.metric,
                                          spec.trial_count() if not resume else None))
        fit_callbacks = [JsonLoggerCallback(), CSVLoggerCallback(), TimelineCallback(timeline), *extra]
        bound = make_trainable(spec, trainable)
        # The trial folder's TensorBoard files are the RunWriter's; Tune's own TBX logger would
        # show every curve twice, so the default loggers are replaced by JSON and CSV only.
        # Checkpoints are kept one per trial (num_to_keep=1), which makes Tune snapshot the
        # experiment state at each checkpoint; cheap here, so its warning about it is silenced.
        with _environment(TUNE_DISABLE_AUTO_CALLBACK_LOGGERS="1",
                          TUNE_WARN_EXCESSIVE_EXPERIMENT_CHECKPOINT_SYNC_THRESHOLD_S="0"):
            if resume:
                say(f"resuming {path} (finished trials are kept; unfinished ones continue from "
                    f"their last checkpoint, errored ones start again)")
                tuner = tune.Tuner.restore(path, trainable=bound, resume_unfinished=True,
                                           restart_errored=True)
            else:
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
                        storage_path=storage_path,
                        callbacks=fit_callbacks,
                        checkpoint_config=tune.CheckpointConfig(num_to_keep=1),
                        failure_config=tune.FailureConfig(max_failures=max_failures),
                        sync_config=tune.SyncConfig(sync_artifacts=not local),
                        verbose=verbose,
                    ),
                )
                say(f"sweep {spec.name}: {num_samples} trials "
                    f"({spec.search.algorithm}), results in {path}")
            if resume:
                # Tuner.restore brings back the stored run config and its callbacks: replace the
                # stored timeline by this run's, and add this run's extra callbacks.
                run_config = restored_run_config(tuner)
                run_config.callbacks = [c for c in (run_config.callbacks or [])
                                        if not isinstance(c, (TimelineCallback, ProgressCallback))]
                run_config.callbacks += [TimelineCallback(timeline), *extra]
                run_config.verbose = verbose
            timeline.mark("fit_start")
            grid = tuner.fit()
            timeline.mark("fit_end")
        statuses = saved_statuses(path, grid)
        table = trials_table(grid, spec, statuses)
        _write_text(path, TRIALS_FILE, table.to_csv(index=False))
    timeline.mark("exit")
    counts = list(statuses.values())
    return SweepOutcome(path=path, table=table, finished=counts.count("TERMINATED"),
                        errored=counts.count("ERROR"),
                        unfinished=len(counts) - counts.count("TERMINATED") - counts.count("ERROR"),
                        timeline=dict(timeline.marks), result_grid=grid)


def saved_statuses(path: str, grid: Any) -> dict[str, str]:
    """Trial id -> status as saved in the experiment state, which is what ``--resume`` acts on.
    After an interruption Tune stops the running trials and marks them TERMINATED in memory,
    but the saved state (written before that) keeps them RUNNING: unfinished."""
    from ray.tune import ExperimentAnalysis

    statuses = {trial.trial_id: trial.status for trial in grid_trials(grid)}
    try:
        saved = {trial.trial_id: trial.status for trial in ExperimentAnalysis(path).trials}
    except Exception:  # noqa: BLE001 - unreadable state: keep what the driver saw
        return statuses
    return {trial_id: saved.get(trial_id, status) for trial_id, status in statuses.items()}


def _restorable(path: str) -> bool:
    from ray.tune import Tuner

    return Tuner.can_restore(path)


def trials_table(grid: Any, spec: SweepSpec, statuses: dict[str, str] | None = None) -> Any:
    """One row per trial: status, the keys the space varies, the metric(s), collapse and rounds;
    sorted best first by the (first) metric, NaN last."""
    import pandas as pd

    rows = []
    for trial in grid_trials(grid):
        metrics = trial.last_result or {}
        status = (statuses or {}).get(trial.trial_id, trial.status)
        row: dict[str, Any] = {"trial": Path(trial.path).name if trial.path else trial.trial_id,
                               "status": status if status in ("TERMINATED", "ERROR") else "UNFINISHED"}
        resolved = spec.resolve(trial.config)
        for key in spec.varied_keys:
            row[key] = metrics.get(key, resolved.get(key))
        for metric in spec.search.metrics:
            row[metric] = metrics.get(metric, math.nan)
        for extra in ("last_accuracy", "collapsed"):
            if extra not in row:
                row[extra] = metrics.get(extra, math.nan)
        row["rounds_done"] = metrics.get("training_iteration", 0)
        row["path"] = trial.path
        rows.append(row)
    table = pd.DataFrame(rows)
    if table.empty:
        return table
    ascending = [mode == "min" for mode in spec.search.modes]
    if spec.search.multi_objective:
        table.insert(2, "pareto", _pareto(table, spec))
        table = table.sort_values(["pareto", *spec.search.metrics], ascending=[False, *ascending],
                                  na_position="last")
    else:
        table = table.sort_values(spec.search.metric, ascending=ascending[0], na_position="last")
    return table.reset_index(drop=True)


def _pareto(table: Any, spec: SweepSpec) -> list[bool]:
    """Whether each row is on the Pareto front of the metrics (NaN rows never are)."""
    signs = [1.0 if mode == "max" else -1.0 for mode in spec.search.modes]
    values = [[s * float(row[m]) for m, s in zip(spec.search.metrics, signs)]
              for _, row in table.iterrows()]
    front = []
    for i, a in enumerate(values):
        if any(math.isnan(x) for x in a):
            front.append(False)
            continue
        dominated = any(all(y >= x for x, y in zip(a, b)) and any(y > x for x, y in zip(a, b))
                        for j, b in enumerate(values) if j != i and not any(math.isnan(y) for y in b))
        front.append(not dominated)
    return front
