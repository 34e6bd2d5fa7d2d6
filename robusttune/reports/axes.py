"""Which RunSpec keys tell a results folder's runs apart: the axes a report's tables follow.

A sweep's grid axes are RunSpec keys (a joint axis sets several together), and every run keeps its
resolved RunSpec, so the axes are read back from the runs: the keys whose values differ between
them. Many differ only because another does: algorithm and aggregator follow ``method``, an
explicit ``marina_p`` or ``demoa_alpha`` set with ``participation`` in a joint axis follows it,
``byzantine_fraction`` follows ``attack`` when the clean runs are the only ones at 0. A table
indexed by all of them repeats itself, so `varying_axes` keeps a key only where the keys kept
before it (in `AXIS_ORDER`, then alphabetically) do not already fix its value: key k
is dropped when every group of runs that agrees on the kept keys has one value of k.

``seed`` is never an axis: a cell is a mean over its seeds (`seed_table` gives the spread).
``dirichlet_alpha`` is shown as ``split``: ``IID`` (alpha = inf, no Dirichlet skew) or
``Dir(alpha)`` (non-IID).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import pandas as pd

from robusttune.core.runspec import run_keys

__all__ = [
    "AXIS_ORDER",
    "NOT_AXES",
    "NOT_CONFIGURATION",
    "THREAT_KEYS",
    "ablation_labelled",
    "accuracy_percent",
    "cell_index",
    "distinct_runs",
    "labelled",
    "row_axes",
    "seed_table",
    "split_label",
    "varying_axes",
]

# The order keys are considered in: a key earlier here is kept, and the later keys it fixes are
# dropped (method before algorithm/aggregator, participation before what is coupled to it).
AXIS_ORDER = (
    "dataset",
    "model",
    "method",
    "attack",
    "attack_strength",
    "byzantine_fraction",
    "participation",
    "participation_mode",
    "sample_size",
    "dirichlet_alpha",
    "demoa_ablation",
    "clients",
    "rounds",
)
# Keys that differ between runs without being what a comparison varies: the seed (averaged
# over), where the data lives and where and how often the run was saved.
NOT_AXES = ("seed", "data_root", "device", "checkpoint_every", "trainer")
# The keys a threat is named by (a column of the accuracy-by-attack table, `plots.threat_label`).
THREAT_KEYS = ("attack", "attack_strength")


def _comparable(value: Any) -> str:
    """One hashable spelling per value: None, NaN and lists group like any other value."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "none"
    return repr(value)


def varying_axes(runs: pd.DataFrame, exclude: Sequence[str] = NOT_AXES) -> list[str]:
    """The RunSpec keys (columns of ``runs``, `results.load_runs`) that label its runs apart, in
    `AXIS_ORDER` then alphabetical order: a key is kept when its value is not a function of the
    keys kept before it (over ``runs``), so a constant key is never kept and a key fixed by an
    earlier one (algorithm by method) is dropped. ``exclude`` keys are never axes."""
    keys = [k for k in AXIS_ORDER if k in runs and k not in exclude]
    known = run_keys()
    keys += sorted(k for k in runs.columns if k in known and k not in keys and k not in exclude)
    if runs.empty:
        return []
    spelled = pd.DataFrame({k: runs[k].map(_comparable) for k in keys}, index=runs.index)
    kept: list[str] = []
    for key in keys:
        if kept:
            fixed = bool((spelled.groupby(kept)[key].nunique() <= 1).all())
        else:
            fixed = spelled[key].nunique() <= 1
        if not fixed:
            kept.append(key)
    return kept


def split_label(alpha: Any) -> str:
    """``IID`` for dirichlet_alpha = inf (no skew), ``Dir(alpha)`` for a Dirichlet (non-IID)
    split."""
    value = float(alpha)
    return "IID" if math.isinf(value) else f"Dir({value:g})"


def labelled(runs: pd.DataFrame) -> pd.DataFrame:
    """``runs`` with the display columns the tables index by: ``split`` (from dirichlet_alpha)
    and ``threat`` (attack at its strength)."""
    from robusttune.display.plots import threat_label

    extra: dict[str, Any] = {}
    if "dirichlet_alpha" in runs:
        extra["split"] = [split_label(a) for a in runs["dirichlet_alpha"]]
    if "attack" in runs:
        strength = runs["attack_strength"] if "attack_strength" in runs else [None] * len(runs)
        extra["threat"] = [threat_label(a, s) for a, s in zip(runs["attack"], strength)]
    return runs.assign(**extra)


