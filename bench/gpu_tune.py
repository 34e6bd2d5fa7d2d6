"""The mission on a GPU: federated runs as Ray Tune trials sharing one GPU, the second phase of
bench/gpu.sh (after bench/gpu.py's figures, which need no Ray).

This script starts one Ray for the whole phase (every GPU and CPU of the machine; no GPU with
``--cpu``) and runs each experiment as a robusttune command in a child process that joins it
(``--address``, as on a cluster), so Ray starts once and a stuck command can be killed at the
phase's deadline:

  quickstart   ``robusttune sweep search_spaces/quickstart.yaml`` (60 trials: digits, MLP) with
               ``--set device=cuda --gpus-per-trial auto``, then the same sweep on the machine's
               CPUs (``--set device=cpu --gpus-per-trial 0``);
  map          a small breakdown map (`MAP`: median and Krum at p = 0.5, sign flip and IPM ladders,
               digits, 20 clients), the same two ways;
  cnn2_fashion a sweep of cnn2 runs on Fashion-MNIST-shaped synthetic data (the GPU machine has no
               dataset files; 20 clients, half sampled, 3 rounds: one run alone leaves a GPU mostly
               idle) at 1, 4 and 16 trials per GPU (``--gpus-per-trial 1``, ``0.25``, ``0.0625``),
               two waves of trials each.

Figures, ``tune_<experiment>_<what>: <number>`` (``_cpu``: the CPU way), in `figure_names`' order:

  trials_per_min  finished trials / (the last run's end - the first run's start) x 60, from each
                  run's summary.json (its time, less its own seconds): Ray's start, the command's
                  imports and its report are not counted; ``seconds`` is the command's wall time
  trials          finished runs (a summary.json each); a trial that failed has none
  trials_at_once  the most runs in progress at one time, from the same spans
  gpu_per_trial   the GPU each trial asked Ray for, as Tune placed it (its placement group in
                  Tune's experiment state; the median over trials, the distinct values in a note)
  gpu_busy_percent, gpu_memory_max_mib
                  NVML's utilisation (the share of time a kernel ran) and memory used on GPU 0,
                  sampled every 0.2 s during the runs (pynvml, else ``nvidia-smi``); 0 on the CPU
  device_vs_cpu   trials per minute on the GPU over the CPU way; cnn2_fashion_16_vs_1_per_gpu the
                  same for 16 trials per GPU over one

On the CPU (``--cpu``) the GPU way is the CPU way (measured once, printed under both names), and
the cnn2 sweeps hold k trials at once by ``--max-concurrent k`` (a run on ``device: cpu`` may not
hold a GPU share); ``--tiny`` shrinks every experiment to a few trials of one round on 2 CPUs, so the
test suite runs every figure (tests/test_gpu_bench.py). An experiment reached after the phase's
deadline (``--started`` + ``--total-budget-s``, bench/gpu.sh passes the command's start) prints
``nan`` with a note; one that fails or overruns prints ``nan`` and the script exits 1. Without
Ray (a machine without the bundle, bench/gpu_bundle.py) every figure is ``nan`` and it exits 1. Without
CUDA it runs only with ``--cpu`` and otherwise exits 2 at once, as bench/gpu.py does (bench/gpu.sh
then skips this phase).
Ray, PyYAML and pynvml are imported inside the functions that use them: the module imports on a
machine with none of them (tests/test_gpu_bench.py).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import math
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT / "bench") not in sys.path:  # the figure lines bench/gpu.py prints too
    sys.path.insert(0, str(ROOT / "bench"))
from figure_lines import Figures  # noqa: E402

QUICKSTART = ROOT / "search_spaces" / "quickstart.yaml"
# A small breakdown map of bench/map_throughput.py's kind: 2 cells, each bisected against the
# worst of the sign flip and IPM ladders (one seed)
MAP: dict[str, Any] = {
    "name": "tune_map",
    "run": {
        "dataset": "digits",
        "model": "mlp",
        "clients": 20,
        "local_epochs": 1,
        "lr": 0.05,
        "rounds": 5,
        "checkpoint_every": 0,
        "eval_every": 100,
    },
    "space": {
        "method": {"grid": ["median", "krum"]},
        "regime": {"grid": [{"participation": 0.5, "participation_mode": "fixed"}]},
    },
    "resources": {"cpu": 1},
    "breakdown": {
        "seeds": [42],
        "relative_threshold": 0.5,
        "max_fraction": 0.5,
        "verify_radius": 1,
        "adversary": {"attack": ["sign_flip", "ipm"]},
    },
}
# cnn2 on Fashion-MNIST's shape: 20 clients of 600 images (12,000 synthetic), 10 a round
CNN2_FASHION: dict[str, Any] = {
    "run": {
        "dataset": "synthetic",
        "synthetic_shape": "1x28x28",
        "synthetic_samples": 12_000,
        "model": "cnn2",
        "clients": 20,
        "participation": 0.5,
        "rounds": 3,
        "local_epochs": 1,
        "batch_size": 32,
        "lr": 0.05,
        "method": "median",
        "checkpoint_every": 0,
        "eval_every": 3,
    },
    "search": {"algorithm": "grid"},
}
PER_GPU = (1, 4, 16)  # trials per GPU, the names of the cnn2_fashion figures
MEASURES = (
    "trials_per_min",
    "trials",
    "trials_at_once",
    "gpu_per_trial",
    "gpu_busy_percent",
    "gpu_memory_max_mib",
    "seconds",
)
CPU_MEASURES = ("trials_per_min", "trials", "trials_at_once", "seconds")
SAMPLE_EVERY_S = 0.2


@dataclass(frozen=True)
class Sizes:
    """One mode's workload (the figure names are the full mode's)."""

    ray_cpus: int | None  # None: every core
    quickstart_grid: dict[str, Any] | None  # None: the file's own space (60 trials)
    quickstart_rounds: int | None
    map_run: dict[str, Any]  # merged into MAP's run
    map_space: dict[str, Any] | None
    cnn2_run: dict[str, Any]  # merged into CNN2_FASHION's run
    per_gpu: tuple[int, ...]  # trials per GPU, named PER_GPU
    waves: int  # cnn2 trials = waves x trials per GPU
    cnn2_cpus_per_trial: float
    min_left_s: float  # an experiment needs this much of the deadline left to start


FULL = Sizes(None, None, None, {}, None, {}, PER_GPU, 2, 1.0, 30.0)
TINY = Sizes(
    2,
    {
        "seed": {"grid": [1]},
        "method": {"grid": ["fedavg", "median"]},
        "threat": {
            "grid": [
                {"attack": "none", "byzantine_fraction": 0.0},
                {"attack": "sign_flip", "attack_strength": 10, "byzantine_fraction": 0.2},
            ]
        },
    },
    1,
    {
        "dataset": "synthetic",
        "synthetic_shape": "16",
        "synthetic_samples": 200,
        "clients": 4,
        "rounds": 1,
        "trainer": "sequential",
    },
    {
        "method": {"grid": ["mean"]},
        "regime": {"grid": [{"participation": 1.0, "participation_mode": "fixed"}]},
    },
    {
        "synthetic_shape": "1x8x8",
        "synthetic_samples": 200,
        "clients": 4,
        "rounds": 1,
        "eval_every": 1,
        "batch_size": 16,
    },
    (1, 2, 4),
    1,
    0.5,
    5.0,
)


def figure_names() -> list[str]:
    """Every figure line the phase prints, in order (the test checks each appears once)."""
    names = ["tune_ray_start_seconds"]
    for experiment in ("quickstart", "map"):
        names += [f"tune_{experiment}_{m}" for m in MEASURES]
        names += [f"tune_{experiment}_cpu_{m}" for m in CPU_MEASURES]
        names.append(f"tune_{experiment}_device_vs_cpu")
    for k in PER_GPU:
        names += [f"tune_cnn2_fashion_{k}_per_gpu_{m}" for m in MEASURES]
    names += ["tune_cnn2_fashion_16_vs_1_per_gpu", "tune_bench_seconds"]
    return names


# -- output ------------------------------------------------------------------------------------


class Phase(Figures):
    """The phase's deadline, its failures, and the figure lines (`Figures`)."""

    def __init__(self, deadline: float, cuda: bool, sizes: Sizes) -> None:
        super().__init__()
        self.started = time.time()
        self.deadline = deadline
        self.cuda = cuda
        self.sizes = sizes

    def left_s(self) -> float:
        return self.deadline - time.time()


