"""Local-training throughput of the two strategies, and DeMoA-style single-step round rate.

    python bench/training.py            # cnn2, 10 clients of ~600 CIFAR-shaped images, 2 epochs
    python bench/training.py --quick    # 4 clients of ~150 images, 1 epoch, fewer DeMoA rounds
    python bench/training.py --tiny     # toy sizes (2 clients of ~16 images, 1 thread): a smoke run

Part 1 times ``train_clients`` on one workload with each strategy at 1 thread and at all threads
(``torch.set_num_threads``) and reports client-images/s = sum_i n_i * E / seconds. Part 2 times
DeMoA rounds (N=25, bernoulli p=0.1, one minibatch gradient per sampled client, cnn2 on 1x8x8):
through ``robusttune.engine.simulation.Simulation`` when it exists and runs ``method=demoa``, otherwise
by timing ``client_gradients`` alone (the output says which). Numbers are of this machine and
this run (shared CPUs are noisy): read the ratios. Part 3 times the steps a breakdown map is made
of, the digits MLP (64 inputs, d = 55,210) on 10 clients of 36-108 samples (72 on average, as a
digits map's 20 shards of the training split) at batch 16, one thread:
``train_clients`` (sequential: the module bound once per call to a flat vector, `bound_copy`)
against the same SGD with one ``torch.func.functional_call`` per step (the trainer before it),
both from one start, printing ``bound_vs_functional_call_mlp: <speed-up>`` and whether they gave
the same bits. The last line is ``auto_vs_fastest: <throughput of what trainer=auto runs /
fastest measured>``.
"""

from __future__ import annotations

import argparse
import os
import time

import torch
import torch.nn.functional as F
from torch.func import functional_call

from robusttune.problem.models import flat_params, make_model, param_layout
from robusttune.problem.training import (
    batch_orders,
    client_gradients,
    resolve_trainer,
    train_clients,
)


