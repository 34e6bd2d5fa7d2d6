"""Every GPU figure of the project in one short run: batched against sequential client training,
exact SWB and its fast rotations, every rule at n = 500, a DeMoA and an SWB-DM round, the peak
GPU memory of each, and a map's short runs sharing the GPU: runs per second of digits and
Fashion-MNIST-shaped MLP runs 1, 4 and 16 at once (worker processes standing in for Ray trials
with fractional GPUs; no Ray there) against as many CPU cores, the GPU's busy share meanwhile,
and 16 runs stacked into one computation (their clients in one batched `train_clients` call).
It is the first phase of bench/gpu.sh; the second, bench/gpu_tune.py, runs sweeps and a map as
Ray Tune trials sharing the GPU.

    PYTHONPATH=. bash bench/gpu.sh                 # a CUDA machine, full sizes (both phases under
                                                   # 9 min, this one stops at 4)
    PYTHONPATH=. bash bench/gpu.sh --cpu --tiny    # every figure at toy sizes on the CPU (the
                                                   # test suite runs this, so it cannot rot)

Runs on a CUDA machine with torch, numpy, scipy and pydantic (``robusttune.core.runspec``'s schema):
it reaches ``robusttune.problem.models``, ``training``, ``aggregators``, ``attacks``, ``algorithms``,
``caches``, ``data`` and ``simulation`` (none imports Ray, Optuna or PyYAML) and the helpers of
``bench/training.py`` and ``bench/aggregators.py``. It ran on an H200 with torch 2.11.0 on
2026-12-04 (bench/results/), pydantic carried there as wheels (docs/how-to/gpu.md).

Output: lines starting with ``#`` are notes; every other line is ``<figure>: <number>``, and the
last one is the headline, ``batched_vs_sequential_cnn2_50_clients``. Figure names are those of
the full sizes in both modes (``--tiny`` shrinks d, n, clients and images; the header says to
what). Timing: ``torch.cuda.synchronize()`` around every timed call (``perf_counter`` alone on
the CPU), one untimed warm-up call (cuDNN's algorithm choice, vmap tracing, allocator growth),
then the median of up to ``--repeats`` calls, fewer once a figure has used ``--figure-budget-s``
(the exact SWB at n = 500, d = 545,098 is the heaviest). A figure reached after ``--budget-s``
prints ``nan`` and a note saying it was skipped, so this phase stays under 4-5 minutes; a
figure that raises prints ``nan`` and the run exits with status 1 after printing the rest.
``*_peak_mib`` is ``torch.cuda.max_memory_allocated`` over the timed calls, the figure's inputs
included (0 on the CPU). ``footprint_*`` set the estimate ``resources.gpu: auto`` shares GPUs by
(`robusttune.problem.footprint`, less the CUDA context it assumes) against those peaks:
``*_over_peak`` above 1 is an estimate on the safe side (nan on the CPU, where there is no
peak); ``cuda_context_*_mib`` is what a side-by-side worker's process holds on the GPU beyond
PyTorch's reserved memory (NVML), the context the estimate assumes at 512 MiB. The
``deterministic_*`` figures come from a child process started with
``CUBLAS_WORKSPACE_CONFIG=:4096:8`` and ``torch.use_deterministic_algorithms(True,
warn_only=True)``, since the cuBLAS setting must precede CUDA's start.
"""

from __future__ import annotations

import argparse
import contextlib
import math
import os
import statistics
import subprocess
import sys
import threading
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
for _path in (str(HERE.parent), str(HERE)):  # robusttune, and the other bench scripts' helpers
    if _path not in sys.path:
        sys.path.insert(0, _path)

# after the path above: the helpers are bench/aggregators.py and bench/training.py
import aggregators as bench_aggregators  # noqa: E402
import torch  # noqa: E402
import training as bench_training  # noqa: E402
from figure_lines import Figures  # noqa: E402

from robusttune.core.runspec import RunSpec  # noqa: E402
from robusttune.engine.simulation import Simulation  # noqa: E402
from robusttune.methods.aggregators import AGGREGATORS, make_aggregator  # noqa: E402
from robusttune.methods.aggregators.swb_blocks import ROTATIONS  # noqa: E402
from robusttune.problem.evaluation import evaluate  # noqa: E402
from robusttune.problem.footprint import run_footprint  # noqa: E402
from robusttune.problem.models import flat_params, make_model  # noqa: E402
from robusttune.problem.training import client_gradients, train_clients  # noqa: E402

# SWB-DM paper, Table V (N = 500, p = 0.1): aggregation seconds per round of SWB over the 50
# sampled states and of SWB-DM over the 500 cached ones. The target: divide by >= 50.
PAPER_SWB_N50_S = 6.18
PAPER_SWB_DM_N500_S = 13.35
HEADLINE = "batched_vs_sequential_cnn2_50_clients"
NONDETERMINISTIC = "does not have a deterministic implementation"


