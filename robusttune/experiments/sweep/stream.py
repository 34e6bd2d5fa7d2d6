"""One Ray Tune experiment for a whole command, its trials proposed as the command asks for runs.

A breakdown map, calibrate's trim sweep, a horizon measurement and a tuning study each need runs
whose RunSpecs depend on earlier results (the next bisection point, a point's next adversary
stage, the next Optuna trial). `TuneStreamRunner` is the `robusttune.engine.runners.Runner` behind them
on Ray: its ``drive(body)`` runs the command's logic (``body``) in a thread of its own and one Tune
experiment in the calling thread; every call ``runner(specs)`` from the body (from any of its
threads) queues those runs and waits for their summaries, and the experiment's searcher
(`RunQueue`, a Tune `Searcher`) hands the next queued run to each slot as it frees. So no slot
waits for a wave's slowest run, and Ray, storage and the experiment start once per command
(issue 45: a map started one experiment per wave and per adversary stage, 1.3 s a run).

Every federated run stays one trial (`run_trial`): it writes its run folder (rounds.csv,
summary.json) into the trial folder, reports once at its end (and at its checkpoints, when its
spec asks for them: a run on a lost node then restarts there), and its summary returns to the
caller through the searcher. A configuration error ends the trial at once with its message, not
retried. Ctrl-C stops the experiment as Tune does; every caller then gets KeyboardInterrupt, and
the runs that had finished are those the caller already received.
"""

from __future__ import annotations

import json
import math
import tempfile
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, TypeVar

from robusttune.core.plugins import declared, load_plugins
from robusttune.core.records import RunSummary
from robusttune.core.registry import SpecError
from robusttune.core.runspec import RunSpec
from robusttune.experiments.sweep.gpu_share import (
    AUTO,
    GpuNode,
    cluster_gpu_nodes,
    refuse_cuda_without_gpus,
    resolve_gpu,
)

__all__ = [
    "RunQueue",
    "TuneStreamRunner",
    "run_trial",
    "stream_trial_name",
    "streamed_run_spec",
    "trial_config",
]

T = TypeVar("T")
SPEC_KEY = "spec"  # the trial config: {"spec": the RunSpec's explicit keys}
SUMMARY_KEY = "summary"  # the last result: the RunSummary as JSON
METRIC = "final_accuracy"
PREFIX = "runs"
IDLE_WAIT = 1.0  # s the searcher waits for a queued run when no trial is in flight
SNAPSHOT_EVERY_S = 600  # s between Tune's experiment snapshots (the last is taken at the end)


class _Pending:
    """One queued run: its spec, and the summary its callers wait for."""

    def __init__(self, spec: RunSpec) -> None:
        self.spec = spec
        self.summary: RunSummary | None = None
        self.interrupted = False
        self.done = threading.Event()

    def finish(self, summary: RunSummary) -> None:
        self.summary = summary
        self.done.set()

    def interrupt(self) -> None:
        self.interrupted = True
        self.done.set()

    def wait(self) -> RunSummary:
        self.done.wait()
        if self.interrupted or self.summary is None:
            raise KeyboardInterrupt("the experiment was interrupted before this run finished")
        return self.summary


