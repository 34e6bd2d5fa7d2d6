"""Writing a breakdown map to a folder: breakdown.csv (one row per cell), breakdown_points.csv
(every evaluated point and the runs behind it), breakdown.png (the heatmap) and breakdown.md."""

from __future__ import annotations

from pathlib import Path

from robusttune.breakdown.bisection import BreakdownMap

__all__ = ["write_breakdown"]


def write_breakdown(result: BreakdownMap, out_dir: str | Path, title: str = "Breakdown map") -> Path:
    """breakdown.csv (one row per cell), breakdown_points.csv (every evaluated point and the runs
    behind it), breakdown.png (heatmap) and breakdown.md; returns the .md path."""
    from robusttune.plots import breakdown_heatmap
    from robusttune.results import markdown_table

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    table = result.to_frame()
    table.to_csv(out / "breakdown.csv", index=False)
    result.points_frame().to_csv(out / "breakdown_points.csv", index=False)
    figure = breakdown_heatmap(table, out / "breakdown.png")
    shown = [c for c in table.columns if c not in ("evaluated", "violations", "threshold")]
    lines = [f"# {title}", "",
             "Largest Byzantine fraction on the lattice {0, 1/N, ...} at which a run survives "
             "(no collapse, final accuracy >= threshold).", "",
             markdown_table(table[shown], floatfmt=".3g", index=False), "", f"Cost: {result.cost_line()}.", ""]
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