def synthetic_clients(
    n_clients: int, mean_size: int, shape: tuple[int, ...], classes: int, seed: int
) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Unequal client sizes spread evenly over [0.5, 1.5] x mean_size, Gaussian inputs."""
    g = torch.Generator().manual_seed(seed)
    sizes = [max(1, round(mean_size * (0.5 + i / max(1, n_clients - 1)))) for i in range(n_clients)]
    return [
        (torch.randn(n, *shape, generator=g), torch.randint(0, classes, (n,), generator=g))
        for n in sizes
    ]


def time_training(model, start, data, args, strategy: str) -> float:
    """Client-images/s of one train_clients call: sum_i n_i * E / seconds."""
    kw = {
        "epochs": args.epochs,
        "batch_size": args.batch_size,
        "lr": 0.01,
        "momentum": 0.9,
        "seeds": list(range(len(data))),
        "strategy": strategy,
    }
    t0 = time.perf_counter()
    train_clients(model, start, data, **kw)
    return sum(len(y) for _, y in data) * args.epochs / (time.perf_counter() - t0)


def warm_up(model, start, data, args) -> None:
    """One small call per strategy: allocator, oneDNN kernels, vmap tracing."""
    small = [(x[: args.batch_size * 2], y[: args.batch_size * 2]) for x, y in data[:2]]
    for strategy in ("sequential", "batched"):
        train_clients(
            model,
            start,
            small,
            epochs=1,
            batch_size=args.batch_size,
            lr=0.01,
            momentum=0.9,
            seeds=[0, 1],
            strategy=strategy,
        )


def demoa_rounds_simulation(rounds: int) -> float:
    """Rounds/s of Simulation.step() for a DeMoA run on digits (N=25, bernoulli p=0.1)."""
    from robusttune.core.runspec import RunSpec
    from robusttune.engine.simulation import Simulation

    spec = RunSpec(
        dataset="digits",
        model="cnn2",
        clients=25,
        participation=0.1,
        participation_mode="bernoulli",
        method="demoa",
        rounds=rounds + 5,
        eval_every=10**6,
        trainer="auto",
        device="cpu",
        checkpoint_every=0,
        # thread counts are what this bench compares, and portable numerics pins one
        # thread (and refuses a process that computed before: this one did)
        numerics="native",
    )
    sim = Simulation(spec)
    for _ in range(5):  # warm-up
        sim.step()
    t0 = time.perf_counter()
    for _ in range(rounds):
        sim.step()
    return rounds / (time.perf_counter() - t0)


def demoa_rounds_gradients(rounds: int, strategy: str, seed: int = 0) -> float:
    """Rounds/s of client_gradients alone: each round samples every one of N=25 clients with
    p=0.1 (digits-shaped 1x8x8 data, ~57 samples per client as 1,437 digits / 25) and computes
    one minibatch gradient (batch 16, the digits default) for each sampled client."""
    model = make_model("cnn2", (1, 8, 8), 10, seed=seed)
    start = flat_params(model)
    data = synthetic_clients(25, 57, (1, 8, 8), 10, seed)
    g = torch.Generator().manual_seed(seed)
    draws = [
        torch.nonzero(torch.rand(25, generator=g) < 0.1).flatten().tolist()
        for _ in range(rounds + 5)
    ]
    draws = [
        d or [0] for d in draws
    ]  # an empty round costs nothing to train; count it as one client

    def run(sampled):
        client_gradients(
            model,
            start,
            [data[i] for i in sampled],
            batch_size=16,
            seeds=list(sampled),
            strategy=strategy,
        )

    for d in draws[:5]:
        run(d)
    t0 = time.perf_counter()
    for d in draws[5:]:
        run(d)
    return rounds / (time.perf_counter() - t0)


def sgd_through_functional_call(
    model, start, data, *, batch_size: int, lr: float, seeds: list[int]
) -> torch.Tensor:
    """The baseline of part 3: one epoch of plain SGD per client from ``start``, the batches of
    `batch_orders`, the parameters passed to ``functional_call`` at every step."""
    layout = param_layout(model)
    out = start.expand(len(data), -1).clone()
    for i, ((x, y), seed) in enumerate(zip(data, seeds)):
        theta = {n: v.requires_grad_(True) for n, v in layout.views(out[i]).items()}
        # one gather for the epoch, then views, as the trainer does
        order = torch.cat(batch_orders(len(y), epochs=1, batch_size=batch_size, seed=seed))
        for xb, yb in zip(x[order].split(batch_size), y[order].split(batch_size)):
            loss = F.cross_entropy(functional_call(model, theta, (xb,)), yb)
            grads = torch.autograd.grad(loss, list(theta.values()))
            with torch.no_grad():
                torch._foreach_add_(list(theta.values()), grads, alpha=-lr)
    return out


def bound_against_functional_call(clients: int, repeats: int) -> tuple[float, bool]:
    """(speed-up of `train_clients` over `sgd_through_functional_call`, same bits) on the map's
    MLP workload at one thread; calls interleaved, each side's best of ``repeats`` rounds kept."""
    torch.set_num_threads(1)
    model = make_model("mlp", (64,), 10, seed=0)
    start = flat_params(model)
    data = synthetic_clients(clients, 72, (64,), 10, seed=0)
    seeds = list(range(clients))
    kw = {"batch_size": 16, "lr": 0.05, "seeds": seeds}
    bound = lambda: train_clients(model, start, data, epochs=1, momentum=0.0, **kw)  # noqa: E731
    baseline = lambda: sgd_through_functional_call(model, start, data, **kw)  # noqa: E731
    same = torch.equal(bound(), baseline())
    best = {"bound": float("inf"), "baseline": float("inf")}
    for _ in range(repeats):
        for name, call in (("bound", bound), ("baseline", baseline)):
            t0 = time.perf_counter()
            for _ in range(20):
                call()
            best[name] = min(best[name], time.perf_counter() - t0)
    return best["baseline"] / best["bound"], same


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="small workload")
    parser.add_argument(
        "--tiny",
        action="store_true",
        help="toy sizes: a smoke run, not a measurement (2 clients of ~16 images, "
        "1 epoch, 1 repeat, 3 DeMoA rounds, 1 thread)",
    )
    parser.add_argument("--clients", type=int, default=10)
    parser.add_argument("--samples", type=int, default=600, help="mean images per client")
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--repeats", type=int, default=2, help="interleaved repeats, best kept")
    parser.add_argument("--demoa-rounds", type=int, default=200)
    parser.add_argument("--threads", type=int, default=os.cpu_count() or 1, help="'all threads'")
    if parser.parse_known_args()[0].quick:  # quick changes the defaults; explicit flags still win
        parser.set_defaults(clients=4, samples=150, epochs=1, demoa_rounds=60, repeats=3)
    if parser.parse_known_args()[0].tiny:  # likewise
        parser.set_defaults(clients=2, samples=16, epochs=1, demoa_rounds=3, repeats=1, threads=1)
    args = parser.parse_args()

    all_threads = max(1, args.threads)
    thread_counts = sorted({1, all_threads})
    model = make_model("cnn2", (3, 32, 32), 10, seed=0)
    start = flat_params(model)
    data = synthetic_clients(args.clients, args.samples, (3, 32, 32), 10, seed=0)
    sizes = [len(y) for _, y in data]
    print(
        f"workload: cnn2 on 3x32x32, {args.clients} clients of {min(sizes)}..{max(sizes)} images "
        f"({sum(sizes)} total), {args.epochs} epoch(s), batch {args.batch_size}"
    )

    # repeats interleave the configurations and keep each one's best, so a burst of load from
    # another process on a shared machine hits every configuration alike, not one of them
    rates: dict[tuple[str, int], float] = {}
    warm_up(model, start, data, args)
    for _ in range(args.repeats):
        for threads in thread_counts:
            torch.set_num_threads(threads)
            for strategy in ("sequential", "batched"):
                rate = time_training(model, start, data, args, strategy)
                rates[(strategy, threads)] = max(rate, rates.get((strategy, threads), 0.0))
    auto = (resolve_trainer("auto", torch.device("cpu")), all_threads)
    print(
        f"local training, client-images/s relative to trainer=auto ({auto[0]} at {auto[1]} threads):"
    )
    for (strategy, threads), rate in rates.items():
        print(
            f"  {strategy:10s} threads={threads:<3d} {rate:9.1f} img/s  ratio {rate / rates[auto]:.2f}"
        )

    print(f"DeMoA rounds (N=25, p=0.1, cnn2 on 1x8x8), {args.demoa_rounds} timed rounds:")
    unavailable = None
    for threads in thread_counts:
        torch.set_num_threads(threads)
        if unavailable is None:
            try:
                rps = demoa_rounds_simulation(args.demoa_rounds)
                print(f"  Simulation(method=demoa) threads={threads:<3d} {rps:8.1f} rounds/s")
                continue
            except Exception as exc:  # the simulation may not exist yet, or not run demoa
                unavailable = f"{type(exc).__name__}: {str(exc)[:80]}"
                print(
                    f"  Simulation unavailable ({unavailable}); timing client_gradients alone "
                    f"(no aggregation, no caches, no evaluation)"
                )
        for strategy in ("sequential", "batched"):
            rps = demoa_rounds_gradients(args.demoa_rounds, strategy)
            print(f"  client_gradients {strategy:10s} threads={threads:<3d} {rps:8.1f} rounds/s")

    clients = args.clients if args.tiny else 10
    speedup, same = bound_against_functional_call(clients, max(3, args.repeats))
    print(
        f"the map's MLP steps ({clients} clients of 72 samples on average, batch 16, one "
        f"thread), same bits as one functional_call per step: {'yes' if same else 'NO'}"
    )
    print(f"bound_vs_functional_call_mlp: {speedup:.2f}")

    fastest = max(rates.values())
    best = max(rates, key=rates.get)
    print(
        f"fastest training configuration: {best[0]} at {best[1]} thread(s); "
        f"thread efficiency of sequential (images/s per thread, 1 vs {all_threads}): "
        f"{rates[('sequential', 1)] * all_threads / rates[('sequential', all_threads)]:.2f}"
    )
    print(f"auto_vs_fastest: {rates[auto] / fastest:.3f}")


if __name__ == "__main__":
    main()
