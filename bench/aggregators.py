"""Aggregation cost at the papers' model size (cnn2, d = 545,098), and SWB against the published
per-chunk loop.

    python bench/aggregators.py            # n in {20, 50, 500}, every rule, SWB comparisons
    python bench/aggregators.py --quick    # n in {20, 50}, one repetition
    python bench/aggregators.py --tiny     # toy sizes (n = 20, d = 4,096, 1 thread): a smoke run
    python bench/aggregators.py --threads 1

Prints seconds per aggregation for every rule and n, the published SWB loop (a Gaussian, a QR
and a matmul per chunk, in a Python loop, as the SWB-DM code does; plus our sign fix, which the
published code lacks, see swb_blocks.HouseholderRotation) against the
`haar`, `shared` and `hadamard` rotations on the same input in the same run, how far each
rotation option moves the aggregate (L2 distance to the exact rule's output and to the honest
mean on an honest + outlier input), SWB's medoid order by `argsort_last` against numpy's stable
float argsort (alone: ``argsort_keys_speedup``, and inside SWB at n = 2:
``swb_n2_argsort_speedup``), the delayed cache's memory at N = 500 and 10,000, and ends with
``swb_speedup_exact: <loop seconds / haar seconds>``.
"""

from __future__ import annotations

import argparse
import functools
import math
import statistics
import time

import numpy as np
import torch

from robusttune.methods.aggregators import AGGREGATORS, make_aggregator, swb_blocks
from robusttune.methods.aggregators.base import argsort_last
from robusttune.methods.aggregators.swb_blocks import published_chunk_step

D = 545_098  # cnn2, the SWB-DM model
CHUNK = 512


def published_swb_loop(
    x: torch.Tensor, *, chunk: int, views: int, trim_ratio: float, generator: torch.Generator
) -> torch.Tensor:
    """SWB as the SWB-DM code computes it: per view, per chunk, draw a Gaussian, QR it, rotate,
    sort, trim, pick the medoid, place back, rotate back; with our sign fix on Q (not in the
    published code; it costs one multiply per chunk and does not change the error)."""
    n, d = x.shape
    k = math.floor(n * trim_ratio + 1e-9)
    out = torch.zeros(d, dtype=x.dtype, device=x.device)
    for _ in range(views):
        for start in range(0, d, chunk):
            X = x[:, start : start + chunk]
            c = X.shape[1]
            gaussian = torch.randn(
                c, c, generator=generator, dtype=x.dtype, device=generator.device
            )
            q, r = torch.linalg.qr(gaussian.to(x.device))
            q = q * torch.sign(torch.diagonal(r))
            out[start : start + c] += published_chunk_step(X, q, k)
    return out / views


def timed(fn, reps: int) -> tuple[float, torch.Tensor]:
    times, out = [], None
    for _ in range(reps):
        start = time.perf_counter()
        out = fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times), out


def messages(
    n: int, f: int, seed: int, d: int = D, device: torch.device | str = "cpu"
) -> tuple[torch.Tensor, torch.Tensor]:
    """n trained-state-like messages of d values: a shared model (norm ~30) plus client noise;
    the first f are outliers that shift every coordinate by 10 client standard deviations (an
    attacker pushing one way). Drawn on ``device`` (no 1 GB host-to-device copy at n = 500).
    Returns (messages, honest mean)."""
    gen = torch.Generator(device=device).manual_seed(seed)
    model = torch.randn(d, generator=gen, device=device) * (30 / math.sqrt(d))
    x = model + 0.01 * torch.randn(n, d, generator=gen, device=device)
    honest = x[f:].mean(0)
    x[:f] += 0.1
    return x, honest


