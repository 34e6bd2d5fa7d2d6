"""The sweep layer: a search-space YAML becomes a Ray Tune experiment in which every trial is one
federated run (`Simulation` wrapped by a function trainable); Optuna proposes the knobs.

This package is the only place in robusttune that imports ray, and it does so lazily: importing
``robusttune.experiments.sweep`` (for ``--dry-run`` or to read a space) never imports or starts Ray.

- `space_file` the YAML's pydantic schema, one model per section               no ray
- `metrics`   what a trial reports, the default selection metric, each mode   no ray
- `domains`   Domain and Axis (one space: entry), their Tune translation     ray only in to_tune
- `space`     SweepSpec: load/parse, grid expansion, constraints, configs    no ray
- `space_overrides` command-line flags and --set written into the file first  no ray
- `constraints` what the constraints section excludes                         no ray
- `trainable` the function trainable around Simulation                       ray inside
- `runner`    `run_sweep`: a sweep run or resumed, step by step              ray inside
- `storage`   STORAGE/NAME, sweep.yaml and trials.csv beside the results     no ray
- `cluster`   the Ray session (local or --address) and its resources         ray inside
- `tuner`     search algorithm, scheduler, trainable, the (restored) Tuner   ray inside
- `progress`  driver-side callbacks: one line per trial, the timeline        ray inside
- `trials`    the per-trial table, sorted best first                         ray inside
- `ray_compat` Ray's private and developer APIs, pinned by a test             ray inside
- `stream`    `TuneStreamRunner`: one experiment per command, runs as asked  ray inside
- `preflight` data, model, rule and attack built once per setting, pre-Ray    no ray
"""

from __future__ import annotations

from typing import Any

from robusttune.experiments.sweep.space import SweepSpec, load_sweep, parse_sweep

__all__ = ["SweepSpec", "load_sweep", "parse_sweep", "run_sweep"]


def __getattr__(name: str) -> Any:
    # Lazy attributes so ``import robusttune.experiments.sweep`` stays free of ray.
    if name == "run_sweep":
        from robusttune.experiments.sweep.runner import run_sweep

        return run_sweep
    raise AttributeError(f"module 'robusttune.experiments.sweep' has no attribute {name!r}")
