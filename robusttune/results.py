"""Results folder -> pandas tables, and the report.

A results folder is anything holding run folders (a sweep folder, ``results/runs``, a breakdown
folder): every ``summary.json`` below it is one run, with the resolved RunSpec under ``spec``, and
its ``rounds.csv`` beside it. The tables are the SWB-DM paper's:

- Table I   mean final accuracy (%) by Byzantine fraction x participation, per method, averaged
            over every attack condition and seed present;
- Table II  number of collapsed runs per method, collapse = final accuracy <= chance + 0.5
            points (the paper's <= 10.5% on 10 classes) or non-finite parameters;
- Table IV  mean accuracy gain (points) from round 10 to round 25 per method (one column per
            dataset), from rounds.csv.

`report` writes report.md with these tables, their CSVs and PNG figures (robusttune.plots).
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any, Sequence

import pandas as pd

from robusttune.config import RUNSPEC_KEYS
from robusttune.records import RunSummary
from robusttune.registry import SpecError

__all__ = [
    "load_runs", "load_rounds", "accuracy_table", "collapse_table", "gain_table", "round_value",
    "markdown_table", "report", "SUMMARY_KEYS", "METHOD_ORDER", "attack_table",
]

SUMMARY_KEYS = ("final_accuracy", "final_loss", "collapsed", "rounds_run",
                "byzantine_majority_rounds", "seconds", "num_classes")
# The paper's column order; other methods follow alphabetically.
METHOD_ORDER = ("fedavg", "median", "krum", "bulyan", "fltrust", "swb", "swb_dm",
                "delayed_momentum", "demoa", "fedcm")
IDENTITY = ("dataset", "method", "attack", "byzantine_fraction", "participation", "seed")


def _sort_methods(frame: pd.DataFrame) -> pd.DataFrame:
    """Rows in the paper's method order (METHOD_ORDER, then alphabetical); other index levels
    (dataset) alphabetical."""
    if frame.empty:
        return frame
    order = {m: i for i, m in enumerate(METHOD_ORDER)}
    names = list(frame.index.names)

    def key(entry: Any) -> tuple:
        entry = entry if isinstance(entry, tuple) else (entry,)
        return tuple((order.get(v, len(order)), str(v)) if n == "method" else (0, str(v))
                     for n, v in zip(names, entry))

    return frame.loc[sorted(frame.index, key=key)]


# -- loading ---------------------------------------------------------------------------------
def load_runs(results_dir: str | Path, include_partial: bool = False) -> pd.DataFrame:
    """One row per run: ``run_id`` (the run folder relative to ``results_dir``), ``run_dir``, the
    summary figures (SUMMARY_KEYS) and every resolved RunSpec key under its own name.
    ``collapsed`` is the summary's flag, or, when absent, final accuracy <= 1/classes + 0.005.
    Runs a scheduler or an interruption stopped early (``stopped_early`` in their summary) are
    left out unless ``include_partial``: their last accuracy is not a final one."""
    root = Path(results_dir)
    rows = []
    for path in sorted(root.rglob("summary.json")):
        try:
            summary = json.loads(path.read_text())
        except (OSError, json.JSONDecodeError):
            continue                     # a run being written; summary.json is atomic otherwise
        if not isinstance(summary, dict) or not isinstance(summary.get("spec"), dict):
            continue                     # some other tool's summary.json
        run = RunSummary.from_dict(summary)
        if run.stopped_early and not include_partial:
            continue
        row: dict[str, Any] = {"run_id": path.parent.relative_to(root).as_posix() or ".",
                               "run_dir": str(path.parent)}
        row.update({key: getattr(run, key) for key in SUMMARY_KEYS})
        row.update({k: v for k, v in run.spec.items() if k in RUNSPEC_KEYS})
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


def load_rounds(results_dir: str | Path, runs: pd.DataFrame | None = None) -> pd.DataFrame:
    """Every run's rounds.csv stacked, with its ``run_id`` first."""
    runs = load_runs(results_dir) if runs is None else runs
    parts = []
    for run_id, folder in zip(runs["run_id"], runs["run_dir"]):
        path = Path(folder) / "rounds.csv"
        if path.exists() and path.stat().st_size:
            part = pd.read_csv(path)
            part.insert(0, "run_id", run_id)
            parts.append(part)
    if not parts:
        return pd.DataFrame(columns=["run_id", "round", "accuracy", "param_norm"])
    return pd.concat(parts, ignore_index=True)


