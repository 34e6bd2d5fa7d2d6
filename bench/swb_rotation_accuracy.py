"""Effect of SWB's rotation option on accuracy, on digits (issue 3: the faster rotations are
named options, so their cost in accuracy must be measured, not assumed).

For swb_dm (state cache + SWB) under ALIE and IPM at beta = 0.2, each `swb_rotation` is run over
the same seeds; the script prints the mean final accuracy per option and, as its last line, the
largest accuracy drop of a fast option against the exact `haar` rotation.

    python bench/swb_rotation_accuracy.py            # 3 seeds, 10 rounds
    python bench/swb_rotation_accuracy.py --quick    # 1 seed, 5 rounds
    python bench/swb_rotation_accuracy.py --tiny     # toy sizes: 1 seed, 2 rounds of 1 local epoch
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from robusttune.core.runspec import RunSpec
from robusttune.engine.simulation import Simulation
from robusttune.methods.aggregators.swb_blocks import ROTATIONS


def final_accuracy(**keys) -> float:
    simulation = Simulation(RunSpec(dataset="digits", **keys))
    for _ in simulation:
        pass
    return simulation.last_accuracy


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument(
        "--tiny",
        action="store_true",
        help="toy sizes: a smoke run, not a measurement (1 seed, 2 rounds of 1 local epoch)",
    )
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    seeds = [42] if args.quick or args.tiny else [42, 7, 3]
    rounds = 2 if args.tiny else 5 if args.quick else 10
    extra = {"local_epochs": 1} if args.tiny else {}

    started = time.perf_counter()
    table: dict[tuple[str, str], list[float]] = {}
    for attack in ("alie", "ipm"):
        for rotation in ROTATIONS:
            for seed in seeds:
                accuracy = final_accuracy(
                    method="swb_dm",
                    attack=attack,
                    byzantine_fraction=0.2,
                    participation=0.5,
                    rounds=rounds,
                    seed=seed,
                    swb_rotation=rotation,
                    **extra,
                )
                table.setdefault((attack, rotation), []).append(accuracy)

    print(
        f"swb_dm on digits, beta=0.2, p=0.5, {rounds} rounds"
        f"{' of 1 local epoch' if args.tiny else ''}, seeds {seeds}"
    )
    print(f"{'attack':8} " + " ".join(f"{r:>10}" for r in ROTATIONS))
    drops = []
    for attack in ("alie", "ipm"):
        means = {r: statistics.mean(table[(attack, r)]) for r in ROTATIONS}
        print(f"{attack:8} " + " ".join(f"{means[r]:10.4f}" for r in ROTATIONS))
        drops += [means["haar"] - means[r] for r in ROTATIONS if r != "haar"]
    print(f"seconds: {time.perf_counter() - started:.1f}")
    print(f"max_accuracy_drop_fast_rotation_vs_haar: {max(drops):.4f}")


if __name__ == "__main__":
    main()
