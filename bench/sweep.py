"""Sweep throughput and fixed cost on this machine.

Runs the same small set of federated runs (digits, 10 clients, half sampled, 5 local epochs) two
ways and compares the whole machine's client-images/s:

  baseline  two independent processes with one torch thread each, the runs split between them,
            timed from launching both to both exiting (their imports included), once before
            and once after the sweep (the machine may be shared: their mean is the reference);
  sweep     `robusttune sweep` machinery on a local Ray (one CPU and one thread per trial, two
            trials side by side), timed from the first trial's start to the last trial's end.

It also reports the sweep's fixed cost: Ray start to the first trial, and the last trial to the
command's exit (Ray shut down). Target: ratio >= 0.9 (DESIGN.md: on CPU, speed comes from trials
side by side with one thread each). Ends with one line ``<figure>: <number>``.

    python bench/sweep.py [--runs 8] [--rounds 5]
    python bench/sweep.py --tiny    # toy sizes: 2 runs of 1 round, 1 local epoch, one baseline
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

RUN = {
    "dataset": "digits",
    "clients": 10,
    "participation": 0.5,
    "checkpoint_every": 0,
    "device": "cpu",
}


def worker(specs: list[dict]) -> None:
    """Run specs one after another with one torch thread; print images trained as JSON."""
    import torch

    torch.set_num_threads(1)
    from robusttune.core.runspec import RunSpec
    from robusttune.engine.simulation import Simulation

    images = 0.0
    for values in specs:
        spec = RunSpec.from_dict(values)
        simulation = Simulation(spec)
        for _ in simulation:
            pass
        images += client_images(simulation)
    print(json.dumps({"images": images, "end": time.time()}))


def client_images(simulation) -> float:
    """Images trained in a run: rounds x sampled clients x local epochs x mean client size
    (the expected count; both sides run identical runs, so the ratio is exact regardless)."""
    spec = simulation.spec
    sizes = [len(y) for y in simulation.data.client_y]
    return spec.rounds * spec.expected_sample_size * spec.local_epochs * sum(sizes) / len(sizes)


def make_sweep(runs: int, rounds: int, **run):
    from robusttune.experiments.sweep.space import parse_sweep

    methods = ["fedavg", "median"]
    seeds = list(range(1, max(1, runs // len(methods)) + 1))
    return parse_sweep(
        {
            "name": "bench_sweep",
            "run": {**RUN, "rounds": rounds, **run},
            "space": {"method": {"grid": methods}, "seed": {"grid": seeds}},
            "resources": {"cpu": 1},
        },
        name="bench_sweep",
    )


def baseline(specs: list[dict]) -> tuple[float, float]:
    """(client images, seconds) for two independent one-thread processes."""
    halves = [specs[0::2], specs[1::2]]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
    started = time.time()
    processes = [
        subprocess.Popen(
            [sys.executable, __file__, "--worker", json.dumps(half)],
            stdout=subprocess.PIPE,
            text=True,
            env=env,
        )
        for half in halves
    ]
    outputs = [json.loads(p.communicate()[0].strip().splitlines()[-1]) for p in processes]
    ended = time.time()
    if any(p.returncode for p in processes):
        raise SystemExit("a baseline worker failed")
    return sum(o["images"] for o in outputs), ended - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument(
        "--tiny",
        action="store_true",
        help="toy sizes: a smoke run, not a measurement (2 runs of 1 round of 1 "
        "local epoch; the baseline measured once, before the sweep)",
    )
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        worker(json.loads(args.worker))
        return

    if args.tiny:
        args.runs, args.rounds = 2, 1
    spec = make_sweep(args.runs, args.rounds, **({"local_epochs": 1} if args.tiny else {}))
    specs = [{**spec.resolve(point), "device": "cpu"} for point in spec.expand().points]
    print(
        f"{len(specs)} runs: {spec.describe(spec.expand().points[0])} ... "
        f"(digits, {RUN['clients']} clients, {args.rounds} rounds)"
    )

    # The machine may be shared: measure the baseline before and after the sweep and compare
    # the sweep with their mean, so a load that comes or goes mid-bench biases neither side.
    images, before = baseline(specs)
    print(
        f"two 1-thread processes: {images:,.0f} client-images in {before:.1f} s "
        f"= {images / before:,.0f} images/s"
    )

    from robusttune.experiments.sweep.runner import run_sweep

    with tempfile.TemporaryDirectory(prefix="robusttune-bench-") as storage:
        outcome = run_sweep(spec, storage=storage, num_cpus=2, verbose=0)
    if args.tiny:  # a smoke run: the baseline once
        after = before
    else:
        _, after = baseline(specs)
        print(f"two 1-thread processes again: {after:.1f} s = {images / after:,.0f} images/s")
    base_rate = images / ((before + after) / 2)
    marks = outcome.timeline
    window = marks["last_trial_end"] - marks["first_trial_start"]
    sweep_rate = images / window
    print(
        f"sweep (2 trials side by side): {outcome.finished} trials, {images:,.0f} client-images "
        f"in {window:.1f} s = {sweep_rate:,.0f} images/s"
    )
    print(
        f"fixed cost: Ray start to first trial {marks['first_trial_start']:.1f} s "
        f"(Ray up after {marks['ray_ready']:.1f} s), last trial to exit "
        f"{marks['exit'] - marks['last_trial_end']:.1f} s"
    )
    print(f"sweep_vs_two_processes_throughput_ratio: {sweep_rate / base_rate:.3f}")


if __name__ == "__main__":
    main()