def row_axes(runs: pd.DataFrame, without: Sequence[str] = ()) -> list[str]:
    """The varying axes as a table's row index, ``method`` last (rows of one block then list the
    methods), dirichlet_alpha shown as ``split``, the threat keys and ``without`` left out."""
    axes = [a for a in varying_axes(runs) if a not in THREAT_KEYS and a not in without]
    axes = ["split" if a == "dirichlet_alpha" else a for a in axes]
    return [a for a in axes if a != "method"] + (["method"] if "method" in runs else [])


def cell_index(runs: pd.DataFrame) -> list[str]:
    """The row index of a per-cell table (columns of `labelled`): `row_axes`, with ``threat``
    just before ``method`` when the attack varies."""
    index = row_axes(runs)
    if "attack" in varying_axes(runs):
        index = [*index[:-1], "threat", *index[-1:]]
    return index


def accuracy_percent(runs: pd.DataFrame) -> pd.Series:
    """Final accuracy in %, a run without a finite accuracy (it diverged) counted as 0, as
    `records.mean_accuracy` does."""
    accuracy = runs["final_accuracy"].astype(float)
    return 100 * accuracy.where(accuracy.map(math.isfinite), 0.0)


def seed_table(runs: pd.DataFrame) -> pd.DataFrame:
    """One row per cell (every varying axis, the threat as ``threat``): ``runs``, the mean final
    accuracy (%) over its seeds, their sample standard deviation ``sd`` (NaN for one seed),
    ``min`` and ``max``, and ``collapsed`` (count). A run without a finite accuracy (it
    diverged) counts as 0, as `records.mean_accuracy` does."""
    if runs.empty:
        return pd.DataFrame(columns=["runs", "mean", "sd", "min", "max", "collapsed"])
    frame = labelled(runs)
    grouped = frame.assign(accuracy=accuracy_percent(frame)).groupby(cell_index(frame), sort=True)
    table = grouped.agg(
        runs=("accuracy", "size"),
        mean=("accuracy", "mean"),
        sd=("accuracy", "std"),
        min=("accuracy", "min"),
        max=("accuracy", "max"),
        collapsed=("collapsed", "sum"),
    )
    table["collapsed"] = table["collapsed"].astype(int)
    return table


# Keys that tell where or how a run was stored or executed, not what it computed.
NOT_CONFIGURATION = ("data_root", "device", "checkpoint_every", "trainer")


def distinct_runs(runs: pd.DataFrame) -> tuple[pd.DataFrame, int]:
    """``runs`` with each configuration once, and how many repeats were dropped. Two runs repeat
    each other when every RunSpec key (seed included, `NOT_CONFIGURATION` left out) agrees: two
    sweeps run into one storage can share an arm (demoa_ablations.yaml's unablated DeMoA is
    demoa.yaml's), and counting both would count one seed twice. Of repeats the run with more
    recorded summary figures is kept (a newer run records figures an older one lacks), then
    the first by ``run_id``."""
    known = run_keys()
    keys = [k for k in runs.columns if k in known and k not in NOT_CONFIGURATION]
    if runs.empty or not keys:
        return runs, 0
    spelled = pd.DataFrame({k: runs[k].map(_comparable) for k in keys}, index=runs.index)
    recorded = runs.notna().sum(axis=1)
    order = (
        runs.assign(_recorded=-recorded).sort_values(["_recorded", "run_id"], kind="stable").index
    )
    keep = ~spelled.loc[order].duplicated(keep="first")
    kept = runs.loc[keep[keep].index].sort_index()
    return kept, len(runs) - len(kept)


def ablation_labelled(runs: pd.DataFrame) -> pd.DataFrame:
    """``runs`` with an ablated DeMoA run's ``method`` naming its ablation, ``demoa[no_decay]``:
    tables grouped by method alone (Tables I, II, IV, Figure 2) then keep the unablated DeMoA
    apart from its ablations instead of averaging the three into one ``demoa`` cell."""
    if runs.empty or "demoa_ablation" not in runs or "method" not in runs:
        return runs
    ablation = runs["demoa_ablation"].fillna("none").astype(str)
    ablated = ablation != "none"
    if not ablated.any():
        return runs
    method = (
        runs["method"]
        .astype(str)
        .where(~ablated, runs["method"].astype(str) + "[" + ablation + "]")
    )
    return runs.assign(method=method)
