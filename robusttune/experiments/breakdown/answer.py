"""A breakdown map's answer as it reads: `breakdown_table` (one row per cell, its answer over the
seeds with the readable ``breakdown`` label, the family of the attack that broke it and the
theory columns), `breakdown_label` (``0.15 [0.05, 0.35]``, ``>= 0.5``, ``clean at chance``) and
`answer`, the few sentences breakdown.md and the terminal open with, each naming its cells by
method (`cells_by_method`). Writing the map's files is `robusttune.experiments.breakdown.report`."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import pandas as pd

from robusttune.experiments.breakdown.bisection import NO_ANSWER, BreakdownMap, Outcome
from robusttune.experiments.breakdown.cell_search import CellResult
from robusttune.experiments.breakdown.frontier import method_key, method_names, never_broke
from robusttune.experiments.breakdown.replicates import ReplicatedMap
from robusttune.experiments.breakdown.theory import theory_columns

__all__ = [
    "CELL_AXES",
    "answer",
    "breakdown_label",
    "breakdown_table",
    "breaking_family",
    "cells_by_method",
]


def breakdown_label(row: Mapping[str, Any]) -> str:
    """How a cell's answer reads: the median fraction over seeds, with the seeds' range in
    brackets where they differ (``0.15 [0.05, 0.35]``), ">= top" for a cell that never broke on
    the lattice (its true breakdown lies above what was tried), "fails clean" or "clean at
    chance" without a baseline."""
    status = row["status"]
    if status in NO_ANSWER:
        return status.replace("_", " ")
    top = (row["lattice_points"] - 1) / row["clients"]
    text = f">= {top:.3g}" if never_broke(row) else f"{row['breakdown_fraction']:.3g}"
    low, high = row.get("breakdown_min"), row.get("breakdown_max")
    if (
        low is not None
        and high is not None
        and not pd.isna(low)
        and not pd.isna(high)
        and high - low > 1e-9
    ):
        text += f" [{low:.3g}, {high:.3g}]"
    flags = {"non_monotone": " (non-monotone)", "seeds_disagree": " (seeds disagree)"}
    return text + flags.get(status, "")


def answer(table: Any) -> list[str]:
    """The map's answer in a few sentences, from its numbers: who breaks at the first Byzantine
    client, who never broke, where the measurement falls below the rule's own bound, and where
    sampling alone handed the Byzantine clients a majority at the failing point. Each sentence
    names its cells by method (`cells_by_method`)."""

    def cells(rows: Any) -> str:
        return cells_by_method(rows, table)

    lines = []
    first = table[~table["status"].isin(NO_ANSWER) & (table["breakdown_byzantine"] == 0)]
    if len(first):
        lines.append(f"Breaks at the first Byzantine client ({len(first)} cells): {cells(first)}.")
    never = table[[never_broke(row) for _, row in table.iterrows()]] if len(table) else table
    if len(never):
        lines.append(
            f"Never broke on the lattice ({len(never)} cells, breakdown above its top): "
            f"{cells(never)}."
        )
    if "theory_fraction" in table:
        theory = pd.to_numeric(table["theory_fraction"], errors="coerce")
        measured = pd.to_numeric(table["breakdown_fraction"], errors="coerce")
        reached = table[
            table["status"].isin(["ok", "survives_all", "seeds_disagree"])
            & theory.notna()
            & (measured >= theory - 1e-9)
        ]
        if len(reached):
            lines.append(
                f"Reached the rule's theoretical fraction over its inputs (measured >= "
                f"`theory_fraction`) in {len(reached)} cells: {cells(reached)}."
            )
        below = table[table["status"].isin(["ok", "seeds_disagree"]) & (measured < theory - 1e-9)]
        if len(below):
            lines.append(
                f"Broke within the rule's own precondition (measured below its theoretical "
                f"fraction: the attack, not the count, broke it) in {len(below)} cells: "
                f"{cells(below)}."
            )
    if "p_majority_run" in table:
        sampled = table[pd.to_numeric(table["p_majority_run"], errors="coerce") > 0.5]
        if len(sampled):
            lines.append(
                f"Where sampling more likely than not hands the Byzantine clients a "
                f"majority of some round at the failing point ({len(sampled)} cells), a "
                f"collapse is the sampling's as much as the rule's: {cells(sampled)}."
            )
    if "attack_family" in table:
        aware = table[table["attack_family"] == "rule-aware"]
        if len(aware):
            lines.append(
                f"Broken first by a rule-aware attack, every strength ladder surviving "
                f"the failing point ({len(aware)} cells): {cells(aware)}."
            )
    flagged = table[table["status"] == "fails_clean"]
    if len(flagged):
        lines.append(
            f"No baseline (the clean run itself failed) in {len(flagged)} cells: {cells(flagged)}."
        )
    chance = table[table["status"] == "clean_at_chance"]
    if len(chance):
        lines.append(
            f"No breakdown point (the clean run did not learn: within clean_margin of "
            f"chance in most seeds) in {len(chance)} cells: {cells(chance)}."
        )
    if "seeds" in table and (table["seeds"] > 1).any():
        unsettled = table[table["status"] == "seeds_disagree"]
        if len(unsettled):
            lines.append(
                f"The seeds disagree by more than one lattice step in {len(unsettled)} "
                f"cells (the median is the answer; the range is in brackets): "
                f"{cells(unsettled)}."
            )
    return lines or ["Every cell broke somewhere inside the lattice; see the table."]