@dataclass(frozen=True)
class Sizes:
    """The workload of one mode. Figure names always use the full sizes."""

    image_shape: tuple[int, int, int]
    train_clients: tuple[int, int]  # named 10 and 50
    train_images: int  # mean images per client (spread over [0.5, 1.5] x mean)
    epochs: int
    batch_size: int
    d: int  # message length of the aggregation figures
    swb_n: tuple[int, int, int]  # named 20, 50, 500
    demoa_clients: int  # named 25
    swb_dm_clients: int  # named 500
    samples: int  # synthetic training set of the two simulated rounds
    rounds: int  # timed DeMoA rounds (a round is milliseconds)
    side_by_side: tuple[int, int, int]  # runs at once on one device, named 1, 4, 16
    wave_runs: int  # runs each side-by-side worker makes in a timed wave
    wave_rounds: int  # rounds of each of those runs
    fashion_samples: int  # the Fashion-MNIST-shaped synthetic training set

    @property
    def shape_text(self) -> str:
        return "x".join(map(str, self.image_shape))


# Full: the SWB-DM setup (cnn2 on CIFAR-shaped data, d = 545,098, 2 local epochs, batch 32,
# N = 500 with p = 0.1, a CIFAR-sized training set) and bench/training.py's ~600 images a client.
FULL = Sizes(
    (3, 32, 32),
    (10, 50),
    600,
    2,
    32,
    bench_aggregators.D,
    (20, 50, 500),
    25,
    500,
    50_000,
    30,
    (1, 4, 16),
    3,
    5,
    12_000,
)
TINY = Sizes((3, 8, 8), (3, 5), 24, 1, 8, 8192, (6, 10, 20), 5, 20, 400, 5, (1, 2, 3), 1, 2, 400)
FULL_NAMES = {"clients": (10, 50), "n": (20, 50, 500), "side_by_side": (1, 4, 16)}
# A map's runs (issue 45): the MLP on digits, and on synthetic data of Fashion-MNIST's shape (the
# GPU machine has no dataset files), 20 clients, all sampled, one local epoch, median.
WORKLOADS = {"digits_mlp": (1, 8, 8), "fashion_mlp": (1, 28, 28)}


def rule_names() -> list[str]:
    """Every registered rule but swb, whose n = 500 figure is ``swb_haar_n500``."""
    return [name for name in AGGREGATORS.names() if name != "swb"]


def figure_names() -> list[str]:
    """Every figure line the script prints, in order (the test checks each appears once)."""
    names: list[str] = []
    timed = lambda base: [f"{base}_seconds", f"{base}_peak_mib"]  # noqa: E731
    for c in FULL_NAMES["clients"]:
        names += timed(f"train_sequential_cnn2_{c}_clients") + timed(
            f"train_batched_cnn2_{c}_clients"
        )
        if c == 10:  # the 50-client ratio is the headline, printed last
            names += [
                "batched_vs_sequential_cnn2_10_clients",
                "batched_vs_sequential_max_abs_diff_cnn2_10_clients",
                "batched_repeat_max_abs_diff_cnn2_10_clients",
                "sync_calls_train_sequential_cnn2_10_clients",
                "sync_calls_train_batched_cnn2_10_clients",
            ]
    names.append("sync_calls_client_gradients_batched_25_clients")
    for n in FULL_NAMES["n"]:
        for rotation in ROTATIONS:
            names += timed(f"swb_{rotation}_n{n}")
        if n == 50:
            names += [
                *timed("swb_published_loop_n50"),
                "swb_published_loop_over_haar_n50",
                "swb_paper_n50_over_haar",
            ]
    names.append("swb_paper_n500_over_haar")
    for name in rule_names():
        names += timed(f"rule_{name}_n500")
    names += [*timed("demoa_round_n25"), "sync_calls_demoa_round_n25"]
    names += [f"footprint_demoa_round_n25_{what}" for what in ("estimate_mib", "over_peak")]
    for dtype in ("float32", "bfloat16"):
        names += [*timed(f"swb_dm_round_n500_{dtype}"), f"swb_dm_cache_n500_{dtype}_mib"]
        if dtype == "float32":  # the estimate does not model a bfloat16 cache
            names += [
                f"footprint_swb_dm_round_n500_float32_{what}"
                for what in ("estimate_mib", "over_peak")
            ]
    for workload in WORKLOADS:
        for k in FULL_NAMES["side_by_side"]:
            names += [
                f"side_by_side_{workload}_{k}_runs_per_s",
                f"side_by_side_{workload}_{k}_device_busy_percent",
                f"side_by_side_{workload}_{k}_runs_per_s_cpu",
            ]
        names += [f"side_by_side_{workload}_16_device_vs_cpu"]
        names += [
            f"footprint_{workload}_estimate_mib",
            f"footprint_{workload}_peak_mib",
            f"footprint_{workload}_over_peak",
            f"cuda_context_{workload}_mib",
        ]
        names += timed(f"stacked_{workload}_16") + timed(f"one_at_a_time_{workload}")
        names += [
            f"stacked_{workload}_16_runs_per_s",
            f"stacked_vs_one_at_a_time_{workload}_16",
            f"stacked_vs_side_by_side_{workload}_16",
        ]
    names += [
        "deterministic_train_batched_cnn2_10_clients_seconds",
        "deterministic_batched_repeat_max_abs_diff_cnn2_10_clients",
        "deterministic_nondeterministic_op_warnings",
        "deterministic_vs_default_batched_cnn2_10_clients",
        "gpu_bench_seconds",
        HEADLINE,
    ]
    return names


