"""What a breakdown map costs against the full lattice, on a reduced version of the default map.

Loads `search_spaces/breakdown.yaml` (the default map: every method x regime, the worst case
over the ladders and the rule-aware attacks of `breakdown.adversary`), keeps the cells of a few methods (``--methods``;
``--all`` keeps every cell and its three seeds: on one core the work the map itself spreads over
two, 39 minutes through Ray on 2 cores) and runs the map in this process
(the `--local` runner, one run at a time, one torch thread) exactly as `robusttune breakdown`
does. Three trial counts, each exact:

  full lattice   every lattice point of every cell evaluated in full: per cell the clean point
                 (seeds runs) + k_max x seeds x the ladder's strengths (`BreakdownMap.grid_trials`)
  bisection      the points bisection and its verification evaluated, each in full (what the map
                 cost before the savings: no run shared, every strength run)
  map            the runs actually made: bisection, with runs shared between cells where the
                 attack changes nothing (no Byzantine client, or none ever sampled) and each
                 point's ladder stopped at its first failure of the survival bar, the
                 settings that broke the cell before tried first (`spec_evaluator`'s
                 ``share``, ``staged``, ``survival`` and ``prioritise``;
                 tests/test_breakdown.py checks that they change no verdict)

Ends with one line ``breakdown_trials_vs_full_lattice: <map / full lattice>``.

    python bench/breakdown.py [--methods fedavg median krum swb_dm demoa+cclip fedcm] [--all]
    python bench/breakdown.py --tiny    # toy sizes: 2 FedAvg cells, N = 5, 2 rounds, one attack
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_METHODS = ["fedavg", "median", "krum", "swb_dm", "demoa+cclip", "fedcm"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--space", default=str(ROOT / "search_spaces" / "breakdown.yaml"))
    parser.add_argument(
        "--methods",
        nargs="+",
        default=DEFAULT_METHODS,
        help="keep the cells of these methods (the `method` cell values)",
    )
    parser.add_argument("--all", action="store_true", help="every cell of the map")
    parser.add_argument(
        "--tiny",
        action="store_true",
        help="toy sizes: a smoke run, not a measurement (two FedAvg cells, "
        "5 clients, 2 rounds, sign flipping only)",
    )
    args = parser.parse_args()

    import torch

    from robusttune.engine.runners import InProcessRunner
    from robusttune.experiments.breakdown import load_plan, spec_evaluator
    from robusttune.experiments.breakdown.replicates import bisect_replicates

    torch.set_num_threads(1)
    plan = load_plan(args.space)
    if args.tiny:
        # the map's own machinery on a toy map: few clients and rounds, one cheap attack, and
        # the FedAvg cells of fixed-size sampling at p = 0.5 and 1 (two rounds either way)
        plan = plan.with_overrides(
            run={"clients": 5, "rounds": 2},
            min_client_rounds=1,
            adversary={"attack": ["sign_flip"]},
        )
        args.methods = ["fedavg"]
    cells = (
        plan.cells
        if args.all
        else [c for c in plan.cells if c.as_dict().get("method") in set(args.methods)]
    )
    if args.tiny:
        cells = [
            c
            for c in cells
            if c.as_dict().get("participation_mode") == "fixed"
            and c.as_dict().get("participation") in (0.5, 1.0)
        ]
    if not cells:
        raise SystemExit(f"no cell of {args.space} has a method among {args.methods}")
    print(
        f"{len(cells)} of the {len(plan.cells)} cells of {Path(args.space).name}"
        f"{'' if args.all else ': methods ' + ', '.join(args.methods)}"
    )
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="robusttune-bench-") as folder:
        evaluate = spec_evaluator(
            plan.base,
            InProcessRunner(folder, threads=1),
            seeds=plan.seeds,
            adversary=plan.adversary or None,
            sampler_seed=plan.sampler_seed,
            survival=(plan.threshold, plan.relative_threshold),
            adaptive=plan.adaptive,
            clean_margin=plan.clean_margin,
        )
        result = bisect_replicates(
            cells,
            plan.seeds,
            evaluate,
            max_fraction=plan.max_fraction,
            threshold=plan.threshold,
            relative_threshold=plan.relative_threshold,
            verify_radius=plan.verify_radius,
            on_non_monotone=plan.on_non_monotone,
            clean_margin=plan.clean_margin,
        )
    seconds = time.perf_counter() - started
    bisection = sum(v.full_runs for c in result.replicates for v in c.outcomes.values())
    cost = result.as_map()  # the cost figures, counted over every (cell, seed)
    full = cost.grid_trials
    statuses = result.to_frame()["status"].value_counts().to_dict()
    print(f"cells: {statuses}; {result.waves} waves in {seconds:.0f} s")
    print(f"full lattice: {full} trials ({cost.grid_points} points)")
    print(
        f"bisection alone: {bisection} trials ({cost.points_used} points) = "
        f"{bisection / full:.3f} of the lattice"
    )
    print(
        f"map (shared runs, staged ladder): {cost.trials_used} trials = "
        f"{cost.trials_used / bisection:.3f} of bisection alone"
    )
    print(f"breakdown_trials_vs_full_lattice: {cost.trial_ratio:.3f}")


if __name__ == "__main__":
    main()