# -- the paper's tables -------------------------------------------------------------------------
def _by_dataset(runs: pd.DataFrame) -> list[str]:
    return ["dataset"] if "dataset" in runs and runs["dataset"].nunique() > 1 else []


def accuracy_table(runs: pd.DataFrame) -> pd.DataFrame:
    """Table I: mean final accuracy (%) per method (rows; per dataset when several) x
    (participation, byzantine_fraction) (columns), over every attack and seed in the folder."""
    if runs.empty:
        return pd.DataFrame()
    index = _by_dataset(runs) + ["method"]
    table = (runs.assign(accuracy=100 * runs["final_accuracy"])
             .pivot_table(index=index, columns=["participation", "byzantine_fraction"],
                          values="accuracy", aggfunc="mean"))
    # the paper's layout: p = 0.5 block before p = 0.1, beta ascending inside each block
    table = table[sorted(table.columns, key=lambda c: (-float(c[0]), float(c[1])))]
    return _sort_methods(table)


def attack_label(attack: str, strength: Any) -> str:
    """An attack as a column heading: its name, and its strength when one was set."""
    if strength is None or (isinstance(strength, float) and math.isnan(strength)):
        return str(attack)
    return f"{attack} x{float(strength):g}"


def attack_table(runs: pd.DataFrame) -> pd.DataFrame:
    """Mean final accuracy (%) per method (rows; per dataset and participation when several) x
    attack at its strength (columns, the clean runs as ``none``), and each method's ``worst``
    attack: where a rule breaks, read by attack rather than averaged over them (Table I)."""
    if runs.empty:
        return pd.DataFrame()
    strength = runs["attack_strength"] if "attack_strength" in runs else pd.Series(None, index=runs.index)
    labelled = runs.assign(accuracy=100 * runs["final_accuracy"],
                           threat=[attack_label(a, s) for a, s in zip(runs["attack"], strength)])
    index = _by_dataset(runs) + (["participation"] if runs["participation"].nunique() > 1 else []) \
        + ["method"]
    table = labelled.pivot_table(index=index, columns="threat", values="accuracy", aggfunc="mean")
    attacked = [c for c in table.columns if c != "none"]
    table = table[(["none"] if "none" in table.columns else []) + sorted(attacked)]
    if attacked:
        table["worst"] = table[attacked].min(axis=1)
    return _sort_methods(table)


def collapse_table(runs: pd.DataFrame) -> pd.DataFrame:
    """Table II: per method, ``collapsed`` runs out of ``runs``."""
    if runs.empty:
        return pd.DataFrame(columns=["collapsed", "runs"])
    index = _by_dataset(runs) + ["method"]
    table = runs.groupby(index).agg(collapsed=("collapsed", "sum"), runs=("collapsed", "size"))
    table["collapsed"] = table["collapsed"].astype(int)
    return _sort_methods(table)


def round_value(rounds: pd.DataFrame, run_id: str, at: int, column: str = "accuracy") -> float:
    """A run's ``column`` at round ``at``: the last evaluated value at or before it (accuracy is
    NaN in rounds that were not evaluated); NaN when the run stopped before ``at``."""
    rows = rounds[rounds["run_id"] == run_id]
    if rows.empty or rows["round"].max() < at:
        return math.nan
    known = rows[(rows["round"] <= at) & rows[column].notna()]
    return float(known.sort_values("round")[column].iloc[-1]) if len(known) else math.nan