class Bench(Figures):
    """Timing on one device, the run's time budget, and the figure lines."""

    def __init__(
        self, device: torch.device, repeats: int, budget_s: float, figure_budget_s: float
    ) -> None:
        super().__init__()
        self.device = device
        self.cuda = device.type == "cuda"
        self.repeats = repeats
        self.started = time.perf_counter()
        self.deadline = self.started + budget_s
        self.figure_budget_s = figure_budget_s

    # -- timing ------------------------------------------------------------------------------
    def sync(self) -> None:
        if self.cuda:
            torch.cuda.synchronize(self.device)

    def expired(self) -> bool:
        return time.perf_counter() > self.deadline

    def timed(
        self,
        base: str,
        fn: Callable[[], Any],
        *,
        repeats: int | None = None,
        warmup: Callable[[], Any] | None = None,
    ) -> tuple[float, Any]:
        """Print ``<base>_seconds`` (median of the timed calls) and ``<base>_peak_mib``; return
        (seconds, the last call's result). ``warmup`` (default: ``fn``) runs once untimed."""
        seconds, peak, out = math.nan, math.nan, None
        if self.expired():
            self.note(f"{base}: skipped, the run's time budget is spent")
        else:
            try:
                seconds, peak, out = self._measure(fn, repeats or self.repeats, warmup or fn)
            except Exception as error:  # one broken figure must not hide the others
                self.failed.append(base)
                self.note(f"{base} failed: {type(error).__name__}: {str(error)[:300]}")
                self.free()
        self.figure(f"{base}_seconds", seconds)
        self.figure(f"{base}_peak_mib", peak)
        return seconds, out

    def _measure(
        self, fn: Callable[[], Any], repeats: int, warmup: Callable[[], Any]
    ) -> tuple[float, float, Any]:
        began = time.perf_counter()
        warmup()
        self.sync()
        if self.cuda:
            torch.cuda.reset_peak_memory_stats(self.device)
        times, out = [], None
        for _ in range(repeats):
            self.sync()
            t0 = time.perf_counter()
            out = fn()
            self.sync()
            times.append(time.perf_counter() - t0)
            if time.perf_counter() - began > self.figure_budget_s or self.expired():
                break
        if len(times) < repeats:
            self.note(
                f"  {len(times)} of {repeats} timed calls (figure budget "
                f"{self.figure_budget_s:g} s, warm-up included)"
            )
        peak = torch.cuda.max_memory_allocated(self.device) / 2**20 if self.cuda else 0.0
        return statistics.median(times), peak, out

    def sync_calls(self, fn: Callable[[], Any]) -> int:
        """Synchronising CUDA calls made by one call of ``fn`` (``set_sync_debug_mode`` warns at
        each); 0 on the CPU, where nothing waits for a device."""
        if not self.cuda:
            fn()
            return 0
        self.sync()
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            torch.cuda.set_sync_debug_mode("warn")
            try:
                fn()
            finally:
                torch.cuda.set_sync_debug_mode("default")
        self.sync()
        return sum("synchroniz" in str(w.message) for w in caught)

    def free(self) -> None:
        if self.cuda:
            torch.cuda.empty_cache()


# -- figures -----------------------------------------------------------------------------------


def client_data(
    sizes: Sizes,
    clients: int,
    device: torch.device,
    *,
    shape: tuple[int, ...] | None = None,
    per_client: int | None = None,
    seed: int = 0,
) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """bench/training.py's unequal clients (CIFAR-shaped, ``sizes.train_images`` each on
    average, unless ``shape`` and ``per_client`` say otherwise), on the device (as the
    simulation holds them), so the figures time training and not host-to-device copies."""
    data = bench_training.synthetic_clients(
        clients, per_client or sizes.train_images, shape or sizes.image_shape, 10, seed=seed
    )
    return [(x.to(device), y.to(device)) for x, y in data]


def training_figures(bench: Bench, sizes: Sizes) -> None:
    model = make_model("cnn2", sizes.image_shape, 10, seed=0).to(bench.device)
    start = flat_params(model)
    for clients, named in zip(sizes.train_clients, FULL_NAMES["clients"]):
        data = client_data(sizes, clients, bench.device)

        def train(strategy: str, data=data) -> torch.Tensor:
            return train_clients(
                model,
                start,
                data,
                epochs=sizes.epochs,
                batch_size=sizes.batch_size,
                lr=0.01,
                momentum=0.9,
                seeds=list(range(len(data))),
                strategy=strategy,
            )

        seq_s, seq = bench.timed(
            f"train_sequential_cnn2_{named}_clients", lambda: train("sequential")
        )
        bat_s, bat = bench.timed(f"train_batched_cnn2_{named}_clients", lambda: train("batched"))
        if named == 50:  # the headline, printed last
            bench.values[HEADLINE] = seq_s / bat_s if bat_s > 0 else math.nan
            continue
        bench.ratio(f"batched_vs_sequential_cnn2_{named}_clients", seq_s, bat_s)
        # the device's batched path against its sequential one (the CPU test holds 1e-5)
        diff = (bat - seq).abs().max().item() if bat is not None and seq is not None else math.nan
        bench.figure("batched_vs_sequential_max_abs_diff_cnn2_10_clients", diff)
        again = train("batched") if bat is not None else None
        diff = (again - bat).abs().max().item() if again is not None else math.nan
        bench.figure("batched_repeat_max_abs_diff_cnn2_10_clients", diff)
        bench.figure(
            "sync_calls_train_sequential_cnn2_10_clients",
            bench.sync_calls(lambda: train("sequential")),
        )
        bench.figure(
            "sync_calls_train_batched_cnn2_10_clients", bench.sync_calls(lambda: train("batched"))
        )
    # a DeMoA round's client work: one minibatch gradient each for N = 25 clients
    data = client_data(sizes, sizes.demoa_clients, bench.device)
    bench.figure(
        "sync_calls_client_gradients_batched_25_clients",
        bench.sync_calls(
            lambda data=data: client_gradients(
                model,
                start,
                data,
                batch_size=sizes.batch_size,
                seeds=list(range(len(data))),
                strategy="batched",
            )
        ),
    )
    del data
    bench.free()


