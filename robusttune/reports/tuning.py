"""A robust-tuning study as text and figure: the Pareto front of its proposals and the knobs it
recommends, for the study's own tuning.md (`write_tuning`) and for
``robusttune report`` on a folder holding a study.

The study's table is tuning.csv (`TuningResult.frame`): one row per proposal with its knobs,
``clean_validation`` and ``worst_validation`` (the scores the study maximised: validation
accuracy, 0 when collapsed), ``worst_attack`` (the adversary's variant that gave the worst case),
``clean_test`` and ``worst_test`` (the test accuracy of the same runs), ``pareto`` (not
dominated in (clean, worst)) and ``recommended`` (the front's highest worst case, then highest
clean accuracy, then the earliest proposal). Selection reads validation accuracy only; the test
columns are what the selected knobs then score on data nobody selected on.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

import pandas as pd

from robusttune.core.csv_input import read_table
from robusttune.core.registry import SpecError
from robusttune.display.markdown import markdown_table

if TYPE_CHECKING:
    from robusttune.experiments.tuning import TuningPlan, TuningResult

__all__ = [
    "RESULT_COLUMNS",
    "RESULT_COLUMN_DOCS",
    "front_table",
    "knob_columns",
    "recommended_line",
    "study_intro",
    "study_lines",
    "tuning_section",
    "write_tuning",
]

TUNING_FILE = "tuning.csv"
# tuning.csv's columns beside the knobs (one column per knob searched), as the reference
# documents them
RESULT_COLUMN_DOCS: dict[str, str] = {
    "proposal": "The proposal's number, in the order Optuna made them.",
    "pareto": "Not dominated in (clean_validation, worst_validation).",
    "recommended": "The front's highest worst case, then highest clean accuracy, then the earliest.",
    "clean_validation": "Validation accuracy without attack, the mean over seeds (0 when collapsed): one objective.",
    "worst_validation": "The worst validation accuracy over the adversary and the seeds (0 when collapsed): the other.",
    "worst_attack": "The adversary's variant that gave the worst case.",
    "worst_seed": "The seed that gave it.",
    "clean_test": "Test accuracy of the clean runs (not selected on).",
    "worst_test": "Test accuracy of the worst-case runs.",
    "worst_collapsed": "Whether the worst-case run collapsed.",
}
RESULT_COLUMNS = tuple(RESULT_COLUMN_DOCS)
NUMERIC_RESULTS = ("proposal", "clean_validation", "worst_validation", "clean_test", "worst_test")


def knob_columns(table: pd.DataFrame) -> list[str]:
    """The knobs the study searched: every column of tuning.csv that is not a result."""
    return [c for c in table.columns if c not in RESULT_COLUMNS]


def _knobs_text(row: pd.Series, knobs: list[str]) -> str:
    return ", ".join(
        f"{k}={row[k]:.4g}" if isinstance(row[k], float) else f"{k}={row[k]}" for k in knobs
    )


def front_table(table: pd.DataFrame) -> pd.DataFrame:
    """The front's proposals, highest worst case first (then highest clean accuracy): the
    proposal, its knobs, both validation scores, the worst attack and both test accuracies."""
    front = table[table["pareto"].astype(bool)]
    front = front.sort_values(
        ["worst_validation", "clean_validation", "proposal"], ascending=[False, False, True]
    )
    columns = [
        "proposal",
        *knob_columns(table),
        "clean_validation",
        "worst_validation",
        "worst_attack",
        "clean_test",
        "worst_test",
    ]
    return front[columns].fillna({"worst_attack": "-"})


def recommended_line(table: pd.DataFrame, source: str = TUNING_FILE) -> str:
    """**Recommended:** the recommended proposal's knobs, its validation scores and the test
    accuracy of the same runs. A table without exactly one recommended row is refused."""
    if "recommended" not in table:
        raise SpecError(
            f"{source} has no recommended column (written by an older robusttune); "
            f"rewrite it with the study's `robusttune tune ... --resume`, which runs "
            f"nothing again"
        )
    chosen = table[table["recommended"].astype(bool)]
    if len(chosen) != 1:
        raise SpecError(
            f"{source}: {len(chosen)} rows are marked recommended; allowed: exactly one"
        )
    row = chosen.iloc[0]
    attack = (
        row["worst_attack"]
        if isinstance(row["worst_attack"], str) and row["worst_attack"]
        else "none"
    )
    return (
        f"**Recommended:** {_knobs_text(row, knob_columns(table))} (proposal "
        f"{int(row['proposal'])}): worst-case validation {row['worst_validation']:.3f} (by "
        f"{attack}), clean validation {row['clean_validation']:.3f}; test accuracy of the "
        f"same runs: worst case {row['worst_test']:.3f}, clean {row['clean_test']:.3f}."
    )


def study_intro(plan: Any, proposals: int) -> str:
    """One sentence: how many proposals, the search, the adversary, beta and the seeds."""
    search = "TPE" if plan.objectives == "worst" else "NSGA-II"
    return (
        f"{proposals} proposals ({plan.objectives.replace('_', ' ')}; {search}, seed "
        f"{plan.sampler_seed}), each scored clean (beta = 0) and against the worst case of "
        f"{plan.threat.describe()} at beta = {plan.byzantine_fraction:g} (k = {plan.byzantine} "
        f"of {plan.clients}), on validation accuracy (0 when collapsed), over seeds {plan.seeds}."
    )


def study_lines(
    table: pd.DataFrame,
    intro: str,
    figure: str | None,
    heading: str = "##",
    source: str = TUNING_FILE,
) -> list[str]:
    """Markdown lines: ``intro``, the recommendation, the front's table and the figure."""
    return [
        intro,
        "",
        recommended_line(table, source),
        "",
        f"{heading} Pareto front (clean vs worst-case validation accuracy)",
        "",
        f"{int(table['pareto'].astype(bool).sum())} of {len(table)} proposals are on the front "
        f"(no other proposal is at least as good on both scores and better on one).",
        "",
        markdown_table(front_table(table), floatfmt=".3f", index=False),
        "",
        *([f"![Pareto front]({figure})", ""] if figure else []),
    ]


