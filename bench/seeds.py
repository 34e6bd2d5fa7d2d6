"""What a map over three seeds costs against three one-seed maps of it, measured in one invocation.

A fixed small map (issue 56's): median, trimmed mean, Krum, geometric median, CCLIP and
DeMoA+median at p = 0.5 and 1.0 (fixed), each cell against the worst of the sign flip and IPM
ladders and MinMax, on digits with the MLP and 20 clients. It runs in this process (the
`--local` runner, one torch thread) four times: once with ``breakdown.seeds`` = [1, 2, 3] (the
seeds as replicates, later seeds starting from the first seed's answer,
`robusttune.experiments.breakdown.replicates`) and once per seed as a map of its own, each map
with its own shared-run cache as separate commands would have. The headline is the runs made:

    seeds3_vs_three_maps_runs = runs(the 3-seed map) / (runs(seed 1) + runs(seed 2) + runs(seed 3))

(target <= 0.7), beside the same ratio of wall seconds, whether every seed's answer is the one
its own map gives (it must be, on every cell whose survival is monotone in that seed), and the
least a 3-seed map can run on this map, whatever its later seeds guess (`least_runs`):

    seeds3_least_vs_three_maps_runs = (runs(seed 1) + sum over the later (cell, seed) of
                                       clean + survivor at b + 1) / the same denominator

The headline cannot go below it; how far above it lies is what a better later-seed search could
still save.

    python bench/seeds.py          # the 12-cell map (a few minutes on one core)
    python bench/seeds.py --tiny   # 2 cells, 5 clients, 2 rounds: a smoke run, not a measurement
"""

from __future__ import annotations

import argparse
import tempfile
import time
from typing import Any

MAP: dict[str, Any] = {
    "name": "seeds",
    "run": {
        "dataset": "digits",
        "model": "mlp",
        "clients": 20,
        "rounds": 5,
        "local_epochs": 1,
        "lr": 0.05,
        "trainer": "sequential",
        "checkpoint_every": 0,
        "eval_every": 100,
    },
    "space": {
        "method": {
            "grid": ["median", "trimmed_mean", "krum", "geometric_median", "cclip", "demoa+median"]
        },
        "regime": {
            "grid": [
                {"participation": 0.5, "participation_mode": "fixed"},
                {"participation": 1.0, "participation_mode": "fixed"},
            ]
        },
    },
    "breakdown": {
        "seeds": [1, 2, 3],
        "max_fraction": 0.5,
        "verify_radius": 1,
        "adversary": {"attack": ["sign_flip", "ipm", "minmax"]},
    },
}
TINY: dict[str, Any] = {
    "run": {"clients": 5, "rounds": 2},
    "space": {
        "method": {"grid": ["median", "krum"]},
        "regime": {"grid": [{"participation": 1.0, "participation_mode": "fixed"}]},
    },
    "breakdown": {"adversary": {"attack": ["sign_flip"]}},
}


def run_map(plan: Any, seeds: list[int], folder: str) -> tuple[Any, int, float]:
    """One map of ``plan``'s cells over ``seeds`` in this process: (the map, runs made, seconds)."""
    from robusttune.engine.runners import InProcessRunner
    from robusttune.experiments.breakdown import spec_evaluator
    from robusttune.experiments.breakdown.replicates import bisect_replicates
    from robusttune.methods.adversary import Adversary

    made = [0]
    started = time.perf_counter()
    evaluate = spec_evaluator(
        plan.base,
        InProcessRunner(folder, threads=1),
        seeds=seeds,
        adversary=Adversary.of(plan.adversary or None, plan.adaptive),
        sampler_seed=plan.sampler_seed,
        survival=(plan.threshold, plan.relative_threshold),
        clean_margin=plan.clean_margin,
        on_trials=lambda n: made.__setitem__(0, made[0] + n),
    )
    result = bisect_replicates(
        plan.cells,
        seeds,
        evaluate,
        max_fraction=plan.max_fraction,
        threshold=plan.threshold,
        relative_threshold=plan.relative_threshold,
        verify_radius=plan.verify_radius,
        on_non_monotone=plan.on_non_monotone,
        clean_margin=plan.clean_margin,
    )
    return result, made[0], time.perf_counter() - started


def least_runs(replicate: Any) -> int:
    """What a later seed's search that guessed its edge b at once must still run: the clean
    point, the survivor at b (every adversary setting: a survivor is only known once all have
    run) and one run at b + 1 (a failure's first setting, as `spec_evaluator`'s ``prioritise``
    mostly makes it). A seed whose clean run failed or did not learn needs its clean point alone.
    No search over that seed, however it guesses, runs less on a monotone cell."""
    clean = replicate.outcomes[0].trials
    b = replicate.breakdown
    if b is None:
        return clean
    survivor = replicate.outcomes[b].trials if b > 0 else 0
    return clean + survivor + (1 if b < replicate.k_max else 0)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tiny", action="store_true", help="toy sizes: a smoke run")
    args = parser.parse_args()

    import torch

    from robusttune.experiments.breakdown.plan import parse_plan

    torch.set_num_threads(1)
    mapping = {
        **MAP,
        "run": dict(MAP["run"]),
        "space": dict(MAP["space"]),
        "breakdown": dict(MAP["breakdown"]),
    }
    if args.tiny:
        for key, values in TINY.items():
            mapping[key] = {**mapping[key], **values}
    plan = parse_plan(mapping, source="bench/seeds.py", default_name="seeds")
    seeds = list(plan.seeds)
    print(f"{len(plan.cells)} cells, seeds {seeds}, adversary {plan.adversary}")
    with tempfile.TemporaryDirectory(prefix="robusttune-bench-seeds-") as folder:
        together, runs_together, seconds_together = run_map(plan, seeds, f"{folder}/together")
        alone = [run_map(plan, [seed], f"{folder}/seed{seed}") for seed in seeds]
    runs_alone = sum(runs for _, runs, _ in alone)
    seconds_alone = sum(seconds for _, _, seconds in alone)
    agree, compared = 0, 0
    for position, (single, _, _) in enumerate(alone):
        for cell in plan.cells:
            mine, theirs = together.results[cell][position], single.results[cell][0]
            if "non_monotone" in (mine.status, theirs.status):
                continue
            compared += 1
            agree += mine.breakdown == theirs.breakdown
    # the first seed is a one-seed map in either way; the later seeds at their least
    least = alone[0][1] + sum(
        least_runs(together.results[cell][position])
        for cell in plan.cells
        for position in range(1, len(seeds))
    )
    summary = together.to_frame()
    spread = (summary["breakdown_max"] - summary["breakdown_min"]).dropna()
    print(
        f"3-seed map: {runs_together} runs in {seconds_together:.1f} s; three one-seed maps: "
        f"{runs_alone} runs ({', '.join(str(r) for _, r, _ in alone)}) in {seconds_alone:.1f} s"
    )
    print(f"every seed's answer its own map's on monotone cells: {agree} of {compared}")
    print(
        f"seeds' spread per cell (max - min): median {spread.median():.3g}, "
        f"largest {spread.max():.3g}; statuses {summary['status'].value_counts().to_dict()}"
    )
    print(
        f"least a 3-seed map can run (the first seed's map, then every later seed's clean point, "
        f"its survivor at b and one run at b + 1): {least} runs"
    )
    print(f"seeds3_least_vs_three_maps_runs: {least / runs_alone:.3f}")
    print(f"seeds3_vs_three_maps_seconds: {seconds_together / seconds_alone:.3f}")
    print(f"seeds3_vs_three_maps_runs: {runs_together / runs_alone:.3f}")


if __name__ == "__main__":
    main()