def aggregation_figures(bench: Bench, sizes: Sizes) -> None:
    haar: dict[int, float] = {}
    for n, named in zip(sizes.swb_n, FULL_NAMES["n"]):
        f = n // 5
        x, honest = bench_aggregators.messages(n, f, seed=n, d=sizes.d, device=bench.device)
        for rotation in ROTATIONS:
            agg = make_aggregator("swb", trim_ratio=0.25, swb_rotation=rotation)
            gen = torch.Generator(device=bench.device).manual_seed(2)
            # the default arguments bind this iteration's rule, messages and generator
            seconds, _ = bench.timed(
                f"swb_{rotation}_n{named}",
                lambda agg=agg, x=x, gen=gen: agg(x, generator=gen),
                repeats=min(bench.repeats, 2) if named == 500 else None,
            )
            if rotation == "haar":
                haar[named] = seconds
        if named == 50:
            gen = torch.Generator(device=bench.device).manual_seed(1)
            loop = lambda y=x, gen=gen: bench_aggregators.published_swb_loop(  # noqa: E731
                y, chunk=bench_aggregators.CHUNK, views=2, trim_ratio=0.25, generator=gen
            )
            # one call: 2 x 1,065 QR factorisations; warmed up on one chunk
            loop_s, _ = bench.timed(
                "swb_published_loop_n50",
                loop,
                repeats=1,
                warmup=lambda loop=loop, x=x: loop(x[:, : bench_aggregators.CHUNK]),
            )
            bench.ratio("swb_published_loop_over_haar_n50", loop_s, haar[50])
            bench.ratio("swb_paper_n50_over_haar", PAPER_SWB_N50_S, haar[50])
        if named == 500:
            bench.ratio("swb_paper_n500_over_haar", PAPER_SWB_DM_N500_S, haar[500])
            reference = honest + 0.001  # FLTrust's server message: near the honest mean
            for name in rule_names():
                agg = bench_aggregators.rule(name, f)
                gen = torch.Generator(device=bench.device).manual_seed(0)
                bench.timed(
                    f"rule_{name}_n500",
                    lambda agg=agg, x=x, reference=reference, gen=gen: agg(
                        x, reference=reference, previous=None, generator=gen
                    ),
                    repeats=2,
                )
        del x, honest
        bench.free()


def round_spec(sizes: Sizes, device: torch.device, **keys: Any) -> RunSpec:
    """A run on the synthetic CIFAR-shaped set (no files needed), never evaluated or
    checkpointed, so a step is one round's training, attack and aggregation.

    In native numerics, as every other figure here: by then this process has computed, which
    the portable mode refuses (robusttune.core.numerics.pin), and on CUDA the portable mode's cost is
    what the ``deterministic_*`` figures measure."""
    return RunSpec(
        dataset="synthetic",
        synthetic_shape=sizes.shape_text,
        synthetic_classes=10,
        synthetic_samples=sizes.samples,
        model="cnn2",
        byzantine_fraction=0.2,
        rounds=10**6,
        eval_every=10**6,
        checkpoint_every=0,
        device=str(device),
        seed=0,
        numerics="native",
        **keys,
    )


def round_figures(bench: Bench, sizes: Sizes) -> None:
    d = flat_params(make_model("cnn2", sizes.image_shape, 10, seed=0)).numel()
    # DeMoA's setting (N = 25, Bernoulli p = 0.1, CCLIP), under ALIE: one minibatch step a round
    if bench.expired():
        bench.timed("demoa_round_n25", lambda: None)
        bench.figure("sync_calls_demoa_round_n25", math.nan)
        footprint_figures(bench, "demoa_round_n25", None, math.nan)
    else:
        sim = Simulation(
            round_spec(
                sizes,
                bench.device,
                clients=sizes.demoa_clients,
                participation=0.1,
                participation_mode="bernoulli",
                method="demoa",
                attack="alie",
            )
        )
        bench.timed(
            "demoa_round_n25",
            sim.step,
            repeats=sizes.rounds,
            warmup=lambda: [sim.step() for _ in range(3)],
        )
        # a round should wait for the device once, for its record (no evaluation in this round)
        bench.figure("sync_calls_demoa_round_n25", bench.sync_calls(sim.step))
        footprint_figures(
            bench, "demoa_round_n25", sim.spec, bench.values["demoa_round_n25_peak_mib"]
        )
        del sim
    # SWB-DM at the paper's scale: N = 500 cached states, p = 0.1 (50 trained a round), IPM
    for dtype in ("float32", "bfloat16"):
        base = f"swb_dm_round_n500_{dtype}"
        spec = round_spec(
            sizes,
            bench.device,
            clients=sizes.swb_dm_clients,
            participation=0.1,
            method="swb_dm",
            attack="ipm",
            cache_dtype=dtype,
        )
        if bench.expired():
            bench.timed(base, lambda: None)
        else:
            sim = Simulation(spec)
            bench.timed(base, sim.step, repeats=min(bench.repeats, 3))
            del sim
        # the slots at rest; a round also holds a float32 copy of them while SWB reads it
        bench.figure(
            f"swb_dm_cache_n500_{dtype}_mib",
            sizes.swb_dm_clients * d * (4 if dtype == "float32" else 2) / 2**20,
        )
        if dtype == "float32":
            footprint_figures(bench, base, spec, bench.values[f"{base}_peak_mib"])
        bench.free()