def gain_table(runs: pd.DataFrame, rounds: pd.DataFrame, start: int = 10, end: int = 25) -> pd.DataFrame:
    """Table IV: mean accuracy gain in points, acc(round ``end``) - acc(round ``start``), per
    method (rows) and dataset (columns), over runs that reached round ``end``."""
    gains = []
    for run_id, method, dataset in zip(runs["run_id"], runs["method"], runs["dataset"]):
        before, after = round_value(rounds, run_id, start), round_value(rounds, run_id, end)
        if math.isfinite(before) and math.isfinite(after):
            gains.append({"method": method, "dataset": dataset, "gain": 100 * (after - before)})
    if not gains:
        return pd.DataFrame()
    table = pd.DataFrame(gains).pivot_table(index="method", columns="dataset", values="gain", aggfunc="mean")
    table.columns = [f"{c} gain" for c in table.columns]
    return _sort_methods(table)


# -- markdown ------------------------------------------------------------------------------------
def _cell(value: Any, floatfmt: str) -> str:
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, float):
        return "" if math.isnan(value) else format(value, floatfmt)
    if value is None:
        return ""
    return str(value).replace("|", "\\|")


def markdown_table(frame: pd.DataFrame, floatfmt: str = ".2f", index: bool | None = None) -> str:
    """A GitHub markdown table (no tabulate dependency). The index is shown when it is named;
    MultiIndex columns are joined as ``p=0.5, β=0.1``-style headers by their level names."""
    if frame.empty:
        return "_(no runs)_"
    show_index = index if index is not None else any(n is not None for n in frame.index.names)
    if isinstance(frame.columns, pd.MultiIndex):
        names = [_short(n) for n in frame.columns.names]
        headers = [", ".join(f"{n}={_cell(v, 'g')}" for n, v in zip(names, col)) for col in frame.columns]
    else:
        headers = [str(c) for c in frame.columns]
    if show_index:
        headers = [" / ".join(str(n) for n in frame.index.names)] + headers
    lines = ["| " + " | ".join(headers) + " |", "|" + "|".join(["---"] * len(headers)) + "|"]
    for key, row in zip(frame.index, frame.itertuples(index=False)):
        cells = [_cell(v, floatfmt) for v in row]
        if show_index:
            label = " / ".join(map(str, key)) if isinstance(key, tuple) else str(key)
            cells = [label] + cells
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def _short(name: Any) -> str:
    return {"participation": "p", "byzantine_fraction": "β"}.get(str(name), str(name))


# -- the report ----------------------------------------------------------------------------------
def default_curve_runs(runs: pd.DataFrame, limit: int = 8) -> list[str]:
    """Runs worth a per-round look: per method, its worst attacked run (lowest final accuracy at
    byzantine_fraction > 0), else its first run; at most ``limit``."""
    if runs.empty:
        return []
    attacked = runs[runs["byzantine_fraction"] > 0] if "byzantine_fraction" in runs else runs
    pool = attacked if len(attacked) else runs
    chosen = (pool.sort_values("final_accuracy", na_position="first")
              .groupby("method", sort=False).head(1))
    return list(_sort_methods(chosen.set_index("method")).head(limit)["run_id"])