class TuneStreamRunner:
    """``runner(specs) -> [RunSummary, ...]`` (same order) through one Ray Tune experiment per
    ``drive``. ``folder`` holds the experiment (``runs000``, ``runs001`` on a rerun into the same
    folder); ``resources`` the per-trial {cpu, gpu} (gpu ``auto``, the default: a share per run
    from its size where the cluster has GPUs, `gpu_share`); ``max_concurrent`` caps the trials
    at once (0: as the cluster's resources allow); ``verbose`` is Tune's. Identical specs asked
    while one is queued or running share that one trial. Call it only inside ``drive`` (with a Ray session
    open around it, local or joined with ``--address``: `robusttune.experiments.sweep.cluster.ray_session`)."""

    def __init__(
        self,
        folder: str | Path,
        resources: dict[str, float | str] | None = None,
        max_concurrent: int = 0,
        announce: Callable[[str], None] | None = None,
        verbose: int = 0,
    ) -> None:
        self.folder = Path(folder).resolve()
        given = {k: v for k, v in (resources or {"cpu": 1}).items() if v is not None}
        # one trial's bundle, as Tune takes it (gpu auto is resolved once Ray is up: `drive`)
        gpu = given.get("gpu", AUTO)
        self.resources: dict[str, Any] = {
            "cpu": float(given.get("cpu", 1) or 0),
            "gpu": gpu if gpu == AUTO else float(gpu or 0),
        }
        self._gpu_nodes: list[GpuNode] = []
        self.max_concurrent = max_concurrent
        self.announce = announce
        self.verbose = verbose
        self._lock = threading.Condition()
        self._queue: deque[_Pending] = deque()
        self._running: dict[str, _Pending] = {}
        self._body_done = False
        self._stopped = False
        self._driving = False

    # -- what callers see -------------------------------------------------------------------
    def __call__(self, specs: Sequence[RunSpec]) -> list[RunSummary]:
        runs = [self._ask(spec) for spec in specs]
        return [run.wait() for run in runs]

    def _ask(self, spec: RunSpec) -> _Pending:
        key = spec.to_json()
        if self.resources["gpu"] == AUTO and not self._gpu_nodes:
            refuse_cuda_without_gpus(spec.device)
        with self._lock:
            if not self._driving:
                raise RuntimeError(
                    "TuneStreamRunner runs only inside its drive(body): call it "
                    "from the body (robusttune.engine.runners.drive)"
                )
            if self._stopped:
                raise KeyboardInterrupt("the experiment was interrupted")
            run = self._running.get(key)
            if run is None:
                run = self._running[key] = _Pending(spec)
                self._queue.append(run)
                self._lock.notify_all()
            return run

    # -- what the searcher sees ---------------------------------------------------------------
    def next_run(self, in_flight: bool) -> _Pending | None:
        """The next queued run, or None when nothing is queued (in time).

        With no trial in flight (``in_flight`` False), Tune sleeps a whole second after a None
        before it asks again (`TuneController._update_trial_queue`): a map's cell that bisects
        alone (the last cells of every map) paid that second on each of its runs, and the tiny
        bench map ran 25 runs of 0.1 s in 18 s. So then it waits up to ``IDLE_WAIT`` s for the
        command's logic to queue a run. With trials in flight it does not wait: Tune asks again
        after each event it handles, and a wait here would hold those events back."""
        with self._lock:
            if not in_flight:
                self._lock.wait_for(lambda: self._queue or self._body_done, timeout=IDLE_WAIT)
            return self._queue.popleft() if self._queue else None

    def finished(self) -> bool:
        """Whether the body has returned, so no run will be asked for again."""
        with self._lock:
            return self._body_done and not self._queue

    def deliver(self, run: _Pending, summary: RunSummary) -> None:
        with self._lock:
            self._running.pop(run.spec.to_json(), None)
        run.finish(summary)

    # -- the command's lifetime ---------------------------------------------------------------
    def drive(self, body: Callable[[], T]) -> T:
        """Run ``body`` (the command's logic, which calls this runner) in a thread of its own and
        the Tune experiment here until ``body`` returns; return what it returned, or raise what
        it raised (KeyboardInterrupt when Ctrl-C stopped the experiment). No experiment starts
        when ``body`` asks for no run (a resumed map whose runs are all kept)."""
        outcome: dict[str, Any] = {}

        def target() -> None:
            try:
                outcome["value"] = body()
            except BaseException as error:  # re-raised in the caller's thread below
                outcome["error"] = error
            finally:
                with self._lock:
                    self._body_done = True
                    self._lock.notify_all()

        if self.resources["gpu"] == AUTO:
            self._gpu_nodes = cluster_gpu_nodes(joined=True)
        with self._lock:
            self._body_done, self._stopped, self._driving = False, False, True
        thread = threading.Thread(target=target, name="robusttune-command", daemon=True)
        thread.start()
        try:
            with self._lock:
                self._lock.wait_for(lambda: self._queue or self._body_done)
                start = bool(self._queue)
            if start:
                self._experiment()
        finally:
            with self._lock:
                if not self._body_done:  # the experiment ended first: Ctrl-C (or Tune failed)
                    self._stopped = True
                    waiting = list(self._running.values())
                    self._queue.clear()
                    self._running.clear()
                else:
                    waiting = []
            for run in waiting:
                run.interrupt()
            thread.join()
            with self._lock:
                self._driving = False
        if "error" in outcome:
            raise outcome["error"]
        return outcome["value"]

    def _experiment(self) -> None:
        from ray import tune
        from ray.tune.logger import JsonLoggerCallback

        from robusttune.experiments.sweep.runner import MAX_FAILURES
        from robusttune.experiments.sweep.storage import is_local, storage_path
        from robusttune.experiments.sweep.tuner import tune_environment

        self.folder.mkdir(parents=True, exist_ok=True)
        name = f"{PREFIX}{len(list(self.folder.glob(f'{PREFIX}[0-9][0-9][0-9]'))):03d}"
        searcher: Any = RunQueue(self)
        if self.max_concurrent:
            from ray.tune.search import ConcurrencyLimiter

            searcher = ConcurrencyLimiter(searcher, max_concurrent=self.max_concurrent)
        # every trial loads the driver's plugins before it builds its run (one object, bound once)
        trainable = tune.with_parameters(run_trial, plugins=declared())
        # no devices known up front: each run's is checked as the command asks for it (`_ask`)
        resources = resolve_gpu(
            self.resources["gpu"], self.resources["cpu"], (), self._gpu_nodes, streamed_run_spec
        )
        tuner = tune.Tuner(
            tune.with_resources(trainable, resources),
            tune_config=tune.TuneConfig(
                search_alg=searcher,
                num_samples=-1,
                metric=METRIC,
                mode="max",
                trial_dirname_creator=stream_trial_name,
                reuse_actors=True,
            ),
            run_config=tune.RunConfig(
                name=name,
                storage_path=storage_path(str(self.folder)),
                # the trial folder's run files are the record: of Tune's loggers only the JSON
                # one (a line per report: the end, and the checkpoints), no CSV or TensorBoard
                # copy (TUNE_DISABLE_AUTO_CALLBACK_LOGGERS, tune_environment)
                callbacks=[JsonLoggerCallback()],
                checkpoint_config=tune.CheckpointConfig(num_to_keep=1),
                failure_config=tune.FailureConfig(max_failures=MAX_FAILURES),
                sync_config=tune.SyncConfig(sync_artifacts=not is_local(str(self.folder))),
                verbose=self.verbose,
            ),
        )
        if self.announce is not None:
            self.announce(f"trials stream into {self.folder / name}")
        # Tune's experiment snapshot serves only Tuner.restore, which a command never uses (its
        # own store keeps the runs): taken every few trials by default ("auto"), it cost the
        # driver 0.2-0.6 s of CPU over the bench map's 15 s of runs, on cores the trials share
        with tune_environment(
            quiet=self.verbose == 0,
            extra={
                "TUNE_MAX_PENDING_TRIALS_PG": str(self._pending_trials()),
                "TUNE_GLOBAL_CHECKPOINT_S": str(SNAPSHOT_EVERY_S),
            },
        ):
            tuner.fit()

    def _pending_trials(self) -> int:
        """How many trials Tune may hold proposed but not yet running. Its default for a
        Searcher is 1: it proposes the next trial only once the last one runs, which starts trials
        one at a time (on 2 cores the bench map's trials took 30.7 s of wall time instead of 17.5
        s with 4). One per slot the cluster holds now (at least 2, so an autoscaling cluster that
        holds none yet sees the demand), at most ``max_concurrent``."""
        import ray

        cpu, gpu = self.resources["cpu"], self.resources["gpu"]
        gpu = 0 if gpu == AUTO else gpu  # per run: its CPUs bound the slots
        held = ray.cluster_resources()
        slots = [int(held.get("CPU", 0) // cpu)] if cpu > 0 else []
        slots += [int(held.get("GPU", 0) // gpu)] if gpu > 0 else []
        pending = max(2, min(slots) if slots else 2)
        return min(pending, self.max_concurrent) if self.max_concurrent else pending


def _search_base() -> type:
    from ray.tune.search import Searcher

    return Searcher


class RunQueue(_search_base()):  # type: ignore[misc]
    """The experiment's searcher: each free slot gets the runner's next queued run; None while
    nothing is queued (Tune asks again), FINISHED once the command's logic has returned."""

    def __init__(self, runner: TuneStreamRunner) -> None:
        super().__init__(metric=METRIC, mode="max")
        self.runner = runner
        self.trials: dict[str, _Pending] = {}

    def suggest(self, trial_id: str) -> dict[str, Any] | str | None:
        run = self.runner.next_run(in_flight=bool(self.trials))
        if run is None:
            return self.FINISHED if self.runner.finished() else None
        self.trials[trial_id] = run
        return trial_config(run.spec)

    def on_trial_complete(
        self, trial_id: str, result: dict[str, Any] | None = None, error: bool = False
    ) -> None:
        run = self.trials.pop(trial_id, None)
        if run is None:
            return
        text = (result or {}).get(SUMMARY_KEY)
        if error or not text:
            summary = RunSummary.failed(
                "trial errored (its folder's error.txt has the traceback)"
                if error
                else "trial ended without a summary"
            )
        else:
            summary = RunSummary.from_dict(json.loads(text))
        self.runner.deliver(run, summary)

    def save(self, checkpoint_path: str) -> None:
        """Nothing to save: a command's runs are kept by its own store (runs.jsonl)."""

    def restore(self, checkpoint_path: str) -> None:
        """Nothing to restore (see `save`)."""

    def __getstate__(self) -> dict[str, Any]:
        # Tune pickles the searcher into its experiment state; the queue lives in this process
        return {k: v for k, v in self.__dict__.items() if k not in ("runner", "trials")}


def stream_trial_name(trial: Any) -> str:
    """``00012_1a2b3_krum_sign_flip_b0.15_p0.5_s42``: proposal order, id, what the run is."""
    values = trial.config.get(SPEC_KEY, {})
    number = str(trial.experiment_tag).split("_", 1)[0]
    pieces = [
        f"{int(number):05d}" if number.isdigit() else "",
        trial.trial_id.split("_")[0],
        str(values.get("method", values.get("aggregator", ""))),
        str(values.get("attack", "")),
        f"b{float(values.get('byzantine_fraction', 0.0)):.4g}",
        f"p{float(values.get('participation', 1.0)):g}",
        f"s{values.get('seed', '')}",
    ]
    return "_".join(p for p in pieces if p)[:120]


def trial_config(spec: RunSpec) -> dict[str, Any]:
    """A streamed trial's config: {SPEC_KEY: the run's explicit keys}."""
    explicit = spec.to_dict()
    return {SPEC_KEY: {k: explicit[k] for k in sorted(spec.explicit) if k in explicit}}


def streamed_run_spec(config: dict[str, Any]) -> RunSpec:
    """The RunSpec of a streamed trial's config (what `gpu_share.AutoGpuResources` sizes)."""
    return RunSpec.from_dict(config[SPEC_KEY])


def run_trial(config: dict[str, Any], plugins: Sequence[Any] = ()) -> None:
    """One streamed trial = one federated run: its run folder in the trial folder, one report at
    the end (with the summary), and a checkpoint every ``checkpoint_every`` rounds if the spec
    asks for them, from which a retried trial continues."""
    import ray
    import torch
    from ray import tune

    from robusttune.engine.recording import RunWriter
    from robusttune.engine.simulation import Simulation
    from robusttune.experiments.sweep.trainable import (
        place_trial,
        report_config_error,
        restore_checkpoint,
        save_checkpoint,
        trial_folder,
        trial_threads,
    )

    started = time.perf_counter()
    context = tune.get_context()
    resources = context.get_trial_resources().required_resources
    torch.set_num_threads(trial_threads(resources))
    values = dict(config[SPEC_KEY])
    device = place_trial(
        str(values.get("device", "auto")),
        resources,
        ray.get_gpu_ids() if resources.get("GPU", 0) > 0 else [],
    )
    folder = trial_folder(context)
    try:
        load_plugins(plugins)  # a plugin missing here ends the trial, not retried
        spec = RunSpec.from_dict({**values, "device": device})
        simulation = Simulation(spec)
    except SpecError as error:
        failed = RunSummary.failed(f"configuration error: {error}", spec=values)
        report_config_error(
            str(error), [METRIC], folder, **{SUMMARY_KEY: json.dumps(failed.to_dict())}
        )
        return
    restored = restore_checkpoint(simulation, context, folder)
    writer = RunWriter(folder, spec, resume_at=simulation.rounds_done, tensorboard=False)
    every = spec.checkpoint_every
    try:
        for record in simulation:
            writer.write(record)
            if (
                every
                and simulation.rounds_done % every == 0
                and simulation.rounds_done < spec.rounds
            ):
                # scalars up to a checkpoint are on disk before it exists (as a sweep's trials)
                writer.flush()
                with tempfile.TemporaryDirectory(prefix="robusttune-ckpt-") as saved:
                    save_checkpoint(simulation, restored, Path(saved))
                    tune.report(
                        {METRIC: math.nan, "round": record.round},
                        checkpoint=tune.Checkpoint.from_directory(saved),
                    )
    except BaseException:
        writer.abort()
        raise
    summary = simulation.summary(time.perf_counter() - started).restored_from(restored)
    writer.close(summary)
    tune.report(
        {
            METRIC: summary.final_accuracy,
            "round": simulation.rounds_done,
            SUMMARY_KEY: json.dumps(summary.at(str(folder)).to_dict()),
        }
    )
