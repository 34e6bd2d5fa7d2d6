"""Writing a breakdown map to a folder: breakdown.csv (one row per cell), breakdown_points.csv
(every evaluated point and the runs behind it), breakdown.png (the heatmap) and breakdown.md."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Mapping

import pandas as pd

from robusttune.breakdown.bisection import BreakdownMap
from robusttune.breakdown.theory import theory_columns

__all__ = ["write_breakdown", "breakdown_table", "breakdown_label", "answer"]


def breakdown_label(row: Mapping[str, Any]) -> str:
    """How a cell's answer reads: the fraction, ">= top" for a cell that never broke on the
    lattice (its true breakdown lies above what was tried), "fails clean" without a baseline."""
    if row["status"] == "fails_clean":
        return "fails clean"
    top = (row["lattice_points"] - 1) / row["clients"]
    if row["status"] == "survives_all":
        return f">= {top:.3g}"
    text = f"{row['breakdown_fraction']:.3g}"
    return text + " (non-monotone)" if row["status"] == "non_monotone" else text


def answer(table: Any) -> list[str]:
    """The map's answer in a few sentences, from its numbers: who breaks at the first Byzantine
    client, who never broke, where the measurement falls below the rule's own bound, and where
    sampling alone handed the Byzantine clients a majority at the failing point."""
    axes = [c for c in table.columns if c in ("method", "aggregator", "algorithm", "attack",
                                              "participation", "participation_mode", "dataset")]

    def cells(rows: Any) -> str:
        return "; ".join(", ".join(f"{k}={r[k]}" for k in axes) for _, r in rows.iterrows())

    lines = []
    first = table[(table["status"] != "fails_clean") & (table["breakdown_byzantine"] == 0)]
    if len(first):
        lines.append(f"Breaks at the first Byzantine client ({len(first)} cells): {cells(first)}.")
    never = table[table["status"] == "survives_all"]
    if len(never):
        lines.append(f"Never broke on the lattice ({len(never)} cells, breakdown above its top): "
                     f"{cells(never)}.")
    if "theory_fraction" in table:
        theory = pd.to_numeric(table["theory_fraction"], errors="coerce")
        below = table[(table["status"] == "ok") & (table["breakdown_fraction"] < theory - 1e-9)]
        if len(below):
            lines.append(f"Broke within the rule's own precondition (measured below its theoretical "
                         f"fraction: the attack, not the count, broke it) in {len(below)} cells: "
                         f"{cells(below)}.")
    if "p_majority_run" in table:
        sampled = table[pd.to_numeric(table["p_majority_run"], errors="coerce") > 0.5]
        if len(sampled):
            lines.append(f"Where sampling more likely than not hands the Byzantine clients a "
                         f"majority of some round at the failing point ({len(sampled)} cells), a "
                         f"collapse is the sampling's as much as the rule's: {cells(sampled)}.")
    flagged = table[table["status"] == "fails_clean"]
    if len(flagged):
        lines.append(f"No baseline (the clean run itself failed) in {len(flagged)} cells: "
                     f"{cells(flagged)}.")
    return lines or ["Every cell broke somewhere inside the lattice; see the table."]


def write_breakdown(result: BreakdownMap, out_dir: str | Path, title: str = "Breakdown map",
                    base: Mapping[str, Any] | None = None) -> Path:
    """breakdown.csv (one row per cell), breakdown_points.csv (every evaluated point and the runs
    behind it), breakdown.png (heatmap) and breakdown.md, which opens with the map's answer;
    with ``base`` (the plan's run) each cell also gets the theory columns (`theory_columns`).
    Returns the .md path."""
    from robusttune.plots import breakdown_heatmap
    from robusttune.results import markdown_table

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    table = breakdown_table(result, base)
    table.to_csv(out / "breakdown.csv", index=False)
    result.points_frame().to_csv(out / "breakdown_points.csv", index=False)
    figure = breakdown_heatmap(table, out / "breakdown.png")
    hidden = ("evaluated", "violations", "threshold", "breakdown_fraction", "breakdown_byzantine",
              "monotone", "lattice_points")
    shown = [c for c in table.columns if c not in hidden]
    lines = [f"# {title}", "", *answer(table), "",
             "Largest Byzantine fraction on the lattice {0, 1/N, ...} at which a run survives "
             "(no collapse, final accuracy >= threshold) against the worst adversary tried "
             "(`broken_by` names the attack setting that broke the first failing point); "
             "`theory_fraction` is the rule's own bound over its `inputs`, `p_majority_round` "
             "and `p_majority_run` the chance of a Byzantine-majority sample at the failing point.",
             "", markdown_table(table[shown], floatfmt=".3g", index=False), "",
             f"Cost: {result.cost_line()}.", ""]
    flagged = table[table["status"] == "non_monotone"]
    if len(flagged):
        lines += ["## Non-monotone cells", "",
                  "Survival is not monotone in the Byzantine count here; the breakdown column is "
                  "bisection's answer, `conservative_fraction` the first evaluated failure minus one.", ""]
        for _, row in flagged.iterrows():
            cell = ", ".join(f"{k}={row[k]}" for k in result.cells[0].cell.as_dict())
            lines.append(f"- {cell}: evaluated {row['evaluated']} (k+ survived, k- failed); "
                         f"contradicting points: {row['violations']}")
        lines.append("")
    if figure is not None:
        lines += [f"![breakdown heatmap]({figure.name})", ""]
    lines += ["Every evaluated point and its runs: `breakdown_points.csv`.", ""]
    path = out / "breakdown.md"
    path.write_text("\n".join(lines))
    return path


def breakdown_table(result: BreakdownMap, base: Mapping[str, Any] | None = None) -> Any:
    """One row per cell: `CellResult.row`, the readable ``breakdown`` label and, with ``base``,
    the theory columns."""
    table = result.to_frame()
    if table.empty:
        return table
    table.insert(len(result.cells[0].cell.as_dict()), "breakdown",
                 [breakdown_label(row) for _, row in table.iterrows()])
    if base is not None:
        extra = pd.DataFrame([theory_columns(base, cell) for cell in result.cells])
        table = pd.concat([table, extra], axis=1)
    return table
