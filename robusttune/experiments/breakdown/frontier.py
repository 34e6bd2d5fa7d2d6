"""The p-frontier of a breakdown map and how firmly the seeds order it: `frontier_table` (per
method and participation p, the smallest breakdown over its cells, with each seed's own
frontier), `ordering_table` and `regime_ordering_table` (in how many seeds the frontier's order
of two methods, or of two regimes of a method, holds), from breakdown.csv's table and
breakdown_seeds.csv's."""

from __future__ import annotations

import itertools
from collections.abc import Mapping
from typing import Any

import pandas as pd

from robusttune.experiments.breakdown.points import NO_ANSWER

__all__ = [
    "frontier_table",
    "method_key",
    "method_names",
    "never_broke",
    "ordering_table",
    "regime_ordering_table",
]


def never_broke(row: Mapping[str, Any]) -> bool:
    """The cell's answer is the lattice top (``never_broke``; a table without the column, one
    written before it existed, by its status)."""
    never = row.get("never_broke")
    if never is None or (isinstance(never, float) and pd.isna(never)):
        return row["status"] == "survives_all"
    return str(never).lower() in ("true", "1")


def method_key(table: Any) -> str | None:
    return next((k for k in ("method", "aggregator", "algorithm") if k in table), None)


def method_names(table: Any, key: str) -> Any:
    """Each row's method as a report names it: the ``key`` column, prefixed by its
    pre-aggregator where a cell sets one (``nnm+median``: NNM in front of the median), so a
    method with and without a pre-aggregator are two methods of the frontier."""
    names = table[key].astype(str)
    if "pre_aggregator" in table:
        pre = table["pre_aggregator"]
        wrapped = pre.notna() & ~pre.astype(str).isin(["none", ""])
        names = names.where(~wrapped, pre.astype(str) + "+" + names)
    return names


def frontier_table(
    table: Any, base: Mapping[str, Any] | None = None, seeds_table: Any = None
) -> Any:
    """The p-frontier beta*(p): one row per (method, participation p), its value the minimum
    breakdown fraction over every cell of that method at that p (the attacks, sampling modes and
    any other axis: the worst case),

        beta*(method, p) = min { breakdown_fraction(cell) : cell.method = method, cell.p = p },

    taken over the cells with a baseline (a cell without one, its clean run failed or did not
    learn, has no breakdown and is only counted, in ``fails_clean``; a (method, p) whose cells
    all lack one has NaN). ``breakdown_fraction`` is each cell's median over seeds; with
    ``seeds_table`` (breakdown_seeds.csv: one row per cell and seed) each seed's own frontier
    beta*_s(method, p) (the same minimum over that seed's answers) is kept too, in
    ``seed_values`` (seed order) with its ``seed_min`` and ``seed_max``.
    ``never_broke`` is true when every cell at the minimum survived its whole lattice, so the
    value is a floor (``>= top``); ``worst`` names the cell(s) at the minimum. The method is the
    ``method`` axis (else ``aggregator``, else ``algorithm``, else one method "all"); p is the
    ``participation`` axis, else ``base``'s participation (else the RunSpec default)."""
    columns = [
        "method",
        "participation",
        "breakdown_fraction",
        "never_broke",
        "lattice_top",
        "label",
        "cells",
        "fails_clean",
        "worst",
        "seed_min",
        "seed_max",
        "seed_values",
    ]
    if table.empty:
        return pd.DataFrame(columns=columns)
    table = _with_method_and_p(table, base)
    key = method_key(table)
    others = [
        c
        for c in ("attack", "participation_mode", "dataset", "aggregator", "algorithm")
        if c in table and c != key and table[c].nunique(dropna=False) > 1
    ]
    per_seed = _seed_frontiers(seeds_table, base)
    rows = []
    for (method, p), group in table.groupby(["_method", "participation"], sort=False):
        measured = group[~group["status"].isin(NO_ANSWER) & group["_fraction"].notna()]
        values = per_seed.get((method, p), [])
        finite = [v for v in values if not pd.isna(v)]
        row = {
            "method": method,
            "participation": p,
            "cells": len(group),
            "fails_clean": int(group["status"].isin(NO_ANSWER).sum()),
            "lattice_top": float(group["_top"].min()),
            "seed_min": min(finite) if finite else float("nan"),
            "seed_max": max(finite) if finite else float("nan"),
            "seed_values": " ".join("-" if pd.isna(v) else f"{v:.3g}" for v in values),
        }
        if measured.empty:
            rows.append(
                {
                    **row,
                    "breakdown_fraction": float("nan"),
                    "never_broke": False,
                    "label": "no baseline",
                    "worst": "",
                }
            )
            continue
        value = float(measured["_fraction"].min())
        at_min = measured[measured["_fraction"] <= value + 1e-12]
        never = all(never_broke(r) for _, r in at_min.iterrows())
        worst = "; ".join(
            ", ".join(f"{k}={r[k]}" for k in others) or "-" for _, r in at_min.iterrows()
        )
        label = f">= {value:.3g}" if never else f"{value:.3g}"
        if len(finite) > 1 and max(finite) - min(finite) > 1e-9:
            label += f" [{min(finite):.3g}, {max(finite):.3g}]"
        rows.append(
            {
                **row,
                "breakdown_fraction": value,
                "never_broke": never,
                "label": label,
                "worst": worst,
            }
        )
    frontier = pd.DataFrame(rows, columns=columns)
    # methods in the map's order, p ascending within each
    order = {m: i for i, m in enumerate(dict.fromkeys(frontier["method"]))}
    frontier["_order"] = frontier["method"].map(order)
    frontier = frontier.sort_values(["_order", "participation"], kind="stable")
    return frontier.drop(columns="_order").reset_index(drop=True)


