"""What the portable float path costs against the native one (robusttune.core.numerics).

Each configuration below is run in a fresh process per mode (a process trains in one mode only),
native and portable alternating within each repeat so that the machine's load falls on both
alike, one torch thread each (how trials run on a CPU); a run's time is its round loop (`Simulation` iterated), imports and data loading
excluded. Prints each configuration's median time per mode and their ratio, then the geometric
mean of the ratios over the configurations, the headline:

    python bench/numerics.py [--repeats 3] [--quick]
    python bench/numerics.py --tiny    # toy sizes: DeMoA mlp under ALIE only, 10 rounds, one repeat

The configurations are the project's normal jobs on the CPU: the quickstart's FedAvg-style runs
(digits, mlp and cnn2, local epochs of SGD), a robust rule under attack, and a DeMoA run (one
minibatch gradient per round, many rounds). Issue 21 makes `portable` the default if this ratio
is at most 1.3.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import subprocess
import sys

CONFIGS = {
    "fedavg mlp": {"model": "mlp", "rounds": 4},
    "fedavg cnn2": {"model": "cnn2", "rounds": 2},
    "krum mlp, ipm": {
        "model": "mlp",
        "method": "krum",
        "attack": "ipm",
        "byzantine_fraction": 0.2,
        "rounds": 4,
    },
    "demoa mlp, alie": {
        "model": "mlp",
        "method": "demoa",
        "attack": "alie",
        "byzantine_fraction": 0.2,
        "rounds": 150,
    },
}
BASE = {"dataset": "digits", "seed": 42, "checkpoint_every": 0, "device": "cpu"}


def worker(values: dict) -> None:
    """Run one spec in this (fresh) process; print the round loop's seconds as JSON. One torch
    thread in both modes, as every trial on a CPU runs: the ratio is the float path's alone."""
    import time

    import torch

    torch.set_num_threads(1)
    from robusttune.core.runspec import RunSpec
    from robusttune.engine.simulation import Simulation

    simulation = Simulation(RunSpec.from_dict(values))
    started = time.perf_counter()
    for _ in simulation:
        pass
    print(json.dumps({"seconds": time.perf_counter() - started}))


def timed(values: dict) -> float:
    out = subprocess.run(
        [sys.executable, __file__, "--worker", json.dumps(values)],
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    return json.loads(out.strip().splitlines()[-1])["seconds"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--quick", action="store_true", help="one repeat, fewer rounds")
    parser.add_argument(
        "--tiny",
        action="store_true",
        help="toy sizes: a smoke run, not a measurement (DeMoA mlp under ALIE "
        "only, 10 rounds, one repeat)",
    )
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        worker(json.loads(args.worker))
        return
    repeats = 1 if args.quick or args.tiny else args.repeats
    configs = CONFIGS
    if args.tiny:  # each run is a fresh process (imports ~3 s): one configuration, two runs
        configs = {"demoa mlp, alie": {**CONFIGS["demoa mlp, alie"], "rounds": 10}}
    ratios = []
    for label, config in configs.items():
        values = {**BASE, **config}
        if args.quick:
            values["rounds"] = max(1, values["rounds"] // 2)
        seconds: dict[str, list[float]] = {"native": [], "portable": []}
        for repeat in range(repeats):
            order = ("native", "portable") if repeat % 2 == 0 else ("portable", "native")
            for mode in order:
                seconds[mode].append(timed({**values, "numerics": mode}))
        native, portable = (statistics.median(seconds[m]) for m in ("native", "portable"))
        ratios.append(portable / native)
        print(
            f"{label:18s} native {native:7.2f} s  portable {portable:7.2f} s  "
            f"ratio {portable / native:5.2f}"
        )
    print(f"portable/native time: {math.exp(statistics.fmean(math.log(r) for r in ratios)):.2f}")


if __name__ == "__main__":
    main()
