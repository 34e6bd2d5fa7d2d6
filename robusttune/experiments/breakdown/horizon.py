"""A map's horizon: for every cell, the round at which its clean run has stopped learning.

A breakdown is read against half the cell's clean margin above chance (``relative_threshold``).
Read after too few rounds, the clean run is still learning, the bar is set by an undertrained
model and a slow rule gets a low one (issue 27). ``robusttune horizon SPACE.yaml`` runs each cell's clean
point (the map's base run and cell values, no Byzantine client, the map's seeds) for
``max_rounds`` rounds, evaluated every ``eval_every`` rounds, finds its plateau round
(`plateau_round`) and writes the map again with each cell's ``rounds`` set to it:

    STORAGE/NAME/horizon.csv         per cell and seed: plateau round, accuracies along the way
    STORAGE/NAME/horizon.md          the same, per cell (the largest plateau round over seeds)
    STORAGE/NAME/curves.csv          every evaluated point of every clean curve (cell, seed,
                                     round, selection_accuracy): another plateau rule can be
                                     tried on them without running anything
    STORAGE/NAME/at_plateau.yaml     the breakdown YAML, each cell at its plateau round
    STORAGE/NAME/plan.yaml, runs.jsonl, trials/   what ``--resume`` keeps (as for a map)

The clean runs' curves are read from their rounds.csv (validation accuracy where the runs hold a
validation part, as every selection reads it: `robusttune.core.records.selection_accuracy`).
"""

from __future__ import annotations

import csv
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from robusttune.core.files import write_text_atomic
from robusttune.core.records import RunSummary, selection_accuracy
from robusttune.core.registry import SpecError
from robusttune.core.runspec import RunSpec
from robusttune.experiments.breakdown.plan import BreakdownPlan

__all__ = ["HorizonPlan", "Plateau", "measure_horizon", "plateau_round", "write_horizon"]


@dataclass(frozen=True)
class Plateau:
    """Where a clean curve stops learning. ``round``: the first evaluated round whose smoothed
    accuracy is within ``tolerance`` of the curve's best smoothed accuracy (``level``);
    ``reached``: whether that round lies in the first two thirds of the horizon (else the curve
    may still be climbing and the horizon should be longer); None for a curve with no finite
    accuracy (a diverged clean run)."""

    round: int | None
    level: float
    reached: bool


def plateau_round(
    rounds: Sequence[int], accuracies: Sequence[float], *, window: int = 3, tolerance: float = 0.02
) -> Plateau:
    """The plateau of an accuracy curve evaluated at ``rounds``:

        s_j = mean(a_{j-w+1}, ..., a_j)            (trailing mean over w evaluations; fewer at the start)
        L   = max_j s_j
        r*  = min { r_j : s_j >= L - tolerance }

    with non-finite accuracies counted as 0 (a diverged evaluation). The curve has reached its
    plateau when r* <= (2/3) r_last, i.e. the best third of the horizon adds less than
    ``tolerance`` to what the first two thirds reached."""
    if len(rounds) != len(accuracies) or not rounds:
        raise ValueError("plateau_round needs one accuracy per evaluated round, at least one")
    if window < 1 or not tolerance >= 0:
        raise ValueError(f"window must be >= 1 and tolerance >= 0; got {window}, {tolerance}")
    values = [a if math.isfinite(a) else 0.0 for a in accuracies]
    if not any(math.isfinite(a) for a in accuracies):
        return Plateau(None, math.nan, False)
    smoothed = [
        sum(values[max(0, j - window + 1) : j + 1]) / (j + 1 - max(0, j - window + 1))
        for j in range(len(values))
    ]
    level = max(smoothed)
    first = next(r for r, s in zip(rounds, smoothed) if s >= level - tolerance)
    return Plateau(int(first), level, first <= (2 / 3) * rounds[-1])


