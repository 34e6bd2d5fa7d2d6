"""``resources.gpu: auto`` (the default): how much of a GPU each trial asks Ray for, chosen from
the size of its run and from the GPU nodes of the cluster. A map's runs are small (a digits MLP
run gains nothing from a GPU alone, docs/how-to/gpu.md), so where a cluster has GPUs they share
each one: a trial asks for 1/k of a GPU, k the runs one GPU holds,

    k = min(MAX_RUNS_PER_GPU, floor(cpus_per_gpu / cpus_per_trial),
            floor(USABLE_MEMORY * gpu_memory / footprint)),   at least 1,

where ``footprint`` is the run's estimated device memory (`robusttune.problem.footprint`),
``gpu_memory`` one GPU's memory (from the node's ``accelerator_type`` resource, which Ray sets
for NVIDIA GPUs) and ``cpus_per_gpu`` the node's CPUs over its GPUs (each trial also holds its
CPUs: more trials than a node's CPUs allow would leave the extra shares unused). Over several GPU
node kinds the smallest k wins, so that the share fits every one. Ray then places k trials on each
GPU, and each trial caps its CUDA memory at its share (`trainable.place_trial`).

Without a GPU in the cluster (or its autoscaler's node types) ``auto`` is 0 and trials run on the
CPU; a run on ``device: cpu`` asks for none; a run whose size cannot be estimated (a plugin
dataset that declares no `DataShape`) asks for a whole GPU. A number (``--gpus-per-trial 0.25``)
overrides all of it."""

from __future__ import annotations

import math
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final

from robusttune.core.registry import SpecError
from robusttune.core.runspec import RunSpec

__all__ = [
    "ACCELERATOR_MEMORY_GIB",
    "AUTO",
    "MAX_RUNS_PER_GPU",
    "UNKNOWN_GPU_MEMORY_GIB",
    "USABLE_MEMORY",
    "AutoGpuResources",
    "GpuNode",
    "cluster_gpu_nodes",
    "device_phrase",
    "gpu_memory_bytes",
    "gpu_nodes",
    "gpu_share",
    "refuse_cuda_without_gpus",
    "resolve_gpu",
    "runs_per_gpu",
    "share_of",
]

AUTO: Final = "auto"
# The most runs one GPU is given: what bench/gpu.py measures side by side (1, 4, 16); beyond it
# their CUDA contexts take turns on the GPU with no figure to say it helps.
MAX_RUNS_PER_GPU = 16
# Of a GPU's memory, the share the estimated footprints may fill (the rest: fragmentation of the
# caching allocator, the driver's own reservations).
USABLE_MEMORY = 0.9
# One GPU's memory in GiB by Ray's accelerator type (the resource ``accelerator_type:<name>`` Ray
# gives a node with NVIDIA GPUs; the vendors' data sheets; plain "A100" is the smaller model).
ACCELERATOR_MEMORY_GIB: dict[str, float] = {
    "A100": 40,
    "A100-40G": 40,
    "A100-80G": 80,
    "A10G": 24,
    "B200": 180,
    "B300": 270,
    "GB200": 186,
    "GB300": 279,
    "H100": 80,
    "H20": 96,
    "H200": 141,
    "K80": 12,
    "L4": 24,
    "L40S": 48,
    "P100": 16,
    "P4": 8,
    "RTX-PRO-6000": 96,
    "T4": 16,
    "V100": 16,
}
# A GPU whose type is not known here and cannot be asked (the driver has no CUDA): the memory of
# the smallest data-centre GPUs still in common use (T4, V100)
UNKNOWN_GPU_MEMORY_GIB = 16.0
ACCELERATOR_PREFIX = "accelerator_type:"


@dataclass(frozen=True)
class GpuNode:
    """One kind of GPU node: its CPUs per GPU and one GPU's memory in bytes."""

    cpus_per_gpu: float
    memory_bytes: int


def gpu_memory_bytes(resources: Mapping[str, float], local_memory: int | None) -> int:
    """One GPU's memory on a node with ``resources``: from its accelerator type, else the
    driver's own GPU (``local_memory``), else UNKNOWN_GPU_MEMORY_GIB."""
    for key in resources:
        if key.startswith(ACCELERATOR_PREFIX):
            gib = ACCELERATOR_MEMORY_GIB.get(key[len(ACCELERATOR_PREFIX) :])
            if gib is not None:
                return int(gib * 2**30)
    return local_memory if local_memory else int(UNKNOWN_GPU_MEMORY_GIB * 2**30)


def gpu_nodes(
    nodes: Sequence[Mapping[str, float]], local_memory: int | None = None
) -> list[GpuNode]:
    """The distinct kinds of GPU node among ``nodes`` (live nodes' and node types' resources);
    empty when none has a GPU."""
    kinds = {
        GpuNode(
            float(node.get("CPU", 0.0)) / float(node["GPU"]), gpu_memory_bytes(node, local_memory)
        )
        for node in nodes
        if float(node.get("GPU", 0.0)) > 0
    }
    return sorted(kinds, key=lambda kind: (kind.cpus_per_gpu, kind.memory_bytes))


def cluster_gpu_nodes(joined: bool) -> list[GpuNode]:
    """The GPU node kinds of the running Ray cluster: its live nodes and, when joined
    (``--address``), the node types its autoscaler can add (GPU workers often start at 0)."""
    import ray

    from robusttune.experiments.sweep.ray_compat import autoscaling_node_types

    resources = [node["Resources"] for node in ray.nodes() if node.get("Alive")]
    types = autoscaling_node_types() if joined else None
    return gpu_nodes([*resources, *(types or {}).values()], _local_gpu_memory())


