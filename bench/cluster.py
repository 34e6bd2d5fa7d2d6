"""Sweep throughput on one node and on a 3-node Ray cluster on this machine.

Runs the same small sweep (digits, 10 clients, half sampled, a grid of methods x seeds, one CPU
per trial) twice, each in a fresh process with its own Ray:

  single   a local Ray with C CPUs, as ``robusttune sweep`` starts by itself;
  cluster  ``ray.cluster_utils.Cluster``: a head with no CPUs (it runs no trial, as in
           cluster.yaml) and two worker nodes with C/2 CPUs each, joined through ``address``
           (what ``--address`` does): the same CPUs, split over nodes.

Both have the same CPUs on the same machine, so the ratio is the price of going multi-node
(scheduling across raylets, trial actors placed on other nodes, results and checkpoints crossing
node boundaries), not a speed-up: on a real cluster each worker node brings its own CPUs or GPUs
and throughput grows with the nodes. Trials per minute are counted from the first trial's start
to the last trial's end (Ray's start-up excluded; it is printed too); one node is measured
before and after the cluster and their mean is the reference. Ends with one line
``<figure>: <number>``.

    python bench/cluster.py [--trials 8] [--rounds 5] [--cpus 2]
    python bench/cluster.py --tiny    # toy sizes: 2 trials of 1 round, 1 local epoch, one node once
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

RUN = {"dataset": "digits", "clients": 10, "participation": 0.5, "device": "cpu"}
METHODS = ["fedavg", "median"]


def make_sweep(trials: int, rounds: int, **run):
    from robusttune.experiments.sweep.space import parse_sweep

    seeds = list(range(1, max(1, trials // len(METHODS)) + 1))
    return parse_sweep(
        {
            "run": {**RUN, "rounds": rounds, "checkpoint_every": 1, **run},
            "space": {"method": {"grid": METHODS}, "seed": {"grid": seeds}},
            "resources": {"cpu": 1},
        },
        name="bench_cluster",
    )


def child(mode: str, trials: int, rounds: int, cpus: int, tiny: bool = False) -> dict:
    """Run the sweep on one node or on a 3-node cluster; return its figures."""
    from robusttune.experiments.sweep.runner import run_sweep

    spec = make_sweep(trials, rounds, **({"local_epochs": 1} if tiny else {}))
    started = time.perf_counter()
    cluster = None
    address = None
    if mode == "cluster":
        from ray.cluster_utils import Cluster

        cluster = Cluster(
            initialize_head=True, head_node_args={"num_cpus": 0, "include_dashboard": False}
        )
        for _ in range(2):
            cluster.add_node(num_cpus=max(1, cpus // 2))
        cluster.wait_for_nodes()
        address = cluster.address
    ready = time.perf_counter() - started
    try:
        with tempfile.TemporaryDirectory(prefix="robusttune-bench-") as storage:
            outcome = run_sweep(
                spec,
                storage=storage,
                address=address,
                num_cpus=None if address else cpus,
                verbose=0,
            )
    finally:
        if cluster is not None:
            cluster.shutdown()
    marks = outcome.timeline
    window = marks["last_trial_end"] - marks["first_trial_start"]
    return {
        "mode": mode,
        "finished": outcome.finished,
        "errored": outcome.errored,
        "window": window,
        "ray_start": ready + marks["first_trial_start"],
        "wall": time.perf_counter() - started,
    }


def measure(mode: str, args: argparse.Namespace) -> dict:
    """One fresh process per measurement, with a private Ray temp dir (a Cluster writes the
    'latest cluster' address file; no other ray.init() on this machine should find it)."""
    ray_tmp = tempfile.mkdtemp(prefix="rtb-", dir="/tmp")
    env = {
        **os.environ,
        "RAY_AUTH_MODE": "disabled",
        "RAY_TMPDIR": ray_tmp,
        "OMP_NUM_THREADS": "1",
        "MKL_NUM_THREADS": "1",
    }
    env.pop("RAY_ADDRESS", None)
    command = [
        sys.executable,
        __file__,
        "--child",
        mode,
        "--trials",
        str(args.trials),
        "--rounds",
        str(args.rounds),
        "--cpus",
        str(args.cpus),
    ]
    if args.tiny:
        command.append("--tiny")
    try:
        done = subprocess.run(command, env=env, capture_output=True, text=True, check=False)
    finally:
        shutil.rmtree(ray_tmp, ignore_errors=True)
    if done.returncode != 0:
        sys.stderr.write(done.stdout[-2000:] + done.stderr[-4000:])
        raise SystemExit(f"the {mode} run failed ({done.returncode})")
    figures = json.loads(done.stdout.strip().splitlines()[-1])
    if figures["finished"] != args.trials or figures["errored"]:
        raise SystemExit(f"the {mode} run finished {figures['finished']} of {args.trials} trials")
    return figures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--trials", type=int, default=8, help="trials in the sweep (even)")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--cpus", type=int, default=2, help="CPUs in all, either way")
    parser.add_argument(
        "--tiny",
        action="store_true",
        help="toy sizes: a smoke run, not a measurement (2 trials of 1 round of 1 "
        "local epoch; one node measured once, before the cluster)",
    )
    parser.add_argument("--child", choices=["single", "cluster"], help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.tiny:
        args.trials, args.rounds = 2, 1
    if args.child:
        print(json.dumps(child(args.child, args.trials, args.rounds, args.cpus, args.tiny)))
        return

    print(
        f"{args.trials} trials: {' / '.join(METHODS)} x seeds on digits, {RUN['clients']} "
        f"clients, {args.rounds} rounds, a checkpoint every round, 1 CPU per trial"
    )
    # The machine may be shared: one node is measured before and after the cluster, and the
    # cluster compared with their mean, so a load that comes or goes mid-bench biases neither.
    labels = {
        "single": f"1 node, {args.cpus} CPUs",
        "cluster": f"3 nodes (head 0 CPUs + 2 workers x {max(1, args.cpus // 2)} CPUs)",
    }
    rates: dict[str, list[float]] = {"single": [], "cluster": []}
    for mode in ("single", "cluster") if args.tiny else ("single", "cluster", "single"):
        figures = measure(mode, args)
        rates[mode].append(figures["finished"] / figures["window"] * 60)
        print(
            f"{labels[mode]}: {rates[mode][-1]:.1f} trials/min ({figures['finished']} trials in "
            f"{figures['window']:.1f} s; Ray up to first trial {figures['ray_start']:.1f} s, "
            f"whole run {figures['wall']:.1f} s)"
        )
    single = sum(rates["single"]) / len(rates["single"])
    print(f"cluster_vs_single_node_trials_per_minute_ratio: {rates['cluster'][0] / single:.3f}")


if __name__ == "__main__":
    main()
