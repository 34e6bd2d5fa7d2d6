"""PNG figures from result tables (matplotlib, Agg canvas).

Figures are built on `matplotlib.figure.Figure` with the Agg canvas, never through pyplot: no
global figure state, no GUI backend, safe in a headless sweep driver or a Ray worker.

- `round_curves`         per-round test accuracy and parameter norm of chosen runs (the paper's
                         failure diagnostics: a rising norm at chance accuracy is median under IPM)
- `aggregation_error_vs_corruption`  the paper's Figure 2: mean L2 aggregation error
                         ||Agg - xbar_H|| against Byzantine fraction per method, one panel per
                         attack, with E(beta) = E0 + C sqrt(beta) fitted (Eq. 1)
- `classification_error_vs_corruption`  the same panels for the test error, 1 - final accuracy
                         (`corruption_curves` draws both)
- `breakdown_heatmap`    aggregator x participation, colour = breakdown fraction, one panel per
                         attack; non-monotone cells marked with '*', cells failing clean with 'x'
- `breakdown_frontier`   the p-frontier beta*(p): breakdown fraction against participation, one
                         line per method; values that never broke are open markers at the top
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any, cast

import numpy as np
import pandas as pd

__all__ = [
    "aggregation_error_vs_corruption",
    "breakdown_frontier",
    "breakdown_heatmap",
    "classification_error_vs_corruption",
    "corruption_curves",
    "fit_sqrt_bound",
    "round_curves",
    "threat_label",
]


def _figure(width: float, height: float) -> Any:
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    figure = Figure(figsize=(width, height), dpi=110)
    FigureCanvasAgg(figure)
    return figure


def _save(figure: Any, path: str | Path) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, bbox_inches="tight")
    return path


def _run_label(run: pd.Series) -> str:
    parts = [str(run.get("method", "?"))]
    if run.get("attack") not in (None, "none"):
        parts.append(str(run["attack"]))
    for key, short in (("byzantine_fraction", "β"), ("participation", "p"), ("seed", "s")):
        if (
            key in run
            and run[key] is not None
            and not (isinstance(run[key], float) and math.isnan(run[key]))
        ):
            parts.append(
                f"{short}={run[key]:g}"
                if isinstance(run[key], (int, float))
                else f"{short}={run[key]}"
            )
    return " ".join(parts)


def round_curves(
    rounds: pd.DataFrame,
    runs: pd.DataFrame,
    run_ids: Sequence[str],
    path: str | Path,
    title: str | None = None,
) -> Path | None:
    """Two panels over rounds (integer ticks): test accuracy (evaluated rounds only) and
    parameter norm, one line per run in ``run_ids``. None when there is nothing to draw."""
    chosen = [r for r in run_ids if (rounds["run_id"] == r).any()] if len(rounds) else []
    if not chosen:
        return None
    figure = _figure(11, 4)
    left, right = figure.subplots(1, 2)
    info = runs.set_index("run_id")
    for run_id in chosen:
        rows = rounds[rounds["run_id"] == run_id].sort_values("round")
        # run ids are unique: .loc of one is that run's row
        label = _run_label(cast(pd.Series, info.loc[run_id])) if run_id in info.index else run_id
        evaluated = rows[rows["accuracy"].notna()]
        (line,) = left.plot(
            evaluated["round"], 100 * evaluated["accuracy"], marker=".", label=label
        )
        right.plot(rows["round"], rows["param_norm"], color=line.get_color(), marker=".")
    from matplotlib.ticker import MaxNLocator

    left.set(xlabel="round", ylabel="test accuracy (%)", title="accuracy")
    right.set(xlabel="round", ylabel="‖w‖₂", title="parameter norm")
    for axis in (left, right):
        axis.grid(alpha=0.3)
        axis.xaxis.set_major_locator(MaxNLocator(integer=True))  # rounds are whole numbers
    left.legend(fontsize=7, loc="best")
    if title:
        figure.suptitle(title)
    return _save(figure, path)


def fit_sqrt_bound(beta: np.ndarray, error: np.ndarray) -> tuple[float, float]:
    """Least-squares (E0, C) of E(beta) = E0 + C sqrt(beta) (SWB-DM, Eq. 1)."""
    design = np.stack([np.ones_like(beta), np.sqrt(beta)], axis=1)
    (e0, c), *_ = np.linalg.lstsq(design, error, rcond=None)
    return float(e0), float(c)


def classification_error_vs_corruption(
    runs: pd.DataFrame,
    path: str | Path,
    attacks: Sequence[str] | None = None,
    fit_method: str | None = None,
) -> tuple[Path | None, dict[str, str]]:
    """Mean test (classification) error, 100 (1 - final accuracy) in %, per method against beta,
    one panel per attack, with E0 + C sqrt(beta) fitted as in `corruption_curves`. This is the
    accuracy side of the paper's Section VII, not its Figure 2 (that is
    `aggregation_error_vs_corruption`)."""
    if runs.empty or "final_accuracy" not in runs:
        return None, {}
    scored = runs.assign(test_error=100 * (1 - runs["final_accuracy"].astype(float)))
    return corruption_curves(
        scored,
        "test_error",
        "test error (%)",
        path,
        attacks=attacks,
        fit_method=fit_method,
        number=".1f",
    )


def aggregation_error_vs_corruption(
    runs: pd.DataFrame,
    path: str | Path,
    attacks: Sequence[str] | None = None,
    fit_method: str | None = None,
) -> tuple[Path | None, dict[str, str]]:
    """SWB-DM's Figure 2: the mean L2 aggregation error ||Agg - xbar_H|| (a run's
    ``aggregation_error`` column, its mean over rounds) per method against beta, one panel per
    attack, with E(beta) = E0 + C sqrt(beta) (Eq. 1) fitted to SWB when present."""
    if runs.empty or "aggregation_error" not in runs or runs["aggregation_error"].isna().all():
        return None, {}  # runs written before the error was recorded
    return corruption_curves(
        runs,
        "aggregation_error",
        "aggregation error ‖Agg − x̄_H‖₂",
        path,
        attacks=attacks,
        fit_method=fit_method,
        number=".3g",
    )


def corruption_curves(
    runs: pd.DataFrame,
    value: str,
    ylabel: str,
    path: str | Path,
    attacks: Sequence[str] | None = None,
    fit_method: str | None = None,
    number: str = ".3g",
) -> tuple[Path | None, dict[str, str]]:
    """The mean of the runs' ``value`` per method against beta, one panel per attack at its
    strength (default: every attack present). The clean runs (beta = 0) are every panel's first
    point. A dashed E0 + C sqrt(beta) is fitted to ``fit_method`` (default swb if present, else
    the first method) where its curve has at least three points: two points fit any
    two-parameter curve exactly, which says nothing. Returns the figure's path (None when no
    panel can be drawn) and, per attack left out, why."""
    skipped: dict[str, str] = {}
    if runs.empty or "attack" not in runs:
        return None, skipped
    strength = (
        runs["attack_strength"] if "attack_strength" in runs else pd.Series(None, index=runs.index)
    )
    labelled = runs.assign(threat=[threat_label(a, s) for a, s in zip(runs["attack"], strength)])
    attacked = labelled[labelled["attack"] != "none"]
    present = list(dict.fromkeys(attacked["threat"]))
    wanted = present if attacks is None else [a for a in present if a.split(" x")[0] in attacks]
    clean = labelled[labelled["byzantine_fraction"] == 0]
    panels = []
    for threat in wanted:
        betas = attacked[(attacked["threat"] == threat) & (attacked["byzantine_fraction"] > 0)]
        if betas.empty:
            skipped[threat] = "no run at a Byzantine fraction above 0"
        elif clean.empty and betas["byzantine_fraction"].nunique() < 2:
            skipped[threat] = "one Byzantine fraction and no clean run: no curve against β"
        else:
            panels.append(threat)
    if not panels:
        return None, skipped
    methods = list(dict.fromkeys(runs["method"]))
    fit_method = fit_method or ("swb" if "swb" in methods else methods[0])
    figure = _figure(5 * len(panels), 3.8)
    axes = np.atleast_1d(figure.subplots(1, len(panels), sharey=True))
    for axis, threat in zip(axes, panels):
        subset = pd.concat(
            [clean, labelled[(labelled["threat"] == threat) & (labelled["byzantine_fraction"] > 0)]]
        )
        for method in methods:
            rows = subset[subset["method"] == method]
            if rows.empty:
                continue
            curve = rows.groupby("byzantine_fraction")[value].mean().sort_index()
            (line,) = axis.plot(curve.index, curve.values, marker="o", label=method)
            finite = curve[np.isfinite(curve.to_numpy(float))]
            if method == fit_method and len(finite) >= 3:
                e0, c = fit_sqrt_bound(finite.index.to_numpy(float), finite.to_numpy(float))
                grid = np.linspace(0, finite.index.max(), 50)
                axis.plot(
                    grid,
                    e0 + c * np.sqrt(grid),
                    "--",
                    color=line.get_color(),
                    label=f"{method}: {e0:{number}} {'+' if c >= 0 else '-'} {abs(c):{number}}√β",
                )
        axis.set(xlabel="Byzantine fraction β", title=threat)
        axis.grid(alpha=0.3)
        axis.legend(fontsize=7)
    axes[0].set_ylabel(ylabel)
    return _save(figure, path), skipped


def threat_label(attack: str, strength: Any) -> str:
    """An attack as a heading: its name, and its strength when one was set (``ipm x10``)."""
    if strength is None or (isinstance(strength, float) and math.isnan(strength)):
        return str(attack)
    return f"{attack} x{float(strength):g}"


def breakdown_heatmap(
    table: pd.DataFrame,
    path: str | Path,
    row: str | None = None,
    column: str = "participation",
    panel: str = "attack",
) -> Path | None:
    """Heatmap of ``breakdown_fraction``: rows = aggregator (or method), columns = participation,
    one panel per attack (and per dataset when several); a cell over several rows shows their
    minimum. With ``breakdown_min`` and ``breakdown_max`` (a map over several seeds: the square
    shows the median) the seeds' range is written under the value where it is not one point. A
    cell that never broke shows ">=" its lattice top, non-monotone cells carry '*', cells whose
    seeds disagree by more than one lattice step '!' (a square over several rows takes its marks
    and range from the rows at its minimum), squares without a baseline (the clean run failed,
    or did not learn, in every row) 'x'. None when the table is empty."""
    if table.empty or "breakdown_fraction" not in table:
        return None
    table = table.copy()
    row = row or next((k for k in ("aggregator", "method") if k in table), None)
    if row is None:
        table["cell"] = "all"
        row = "cell"
    if column not in table:
        table[column] = "-"
    if panel not in table:
        table[panel] = "all"
    for extra in ("dataset", "participation_mode", "method"):
        # further cell axes (optionally x dataset) get panels of their own, not a hidden minimum
        if extra in table and extra not in (row, column, panel) and table[extra].nunique() > 1:
            table[panel] = table[panel].astype(str) + " · " + table[extra].astype(str)
    if "status" not in table:
        table["status"] = "ok"
    table["breakdown_fraction"] = pd.to_numeric(table["breakdown_fraction"], errors="coerce")
    panels = list(dict.fromkeys(table[panel]))
    rows = list(dict.fromkeys(table[row]))
    columns = sorted(dict.fromkeys(table[column]), key=str)
    top = (
        float(np.nanmax(table["breakdown_fraction"]))
        if table["breakdown_fraction"].notna().any()
        else 0.5
    )
    figure = _figure(1.2 + 1.3 * len(columns) * len(panels) + 1.0, 0.9 + 0.45 * len(rows))
    axes = np.atleast_1d(figure.subplots(1, len(panels), sharey=True, squeeze=False)[0])
    from matplotlib import colormaps

    cmap = colormaps["viridis"].with_extremes(bad="#dddddd")
    image = None
    for axis, name in zip(axes, panels):
        sub = table[table[panel] == name]
        grid = np.full((len(rows), len(columns)), np.nan)
        marks = [["" for _ in columns] for _ in rows]
        never = np.zeros((len(rows), len(columns)), dtype=bool)
        spread = [["" for _ in columns] for _ in rows]
        for (r, c), group in sub.groupby([row, column], sort=False):
            i, j = rows.index(r), columns.index(c)
            grid[i, j] = group["breakdown_fraction"].min()
            if math.isnan(grid[i, j]):
                marks[i][j] = "x"  # no row of the square has a baseline
                continue
            # the square shows its lowest row: its marks and range are that row's
            shown = group[group["breakdown_fraction"] <= grid[i, j] + 1e-12]
            broke = (
                shown["never_broke"].astype(str).str.lower().isin(["true", "1"])
                if "never_broke" in shown
                else shown["status"] == "survives_all"
            )
            never[i, j] = bool(broke.all())
            if "breakdown_min" in shown and "breakdown_max" in shown:
                low = pd.to_numeric(shown["breakdown_min"], errors="coerce").min()
                high = pd.to_numeric(shown["breakdown_max"], errors="coerce").max()
                if not (math.isnan(low) or math.isnan(high)) and high - low > 1e-9:
                    spread[i][j] = f"\n{low:.2f}-{high:.2f}"
            if (shown["status"] == "non_monotone").any():
                marks[i][j] = "*"
            if (shown["status"] == "seeds_disagree").any():
                marks[i][j] = "!"
        image = axis.imshow(
            np.ma.masked_invalid(grid), cmap=cmap, vmin=0, vmax=max(top, 1e-9), aspect="auto"
        )
        for i in range(len(rows)):
            for j in range(len(columns)):
                # a cell that never broke survived the whole lattice: its fraction is a floor
                text = (
                    ""
                    if math.isnan(grid[i, j])
                    else (f">={grid[i, j]:.2f}" if never[i, j] else f"{grid[i, j]:.2f}")
                )
                axis.text(
                    j,
                    i,
                    text + marks[i][j] + spread[i][j],
                    ha="center",
                    va="center",
                    fontsize=8 if not spread[i][j] else 7,
                    color="white"
                    if not math.isnan(grid[i, j]) and grid[i, j] < 0.6 * top
                    else "black",
                )
        axis.set_xticks(
            range(len(columns)), [f"{c:g}" if isinstance(c, float) else str(c) for c in columns]
        )
        axis.set_yticks(range(len(rows)), [str(r) for r in rows])
        axis.set(xlabel=column, title=str(name))
    axes[0].set_ylabel(row)
    if image is not None:
        figure.colorbar(image, ax=list(axes), label="breakdown fraction")
    return _save(figure, path)


def breakdown_frontier(frontier: pd.DataFrame, path: str | Path) -> Path | None:
    """The p-frontier (`robusttune.experiments.breakdown.frontier.frontier_table`): x = participation p, y =
    breakdown fraction beta*(p), one line per method. A value that never broke (its cells
    survived the whole lattice, so beta* is at least the top) is an open marker at the lattice
    top; a filled marker is a measured breakdown; methods whose cells all failed clean at some p
    leave a gap there. With ``seed_min`` and ``seed_max`` (a map over several seeds: the line
    is the medians') a bar spans the seeds' own frontiers. None when there is nothing to draw."""
    if frontier.empty or frontier["breakdown_fraction"].notna().sum() == 0:
        return None
    from matplotlib import colormaps

    methods = list(dict.fromkeys(frontier["method"]))
    figure = _figure(7.5, 4.6)
    axis = figure.subplots(1, 1)
    colours = colormaps["tab20"]
    top = float(frontier["lattice_top"].max())
    ps = sorted(dict.fromkeys(frontier["participation"].astype(float)))
    gap = min((b - a for a, b in itertools.pairwise(ps)), default=1.0)
    shift = 0.25 * gap / max(len(methods), 1)
    for i, method in enumerate(methods):
        rows = frontier[frontier["method"] == method].sort_values("participation")
        x = rows["participation"].to_numpy(float)
        y = pd.to_numeric(rows["breakdown_fraction"], errors="coerce").to_numpy(float)
        never = rows["never_broke"].to_numpy(bool)
        # a small sideways shift per method keeps equal values (0, the top) from hiding each
        # other; the values themselves are drawn where they are
        x = x + (i - (len(methods) - 1) / 2) * shift
        colour = colours(i % 20)
        axis.plot(x, y, "-", color=colour, alpha=0.8, label=method)
        if "seed_min" in rows and "seed_max" in rows:
            low = pd.to_numeric(rows["seed_min"], errors="coerce").to_numpy(float)
            high = pd.to_numeric(rows["seed_max"], errors="coerce").to_numpy(float)
            shown = ~(np.isnan(low) | np.isnan(high) | np.isnan(y))
            axis.vlines(x[shown], low[shown], high[shown], color=colour, alpha=0.5, linewidth=2)
        axis.plot(x[~never], y[~never], "o", color=colour, markersize=5)
        axis.plot(x[never], y[never], "o", markerfacecolor="white", color=colour, markersize=6)
    axis.axhline(top, color="grey", linestyle=":", linewidth=1)
    axis.text(
        float(frontier["participation"].min()),
        top,
        " lattice top (open: never broke)",
        va="bottom",
        fontsize=7,
        color="grey",
    )
    axis.set(
        xlabel="participation p",
        ylabel="breakdown fraction β*",
        title="the p-frontier: worst case over attacks and sampling modes",
        ylim=(-0.03, top + 0.06),
    )
    axis.set_xticks(ps)
    axis.grid(alpha=0.3)
    axis.legend(fontsize=6, loc="center left", bbox_to_anchor=(1.01, 0.5))
    return _save(figure, path)


def pareto_figure(proposals: pd.DataFrame, path: str | Path) -> Path | None:
    """Robust tuning's result (`robusttune.experiments.tuning`): x = clean validation accuracy, y =
    worst-case validation accuracy, one point per proposal; the Pareto front filled and joined,
    the other proposals open, the recommended one starred. None when there is nothing to draw."""
    if proposals.empty:
        return None
    figure = _figure(5.5, 4.2)
    axis = figure.subplots(1, 1)
    front = proposals[proposals["pareto"]].sort_values("clean_validation")
    rest = proposals[~proposals["pareto"]]
    axis.plot(
        rest["clean_validation"],
        rest["worst_validation"],
        "o",
        markerfacecolor="white",
        color="grey",
        label="proposal",
    )
    axis.plot(
        front["clean_validation"],
        front["worst_validation"],
        "o-",
        color="tab:red",
        label="Pareto front",
    )
    if "recommended" in proposals:
        chosen = proposals[proposals["recommended"].astype(bool)]
        axis.plot(
            chosen["clean_validation"],
            chosen["worst_validation"],
            "*",
            color="black",
            markersize=12,
            label="recommended",
        )
    axis.set(
        xlabel="clean validation accuracy",
        ylabel="worst-case validation accuracy",
        title="robust tuning: clean vs worst case",
    )
    axis.grid(alpha=0.3)
    axis.legend(fontsize=7)
    return _save(figure, path)