def _plan_of(folder: Path) -> Any:
    """The study's TuningPlan from its plan.yaml, or the one-line reason it cannot be read."""
    import yaml

    from robusttune.core.yaml_input import parse_yaml, read_yaml_text
    from robusttune.experiments.tuning import parse_tuning

    path = folder / "plan.yaml"
    if not path.exists():
        return f"{path} is missing"
    try:
        mapping = parse_yaml(read_yaml_text(path), str(path)) or {}
        name = mapping.pop("name", folder.name) if isinstance(mapping, dict) else folder.name
        return parse_tuning(mapping, source=str(path), default_name=str(name))
    except (SpecError, yaml.YAMLError) as error:
        return str(error).splitlines()[0]


def tuning_section(root: Path, out_dir: Path) -> list[str]:
    """The report's robust-tuning section: for every tuning.csv below ``root`` (a study's
    folder, or a folder of studies), its front, recommendation and figure (drawn into
    ``out_dir``, with the front's table as tuning_front*.csv). No lines when there is none."""
    from robusttune.display.plots import pareto_figure

    studies = sorted(p for p in root.rglob(TUNING_FILE) if out_dir not in p.parents)
    lines: list[str] = []
    tables = [
        (csv, read_table(csv, required=NUMERIC_RESULTS[:3], numeric=NUMERIC_RESULTS))
        for csv in studies
    ]
    # a tuning.csv that is not one (broken, or another tool's) is passed over
    studies = [csv for csv, table in tables if table is not None]
    for index, (csv, table) in enumerate((c, t) for c, t in tables if t is not None):
        suffix = "" if len(studies) == 1 else f"_{index:02d}"
        figure = pareto_figure(table, out_dir / f"pareto{suffix}.png")
        front_table(table).to_csv(out_dir / f"tuning_front{suffix}.csv", index=False)
        plan = _plan_of(csv.parent)
        intro = (
            study_intro(plan, len(table))
            if not isinstance(plan, str)
            else f"{len(table)} proposals ({plan})."
        )
        where = csv.parent.relative_to(root) if csv.parent != root else Path(".")
        lines += [
            f"## Robust tuning: {csv.parent.name}",
            "",
            *study_lines(
                table,
                f"From `{where / TUNING_FILE}`: {intro}",
                figure.name if figure else None,
                heading="###",
                source=str(csv),
            ),
        ]
    return lines


def write_tuning(result: TuningResult, plan: TuningPlan, out: Path) -> Path:
    """tuning.csv (every proposal), pareto.png and tuning.md (this module's `study_lines`: the
    front and the recommended knobs with their test accuracy) under ``out``; returns tuning.md's
    path."""
    from robusttune.core.files import write_text_atomic
    from robusttune.display.plots import pareto_figure

    out.mkdir(parents=True, exist_ok=True)
    table = result.frame()
    table.to_csv(out / "tuning.csv", index=False)
    figure = pareto_figure(table, out / "pareto.png")
    lines = [
        f"# {plan.name}: robust tuning",
        "",
        *study_lines(
            table, study_intro(plan, len(result.proposals)), figure.name if figure else None
        ),
    ]
    path = out / "tuning.md"
    write_text_atomic(path, "\n".join(lines))
    return path
