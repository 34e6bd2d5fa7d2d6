"""A results folder read as tables: `load_runs` (one row per run: every summary.json below the
folder, its figures and its resolved RunSpec) and `load_rounds` (their rounds.csv stacked). A
folder others wrote may hold files that are not this tool's or are broken: those are passed
over (`robusttune.core.csv_input.read_table`; a summary whose spec no run could have)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pandas as pd

from robusttune.core.csv_input import read_table
from robusttune.core.records import RunSummary
from robusttune.core.registry import SpecError
from robusttune.core.runspec import RunSpec, run_keys

__all__ = [
    "IDENTITY",
    "ROUND_NUMERIC",
    "ROUND_REQUIRED",
    "SUMMARY_KEYS",
    "load_rounds",
    "load_runs",
]

SUMMARY_KEYS = (
    "final_accuracy",
    "final_validation_accuracy",
    "final_loss",
    "collapsed",
    "rounds_run",
    "byzantine_majority_rounds",
    "seconds",
    "num_classes",
    "mean_aggregation_error",
    "mean_honest_input_spread",
)
IDENTITY = ("dataset", "method", "attack", "byzantine_fraction", "participation", "seed")


def load_runs(results_dir: str | Path, include_partial: bool = False) -> pd.DataFrame:
    """One row per run: ``run_id`` (the run folder relative to ``results_dir``), ``run_dir``, the
    summary figures (SUMMARY_KEYS) and every resolved RunSpec key under its own name.
    ``collapsed`` is the summary's flag, or, when absent, final accuracy <= 1/classes + 0.005.
    Runs a scheduler or an interruption stopped early (``stopped_early`` in their summary) are
    left out unless ``include_partial``: their last accuracy is not a final one."""
    root = Path(results_dir)
    rows = []
    keys = run_keys()  # a plugin's knobs are columns too
    for path in sorted(root.rglob("summary.json")):
        try:
            summary = json.loads(path.read_bytes().decode("utf-8"))
        except (OSError, ValueError):
            continue  # a run being written; summary.json is atomic otherwise
        if not isinstance(summary, dict) or not isinstance(summary.get("spec"), dict):
            continue  # some other tool's summary.json
        try:
            # the spec resolved again: a key missing (a summary written before the key existed)
            # takes its default, and a spec no run could have had is not a run of this tool
            resolved = RunSpec.from_dict(summary["spec"]).to_dict()
            run = RunSummary.from_dict({**summary, "spec": {**resolved, **summary["spec"]}})
        except (SpecError, ValueError, TypeError, AttributeError):
            continue
        if run.stopped_early and not include_partial:
            continue
        row: dict[str, Any] = {
            "run_id": path.parent.relative_to(root).as_posix() or ".",
            "run_dir": str(path.parent),
        }
        row.update({key: getattr(run, key) for key in SUMMARY_KEYS})
        row.update({k: v for k, v in run.spec.items() if k in keys})
        rows.append(row)
    columns = ["run_id", "run_dir", *SUMMARY_KEYS]
    frame = pd.DataFrame(rows, columns=None if rows else columns)
    if frame.empty:
        return pd.DataFrame(columns=columns + list(IDENTITY))
    frame["final_accuracy"] = frame["final_accuracy"].astype(float)
    frame["final_loss"] = frame["final_loss"].astype(float)
    frame["collapsed"] = frame["collapsed"].astype(bool)
    ordered = ["run_id"] + [c for c in IDENTITY if c in frame] + list(SUMMARY_KEYS)
    rest = [c for c in frame.columns if c not in ordered]
    return frame[ordered + rest].reset_index(drop=True)


# what a report reads of a rounds.csv: these columns, as numbers
ROUND_REQUIRED = ("round", "accuracy", "param_norm")
ROUND_NUMERIC = (
    "round",
    "accuracy",
    "loss",
    "param_norm",
    "nonfinite_params",
    "max_class_share",
    "sampled",
    "byzantine_sampled",
    "byzantine_input_share",
    "f_assumed",
    "train_seconds",
    "aggregate_seconds",
    "aggregation_error",
    "honest_input_spread",
    "validation_accuracy",
)


def load_rounds(results_dir: str | Path, runs: pd.DataFrame | None = None) -> pd.DataFrame:
    """Every run's rounds.csv stacked, with its ``run_id`` first."""
    runs = load_runs(results_dir) if runs is None else runs
    parts = []
    for run_id, folder in zip(runs["run_id"], runs["run_dir"]):
        path = Path(folder) / "rounds.csv"
        if path.exists() and path.stat().st_size:
            # a rounds.csv that is not one (broken, or another tool's) is passed over
            part = read_table(path, required=ROUND_REQUIRED, numeric=ROUND_NUMERIC)
            if part is None:
                continue
            part.insert(0, "run_id", run_id)
            parts.append(part)
    if not parts:
        return pd.DataFrame(columns=["run_id", "round", "accuracy", "param_norm"])
    return pd.concat(parts, ignore_index=True)