def rule(name: str, f: int):
    params = {"f": f, "trim_ratio": 0.25 if name == "swb" else None}
    if name == "bucketing":
        params.update(inner="krum", bucket_size=2)
    return make_aggregator(name, **params)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="n in {20, 50}, one repetition")
    parser.add_argument(
        "--tiny",
        action="store_true",
        help="toy sizes: a smoke run, not a measurement (n = 20, d = 4,096, 1 thread)",
    )
    parser.add_argument(
        "--threads", type=int, default=None, help="torch threads (default: torch's)"
    )
    parser.add_argument("--reps", type=int, default=None, help="repetitions per small-n timing")
    args = parser.parse_args()
    if args.threads or args.tiny:
        torch.set_num_threads(args.threads or 1)
    sizes = [20] if args.tiny else [20, 50] if args.quick else [20, 50, 500]
    reps = args.reps or (1 if args.quick or args.tiny else 2)
    d = 4_096 if args.tiny else D
    print(
        f"d = {d:,}, torch {torch.__version__}, {torch.get_num_threads()} threads, "
        f"sizes {sizes}, {reps} repetition(s) (1 at n = 500); f = floor(0.2 n)"
    )

    # -- every rule ------------------------------------------------------------------------
    table: dict[str, dict[int, float]] = {name: {} for name in AGGREGATORS.names()}
    for n in sizes:
        f = n // 5
        x, honest = messages(n, f, seed=n, d=d)
        reference = honest + 0.001
        for name in AGGREGATORS.names():
            agg = rule(name, f)
            gen = torch.Generator().manual_seed(0)
            call = functools.partial(agg, x, reference=reference, previous=None, generator=gen)
            seconds, _ = timed(call, 1 if n >= 500 else reps)
            table[name][n] = seconds
            print(f"  {name:<17} n={n:<4} {seconds:8.3f} s", flush=True)
        x = honest = reference = None  # frees the largest inputs before the next size's
    print(f"\nseconds per aggregation (d = {d:,})")
    print("  rule              " + "".join(f"{'n=' + str(n):>10}" for n in sizes))
    for name, row in table.items():
        print(f"  {name:<17} " + "".join(f"{row[n]:10.3f}" for n in sizes))

    # -- SWB: published loop vs the rotations, same input, same run ------------------------
    n, f = (20, 4) if args.tiny else (50, 10)
    x, honest = messages(n, f, seed=7, d=d)
    print(
        f"\nSWB at n = {n}, d = {d:,}, C = {CHUNK}, P = 2 views, r = 0.25 "
        f"({math.ceil(d / CHUNK)} chunks per view)"
    )
    loop_s, loop_out = timed(
        lambda: published_swb_loop(
            x, chunk=CHUNK, views=2, trim_ratio=0.25, generator=torch.Generator().manual_seed(1)
        ),
        1,
    )
    print(f"  published per-chunk loop      {loop_s:8.2f} s", flush=True)
    results = {}
    for rotation in ("haar", "shared", "hadamard"):
        agg = make_aggregator("swb", trim_ratio=0.25, swb_rotation=rotation)
        seconds, out = timed(lambda: agg(x, generator=torch.Generator().manual_seed(2)), reps)
        results[rotation] = (seconds, out)
        print(
            f"  {rotation:<29} {seconds:8.2f} s   loop / {rotation} = {loop_s / seconds:5.2f}x",
            flush=True,
        )
    # A second exact draw: how far two exact aggregates are from each other sets the scale
    # against which the faster rotations' differences should be read.
    exact2 = make_aggregator("swb", trim_ratio=0.25)(x, generator=torch.Generator().manual_seed(3))
    exact = results["haar"][1]
    mean = x.mean(0)
    print(
        f"\neffect of the rotation on the aggregate ({f} of {n} messages shifted by +0.1 on "
        f"every coordinate; honest spread 0.01 per coordinate)"
    )
    print(f"  {'output':<26}{'L2 to honest mean':>18}{'L2 to haar output':>19}")
    rows = [
        ("haar (seed 2)", exact),
        ("haar (another draw)", exact2),
        ("shared", results["shared"][1]),
        ("hadamard", results["hadamard"][1]),
        ("published loop", loop_out),
        ("mean (FedAvg)", mean),
        ("median", make_aggregator("median")(x)),
    ]
    for label, out in rows:
        print(
            f"  {label:<26}{(out - honest).norm().item():18.4f}{(out - exact).norm().item():19.4f}"
        )
    x = None  # frees the messages before the next part

    # -- SWB's medoid order: argsort_last against numpy's stable float argsort ----------------
    # With few clients (p = 0.1 of 20: n = 2) SWB spends most of a call placing b in the medoid's
    # order, one stable argsort of d values; argsort_last sorts integer keys instead (the same
    # permutation, tests/test_extreme_messages.py). Both are timed here, alone and inside SWB at
    # n = 2 with the maps' shared rotation (the swb_blocks module's argsort swapped for numpy's),
    # interleaved.
    rows_of_chunks = torch.randn(d // CHUNK, CHUNK, generator=torch.Generator().manual_seed(3))
    stable_numpy = functools.partial(np.argsort, rows_of_chunks.numpy(), axis=-1, kind="stable")
    swb_at_2 = functools.partial(
        make_aggregator("swb", f=0, trim_ratio=0.25, swb_rotation="shared"),
        messages(2, 0, seed=2, d=d)[0],
        generator=torch.Generator().manual_seed(0),
    )
    times: dict[str, list[float]] = {key: [] for key in ("keys", "numpy", "swb keys", "swb numpy")}
    for _ in range(max(3, reps)):
        times["keys"].append(timed(functools.partial(argsort_last, rows_of_chunks), 1)[0])
        times["numpy"].append(timed(stable_numpy, 1)[0])
        times["swb keys"].append(timed(swb_at_2, 1)[0])
        swb_blocks.argsort_last = lambda x: torch.from_numpy(
            np.argsort(x.numpy(), axis=-1, kind="stable")
        )
        try:
            times["swb numpy"].append(timed(swb_at_2, 1)[0])
        finally:
            swb_blocks.argsort_last = argsort_last
    best = {key: min(values) for key, values in times.items()}
    print(
        f"\nSWB's medoid order ({d // CHUNK:,} rows of {CHUNK}), seconds (best of {len(times['keys'])})"
    )
    print(f"  stable argsort, numpy      {best['numpy']:8.4f} s")
    print(f"  argsort_last (int keys)    {best['keys']:8.4f} s")
    print(f"  SWB at n = 2, numpy's      {best['swb numpy']:8.4f} s")
    print(f"  SWB at n = 2, argsort_last {best['swb keys']:8.4f} s")
    print(f"argsort_keys_speedup: {best['numpy'] / best['keys']:.2f}")
    print(f"swb_n2_argsort_speedup: {best['swb numpy'] / best['swb keys']:.2f}")

    # -- cache memory ------------------------------------------------------------------------
    print("\ndelayed cache (N slots of d = 545,098), computed")
    for slots in (500, 10_000):
        for dtype, size in (("float32", 4), ("bfloat16", 2)):
            print(f"  N = {slots:>6,}  {dtype:<9} {slots * D * size / 2**30:7.2f} GiB")
    print(f"swb_speedup_exact: {loop_s / results['haar'][0]:.2f}")


if __name__ == "__main__":
    main()