def _with_method_and_p(table: Any, base: Mapping[str, Any] | None) -> Any:
    """``table`` with the frontier's working columns: ``_method``, ``participation`` (the base
    run's where no cell sets it), ``_top`` and ``_fraction``."""
    from robusttune.core.schema import RunSchema

    table = table.copy()
    key = method_key(table)
    table["_method"] = method_names(table, key) if key else "all"
    if "participation" not in table:
        default = RunSchema.model_fields["participation"].default
        table["participation"] = (base or {}).get("participation", default)
    table["_top"] = (table["lattice_points"] - 1) / table["clients"]
    table["_fraction"] = pd.to_numeric(table["breakdown_fraction"], errors="coerce")
    return table


def _seed_frontiers(
    seeds_table: Any, base: Mapping[str, Any] | None
) -> dict[tuple[Any, ...], list[float]]:
    """(method, p) -> each seed's frontier value, in seed order (NaN where that seed has no
    measured cell there); empty without a seeds table or a seed column."""
    if seeds_table is None or seeds_table.empty or "seed" not in seeds_table:
        return {}
    table = _with_method_and_p(seeds_table, base)
    seeds = list(dict.fromkeys(table["seed"]))
    out: dict[tuple[Any, ...], list[float]] = {}
    for key, group in table.groupby(["_method", "participation"], sort=False):
        measured = group[~group["status"].isin(NO_ANSWER) & group["_fraction"].notna()]
        by_seed = measured.groupby("seed")["_fraction"].min()
        out[key] = [float(by_seed.get(s, float("nan"))) for s in seeds]
    return out


def ordering_table(frontier: Any) -> Any:
    """How firmly the frontier orders the methods at each p: for each p, the methods in
    descending order of their frontier value beta*(method, p) (the medians over seeds), and for
    every two neighbours A above B with beta*(A) > beta*(B), in how many seeds A's own frontier
    is above B's (``holds``), equal (``ties``) or below (``reversed``), of the seeds where both
    have one (``seeds``). Empty unless the frontier holds per-seed values of several seeds."""
    columns = [
        "participation",
        "higher",
        "lower",
        "higher_fraction",
        "lower_fraction",
        "holds",
        "ties",
        "reversed",
        "seeds",
    ]
    rows = []
    if frontier.empty or "seed_values" not in frontier:
        return pd.DataFrame(columns=columns)
    for p, group in frontier.groupby("participation", sort=True):
        ranked = group[group["breakdown_fraction"].notna()].sort_values(
            "breakdown_fraction", ascending=False, kind="stable"
        )
        ranked = list(ranked.itertuples(index=False))
        for above, below in itertools.pairwise(ranked):
            if not above.breakdown_fraction > below.breakdown_fraction + 1e-12:
                continue
            counts = _seed_comparison(above.seed_values, below.seed_values)
            if counts is not None:
                rows.append(
                    {
                        "participation": p,
                        "higher": above.method,
                        "lower": below.method,
                        "higher_fraction": above.breakdown_fraction,
                        "lower_fraction": below.breakdown_fraction,
                        **counts,
                    }
                )
    return pd.DataFrame(rows, columns=columns)


def regime_ordering_table(frontier: Any) -> Any:
    """How firmly the frontier orders the regimes of each method: for every method and two
    neighbouring participations p < p' whose frontier values (medians over seeds) differ, in how
    many seeds the method's own frontier at the higher of the two values is above the other's
    (``holds``), equal (``ties``) or below (``reversed``), of the seeds where both have one.
    Empty unless the frontier holds per-seed values of several seeds."""
    columns = [
        "method",
        "higher_p",
        "lower_p",
        "higher_fraction",
        "lower_fraction",
        "holds",
        "ties",
        "reversed",
        "seeds",
    ]
    rows = []
    if frontier.empty or "seed_values" not in frontier:
        return pd.DataFrame(columns=columns)
    for method, group in frontier.groupby("method", sort=False):
        ordered = list(group.sort_values("participation").itertuples(index=False))
        for first, second in itertools.pairwise(ordered):
            if (
                pd.isna(first.breakdown_fraction)
                or pd.isna(second.breakdown_fraction)
                or abs(first.breakdown_fraction - second.breakdown_fraction) <= 1e-12
            ):
                continue
            high, low = (
                (first, second)
                if first.breakdown_fraction > second.breakdown_fraction
                else (second, first)
            )
            counts = _seed_comparison(high.seed_values, low.seed_values)
            if counts is not None:
                rows.append(
                    {
                        "method": method,
                        "higher_p": high.participation,
                        "lower_p": low.participation,
                        "higher_fraction": high.breakdown_fraction,
                        "lower_fraction": low.breakdown_fraction,
                        **counts,
                    }
                )
    return pd.DataFrame(rows, columns=columns)


def _seed_comparison(higher: Any, lower: Any) -> dict[str, int] | None:
    """Seed by seed, the frontier values ``higher`` against ``lower`` (frontier.csv's
    ``seed_values``): in how many seeds the first is above (``holds``), equal (``ties``) or below
    (``reversed``), of the ``seeds`` where both have one; None where fewer than two do."""
    pairs = [
        (x, y) for x, y in zip(_values(higher), _values(lower)) if not (pd.isna(x) or pd.isna(y))
    ]
    if len(pairs) < 2:
        return None
    return {
        "holds": sum(x > y + 1e-12 for x, y in pairs),
        "ties": sum(abs(x - y) <= 1e-12 for x, y in pairs),
        "reversed": sum(x < y - 1e-12 for x, y in pairs),
        "seeds": len(pairs),
    }


def _values(text: Any) -> list[float]:
    if not isinstance(text, str) or not text:
        return []
    return [float("nan") if word == "-" else float(word) for word in text.split()]