def footprint_estimate_mib(spec: RunSpec, evaluated: bool) -> float:
    """The run's estimated device memory less the CUDA context (`robusttune.problem.footprint`),
    without the evaluation part unless ``evaluated`` (the simulated rounds are never evaluated)."""
    parts = run_footprint(spec)
    activations = max(parts.training, parts.evaluation) if evaluated else parts.training
    return (parts.data + parts.state + activations) / 2**20


def footprint_figures(bench: Bench, base: str, spec: RunSpec | None, peak_mib: float) -> None:
    """``footprint_<base>_estimate_mib`` of a simulated round's run (`footprint_estimate_mib`)
    and ``footprint_<base>_over_peak``, that over the measured ``peak_mib`` (nan on the CPU)."""
    estimate = math.nan if spec is None else footprint_estimate_mib(spec, evaluated=False)
    bench.figure(f"footprint_{base}_estimate_mib", estimate)
    bench.ratio(f"footprint_{base}_over_peak", estimate, peak_mib if bench.cuda else 0.0)


# -- runs side by side, and stacked (issue 45: many short runs per GPU) -----------------------


def wave_spec(workload: str, device: str, sizes: Sizes, seed: int) -> RunSpec:
    """One run of a map's kind: ``WORKLOADS[workload]``, ``sizes.wave_rounds`` rounds, evaluated
    at its end only, never checkpointed; native numerics (see `round_spec`)."""
    data: dict[str, Any] = (
        {"dataset": "digits"}
        if workload == "digits_mlp"
        else {
            "dataset": "synthetic",
            "synthetic_shape": "x".join(map(str, WORKLOADS[workload])),
            "synthetic_samples": sizes.fashion_samples,
        }
    )
    return RunSpec(
        **data,
        model="mlp",
        clients=20,
        participation=1.0,
        rounds=sizes.wave_rounds,
        local_epochs=1,
        batch_size=16,
        lr=0.05,
        aggregator="median",
        eval_every=sizes.wave_rounds,
        checkpoint_every=0,
        device=device,
        seed=seed,
        numerics="native",
    )


def wave_worker(conn: Any, device: str) -> None:
    """A worker process standing in for one Ray trial (one CPU thread, its own CUDA context):
    for each task, one untimed run (data, kernels, allocator), "ready", then on "go" the timed
    runs one after another, and their (start, end) on the machine's monotonic clock, the peak
    allocated over them and the memory its process holds beyond PyTorch's reserved
    (`process_overhead_bytes`), in bytes (0 on the CPU)."""
    torch.set_num_threads(1)
    while (task := conn.recv()) is not None:
        workload, sizes, first_seed = task
        try:
            for _ in Simulation(wave_spec(workload, device, sizes, seed=10_000 + first_seed)):
                pass
            conn.send(("ready", None))
            conn.recv()
            if device == "cuda":
                torch.cuda.reset_peak_memory_stats()
            began = time.monotonic()
            for seed in range(first_seed, first_seed + sizes.wave_runs):
                for _ in Simulation(wave_spec(workload, device, sizes, seed)):
                    pass
            peak, overhead = 0.0, 0.0
            if device == "cuda":
                torch.cuda.synchronize()
                peak, overhead = torch.cuda.max_memory_allocated(), process_overhead_bytes()
            conn.send(("done", (began, time.monotonic(), peak, overhead)))
        except Exception as error:  # reported by the parent as the figure's failure
            conn.send(("error", f"{type(error).__name__}: {str(error)[:300]}"))


def process_overhead_bytes() -> float:
    """What this process holds on GPU 0 by NVML beyond PyTorch's reserved memory: its CUDA
    context and loaded kernels; nan where NVML does not report processes (no nvidia-ml-py, or a
    sandbox that hides them)."""
    try:
        import pynvml

        pynvml.nvmlInit()
        handle = pynvml.nvmlDeviceGetHandleByIndex(0)
        used = [
            p.usedGpuMemory
            for p in pynvml.nvmlDeviceGetComputeRunningProcesses(handle)
            if p.pid == os.getpid()
        ]
    except Exception:  # no binding or no process list: the figure is nan
        return math.nan
    if not used or used[0] is None:
        return math.nan
    return float(used[0]) - torch.cuda.memory_reserved()