# -- measuring one command ---------------------------------------------------------------------


@dataclass
class Measured:
    """One experiment's figures (`MEASURES`), nan where not measured."""

    trials_per_min: float = math.nan
    trials: float = math.nan
    trials_at_once: float = math.nan
    gpu_per_trial: float = math.nan
    gpu_busy_percent: float = math.nan
    gpu_memory_max_mib: float = math.nan
    seconds: float = math.nan


def run_spans(folder: Path) -> list[tuple[float, float]]:
    """(start, end) on the wall clock of each finished run under ``folder``: its summary.json's
    modification time, less the run's own ``seconds``."""
    spans = []
    for summary in folder.rglob("summary.json"):
        end = summary.stat().st_mtime
        spans.append((end - float(json.loads(summary.read_text())["seconds"]), end))
    return spans


def most_at_once(spans: list[tuple[float, float]]) -> int:
    """The most spans that overlap at one time (a span ending as another starts: not both)."""
    events = sorted(
        [(start, 1) for start, _ in spans] + [(end, -1) for _, end in spans],
        key=lambda event: (event[0], event[1]),
    )
    running = peak = 0
    for _, change in events:
        running += change
        peak = max(peak, running)
    return peak


def placed_gpu_shares(folder: Path) -> list[float]:
    """The GPU each trial under ``folder`` asked Ray for, from the placement group Tune kept for
    it in each experiment state (``experiment_state-*.json``) found there."""
    from ray.tune import ExperimentAnalysis

    shares = []
    for state in sorted({path.parent for path in folder.rglob("experiment_state-*.json")}):
        for trial in ExperimentAnalysis(str(state)).trials:
            shares.append(float(trial.placement_group_factory.required_resources.get("GPU", 0.0)))
    return shares