CELL_AXES = (
    "method",
    "aggregator",
    "algorithm",
    "attack",
    "participation",
    "participation_mode",
    "dataset",
)


def cells_by_method(rows: Any, table: Any) -> str:
    """``rows`` (cells of ``table``) named compactly, method by method in the table's order:
    ``median: every cell``, or its regimes (``p=0.1 fixed``, the other axes' values), a regime
    followed by its attacks in brackets when only some of that regime's attacks are among
    ``rows``. Without a method axis each cell is named by its axes."""
    axes = [c for c in CELL_AXES if c in table.columns]
    method = method_key(table)
    if method is None:
        return "; ".join(", ".join(f"{k}={r[k]}" for k in axes) for _, r in rows.iterrows())
    regime = [c for c in axes if c not in (method, "attack")]

    def regime_label(key: tuple[Any, ...]) -> str:
        words = [f"p={v:g}" if axis == "participation" else str(v) for axis, v in zip(regime, key)]
        return " ".join(words) or "-"

    parts = []
    row_names, table_names = method_names(rows, method), method_names(table, method)
    for name in dict.fromkeys(row_names):
        picked, every = rows[row_names == name], table[table_names == name]
        if len(picked) == len(every):
            parts.append(f"{name}: every cell" if len(every) > 1 else str(name))
            continue
        if not regime:
            attacks = ", ".join(map(str, picked["attack"])) if "attack" in picked else ""
            parts.append(f"{name}: {attacks}")
            continue
        labels = []
        for key, group in picked.groupby(regime, sort=False):
            key = key if isinstance(key, tuple) else (key,)
            whole = every
            for axis, value in zip(regime, key):
                whole = whole[whole[axis] == value]
            label = regime_label(key)
            if "attack" in group and len(group) < len(whole):
                label += f" ({', '.join(map(str, group['attack']))})"
            labels.append(label)
        parts.append(f"{name}: {', '.join(labels)}")
    return "; ".join(parts)


def breaking_family(cell: CellResult, base: Mapping[str, Any] | None = None) -> str:
    """The family (`robusttune.methods.adversary.family_of`: ladder or rule-aware) of the attack that
    broke the cell's first failing point: the breaker's attack, else the cell's, else the base
    run's; "" when no evaluated point failed or its verdict names no setting."""
    from robusttune.methods.adversary import family_of

    if not cell.broken_by:
        return ""
    failures = sorted(k for k in cell.outcomes if not cell.survived(k))
    verdict = cell.outcomes[failures[0]]
    # broken_by is "" unless the first failing point's verdict is an Outcome with a breaker
    assert isinstance(verdict, Outcome)
    breaker = dict(verdict.breaker)
    attack = breaker.get("attack", cell.cell.as_dict().get("attack", (base or {}).get("attack")))
    return family_of(attack) if attack else ""


def breakdown_table(
    result: BreakdownMap | ReplicatedMap, base: Mapping[str, Any] | None = None
) -> Any:
    """One row per cell: its answer over seeds (`robusttune.experiments.breakdown.replicates.summarise`),
    the readable ``breakdown`` label and, with ``base``, the theory columns (drawn from the seed
    whose answer is the median)."""
    result = ReplicatedMap.of(result)
    table = result.to_frame()
    if table.empty:
        return table
    table.insert(
        len(result.cells[0].as_dict()),
        "breakdown",
        [breakdown_label(row) for _, row in table.iterrows()],
    )
    representatives = [result.representative(cell) for cell in result.cells]
    table.insert(
        list(table.columns).index("broken_by") + 1,
        "attack_family",
        [breaking_family(r, base) for r in representatives],
    )
    if base is not None:
        extra = pd.DataFrame([theory_columns(base, r) for r in representatives])
        table = pd.concat([table, extra], axis=1)
    return table
