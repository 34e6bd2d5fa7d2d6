"""Results folder -> the report: report.md with the SWB-DM paper's tables
(`robusttune.reports.paper_tables`), their CSVs and PNG figures (robusttune.display.plots), the
curves, the seed spread and the HTML page.

A results folder is anything holding run folders (a sweep folder, ``results/runs``, a breakdown
map's or a tuning study's folder): every ``summary.json`` below it is one run, with the resolved
RunSpec under ``spec``, and its ``rounds.csv`` beside it. Loading the folder is
`robusttune.reports.runs`'s (`load_runs`, `load_rounds`, re-exported here).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import pandas as pd

from robusttune.core.csv_input import read_table
from robusttune.core.registry import SpecError
from robusttune.display.markdown import markdown_table
from robusttune.display.plots import threat_label
from robusttune.reports import axes
from robusttune.reports.aggregation import figure_two_section
from robusttune.reports.paper_tables import (
    accuracy_table,
    attack_table,
    collapse_table,
    gain_table,
    sort_methods,
)

# re-exported: callers read them here
from robusttune.reports.runs import SUMMARY_KEYS, load_rounds, load_runs
from robusttune.reports.spread import spread_section
from robusttune.reports.tuning import tuning_section

__all__ = ["SUMMARY_KEYS", "load_rounds", "load_runs", "report"]


def default_curve_runs(runs: pd.DataFrame, limit: int = 8) -> list[str]:
    """Runs worth a per-round look when one figure is asked for: per method, its worst attacked
    run (lowest final accuracy at byzantine_fraction > 0), else its first run; at most
    ``limit``."""
    if runs.empty:
        return []
    attacked = runs[runs["byzantine_fraction"] > 0] if "byzantine_fraction" in runs else runs
    pool = attacked if len(attacked) else runs
    chosen = (
        pool.sort_values("final_accuracy", na_position="first")
        .groupby("method", sort=False)
        .head(1)
    )
    return list(sort_methods(chosen.set_index("method")).head(limit)["run_id"])


def curve_groups(runs: pd.DataFrame) -> list[tuple[str, list[str]]]:
    """Like-for-like per-round figures: one per attack present (at its strength), at that
    attack's largest Byzantine fraction, holding one run per method (the first seed, and the
    lowest participation when several), so the lines of a figure differ in the method alone.
    Returns (title, run ids) pairs; the clean runs make a figure of their own."""
    if runs.empty:
        return []
    strength = (
        runs["attack_strength"] if "attack_strength" in runs else pd.Series(None, index=runs.index)
    )
    labelled = runs.assign(threat=[threat_label(a, s) for a, s in zip(runs["attack"], strength)])
    groups = []
    for threat in ["none", *sorted(t for t in labelled["threat"].unique() if t != "none")]:
        rows = labelled[labelled["threat"] == threat]
        if rows.empty:
            continue
        beta = rows["byzantine_fraction"].max()
        rows = rows[rows["byzantine_fraction"] == beta]
        if "participation" in rows:
            rows = rows[rows["participation"] == rows["participation"].min()]
        rows = rows.sort_values(["seed", "run_id"]).groupby("method", sort=False).head(1)
        ordered = sort_methods(rows.set_index("method"))
        title = "clean" if threat == "none" else f"{threat} at β={beta:g}"
        if "participation" in rows and runs["participation"].nunique() > 1:
            title += f", p={rows['participation'].iloc[0]:g}"
        groups.append((title, list(ordered["run_id"])))
    return groups


def gain_rounds_for(
    rounds: pd.DataFrame, runs: pd.DataFrame, start: int, end: int
) -> tuple[int, int]:
    """The rounds Table IV compares: the requested (start, end) when every run reached ``end``;
    otherwise ``end`` becomes the last round every run has and ``start`` its half (at least 1),
    so short runs still get their warm-up gain (report.md says which rounds)."""
    if rounds.empty:
        return start, end
    reached = int(rounds.groupby("run_id")["round"].max().min())
    if reached >= end:
        return start, end
    return max(1, min(start, reached // 2)), reached


def report(
    results_dir: str | Path,
    out: str | Path | None = None,
    curve_runs: Sequence[str] | None = None,
    gain_rounds: tuple[int, int] = (10, 25),
) -> Path:
    """Write ``report.md`` (Tables I, II, IV in markdown, figures) with ``runs.csv``,
    ``table1_accuracy.csv``, ``table2_collapses.csv``, ``table4_gain.csv`` (and Figure 2's
    ``aggregation_error*.csv`` when the runs recorded it, a tuning study's front and
    ``tuning_front.csv`` when the folder holds one, `robusttune.reports.tuning`) and PNGs beside it, in
    ``out`` (default ``RESULTS_DIR/report``). ``curve_runs`` picks the runs drawn per round (run
    ids or unique substrings of them); default `default_curve_runs`. Returns report.md's path."""
    from robusttune.display import plots
    from robusttune.reports import majority

    root = Path(results_dir)
    if not root.is_dir():
        raise SpecError(f"results folder {str(root)!r} does not exist")
    runs = load_runs(root)
    if runs.empty:
        # an empty folder, or a sweep whose trials all errored (they leave no summary.json)
        raise SpecError(
            f"results folder {str(root)!r} holds no finished run (no summary.json "
            f"below it); allowed: a sweep, breakdown, tuning or runs folder with finished runs"
        )
    runs, repeats = axes.distinct_runs(runs)
    runs = axes.ablation_labelled(runs)
    out_dir = Path(out) if out is not None else root / "report"
    out_dir.mkdir(parents=True, exist_ok=True)
    rounds = load_rounds(root, runs)
    runs.to_csv(out_dir / "runs.csv", index=False)
    table1, table2 = accuracy_table(runs), collapse_table(runs)
    by_attack = attack_table(runs)
    by_attack.to_csv(out_dir / "accuracy_by_attack.csv")
    start, end = gain_rounds_for(rounds, runs, *gain_rounds)
    table4 = gain_table(runs, rounds, start, end) if len(runs) and start < end else pd.DataFrame()
    for name, table in (
        ("table1_accuracy", table1),
        ("table2_collapses", table2),
        ("table4_gain", table4),
    ):
        table.to_csv(out_dir / f"{name}.csv")

    spread = seed_spread_section(runs, out_dir)
    by_majority = majority.majority_section(runs, rounds, out_dir)
    by_input_spread = spread_section(runs, out_dir)
    extra = (
        (["accuracy_by_seed.csv"] if spread else [])
        + (["majority_summary.csv", "majority_runs.csv"] if by_majority else [])
        + (["honest_input_spread.csv"] if by_input_spread else [])
    )
    chosen = _resolve_runs(runs, curve_runs) if curve_runs else default_curve_runs(runs)
    lines = [
        f"# Results: {root.resolve().name}",
        "",
        f"{len(runs)} runs from `{root}`"
        + (
            f"; datasets: {', '.join(map(str, sorted(runs['dataset'].unique())))}; methods: "
            f"{', '.join(map(str, runs['method'].unique()))}."
            if len(runs)
            else "."
        )
        + (
            f" {repeats} more run(s) repeated a configuration already counted (same resolved "
            f"RunSpec, seed included) and are left out."
            if repeats
            else ""
        ),
        "",
        "## Accuracy (%) by attack",
        "",
        "Mean final accuracy per method under each attack (at its strength, when set) and "
        "the worst of them: where each rule breaks.",
        "",
        markdown_table(by_attack),
        "",
        *spread,
        *by_majority,
        *by_input_spread,
        "## Table I: mean final accuracy (%) by Byzantine fraction β and participation p",
        "",
        "Averaged over every attack condition and seed in the folder.",
        "",
        markdown_table(table1),
        "",
        "## Table II: collapsed runs (final accuracy <= chance + 0.5 points, or non-finite)",
        "",
        markdown_table(table2),
        "",
        f"## Table IV: mean accuracy gain (points) from round {start} to round {end}",
        "",
    ]
    if (start, end) != tuple(gain_rounds):
        lines += [
            f"The runs are shorter than round {gain_rounds[1]}: the gain is taken from round "
            f"{start} to round {end}, the last round every run has.",
            "",
        ]
    lines += [
        markdown_table(table4)
        if not table4.empty
        else f"_(no gain to compute: the runs have {end} round(s))_",
        "",
    ]
    lines += ["## Per-round accuracy and parameter norm", ""]
    if curve_runs:
        groups = [("chosen runs", _resolve_runs(runs, curve_runs))]
    else:
        lines += [
            "One figure per attack (at its strength and largest β, one run per method, the "
            "first seed), so the lines of a figure differ in the method alone.",
            "",
        ]
        groups = curve_groups(runs)
    for index, (title, chosen) in enumerate(groups):
        name = "curves.png" if curve_runs else f"curves_{index:02d}.png"
        figure = plots.round_curves(rounds, runs, chosen, out_dir / name, title=title)
        if figure is not None:
            lines += [
                f"### {title}",
                "",
                "Runs: " + ", ".join(f"`{r}`" for r in chosen),
                "",
                f"![{title}]({figure.name})",
                "",
            ]
    figure_two = figure_two_section(runs, rounds, out_dir)
    lines += figure_two
    extra += ["aggregation_error.csv", "aggregation_error_fit.csv"] if figure_two else []
    figure, skipped = plots.classification_error_vs_corruption(
        runs, out_dir / "test_error_vs_corruption.png"
    )
    if figure is not None:
        lines += [
            "## Test error against corruption",
            "",
            "Mean test error (1 - final accuracy) per method against β, one panel per attack "
            "present (at its strength); dashed: E(β) = E0 + C sqrt(β) fitted to SWB when "
            "present, else to the first method, where its curve has at least three points "
            "(the paper's Eq. 1 shape, drawn here for accuracy; the paper's Figure 2, the "
            "aggregation error, is above when the runs recorded it).",
            "",
            f"![test error against corruption]({figure.name})",
            "",
        ]
        for attack, reason in skipped.items():
            lines += [f"- no panel for {attack}: {reason}"]
        if skipped:
            lines.append("")
    breakdown_csv = next(iter(sorted(root.rglob("breakdown.csv"))), None)
    breakdown = (
        None
        if breakdown_csv is None
        else read_table(
            breakdown_csv,
            required=("status", "breakdown_fraction", "lattice_points", "clients"),
            numeric=(
                "breakdown_fraction",
                "breakdown_min",
                "breakdown_max",
                "lattice_points",
                "clients",
            ),
        )
    )
    if breakdown is not None:
        figure = plots.breakdown_heatmap(breakdown, out_dir / "breakdown.png")
        shown = [c for c in breakdown.columns if c not in ("evaluated", "violations", "threshold")]
        lines += [
            "## Breakdown map",
            "",
            markdown_table(breakdown[shown], floatfmt=".3g", index=False),
            "",
        ]
        if figure is not None:
            lines += [f"![breakdown]({figure.name})", ""]
    tuning = tuning_section(root, out_dir)
    lines += tuning
    extra += [f.name for f in sorted(out_dir.glob("tuning_front*.csv"))] if tuning else []
    lines += [
        "CSV files beside this report: runs.csv, accuracy_by_attack.csv, table1_accuracy.csv, "
        "table2_collapses.csv, table4_gain.csv" + "".join(f", {n}" for n in extra) + ".",
        "",
    ]
    path = out_dir / "report.md"
    text = "\n".join(lines)
    path.write_text(text)
    (out_dir / "report.html").write_text(
        report_html(text, out_dir, title=f"Results: {root.resolve().name}")
    )
    return path