@dataclass(frozen=True)
class HorizonPlan:
    """What a horizon measurement is: the map's plan and the measurement's settings. A resume
    must match ``identity()`` (`robusttune.experiments.breakdown.store.MapStore`)."""

    plan: BreakdownPlan
    max_rounds: int = 200
    eval_every: int = 5
    window: int = 3
    tolerance: float = 0.02
    seeds: tuple[int, ...] = ()
    name: str = "horizon"
    raw: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        for key, value, low in (
            ("max_rounds", self.max_rounds, 1),
            ("eval_every", self.eval_every, 1),
            ("window", self.window, 1),
        ):
            if not isinstance(value, int) or value < low:
                raise SpecError(
                    f"--{key.replace('_', '-')} must be an integer >= {low}; got {value!r}"
                )
        if self.eval_every > self.max_rounds:
            raise SpecError(
                f"--eval-every {self.eval_every} exceeds --max-rounds {self.max_rounds}; "
                f"allowed: at most --max-rounds"
            )
        if not (math.isfinite(self.tolerance) and 0 <= self.tolerance < 1):
            raise SpecError(f"--tolerance must be a number in [0, 1); got {self.tolerance!r}")
        seeds = self.seeds or tuple(self.plan.seeds)
        object.__setattr__(self, "seeds", tuple(int(s) for s in seeds))
        object.__setattr__(
            self,
            "raw",
            {
                "map": self.plan.identity(),
                "horizon": {
                    "max_rounds": self.max_rounds,
                    "eval_every": self.eval_every,
                    "window": self.window,
                    "tolerance": self.tolerance,
                    "seeds": list(self.seeds),
                },
            },
        )

    def identity(self) -> dict[str, Any]:
        return self.raw

    def clean_specs(self) -> list[tuple[int, int, RunSpec]]:
        """(cell index, seed, RunSpec) of every clean run: the cell's k = 0 point for
        ``max_rounds`` rounds, evaluated every ``eval_every`` (and at the last)."""
        specs = []
        for index, cell in enumerate(self.plan.cells):
            for seed in self.seeds:
                values = {
                    **self.plan.base,
                    **cell.as_dict(),
                    "byzantine_fraction": 0.0,
                    "attack": "none",
                    "attack_strength": None,
                    "seed": seed,
                    "rounds": self.max_rounds,
                    "eval_every": self.eval_every,
                }
                specs.append((index, seed, RunSpec.from_dict(values)))
        return specs


def curve_of(summary: RunSummary) -> tuple[list[int], list[float]]:
    """The evaluated rounds of a clean run and its selection accuracy there, from rounds.csv."""
    if summary.run_dir is None or not (Path(summary.run_dir) / "rounds.csv").is_file():
        raise SpecError(
            f"a clean run left no rounds.csv ({summary.run_dir}); "
            f"the horizon needs each run's folder"
        )
    rounds, accuracies = [], []
    with (Path(summary.run_dir) / "rounds.csv").open() as handle:
        for row in csv.DictReader(handle):
            test, validation = (
                float(row["accuracy"]),
                float(row.get("validation_accuracy") or "nan"),
            )
            if math.isnan(test) and math.isnan(validation):
                continue  # not evaluated this round
            rounds.append(int(row["round"]))
            accuracies.append(selection_accuracy(test, validation, summary.has_validation))
    return rounds, accuracies


