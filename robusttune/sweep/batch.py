"""Run a list of RunSpecs as the trials of one Ray Tune sweep and return their RunSummaries: the
`robusttune.runners.Runner` that breakdown bisection and the calibrate trim sweep hand each wave
of points to on Ray.

Each call is one grid sweep (`run_sweep`) whose single joint axis ``trial`` lists, per RunSpec,
the keys that differ between the RunSpecs of the batch (the shared ones go to ``run:``), so trial
folders stay short and say what differs. Every trial writes its run folder (rounds.csv,
summary.json, TensorBoard) as in any sweep; the summaries are read back from those folders.
Successive calls are sweeps ``wave000``, ``wave001`` ... under one folder; open a Ray session
around all of them (`ray_session`) so Ray starts once.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Callable, Sequence

from robusttune.config import RunSpec
from robusttune.records import RunSummary
from robusttune.sweep.space import parse_sweep

__all__ = ["TuneBatchRunner"]


class TuneBatchRunner:
    """``runner(specs) -> [RunSummary, ...]`` (same order) through Ray Tune.

    ``folder`` holds one sweep folder per call; ``resources`` is the per-trial {cpu, gpu};
    ``address`` joins a running cluster (else the caller's or a local Ray). A trial that errored
    comes back as ``RunSummary.failed(reason)`` (collapsed, NaN accuracy). ``verbose`` is Tune's
    (0: none of its per-wave tables, which the breakdown's one progress line replaces);
    ``announce`` receives the sweep layer's one-line notes of each wave."""

    def __init__(self, folder: str | Path, resources: dict[str, float] | None = None,
                 address: str | None = None, max_concurrent: int = 0, prefix: str = "wave",
                 announce: Callable[[str], None] | None = None, verbose: int = 0) -> None:
        self.folder = Path(folder).resolve()
        self.resources = {k: v for k, v in (resources or {"cpu": 1}).items() if v is not None}
        self.address = address
        self.max_concurrent = max_concurrent
        self.prefix = prefix
        self.announce = announce
        self.verbose = verbose
        existing = sorted(self.folder.glob(f"{prefix}[0-9][0-9][0-9]")) if self.folder.exists() else []
        self.calls = len(existing)    # a rerun into the same folder appends waves, never reuses one

    def __call__(self, specs: Sequence[RunSpec]) -> list[RunSummary]:
        from robusttune.sweep.runner import run_sweep

        if not specs:
            return []
        unique: dict[str, int] = {}
        order = [unique.setdefault(s.to_json(), len(unique)) for s in specs]
        distinct = [specs[order.index(i)] for i in range(len(unique))]
        dicts = [_explicit(s) for s in distinct]
        keys = list(dict.fromkeys(k for d in dicts for k in d))
        shared = {k: dicts[0][k] for k in keys
                  if all(k in d and _same(d[k], dicts[0][k]) for d in dicts)}
        groups = [{k: v for k, v in d.items() if k not in shared} or {"seed": d.get("seed", 42)}
                  for d in dicts]
        name = f"{self.prefix}{self.calls:03d}"
        self.calls += 1
        raw = {"name": name, "run": shared,
               "space": {"trial": {"grid": groups}},
               "search": {"algorithm": "grid"},
               "resources": self.resources, "max_concurrent": self.max_concurrent,
               # a breakdown's clean point keeps its cell's attack at byzantine_fraction 0
               "constraints": {"attack_matches_byzantine": False}}
        sweep = parse_sweep(raw, name=name, source=f"{name} (batch of {len(distinct)} runs)")
        axis = sweep.axes[0]
        label_of = {json.dumps(g, sort_keys=True, default=str): label for label, g in axis.groups.items()}
        outcome = run_sweep(sweep, storage=str(self.folder), address=self.address, verbose=self.verbose,
                            announce=self.announce)
        if outcome.unfinished:
            # Ctrl-C: Tune stopped the wave and returned. Its stopped runs have no final figures,
            # and the caller must not go on to the next wave as if they had.
            raise KeyboardInterrupt(f"{name}: {outcome.unfinished} runs interrupted ({outcome.path})")
        by_label: dict[str, RunSummary] = {}
        for result in outcome.result_grid:
            label = result.config.get("trial")
            by_label[label] = _read_summary(result)
        summaries = []
        for group in groups:
            label = label_of[json.dumps(group, sort_keys=True, default=str)]
            summaries.append(by_label.get(label, RunSummary.failed("trial did not run")))
        return [summaries[i] for i in order]


def _explicit(spec: RunSpec) -> dict[str, Any]:
    """The values a RunSpec was given (its resolved value per explicit key)."""
    resolved = spec.to_dict()
    return {k: resolved[k] for k in sorted(spec.explicit) if k in resolved}


def _same(a: Any, b: Any) -> bool:
    return type(a) is type(b) and a == b


def _read_summary(result: Any) -> RunSummary:
    path = Path(result.path) / "summary.json" if result.path else None
    if result.error is not None or path is None or not path.exists():
        reason = str(result.error).splitlines()[0] if result.error is not None else "no summary.json"
        return RunSummary.failed(reason, run_dir=str(result.path))
    return RunSummary.from_dict(json.loads(path.read_text())).at(str(result.path))
