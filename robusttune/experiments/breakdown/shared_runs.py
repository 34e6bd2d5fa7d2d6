"""Runs made once: `canonical_spec` (a RunSpec with the knobs its run ignores removed, so equal
runs share one key) and `SharedRuns` (the runs an evaluator has made, by that key, safe for the
cells that evaluate in threads of their own): `spec_evaluator`'s ``share``."""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

from robusttune.core.records import RunSummary
from robusttune.core.runspec import RunSpec

if TYPE_CHECKING:  # the runners import torch; sharing needs only their protocol
    from robusttune.engine.runners import Runner

__all__ = ["SharedRuns", "canonical_spec"]


def canonical_spec(spec: RunSpec) -> RunSpec:
    """The RunSpec a run is equal to with the knobs it ignores removed, so that equal runs share
    one key (`spec_evaluator`'s ``share``).

    Rule: a run in which no round samples a Byzantine client (none exists, k = floor(beta N) =
    0, or the run's sampling stream never draws one: `sampling.byzantine_ever_sampled`) never
    calls its attack (a round builds Byzantine messages only for its sampled Byzantine clients;
    a data-side attack poisons only Byzantine clients' labels, and only sampled clients train;
    a cache slot of a never-sampled client keeps its initial value), so attack,
    attack_strength and attack_scope do not change a single number of it: they are set to none
    and the defaults. beta itself stays (f = floor(n beta) still sets what a rule trims).
    Every other spec is its own canonical form. tests/test_breakdown.py checks such runs bit
    for bit against the originals."""
    if spec.attack == "none" and spec.attack_strength is None and spec.attack_scope == "inputs":
        return spec
    from robusttune.problem.sampling import byzantine_ever_sampled  # torch; only when sharing

    if not byzantine_ever_sampled(spec):
        return spec.updated(attack="none", attack_strength=None, attack_scope="inputs")
    return spec


class SharedRuns:
    """The runs an evaluator has already made, by canonical RunSpec: a spec equal to one run
    before (in this batch, an earlier wave or another cell) is not run again. Without ``share``
    every spec runs, as the runner is handed it. Cells evaluated in threads of their own share
    it: a run another thread is making is waited for, not made twice."""

    def __init__(
        self, runner: Runner, share: bool, on_trials: Callable[[int], None] | None
    ) -> None:
        self.runner, self.share, self.on_trials = runner, share, on_trials
        self.done: dict[str, RunSummary] = {}
        self._lock = threading.Lock()
        self._making: dict[str, threading.Event] = {}

    def __call__(self, specs: Sequence[RunSpec]) -> tuple[list[RunSummary], list[bool]]:
        """Summaries for ``specs`` in order, and for each whether it was a new run (the first
        spec of its key that was not run before): what the trial count charges."""
        if not self.share:
            summaries = self.runner(list(specs))
            if self.on_trials is not None:
                self.on_trials(len(specs))
            return summaries, [True] * len(specs)
        canonical = [canonical_spec(s) for s in specs]
        keys = [s.to_json() for s in canonical]
        fresh: dict[str, RunSpec] = {}
        with self._lock:
            for key, spec in zip(keys, canonical):
                if key not in self.done and key not in self._making and key not in fresh:
                    fresh[key] = spec
            others = {self._making[k] for k in keys if k in self._making}
            for key in fresh:
                self._making[key] = threading.Event()
        try:
            if fresh:
                summaries = self.runner(list(fresh.values()))
                with self._lock:
                    self.done.update(zip(fresh, summaries))
                if self.on_trials is not None:
                    self.on_trials(len(fresh))
        finally:
            with self._lock:
                for key in fresh:
                    self._making.pop(key).set()
        for event in others:
            event.wait()
        new = []
        for key in keys:
            new.append(key in fresh)
            fresh.pop(key, None)
        with self._lock:
            missing = [k for k in keys if k not in self.done]
            if missing:  # the thread making it was interrupted
                raise KeyboardInterrupt("a shared run was not finished")
            return [self.done[k] for k in keys], new
