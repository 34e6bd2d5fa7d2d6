"""The Runner protocol: a list of RunSpecs in, their RunSummaries out, in the same order. Breakdown
maps, the calibration trim sweep, horizon measurements and tuning studies know only this (and
`drive`); the in-process runner below and the Ray Tune runner
(`robusttune.experiments.sweep.stream.TuneStreamRunner`, one experiment per command) stand behind it."""

from __future__ import annotations

import multiprocessing
import os
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Protocol, TypeVar

import torch

from robusttune.core.numerics import fresh_process_environment, pin, try_pin
from robusttune.core.records import RunSummary
from robusttune.core.runspec import RunSpec
from robusttune.engine.recording import run_to_folder

__all__ = ["InProcessRunner", "Runner", "drive"]

T = TypeVar("T")


class Runner(Protocol):
    """``runner(specs) -> [RunSummary, ...]``, one per spec, same order. A run that could not
    finish comes back as ``RunSummary.failed(reason)`` (collapsed, NaN accuracy), not raised."""

    def __call__(self, specs: Sequence[RunSpec]) -> list[RunSummary]: ...


def drive(runner: Runner, body: Callable[[], T]) -> T:
    """Run a command's logic ``body`` (which calls ``runner``) the way ``runner`` needs: a
    streaming runner (`robusttune.experiments.sweep.stream.TuneStreamRunner`) runs its one experiment around
    it (``runner.drive``); any other runner is simply called from ``body``."""
    driver = getattr(runner, "drive", None)
    return driver(body) if driver is not None else body()


class InProcessRunner:
    """Runs RunSpecs one after another in this process (no Ray): the fallback runner, and what
    the tests use. With ``out_dir`` each run writes a run folder ``out_dir/trials/NNNNN-...``
    (rounds.csv, summary.json) that its summary's ``run_dir`` names.

    A run whose numerics this process cannot train in (a script or notebook that computed with
    torch before its first portable run, or one already pinned to the other mode) goes to a fresh
    worker process started in that mode, kept for the runner's next runs: the same bits as a run
    in a fresh process, instead of a refusal (robusttune.core.numerics)."""

    def __init__(
        self,
        out_dir: str | Path | None = None,
        tensorboard: bool = False,
        threads: int | None = None,
    ) -> None:
        self.out_dir = Path(out_dir) if out_dir is not None else None
        self.tensorboard = tensorboard
        # torch threads while running, like a Tune trial's (its CPUs): on a busy 2-core machine
        # the default of one thread per core ran a 13-run breakdown 10x slower than 1 thread
        self.threads = threads
        # a rerun into the same folder numbers on: RunWriter appends to an existing rounds.csv
        trials = self.out_dir / "trials" if self.out_dir is not None else None
        self.count = len(list(trials.iterdir())) if trials is not None and trials.is_dir() else 0
        self._workers: dict[str, ProcessPoolExecutor] = {}
        # a map's cells may call from threads of their own: one run at a time, numbered in order
        self._lock = threading.Lock()

    def __call__(self, specs: Sequence[RunSpec]) -> list[RunSummary]:
        with self._lock:
            saved = torch.get_num_threads()
            if self.threads:
                torch.set_num_threads(self.threads)
            try:
                return [self._run(spec) for spec in specs]
            finally:
                torch.set_num_threads(saved)

    def _run(self, spec: RunSpec) -> RunSummary:
        folder = None
        if self.out_dir is not None:
            folder = (
                self.out_dir
                / "trials"
                / (
                    f"{self.count:05d}-{spec.method}-{spec.attack}-b{spec.byzantine_fraction:.4g}"
                    f"-p{spec.participation:g}-s{spec.seed}"
                )
            )
        self.count += 1
        if try_pin(spec.numerics):
            return run_to_folder(spec, folder, tensorboard=self.tensorboard)
        return (
            self._worker(spec.numerics)
            .submit(_run_in_worker, spec, folder, self.tensorboard, self.threads)
            .result()
        )

    def _worker(self, mode: str) -> ProcessPoolExecutor:
        if mode not in self._workers:
            self._workers[mode] = ProcessPoolExecutor(
                max_workers=1,
                mp_context=multiprocessing.get_context("spawn"),
                initializer=_start_worker,
                initargs=(fresh_process_environment(mode), mode),
            )
        return self._workers[mode]

    def close(self) -> None:
        """Stop the fresh worker processes, if any were started."""
        for worker in self._workers.values():
            worker.shutdown()
        self._workers.clear()


def _start_worker(env: dict[str, str], mode: str) -> None:
    # a spawned process has imported torch but not yet computed: set the mode's environment, pin
    for key in set(os.environ) - set(env):
        del os.environ[key]
    os.environ.update(env)
    pin(mode)


def _run_in_worker(
    spec: RunSpec, folder: Path | None, tensorboard: bool, threads: int | None
) -> RunSummary:
    if threads and spec.numerics != "portable":  # portable runs one thread
        torch.set_num_threads(threads)
    return run_to_folder(spec, folder, tensorboard=tensorboard)