def _local_gpu_memory() -> int | None:
    import torch

    if not torch.cuda.is_available():
        return None
    return int(torch.cuda.get_device_properties(0).total_memory)


def runs_per_gpu(footprint: int | None, node: GpuNode, cpus_per_trial: float) -> int:
    """k of the module docstring for one node kind: 1 when the footprint is unknown."""
    if footprint is None:
        return 1
    by_cpu = (
        math.floor(node.cpus_per_gpu / cpus_per_trial + 1e-9)
        if cpus_per_trial > 0
        else MAX_RUNS_PER_GPU
    )
    by_memory = math.floor(USABLE_MEMORY * node.memory_bytes / footprint)
    return max(1, min(MAX_RUNS_PER_GPU, by_cpu, by_memory))


def share_of(runs: int) -> float:
    """1/runs rounded down to Ray's resolution of 1e-4, so that ``runs`` shares fit one GPU."""
    return math.floor(1e4 / runs) / 1e4


def gpu_share(
    spec: RunSpec,
    nodes: Sequence[GpuNode],
    cpus_per_trial: float,
    on_unsized: Callable[[RunSpec], None] | None = None,
) -> float:
    """The GPU a trial of run ``spec`` asks for under ``auto``: 0 without GPU nodes or on
    ``device: cpu``, else 1/k for the smallest k over ``nodes`` (`runs_per_gpu`); a run that
    cannot be sized is handed to ``on_unsized`` and takes a whole GPU."""
    if not nodes or spec.device == "cpu":
        return 0.0
    from robusttune.problem.footprint import run_footprint

    estimate = run_footprint(spec)  # the model's profile is kept: arithmetic after the first
    if estimate is None and on_unsized is not None:
        on_unsized(spec)
    footprint = None if estimate is None else estimate.total
    return share_of(min(runs_per_gpu(footprint, node, cpus_per_trial) for node in nodes))


def device_phrase(where: str, device: str) -> str:
    """``run.device cuda``, or ``device cuda (space.<axis>)`` for a value an axis gives."""
    return f"{where} {device}" if where == "run.device" else f"device {device} ({where})"


def refuse_cuda_without_gpus(device: str, where: str = "run.device") -> None:
    """``device: cuda`` where ``auto`` finds no GPU in the cluster: one line, before any trial.
    ``where`` says which part of the file gives the device (`domains.key_values`)."""
    if device.startswith("cuda"):
        raise SpecError(
            f"{device_phrase(where, device)} with resources.gpu auto, but the Ray "
            f"cluster has no GPU; allowed: device auto or cpu, or a cluster with GPUs "
            f"(--address)"
        )


class AutoGpuResources:
    """Tune's per-trial resources under ``auto`` (``tune.with_resources(trainable, this)``): the
    trial's config -> its bundle of ``cpu`` CPUs and `gpu_share` of its run. ``run_spec`` turns a
    config into the RunSpec (a sweep's point, or a streamed trial's spec). A run that cannot be
    sized takes a whole GPU, said once per dataset and model."""

    def __init__(
        self, cpu: float, nodes: Sequence[GpuNode], run_spec: Callable[[dict[str, Any]], RunSpec]
    ) -> None:
        self.cpu = float(cpu)
        self.nodes = list(nodes)
        self.run_spec = run_spec
        self._unsized: set[tuple[str, str]] = set()

    def share(self, spec: RunSpec) -> float:
        return gpu_share(spec, self.nodes, self.cpu, on_unsized=self._say_unsized)

    def _say_unsized(self, spec: RunSpec) -> None:
        if (spec.dataset, spec.model) in self._unsized:
            return
        self._unsized.add((spec.dataset, spec.model))
        print(
            f"note: a run of dataset {spec.dataset} with model {spec.model} cannot be sized "
            f"before it runs (the dataset declares no data_shape, or the model cannot be built "
            f"on the meta device): each such trial takes a whole GPU; --gpus-per-trial sets a "
            f"share",
            file=sys.stderr,
            flush=True,
        )

    def __call__(self, config: dict[str, Any]) -> Any:
        from ray.tune import PlacementGroupFactory

        bundle = {"CPU": self.cpu}
        try:
            gpu = self.share(self.run_spec(config))
        except (SpecError, ValueError):
            gpu = 0.0  # the trial reports its configuration error itself, on the CPU
        if gpu > 0:
            bundle["GPU"] = gpu
        return PlacementGroupFactory([bundle])


def resolve_gpu(
    gpu: float | str,
    cpu: float,
    devices: Sequence[tuple[str, str]],
    nodes: Sequence[GpuNode],
    run_spec: Callable[[dict[str, Any]], RunSpec],
) -> dict[str, float] | AutoGpuResources:
    """What ``tune.with_resources`` gets for ``resources: {cpu, gpu}``: the fixed bundle for a
    number, or for ``auto`` the fixed CPU-only bundle where no trial can have a GPU (none in the
    cluster, or every device cpu) and else `AutoGpuResources`. ``devices``: (where, device) for
    every device the trials can have (`domains.key_values`), or none where each run is checked
    as it is asked for (a map's); a cuda one on a cluster without GPUs is an error, as it is
    with ``gpu: 0``."""
    if gpu != AUTO:
        return {"cpu": float(cpu), "gpu": float(gpu)}
    if not nodes:
        for where, device in devices:
            refuse_cuda_without_gpus(device, where)
        return {"cpu": float(cpu), "gpu": 0.0}
    if devices and all(device == "cpu" for _, device in devices):
        return {"cpu": float(cpu), "gpu": 0.0}
    return AutoGpuResources(cpu, nodes, run_spec)
