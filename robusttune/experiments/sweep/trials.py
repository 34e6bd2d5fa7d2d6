"""The per-trial table of a finished (or interrupted) sweep: each trial's status as saved in the
experiment state, the keys the space varies, the metric(s), collapse and rounds, sorted best first
(the Pareto front first for several metrics). The runner writes it as trials.csv."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from robusttune.experiments.sweep.ray_compat import grid_trials, quiet_analysis
from robusttune.experiments.sweep.space import SweepSpec
from robusttune.experiments.sweep.trainable import CONFIG_ERROR

__all__ = ["config_error", "config_errors", "saved_statuses", "trials_table"]


def config_error(trial: Any) -> str | None:
    """The message of a trial that ended on a configuration error (`trainable.CONFIG_ERROR`);
    Tune saw such a trial end normally, the sweep counts it as errored."""
    message = (trial.last_result or {}).get(CONFIG_ERROR)
    return str(message) if message else None


def config_errors(grid: Any) -> dict[str, str]:
    """Trial folder name -> configuration error message, for the trials that had one."""
    found = {}
    for trial in grid_trials(grid):
        message = config_error(trial)
        if message:
            found[Path(trial.path).name if trial.path else trial.trial_id] = message
    return found


def saved_statuses(path: str, grid: Any) -> dict[str, str]:
    """Trial id -> status as saved in the experiment state, which is what ``--resume`` acts on.
    After an interruption Tune stops the running trials and marks them TERMINATED in memory,
    but the saved state (written before that) keeps them RUNNING: unfinished."""
    from ray.tune import ExperimentAnalysis

    trials = grid_trials(grid)
    statuses = {trial.trial_id: trial.status for trial in trials}
    try:
        with quiet_analysis():  # its per-trial warnings about trials not started yet
            saved = {trial.trial_id: trial.status for trial in ExperimentAnalysis(path).trials}
    except Exception:
        saved = {}
    merged = {trial_id: saved.get(trial_id, status) for trial_id, status in statuses.items()}
    for trial in trials:
        if config_error(trial):
            merged[trial.trial_id] = "ERROR"
    return merged


def trials_table(grid: Any, spec: SweepSpec, statuses: dict[str, str] | None = None) -> Any:
    """One row per trial: status, the keys the space varies, the metric(s), collapse and rounds;
    sorted best first by the (first) metric, NaN last."""
    import pandas as pd

    rows = []
    for trial in grid_trials(grid):
        metrics = trial.last_result or {}
        status = (statuses or {}).get(trial.trial_id, trial.status)
        row: dict[str, Any] = {
            "trial": Path(trial.path).name if trial.path else trial.trial_id,
            "status": status if status in ("TERMINATED", "ERROR") else "UNFINISHED",
        }
        resolved = spec.resolve(trial.config)
        for key in spec.varied_keys:
            row[key] = metrics.get(key, resolved.get(key))
        for metric in spec.search.metrics:
            row[metric] = metrics.get(metric, math.nan)
        for extra in ("last_validation_accuracy", "last_accuracy", "collapsed"):
            if extra not in row:
                row[extra] = metrics.get(extra, math.nan)
        row["rounds_done"] = 0 if config_error(trial) else metrics.get("training_iteration", 0)
        row["path"] = trial.path
        rows.append(row)
    table = pd.DataFrame(rows)
    if table.empty:
        return table
    ascending = [mode == "min" for mode in spec.search.modes]
    if spec.search.multi_objective:
        table.insert(2, "pareto", _pareto(table, spec))
        table = table.sort_values(
            ["pareto", *spec.search.metrics], ascending=[False, *ascending], na_position="last"
        )
    else:
        table = table.sort_values(spec.search.metric, ascending=ascending[0], na_position="last")
    return table.reset_index(drop=True)


def _pareto(table: Any, spec: SweepSpec) -> list[bool]:
    """Whether each row is on the Pareto front of the metrics (NaN rows never are)."""
    signs = [1.0 if mode == "max" else -1.0 for mode in spec.search.modes]
    values = [
        [s * float(row[m]) for m, s in zip(spec.search.metrics, signs)]
        for _, row in table.iterrows()
    ]
    front = []
    for i, a in enumerate(values):
        if any(math.isnan(x) for x in a):
            front.append(False)
            continue
        dominated = any(
            all(y >= x for x, y in zip(a, b)) and any(y > x for x, y in zip(a, b))
            for j, b in enumerate(values)
            if j != i and not any(math.isnan(y) for y in b)
        )
        front.append(not dominated)
    return front