class GpuSampler:
    """GPU 0's utilisation (percent) and memory used (MiB) every `SAMPLE_EVERY_S`, with the wall
    time of each sample, from NVML (pynvml) or else a streaming ``nvidia-smi``; nothing where
    neither answers, or with ``enabled`` False (the CPU)."""

    def __init__(self, enabled: bool) -> None:
        self.samples: list[tuple[float, float, float]] = []
        self.source = "none"
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._process: subprocess.Popen[str] | None = None
        if enabled:
            self._thread = threading.Thread(target=self._run, daemon=True)
            self._thread.start()

    def _run(self) -> None:
        try:
            import pynvml

            pynvml.nvmlInit()
            handle = pynvml.nvmlDeviceGetHandleByIndex(0)
            self.source = "NVML"
            while not self._stop.wait(SAMPLE_EVERY_S):
                busy = pynvml.nvmlDeviceGetUtilizationRates(handle).gpu
                used = pynvml.nvmlDeviceGetMemoryInfo(handle).used / 2**20
                self.samples.append((time.time(), float(busy), float(used)))
            return
        except Exception:  # no binding or no device: try nvidia-smi
            pass
        if shutil.which("nvidia-smi") is None:
            return
        self.source = "nvidia-smi"
        self._process = subprocess.Popen(
            [
                "nvidia-smi",
                "--id=0",
                "--query-gpu=utilization.gpu,memory.used",
                "--format=csv,noheader,nounits",
                f"--loop-ms={int(SAMPLE_EVERY_S * 1000)}",
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
        )
        if self._stop.is_set():  # stop() came while it started: it saw no process to end
            self._process.terminate()
        assert self._process.stdout is not None
        for line in self._process.stdout:
            try:
                busy, used = (float(part) for part in line.split(","))
            except ValueError:
                continue
            self.samples.append((time.time(), busy, used))

    def stop(self) -> None:
        self._stop.set()
        if self._process is not None:
            self._process.terminate()
        if self._thread is not None:
            self._thread.join(timeout=5)

    def between(self, start: float, end: float) -> tuple[float, float]:
        """(mean utilisation, largest memory used) over the samples taken in [start, end]."""
        inside = [(busy, used) for when, busy, used in self.samples if start <= when <= end]
        if not inside:
            return math.nan, math.nan
        return statistics.fmean(b for b, _ in inside), max(u for _, u in inside)


def run_command(
    phase: Phase, name: str, args: list[str], folder: Path, address: str, expected: int
) -> Measured:
    """Run ``robusttune <args>`` joined to the phase's Ray (its results under ``folder``), the GPU
    sampled meanwhile, killed at the phase's deadline; its `Measured` figures. A command that
    fails, overruns or finishes fewer than ``expected`` runs is noted and counted as failed."""
    measured = Measured()
    left = phase.left_s()
    if left < phase.sizes.min_left_s:
        phase.note(f"tune_{name}: skipped, the phase's time budget is spent")
        return measured
    command = [sys.executable, "-m", "robusttune.commands.cli", *args, "--address", address]
    env = {**os.environ, "RAY_AUTH_MODE": "disabled"}
    sampler = GpuSampler(phase.cuda)
    began = time.time()
    process = subprocess.Popen(
        command,
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    try:
        output, _ = process.communicate(timeout=left)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        output, _ = process.communicate()
        phase.failed.append(name)
        phase.note(f"tune_{name}: killed at the phase's deadline ({left:.0f} s)")
    finally:
        sampler.stop()
    measured.seconds = time.time() - began
    if process.returncode not in (0, -signal.SIGKILL):
        phase.failed.append(name)
        tail = " | ".join(output.strip().splitlines()[-6:])[-600:]
        phase.note(f"tune_{name}: exit status {process.returncode}: {tail}")
    spans = run_spans(folder)
    measured.trials = float(len(spans))
    if len(spans) < expected and name not in phase.failed:
        phase.failed.append(name)
        phase.note(f"tune_{name}: {len(spans)} of {expected} runs finished")
    if spans:
        first, last = min(s for s, _ in spans), max(e for _, e in spans)
        measured.trials_per_min = 60 * len(spans) / (last - first) if last > first else math.nan
        measured.trials_at_once = float(most_at_once(spans))
        if phase.cuda:
            measured.gpu_busy_percent, measured.gpu_memory_max_mib = sampler.between(first, last)
        else:
            measured.gpu_busy_percent, measured.gpu_memory_max_mib = 0.0, 0.0
        try:
            shares = placed_gpu_shares(folder)
        except Exception as error:  # an unreadable state: the figure is nan
            phase.note(f"tune_{name}: no placement read back: {type(error).__name__}: {error}")
            shares = []
        if shares:
            measured.gpu_per_trial = statistics.median(shares)
            counts = {share: shares.count(share) for share in sorted(set(shares))}
            phase.note(
                f"tune_{name}: GPU per trial as placed: "
                + ", ".join(f"{share:g} x {count}" for share, count in counts.items())
            )
    if phase.cuda and sampler.source == "none":
        phase.note(f"tune_{name}: neither NVML nor nvidia-smi answered: no busy share")
    return measured


def print_measured(
    phase: Phase, prefix: str, measured: Measured, measures: tuple[str, ...]
) -> None:
    for what in measures:
        phase.figure(f"{prefix}_{what}", getattr(measured, what))


# -- the experiments ---------------------------------------------------------------------------


def write_yaml(folder: Path, name: str, content: dict[str, Any]) -> Path:
    import yaml

    path = folder / f"{name}.yaml"
    path.write_text(yaml.safe_dump(content, sort_keys=False))
    return path


def quickstart_space(sizes: Sizes, folder: Path) -> tuple[Path, int]:
    """The quickstart's file (tiny: its run with a 4-trial grid and one round), and its trial
    count."""
    import yaml

    content = yaml.safe_load(QUICKSTART.read_text())
    if sizes.quickstart_grid is None:
        space = content["space"]
        return QUICKSTART, math.prod(len(axis["grid"]) for axis in space.values())
    content["space"] = sizes.quickstart_grid
    content["run"]["rounds"] = sizes.quickstart_rounds
    count = math.prod(len(axis["grid"]) for axis in sizes.quickstart_grid.values())
    return write_yaml(folder, "quickstart", content), count


def device_against_cpu(
    phase: Phase,
    experiment: str,
    kind: str,
    space: Path,
    expected: int,
    folder: Path,
    address: str,
    device_flags: list[str],
) -> None:
    """``robusttune <kind> space`` on the GPU (``device_flags``) and on the CPUs, and their
    figures; on the CPU (``--cpu``) once, printed for both."""
    cpu_flags = ["--set", "device=cpu", "--gpus-per-trial", "0"]
    ways = [("", device_flags)] + ([("cpu", cpu_flags)] if phase.cuda else [])
    results: dict[str, Measured] = {}
    for way, flags in ways:
        name = f"{experiment}_{way}" if way else experiment
        args = [kind, str(space), "--storage", str(folder), "--name", name, *flags]
        results[way] = run_command(phase, name, args, folder / name, address, expected)
    results.setdefault("cpu", results[""])
    print_measured(phase, f"tune_{experiment}", results[""], MEASURES)
    print_measured(phase, f"tune_{experiment}_cpu", results["cpu"], CPU_MEASURES)
    phase.ratio(
        f"tune_{experiment}_device_vs_cpu",
        results[""].trials_per_min,
        results["cpu"].trials_per_min,
    )


def cnn2_fashion(phase: Phase, folder: Path, address: str) -> None:
    """The cnn2 sweep at each of ``sizes.per_gpu`` trials per GPU (named `PER_GPU`)."""
    sizes = phase.sizes
    per_min: dict[int, float] = {}
    for k, named in zip(sizes.per_gpu, PER_GPU):
        trials = sizes.waves * k
        content = {
            "name": f"cnn2_fashion_{named}_per_gpu",
            "run": {
                **CNN2_FASHION["run"],
                **sizes.cnn2_run,
                "device": "cuda" if phase.cuda else "cpu",
            },
            "space": {"seed": {"grid": list(range(1, trials + 1))}},
            "search": CNN2_FASHION["search"],
        }
        space = write_yaml(folder, content["name"], content)
        args = [
            "sweep",
            str(space),
            "--storage",
            str(folder),
            "--cpus-per-trial",
            f"{sizes.cnn2_cpus_per_trial:g}",
        ]
        if phase.cuda:  # k shares of one GPU, as `gpu_share.share_of` rounds them
            args += ["--gpus-per-trial", f"{math.floor(1e4 / k) / 1e4:g}"]
        else:  # a run on device cpu may not hold a GPU share: k at once by Tune's limit
            args += ["--gpus-per-trial", "0", "--max-concurrent", str(k)]
        measured = run_command(
            phase, content["name"], args, folder / content["name"], address, trials
        )
        per_min[named] = measured.trials_per_min
        print_measured(phase, f"tune_{content['name']}", measured, MEASURES)
    phase.ratio("tune_cnn2_fashion_16_vs_1_per_gpu", per_min[16], per_min[1])


def start_ray(phase: Phase) -> str:
    """One local Ray for the phase (every core, or ``sizes.ray_cpus``; the GPUs Ray finds, none
    with ``--cpu``), its GCS address."""
    os.environ["RAY_AUTH_MODE"] = "disabled"
    import ray

    context = ray.init(
        num_cpus=phase.sizes.ray_cpus or os.cpu_count(),
        num_gpus=None if phase.cuda else 0,
        include_dashboard=False,
        logging_level="WARNING",
    )
    resources = ray.cluster_resources()
    phase.note(
        "Ray "
        + ray.__version__
        + " from "
        + str(Path(ray.__file__).parent)
        + ": "
        + ", ".join(
            f"{key} {value:g}"
            for key, value in sorted(resources.items())
            if key in ("CPU", "GPU") or key.startswith("accelerator_type")
        )
    )
    return str(context.address_info["gcs_address"])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cpu", action="store_true", help="every trial on the CPU, no GPU")
    parser.add_argument("--tiny", action="store_true", help="toy sizes: a smoke run")
    parser.add_argument(
        "--started",
        type=float,
        default=None,
        help="the whole command's start (epoch seconds; default: now)",
    )
    parser.add_argument(
        "--total-budget-s",
        type=float,
        default=525.0,
        help="experiments reached after --started + this print nan",
    )
    args, _ = parser.parse_known_args(argv)  # bench/gpu.py's options pass through bench/gpu.sh

    sizes = TINY if args.tiny else FULL
    cuda = not args.cpu
    if cuda:
        import torch

        if not torch.cuda.is_available():  # as bench/gpu.py: the CPU only when asked for
            print(
                "# no CUDA device visible: run with --cpu (and --tiny for a smoke run)",
                file=sys.stderr,
            )
            return 2
    phase = Phase((args.started or time.time()) + args.total_budget_s, cuda, sizes)
    phase.note(
        f"the mission through Ray Tune: {'tiny' if args.tiny else 'full'} sizes, "
        f"{'GPU' if cuda else 'CPU'}, deadline in "
        f"{phase.left_s():.0f} s"
    )
    if importlib.util.find_spec("ray") is None or importlib.util.find_spec("optuna") is None:
        phase.note(
            "no Ray or Optuna in this Python: install the bundle (make gpu-bundle, "
            "docs/how-to/gpu.md); every Tune figure is nan"
        )
        for name in figure_names():
            phase.figure(name, math.nan)
        return 1
    folder = Path(tempfile.mkdtemp(prefix="robusttune-gpu-tune-"))
    began = time.perf_counter()
    try:
        address = start_ray(phase)
        phase.figure("tune_ray_start_seconds", time.perf_counter() - began)
        device = ["--set", "device=cuda"] if cuda else ["--set", "device=cpu"]
        space, count = quickstart_space(sizes, folder)
        device_against_cpu(
            phase,
            "quickstart",
            "sweep",
            space,
            count,
            folder,
            address,
            [*device, "--gpus-per-trial", "auto"],
        )
        plan = {
            **MAP,
            "run": {**MAP["run"], **sizes.map_run},
            "space": sizes.map_space or MAP["space"],
        }
        # a map's run count is found by bisection: any finished run is the expectation
        device_against_cpu(
            phase,
            "map",
            "breakdown",
            write_yaml(folder, "map", plan),
            1,
            folder,
            address,
            [*device, "--gpus-per-trial", "auto"],
        )
        cnn2_fashion(phase, folder, address)
    except Exception as error:  # Ray that does not start, a broken figure: the rest print nan
        phase.failed.append("tune")
        phase.note(f"the Tune phase stopped: {type(error).__name__}: {str(error)[:300]}")
        for name in figure_names()[:-1]:
            if name not in phase.values:
                phase.figure(name, math.nan)
    finally:
        import ray

        ray.shutdown()
        shutil.rmtree(folder, ignore_errors=True)
    phase.figure("tune_bench_seconds", time.perf_counter() - began)
    if phase.failed:
        phase.note(f"failed: {', '.join(phase.failed)}")
    return 1 if phase.failed else 0


if __name__ == "__main__":
    sys.exit(main())