def report(results_dir: str | Path, out: str | Path | None = None,
           curve_runs: Sequence[str] | None = None, gain_rounds: tuple[int, int] = (10, 25)) -> Path:
    """Write ``report.md`` (Tables I, II, IV in markdown, figures) with ``runs.csv``,
    ``table1_accuracy.csv``, ``table2_collapses.csv``, ``table4_gain.csv`` and PNGs beside it, in
    ``out`` (default ``RESULTS_DIR/report``). ``curve_runs`` picks the runs drawn per round (run
    ids or unique substrings of them); default `default_curve_runs`. Returns report.md's path."""
    from robusttune import plots

    root = Path(results_dir)
    if not root.is_dir():
        raise SpecError(f"results folder {str(root)!r} does not exist")
    runs = load_runs(root)
    if runs.empty:
        # an empty folder, or a sweep whose trials all errored (they leave no summary.json)
        raise SpecError(f"results folder {str(root)!r} holds no finished run (no summary.json "
                        f"below it); allowed: a sweep, breakdown or runs folder with finished runs")
    out_dir = Path(out) if out is not None else root / "report"
    out_dir.mkdir(parents=True, exist_ok=True)
    rounds = load_rounds(root, runs)
    runs.to_csv(out_dir / "runs.csv", index=False)
    table1, table2 = accuracy_table(runs), collapse_table(runs)
    by_attack = attack_table(runs)
    by_attack.to_csv(out_dir / "accuracy_by_attack.csv")
    start, end = gain_rounds
    table4 = gain_table(runs, rounds, start, end) if len(runs) else pd.DataFrame()
    for name, table in (("table1_accuracy", table1), ("table2_collapses", table2), ("table4_gain", table4)):
        table.to_csv(out_dir / f"{name}.csv")

    chosen = _resolve_runs(runs, curve_runs) if curve_runs else default_curve_runs(runs)
    lines = [f"# Results: {root.resolve().name}", "",
             f"{len(runs)} runs from `{root}`"
             + (f"; datasets: {', '.join(map(str, sorted(runs['dataset'].unique())))}; methods: "
                f"{', '.join(map(str, runs['method'].unique()))}." if len(runs) else "."), "",
             "## Accuracy (%) by attack", "",
             "Mean final accuracy per method under each attack (at its strength, when set) and "
             "the worst of them: where each rule breaks.", "",
             markdown_table(by_attack), "",
             "## Table I: mean final accuracy (%) by Byzantine fraction β and participation p", "",
             "Averaged over every attack condition and seed in the folder.", "",
             markdown_table(table1), "",
             "## Table II: collapsed runs (final accuracy <= chance + 0.5 points, or non-finite)", "",
             markdown_table(table2), "",
             f"## Table IV: mean accuracy gain (points) from round {start} to round {end}", ""]
    lines += [markdown_table(table4) if not table4.empty else
              f"_(no run reached round {end}; rerun with rounds >= {end} to fill this table)_", ""]
    figure = plots.round_curves(rounds, runs, chosen, out_dir / "curves.png")
    if figure is not None:
        lines += ["## Per-round accuracy and parameter norm", "",
                  "Runs: " + ", ".join(f"`{r}`" for r in chosen), "", f"![curves]({figure.name})", ""]
    figure = plots.error_vs_corruption(runs, out_dir / "error_vs_corruption.png")
    if figure is not None:
        lines += ["## Test error against corruption (Figure 2 style)", "",
                  "Mean test error (1 - final accuracy) per method against β, one panel per attack; "
                  "dashed: E(β) = E0 + C sqrt(β) fitted to SWB when present, else to the first "
                  "method (the paper's Eq. 1 shape; the paper plots aggregation error, which runs "
                  "do not record).", "",
                  f"![error against corruption]({figure.name})", ""]
    breakdown_csv = next(iter(sorted(root.rglob("breakdown.csv"))), None)
    if breakdown_csv is not None:
        table = pd.read_csv(breakdown_csv)
        figure = plots.breakdown_heatmap(table, out_dir / "breakdown.png")
        shown = [c for c in table.columns if c not in ("evaluated", "violations", "threshold")]
        lines += ["## Breakdown map", "", markdown_table(table[shown], floatfmt=".3g", index=False), ""]
        if figure is not None:
            lines += [f"![breakdown]({figure.name})", ""]
    lines += ["CSV files beside this report: runs.csv, table1_accuracy.csv, table2_collapses.csv, "
              "table4_gain.csv.", ""]
    path = out_dir / "report.md"
    path.write_text("\n".join(lines))
    return path


def _resolve_runs(runs: pd.DataFrame, wanted: Sequence[str]) -> list[str]:
    ids = list(runs["run_id"])
    chosen = []
    for name in wanted:
        if name in ids:
            chosen.append(name)
            continue
        matches = [i for i in ids if name in i]
        if len(matches) != 1:
            raise SpecError(f"run {name!r} matches {len(matches)} runs; give a run id from runs.csv")
        chosen.append(matches[0])
    return chosen