def measure_horizon(
    horizon: HorizonPlan, runner: Callable[[Sequence[RunSpec]], list[RunSummary]]
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Run every cell's clean runs with ``runner`` (one call: on Ray they run side by side).
    Returns one row per cell and seed (the cell's values, seed, plateau round, level, whether it
    was reached, and the accuracy at the cell's own rounds, at the plateau and at max_rounds) and
    the curves the plateaus were read from: one row per cell, seed and evaluated round."""
    jobs = horizon.clean_specs()
    summaries = runner([spec for _, _, spec in jobs])
    rows: list[dict[str, Any]] = []
    curves: list[dict[str, Any]] = []
    for (index, seed, _), summary in zip(jobs, summaries):
        cell = horizon.plan.cells[index]
        if summary.error is not None:
            raise SpecError(f"the clean run of {cell.label}, seed {seed}, failed: {summary.error}")
        rounds, accuracies = curve_of(summary)
        curves.extend(
            {"cell": index, "seed": seed, "round": r, "selection_accuracy": a}
            for r, a in zip(rounds, accuracies)
        )
        plateau = plateau_round(
            rounds, accuracies, window=horizon.window, tolerance=horizon.tolerance
        )
        at = dict(zip(rounds, accuracies))
        own = int(cell.as_dict().get("rounds", horizon.plan.base.get("rounds", 10)))
        rows.append(
            {
                "cell": index,
                **cell.as_dict(),
                "seed": seed,
                "plateau_round": plateau.round,
                "plateau_reached": plateau.reached,
                "plateau_level": plateau.level,
                "accuracy_at_cell_rounds": _nearest(at, own),
                "cell_rounds": own,
                "accuracy_at_plateau": at.get(plateau.round, math.nan)
                if plateau.round
                else math.nan,
                "accuracy_at_max_rounds": accuracies[-1] if accuracies else math.nan,
            }
        )
    return rows, curves


def _nearest(at: dict[int, float], round_number: int) -> float:
    """The accuracy at the evaluated round closest to ``round_number`` from below (or the first)."""
    below = [r for r in at if r <= round_number]
    return at[max(below)] if below else at[min(at)] if at else math.nan


def cell_horizons(rows: list[dict[str, Any]]) -> dict[int, int | None]:
    """Per cell the largest plateau round over its seeds (None when a seed's clean run has no
    plateau: it diverged)."""
    out: dict[int, int | None] = {}
    for row in rows:
        if row["plateau_round"] is None:
            out[row["cell"]] = None
        elif row["cell"] not in out or out[row["cell"]] is not None:
            out[row["cell"]] = max(out.get(row["cell"]) or 0, row["plateau_round"])
    return out


def at_plateau(horizon: HorizonPlan, horizons: dict[int, int | None]) -> dict[str, Any]:
    """The map's YAML mapping with one joint grid axis ``cell`` listing every cell's values
    and ``rounds`` = its plateau round (the cell's own rounds where its clean run diverged),
    named after the measurement: NAME_horizon gives NAME_at_plateau."""
    raw = dict(horizon.plan.raw.items())
    entries = []
    for index, cell in enumerate(horizon.plan.cells):
        values = cell.as_dict()
        plateau = horizons.get(index)
        if plateau is not None:
            values["rounds"] = int(plateau)
        entries.append(values)
    drawn = {
        k: v
        for k, v in (raw.get("space") or {}).items()
        if not (isinstance(v, dict) and "grid" in v)
    }
    raw["space"] = {"cell": {"grid": entries}, **drawn}
    # named after the measurement, so two measurements of one map (say on two datasets) give
    # two maps that can share a storage
    stem = horizon.name.removesuffix("_horizon") or horizon.name
    raw["name"] = f"{stem}_at_plateau"
    return raw


def write_horizon(
    horizon: HorizonPlan,
    rows: list[dict[str, Any]],
    curves: list[dict[str, Any]],
    folder: Path,
    command: str = "",
) -> Path:
    """horizon.csv, curves.csv, horizon.md and at_plateau.yaml in ``folder`` (``rows`` and
    ``curves`` as `measure_horizon` returns them); returns the YAML's path."""
    import pandas as pd

    from robusttune.display.markdown import markdown_table

    folder.mkdir(parents=True, exist_ok=True)
    frame = pd.DataFrame(rows)
    write_text_atomic(folder / "horizon.csv", frame.to_csv(index=False))
    write_text_atomic(
        folder / "curves.csv",
        pd.DataFrame(curves, columns=["cell", "seed", "round", "selection_accuracy"]).to_csv(
            index=False
        ),
    )
    horizons = cell_horizons(rows)
    keys = list(dict.fromkeys(k for cell in horizon.plan.cells for k in cell.as_dict()))
    per_cell = []
    for index, cell in enumerate(horizon.plan.cells):
        mine = frame[frame["cell"] == index]
        per_cell.append(
            {
                **{k: cell.as_dict().get(k, "") for k in keys},
                "horizon": horizons.get(index),
                "reached": bool(mine["plateau_reached"].all()),
                "accuracy at cell rounds": mine["accuracy_at_cell_rounds"].mean(),
                "accuracy at horizon": mine["accuracy_at_plateau"].mean(),
                f"accuracy at {horizon.max_rounds}": mine["accuracy_at_max_rounds"].mean(),
            }
        )
    settings = horizon.raw["horizon"]
    text = (
        f"# Horizon: {horizon.plan.name}\n\n"
        f"Each cell's clean run (no Byzantine client), seeds {list(horizon.seeds)}, for "
        f"{settings['max_rounds']} rounds, evaluated every {settings['eval_every']}. Horizon: the "
        f"first evaluated round whose trailing mean over {settings['window']} evaluations is "
        f"within {settings['tolerance']:g} of the curve's best, the largest over seeds. "
        f"`reached`: the horizon lies in the first two thirds of the rounds at every seed.\n\n"
        + markdown_table(pd.DataFrame(per_cell), floatfmt=".3f")
        + "\n"
    )
    write_text_atomic(folder / "horizon.md", text)
    path = folder / "at_plateau.yaml"
    header = (
        f"# {command}\n# each cell at its clean run's plateau round (horizon.md)\n"
        if command
        else ""
    )
    write_text_atomic(path, header + yaml.safe_dump(at_plateau(horizon, horizons), sort_keys=False))
    return path