class WavePool:
    """``size`` worker processes (spawned: CUDA cannot follow a fork) on one device."""

    def __init__(self, device: str, size: int) -> None:
        import multiprocessing

        context = multiprocessing.get_context("spawn")
        self.device = device
        self.workers = []
        for _ in range(size):
            mine, theirs = context.Pipe()
            process = context.Process(target=wave_worker, args=(theirs, device), daemon=True)
            process.start()
            self.workers.append((process, mine))

    def wave(
        self, bench: Bench, workload: str, sizes: Sizes, k: int
    ) -> tuple[float, float, float, float]:
        """(runs per second, mean device-busy percent, the largest peak allocated by a worker,
        the largest process overhead of one) of ``k`` workers each making ``sizes.wave_runs``
        runs at once: runs / (last end - first start); the memory in bytes, 0 on the CPU."""
        conns = [conn for _, conn in self.workers[:k]]
        for i, conn in enumerate(conns):
            conn.send((workload, sizes, 100 * i))
        self._expect(bench, conns, "ready")
        busy: list[float] = []
        stop = threading.Event()
        sampler = threading.Thread(target=_sample_busy, args=(self.device, busy, stop), daemon=True)
        sampler.start()
        for conn in conns:
            conn.send("go")
        spans = self._expect(bench, conns, "done")
        stop.set()
        sampler.join()
        wall = max(span[1] for span in spans) - min(span[0] for span in spans)
        return (
            k * sizes.wave_runs / wall,
            statistics.fmean(busy) if busy else 0.0,
            max(span[2] for span in spans),
            max(span[3] for span in spans),
        )

    @staticmethod
    def _expect(bench: Bench, conns: list[Any], what: str) -> list[Any]:
        out = []
        for conn in conns:
            if not conn.poll(max(1.0, bench.deadline - time.perf_counter() + 60)):
                raise TimeoutError(f"a side-by-side worker sent no {what!r} in time")
            kind, value = conn.recv()
            if kind == "error":
                raise RuntimeError(value)
            out.append(value)
        return out

    def close(self) -> None:
        for _, conn in self.workers:
            with contextlib.suppress(OSError):  # a worker that died has closed its end
                conn.send(None)
        for process, _ in self.workers:
            process.join(timeout=10)
            if process.is_alive():
                process.kill()


def _sample_busy(device: str, busy: list[float], stop: threading.Event) -> None:
    """``torch.cuda.utilization`` (NVML: the share of the last sample period in which a kernel
    ran) every 50 ms until ``stop``; nothing on the CPU."""
    if device != "cuda":
        return
    while not stop.wait(0.05):
        try:
            busy.append(float(torch.cuda.utilization()))
        except Exception:  # no NVML binding on this machine: the figure is nan
            busy.append(math.nan)
            return


def stacked_runs(
    sizes: Sizes,
    workload: str,
    device: torch.device,
    runs: int,
    strategy: str,
    rounds: int | None = None,
) -> Callable[[], torch.Tensor]:
    """``runs`` runs of `wave_spec`'s shape (20 clients, one epoch, batch 16, median) on
    bench/training.py's synthetic clients of the workload's shape (digits' ~72 images a client,
    Fashion-MNIST's samples / 20), as one computation when ``strategy`` is batched: each round
    trains the runs' clients in one `train_clients` call from their own runs' models and takes
    every run's coordinate-wise median at once; then each run is evaluated once. With ``runs=1``
    and the device's own trainer it is one run at a time, the reference. ``rounds``: fewer
    rounds, for a warm-up."""
    shape, clients = WORKLOADS[workload], 20
    per_client = 72 if workload == "digits_mlp" else sizes.fashion_samples // clients
    model = make_model("mlp", shape, 10, seed=0).to(device)
    start = flat_params(model)
    data = client_data(sizes, clients, device, shape=shape, per_client=per_client) * runs
    ((test_x, test_y),) = client_data(sizes, 1, device, shape=shape, per_client=360, seed=1)
    seeds = list(range(len(data)))

    def run() -> torch.Tensor:
        theta = start.unsqueeze(0).repeat(runs, 1)
        for _ in range(rounds or sizes.wave_rounds):
            trained = train_clients(
                model,
                theta.repeat_interleave(clients, 0),
                data,
                epochs=1,
                batch_size=16,
                lr=0.05,
                momentum=0.0,
                seeds=seeds,
                strategy=strategy,
            )
            theta = trained.view(runs, clients, -1).median(dim=1).values
        return torch.tensor(
            [evaluate(model, theta[r], test_x, test_y).accuracy for r in range(runs)]
        )

    return run


