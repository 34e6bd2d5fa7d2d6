"""Breakdown maps: for every cell (aggregator x attack x participation [x dataset]) the largest
Byzantine fraction on the lattice {0, 1/N, 2/N, ...} at which a run survives.

- `points`    cells, lattice points, outcomes and the survival bar (above chance)     knows no runs
- `cell_search` one cell's search: bisection (or a later seed's outward search) and its answer
- `bisection` the core's drivers: every cell's search in lock-step waves or each on its own
- `evaluate`  `spec_evaluator`: points -> RunSpecs -> a Runner -> outcomes (Optuna-tuned knobs,
              the worst case over each attack's strength ladder; equal runs shared by
              `canonical_spec`, each ladder stopped at its first collapse or failure)
- `shared_runs` `canonical_spec` and `SharedRuns`: a run equal to one made before is not made again
- `plan`      the breakdown YAML -> `BreakdownPlan` (cells and knobs from a sweep-layer space)
- `replicates` `bisect_replicates`: every cell once per seed (later seeds from the first seed's
              answer), the answer the median over seeds with its range (`ReplicatedMap`)
- `prior`     `prior_starts`: each cell's answer in an earlier map, where its bisection starts
- `frontier`  `frontier_table` (the p-frontier, per seed too) and the orderings over seeds
- `answer`    `breakdown_table` and the answer in words: one row per cell, its label and sentences
- `report`    `write_breakdown`: breakdown.csv, breakdown_seeds.csv, breakdown_points.csv,
              breakdown.png, breakdown.md, frontier.csv and frontier.png (`frontier_table`: the
              p-frontier beta*(p)), ordering.csv (`ordering_table`)
"""

from __future__ import annotations

from robusttune.experiments.breakdown.bisection import (
    BreakdownMap,
    Cell,
    CellResult,
    Evaluator,
    Outcome,
    Point,
    Verdict,
    bisect_breakdown,
    bisect_concurrently,
    lattice_top,
    survival_bar,
)
from robusttune.experiments.breakdown.evaluate import adversary_variants, spec_evaluator
from robusttune.experiments.breakdown.plan import PLAN_KEYS, BreakdownPlan, load_plan
from robusttune.experiments.breakdown.prior import prior_starts, read_prior
from robusttune.experiments.breakdown.replicates import ReplicatedMap, bisect_replicates
from robusttune.experiments.breakdown.report import write_breakdown
from robusttune.experiments.breakdown.shared_runs import canonical_spec

__all__ = [
    "PLAN_KEYS",
    "BreakdownMap",
    "BreakdownPlan",
    "Cell",
    "CellResult",
    "Evaluator",
    "Outcome",
    "Point",
    "ReplicatedMap",
    "Verdict",
    "adversary_variants",
    "bisect_breakdown",
    "bisect_concurrently",
    "bisect_replicates",
    "canonical_spec",
    "lattice_top",
    "load_plan",
    "prior_starts",
    "read_prior",
    "spec_evaluator",
    "survival_bar",
    "write_breakdown",
]