def seed_spread_section(runs: pd.DataFrame, out_dir: Path) -> list[str]:
    """The report's per-cell seed spread (`axes.seed_table`), written to accuracy_by_seed.csv;
    no lines when no cell has more than one seed."""
    table = axes.seed_table(runs)
    if table.empty or table["runs"].max() < 2:
        return []
    table.to_csv(out_dir / "accuracy_by_seed.csv")
    return [
        "## Final accuracy (%) per cell over its seeds",
        "",
        "Every cell of the axes that vary: mean, sample standard deviation, range and "
        "collapsed runs over its seeds.",
        "",
        markdown_table(table, floatfmt=".1f"),
        "",
    ]


def report_html(markdown_text: str, folder: Path, title: str) -> str:
    """report.md as one self-contained HTML page: the markdown rendered (tables included), every
    figure embedded as a data: URI, so the page opens anywhere without its folder. A small script
    counts the figures that loaded into ``data-figures-loaded`` on <body> (the tests read it in a
    headless browser)."""
    import base64
    import re

    import markdown

    def embed(match: re.Match[str]) -> str:
        alt, name = match.group(1), match.group(2)
        data = base64.b64encode((folder / name).read_bytes()).decode()
        return f"![{alt}](data:image/png;base64,{data})"

    body = markdown.markdown(
        re.sub(r"!\[([^\]]*)\]\(([^)]+\.png)\)", embed, markdown_text), extensions=["tables"]
    )
    return f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>{title}</title>
<style>
body {{ font-family: sans-serif; max-width: 70rem; margin: 2rem auto; padding: 0 1rem; }}
table {{ border-collapse: collapse; margin: 1rem 0; }}
th, td {{ border: 1px solid #ccc; padding: 0.2rem 0.5rem; text-align: right; }}
img {{ max-width: 100%; }}
</style></head>
<body data-figures-loaded="pending">
{body}
<script>
window.addEventListener("load", () => {{
  const figures = Array.from(document.images);
  const loaded = figures.filter(img => img.complete && img.naturalWidth > 0).length;
  document.body.dataset.figuresLoaded = loaded + "/" + figures.length;
}});
</script>
</body></html>
"""


def _resolve_runs(runs: pd.DataFrame, wanted: Sequence[str]) -> list[str]:
    ids = list(runs["run_id"])
    chosen = []
    for name in wanted:
        if name in ids:
            chosen.append(name)
            continue
        matches = [i for i in ids if name in i]
        if len(matches) != 1:
            raise SpecError(
                f"run {name!r} matches {len(matches)} runs; give a run id from runs.csv"
            )
        chosen.append(matches[0])
    return chosen