def side_by_side_figures(bench: Bench, sizes: Sizes) -> None:
    """Runs per second of waves of a map's runs, 1, 4 and 16 at once on the device (worker
    processes standing in for trials that share it, as fractional GPUs do) and on as many CPU
    cores, the device's busy share during its waves, and the same runs stacked into one
    computation (`stacked_runs`) against one at a time and against 16 side by side."""
    devices = [str(bench.device.type), "cpu"]
    largest = max(sizes.side_by_side)
    pools: dict[str, WavePool] = {}
    try:
        for workload in WORKLOADS:
            per_s: dict[tuple[str, int], float] = {}
            alone = (math.nan, math.nan)
            for k, named in zip(sizes.side_by_side, FULL_NAMES["side_by_side"]):
                for which, device in zip(("", "_cpu"), devices):
                    if which == "_cpu" and bench.device.type == "cpu":
                        per_s[(which, named)] = per_s[("", named)]  # the same measurement
                        bench.figure(
                            f"side_by_side_{workload}_{named}_runs_per_s_cpu", per_s[("", named)]
                        )
                        continue
                    value, busy, peak, overhead = math.nan, math.nan, math.nan, math.nan
                    if bench.expired():
                        bench.note(
                            f"side_by_side_{workload}_{named}{which}: skipped, the run's "
                            f"time budget is spent"
                        )
                    else:
                        try:
                            if device not in pools:
                                pools[device] = WavePool(device, largest)
                            pool = pools[device]
                            value, busy, peak, overhead = pool.wave(bench, workload, sizes, k)
                        except Exception as error:
                            bench.failed.append(f"side_by_side_{workload}_{named}{which}")
                            bench.note(
                                f"side_by_side_{workload}_{named}{which} failed: "
                                f"{type(error).__name__}: {str(error)[:300]}"
                            )
                    per_s[(which, named)] = value
                    if which == "" and named == 1:  # one run alone on the device: its own peak
                        alone = (peak, overhead)
                    if which == "":
                        bench.figure(f"side_by_side_{workload}_{named}_runs_per_s", value)
                        bench.figure(
                            f"side_by_side_{workload}_{named}_device_busy_percent",
                            busy if bench.cuda else 0.0,
                        )
                    else:
                        bench.figure(f"side_by_side_{workload}_{named}_runs_per_s_cpu", value)
            bench.ratio(
                f"side_by_side_{workload}_16_device_vs_cpu", per_s[("", 16)], per_s[("_cpu", 16)]
            )
            # the estimate of a whole run (evaluated at its end) against one run alone's peak
            peak, overhead = alone
            estimate = bench.figure(
                f"footprint_{workload}_estimate_mib",
                footprint_estimate_mib(wave_spec(workload, "cpu", sizes, 0), evaluated=True),
            )
            bench.figure(f"footprint_{workload}_peak_mib", peak / 2**20)
            bench.ratio(f"footprint_{workload}_over_peak", estimate, peak / 2**20)
            bench.figure(f"cuda_context_{workload}_mib", overhead / 2**20)
            runs = sizes.side_by_side[-1]
            # warmed up on one round: a whole stacked wave on 16 CPU cores' worth of runs is long
            stacked_s, _ = bench.timed(
                f"stacked_{workload}_16",
                stacked_runs(sizes, workload, bench.device, runs, "batched"),
                repeats=2,
                warmup=stacked_runs(sizes, workload, bench.device, runs, "batched", rounds=1),
            )
            one_s, _ = bench.timed(
                f"one_at_a_time_{workload}",
                stacked_runs(sizes, workload, bench.device, 1, "auto"),
                repeats=2,
            )
            stacked = runs / stacked_s if stacked_s > 0 else math.nan
            bench.figure(f"stacked_{workload}_16_runs_per_s", stacked)
            bench.ratio(
                f"stacked_vs_one_at_a_time_{workload}_16",
                stacked,
                1 / one_s if one_s > 0 else math.nan,
            )
            bench.ratio(f"stacked_vs_side_by_side_{workload}_16", stacked, per_s[("", 16)])
    finally:
        for pool in pools.values():
            pool.close()
        bench.free()


def deterministic_child(bench: Bench, sizes: Sizes) -> None:
    """In the child process: batched training under deterministic algorithms, and how many
    operations of the training, DeMoA and aggregation paths have no deterministic kernel."""
    model = make_model("cnn2", sizes.image_shape, 10, seed=0).to(bench.device)
    start = flat_params(model)
    data = client_data(sizes, sizes.train_clients[0], bench.device)

    def train() -> torch.Tensor:
        return train_clients(
            model,
            start,
            data,
            epochs=sizes.epochs,
            batch_size=sizes.batch_size,
            lr=0.01,
            momentum=0.9,
            seeds=list(range(len(data))),
            strategy="batched",
        )

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        seconds, _, out = bench._measure(train, bench.repeats, train)
        again = train()
        train_clients(
            model,
            start,
            data,
            epochs=1,
            batch_size=sizes.batch_size,
            lr=0.01,
            momentum=0.9,
            seeds=list(range(len(data))),
            strategy="sequential",
        )
        client_gradients(
            model,
            start,
            data,
            batch_size=sizes.batch_size,
            seeds=list(range(len(data))),
            strategy="batched",
        )
        x, _ = bench_aggregators.messages(20, 4, seed=0, d=8192, device=bench.device)
        gen = torch.Generator(device=bench.device).manual_seed(0)
        for name in AGGREGATORS.names():
            bench_aggregators.rule(name, 4)(x, reference=x[0], previous=None, generator=gen)
    ops = sorted(
        {str(w.message).split(" does not")[0] for w in caught if NONDETERMINISTIC in str(w.message)}
    )
    for op in ops:
        bench.note(f"no deterministic kernel: {op}")
    bench.figure("deterministic_train_batched_cnn2_10_clients_seconds", seconds)
    bench.figure(
        "deterministic_batched_repeat_max_abs_diff_cnn2_10_clients",
        (again - out).abs().max().item(),
    )
    bench.figure(
        "deterministic_nondeterministic_op_warnings",
        sum(NONDETERMINISTIC in str(w.message) for w in caught),
    )


def deterministic_figures(bench: Bench, argv: list[str]) -> None:
    names = [
        "deterministic_train_batched_cnn2_10_clients_seconds",
        "deterministic_batched_repeat_max_abs_diff_cnn2_10_clients",
        "deterministic_nondeterministic_op_warnings",
    ]
    left = bench.deadline - time.perf_counter()
    values: dict[str, float] = {}
    if left < 30:
        bench.note("deterministic figures: skipped, the run's time budget is spent")
    else:
        env = {**os.environ, "CUBLAS_WORKSPACE_CONFIG": ":4096:8"}
        try:
            child = subprocess.run(
                [sys.executable, __file__, *argv, "--deterministic-child"],
                env=env,
                capture_output=True,
                text=True,
                timeout=left,
                check=False,
            )
            for line in child.stdout.splitlines():
                if line.startswith("#"):
                    print(line, flush=True)
                elif ":" in line:
                    key, value = line.rsplit(":", 1)
                    values[key.strip()] = float(value)
            if child.returncode != 0:
                bench.failed.append("deterministic")
                bench.note(f"deterministic child exited {child.returncode}: {child.stderr[-300:]}")
        except subprocess.TimeoutExpired:
            bench.failed.append("deterministic")
            bench.note("deterministic child ran past the run's time budget")
    for name in names:
        bench.figure(name, values.get(name, math.nan))
    bench.ratio(
        "deterministic_vs_default_batched_cnn2_10_clients",
        values.get(names[0], math.nan),
        bench.values.get("train_batched_cnn2_10_clients_seconds", math.nan),
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cpu", action="store_true", help="run on the CPU even when CUDA is there")
    parser.add_argument(
        "--tiny", action="store_true", help="toy sizes: a smoke run, not a measurement"
    )
    parser.add_argument(
        "--repeats", type=int, default=3, help="timed calls per figure (median kept)"
    )
    parser.add_argument(
        "--budget-s",
        type=float,
        default=240.0,
        help="figures reached after this many seconds print nan (default 4 min: "
        "bench/gpu_tune.py has the rest of bench/gpu.sh's 9)",
    )
    parser.add_argument(
        "--total-budget-s",
        type=float,
        default=None,
        help="bench/gpu_tune.py's (bench/gpu.sh passes its options to both)",
    )
    parser.add_argument(
        "--figure-budget-s",
        type=float,
        default=30.0,
        help="a figure stops repeating once it has used this long",
    )
    parser.add_argument("--deterministic-child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    passthrough = [
        a for a in (argv if argv is not None else sys.argv[1:]) if a != "--deterministic-child"
    ]

    if not args.cpu and not torch.cuda.is_available():
        print(
            "# no CUDA device visible: run with --cpu (and --tiny for a smoke run)", file=sys.stderr
        )
        return 2
    device = torch.device("cpu" if args.cpu else "cuda")
    sizes = TINY if args.tiny else FULL
    if args.tiny:
        torch.set_num_threads(1)  # a smoke run on a shared machine: predictable, not fast
    bench = Bench(device, args.repeats, args.budget_s, args.figure_budget_s)

    if args.deterministic_child:
        torch.use_deterministic_algorithms(True, warn_only=True)
        torch.backends.cudnn.deterministic = True
        torch.backends.cudnn.benchmark = False
        deterministic_child(bench, sizes)
        return 0

    name = torch.cuda.get_device_name(device) if bench.cuda else "cpu"
    bench.note(
        f"torch {torch.__version__}, device {name}, {torch.get_num_threads()} CPU threads, "
        f"{time.strftime('%Y-%m-%d')}"
    )
    bench.note(
        f"{'tiny' if args.tiny else 'full'} sizes: images {sizes.shape_text}, training "
        f"clients {sizes.train_clients} (named 10, 50) of ~{sizes.train_images} images, "
        f"{sizes.epochs} epoch(s), batch {sizes.batch_size}; aggregation d = {sizes.d:,}, "
        f"n = {sizes.swb_n} (named 20, 50, 500); DeMoA N = {sizes.demoa_clients} (named 25); "
        f"SWB-DM N = {sizes.swb_dm_clients} (named 500); {sizes.samples:,} synthetic images"
    )
    bench.note(
        "seconds are medians of timed calls after a warm-up; ratios > 1 favour the named "
        "first; peak_mib includes each figure's inputs"
    )
    training_figures(bench, sizes)
    aggregation_figures(bench, sizes)
    round_figures(bench, sizes)
    side_by_side_figures(bench, sizes)
    deterministic_figures(bench, passthrough)
    bench.figure("gpu_bench_seconds", time.perf_counter() - bench.started)
    if bench.failed:
        bench.note(f"failed: {', '.join(bench.failed)}")
    bench.figure(HEADLINE, bench.values.get(HEADLINE, math.nan))
    return 1 if bench.failed else 0


if __name__ == "__main__":
    sys.exit(main())
