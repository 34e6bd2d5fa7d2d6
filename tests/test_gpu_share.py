"""``resources.gpu: auto`` (robusttune.experiments.sweep.gpu_share): the share of a GPU a trial asks
for, from its run's size and the cluster's GPU nodes, on hand cases; the value in files and on the
command line; and, in a child process with a Ray of one logical GPU, Tune placing each trial of a
sweep with the share of its own run (no CUDA needed: the trainable only reports what Ray gave it)."""

from __future__ import annotations

import json
import math
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from robusttune.core.registry import SpecError
from robusttune.core.runspec import RunSpec
from robusttune.experiments.sweep.gpu_share import (
    AUTO,
    MAX_RUNS_PER_GPU,
    USABLE_MEMORY,
    AutoGpuResources,
    GpuNode,
    gpu_memory_bytes,
    gpu_nodes,
    gpu_share,
    resolve_gpu,
    runs_per_gpu,
    share_of,
)
from robusttune.experiments.sweep.space import parse_sweep
from robusttune.problem.footprint import run_footprint

ROOT = Path(__file__).resolve().parents[1]
GIB = 2**30
H100 = GpuNode(cpus_per_gpu=16.0, memory_bytes=80 * GIB)


def test_gpu_memory_from_the_accelerator_type_else_the_drivers_gpu_else_16_gib():
    assert gpu_memory_bytes({"GPU": 1, "accelerator_type:H100": 1}, None) == 80 * GIB
    assert gpu_memory_bytes({"GPU": 1, "accelerator_type:A100-80G": 1}, 5) == 80 * GIB
    assert gpu_memory_bytes({"GPU": 1, "accelerator_type:NEW": 1}, 24 * GIB) == 24 * GIB
    assert gpu_memory_bytes({"GPU": 1}, None) == 16 * GIB


def test_gpu_nodes_are_the_distinct_kinds_of_node_with_gpus():
    nodes = [
        {"CPU": 2.0},
        {"CPU": 16.0, "GPU": 1.0, "accelerator_type:H100": 1.0},
        {"CPU": 16.0, "GPU": 1.0, "accelerator_type:H100": 1.0},
        {"CPU": 8.0, "GPU": 2.0, "accelerator_type:T4": 1.0},
    ]
    assert gpu_nodes(nodes) == [GpuNode(4.0, 16 * GIB), H100]
    assert gpu_nodes([{"CPU": 64.0}, {"CPU": 0.0}]) == []


def test_runs_per_gpu_is_the_smallest_of_cpus_memory_and_the_cap():
    node = GpuNode(cpus_per_gpu=4.0, memory_bytes=16 * GIB)
    assert runs_per_gpu(GIB, node, 1.0) == 4  # the node's CPUs
    assert runs_per_gpu(GIB, node, 2.0) == 2  # two CPUs a trial
    assert runs_per_gpu(5 * GIB, node, 1.0) == math.floor(USABLE_MEMORY * 16 / 5) == 2  # memory
    assert runs_per_gpu(40 * GIB, node, 1.0) == 1  # too big: a whole GPU, not 0
    assert runs_per_gpu(GIB, GpuNode(96.0, 141 * GIB), 1.0) == MAX_RUNS_PER_GPU
    assert runs_per_gpu(None, H100, 1.0) == 1  # unknown size: a whole GPU


@pytest.mark.parametrize("runs", range(1, MAX_RUNS_PER_GPU + 1))
def test_a_share_lets_exactly_that_many_runs_fit_one_gpu(runs):
    share = share_of(runs)
    assert runs * share <= 1 < (runs + 1) * share
    assert share == round(share, 4)  # Ray's resolution


def test_the_share_of_a_run_on_its_cluster():
    digits = RunSpec.from_dict({"dataset": "digits", "model": "mlp", "clients": 20})
    assert gpu_share(digits, [H100], 1.0) == 1 / 16  # 16 CPUs, a small run
    assert gpu_share(digits, [], 1.0) == 0.0  # no GPU in the cluster
    on_cpu = RunSpec.from_dict({"dataset": "digits", "device": "cpu"})
    assert gpu_share(on_cpu, [H100], 1.0) == 0.0
    big = RunSpec.from_dict({"dataset": "cifar10", "model": "resnet18", "clients": 20})
    runs = math.floor(USABLE_MEMORY * 80 * GIB / run_footprint(big).total)
    assert 1 < runs < 16
    assert gpu_share(big, [H100], 1.0) == share_of(runs)
    # over several kinds of node the share fits the smallest
    assert gpu_share(big, [H100, GpuNode(4.0, 16 * GIB)], 1.0) == 1.0


@pytest.mark.parametrize(
    ("values", "on_h100", "on_a10g"),
    [
        ({"dataset": "digits", "model": "mlp", "clients": 20}, 1 / 16, 1 / 8),
        ({"dataset": "fashion_mnist", "model": "mlp", "clients": 20}, 1 / 16, 1 / 8),
        ({"dataset": "cifar10", "model": "cnn2", "clients": 50, "batch_size": 32}, 1 / 16, 1 / 8),
        (
            {"dataset": "cifar10", "model": "resnet18", "clients": 20, "batch_size": 32},
            share_of(6),
            1.0,
        ),
    ],
)
def test_the_shares_docs_how_to_gpu_states(values, on_h100, on_a10g):
    """docs/how-to/gpu.md's examples: a 16-CPU H100 node and a g5.2xlarge (8 CPUs, an A10G)."""
    spec = RunSpec.from_dict({"participation": 0.5, **values})
    a10g = GpuNode(cpus_per_gpu=8.0, memory_bytes=24 * GIB)
    assert (gpu_share(spec, [H100], 1.0), gpu_share(spec, [a10g], 1.0)) == (on_h100, on_a10g)


def test_a_run_that_cannot_be_sized_takes_a_whole_gpu_with_one_note(monkeypatch, capsys):
    from robusttune.core.registries import DATASETS

    monkeypatch.delattr(DATASETS["digits"], "data_shape")  # as a plugin dataset without one
    per_trial = AutoGpuResources(1.0, [H100], RunSpec.from_dict)
    for seed in (1, 2):
        assert per_trial({"dataset": "digits", "seed": seed}).bundles == [{"CPU": 1.0, "GPU": 1.0}]
    notes = capsys.readouterr().err.splitlines()
    assert len(notes) == 1 and "each such trial takes a whole GPU" in notes[0]


def test_resolve_gpu_fixed_numbers_cpu_only_clusters_and_auto():
    run_spec = RunSpec.from_dict
    auto, cpu = [("run.device", "auto")], [("run.device", "cpu")]
    assert resolve_gpu(0.25, 1.0, auto, [H100], run_spec) == {"cpu": 1.0, "gpu": 0.25}
    assert resolve_gpu(AUTO, 2.0, auto, [], run_spec) == {"cpu": 2.0, "gpu": 0.0}
    assert resolve_gpu(AUTO, 1.0, cpu, [H100], run_spec) == {"cpu": 1.0, "gpu": 0.0}
    with pytest.raises(
        SpecError,
        match=r"run.device cuda with resources.gpu auto, but the Ray "
        r"cluster has no GPU; allowed: ",
    ):
        resolve_gpu(AUTO, 1.0, [("run.device", "cuda")], [], run_spec)
    # a device axis: any cuda value is refused on a cluster without GPUs, naming the axis
    axis = [("space.device", "cpu"), ("space.device", "cuda:1")]
    with pytest.raises(
        SpecError,
        match=r"^device cuda:1 \(space.device\) with resources.gpu "
        r"auto, but the Ray cluster has no GPU",
    ):
        resolve_gpu(AUTO, 1.0, axis, [], run_spec)
    assert isinstance(resolve_gpu(AUTO, 1.0, axis, [H100], run_spec), AutoGpuResources)
    per_trial = resolve_gpu(AUTO, 1.0, auto, [H100], run_spec)
    assert isinstance(per_trial, AutoGpuResources)
    bundle = per_trial({"dataset": "digits", "model": "mlp", "clients": 20})
    assert bundle.bundles == [{"CPU": 1.0, "GPU": 1 / 16}]
    # a configuration RunSpec rejects goes to the CPU, where the trial reports its error
    assert per_trial({"clients": -3}).bundles == [{"CPU": 1.0}]


def test_a_streamed_trial_is_sized_from_its_own_run_and_cuda_needs_a_gpu(tmp_path):
    """A map's trial (stream.py) gets the share of the run its config carries; asking for a run
    on CUDA from a cluster without GPUs is one line, before any trial."""
    from robusttune.experiments.sweep.stream import (
        TuneStreamRunner,
        streamed_run_spec,
        trial_config,
    )

    per_trial = AutoGpuResources(1.0, [H100], streamed_run_spec)
    for model, clients in (("mlp", 20), ("resnet18", 20)):
        run = RunSpec.from_dict({"dataset": "cifar10", "model": model, "clients": clients})
        assert streamed_run_spec(trial_config(run)) == run
        assert per_trial(trial_config(run)).bundles == [
            {"CPU": 1.0, "GPU": gpu_share(run, [H100], 1.0)}
        ]
    runner = TuneStreamRunner(tmp_path, {"cpu": 1, "gpu": "auto"})  # no GPU node known
    with pytest.raises(
        SpecError,
        match=r"run.device cuda with resources.gpu auto, but the Ray "
        r"cluster has no GPU",
    ):
        runner([RunSpec.from_dict({"device": "cuda"})])


def test_every_device_a_sweeps_trials_can_have_is_checked_against_its_gpus():
    """run.device, a device axis and a joint axis that sets device in some groups: each cuda value
    needs a GPU (gpu: 0 is one line naming where it comes from), a device that is cpu in every
    trial with a fixed GPU share reserves a GPU nobody uses; a mix of the two is a sweep that
    compares devices and stands."""
    from robusttune.experiments.sweep.domains import key_values

    base = {"dataset": "digits", "model": "mlp", "rounds": 1}

    def values(space: dict, run: dict | None = None) -> list:
        spec = parse_sweep({"run": {**base, **(run or {})}, "space": space}, name="t")
        return key_values("device", spec.run, spec.axes, "auto")

    assert values({}) == [("run.device", "auto")]
    assert values({}, {"device": "cpu"}) == [("run.device", "cpu")]
    assert values({"device": {"grid": ["cpu", "cuda"]}}) == [
        ("space.device", "cpu"),
        ("space.device", "cuda"),
    ]
    joint = {
        "setting": {
            "grid": [
                {"method": "median", "device": "cuda"},
                {"method": "krum"},
                {"method": "mean", "device": "cuda"},
            ]
        }
    }
    assert values(joint, {"device": "cpu"}) == [("space.setting", "cuda"), ("run.device", "cpu")]
    everywhere = {"setting": {"grid": [{"method": "median", "device": "cpu"}]}}
    assert values(everywhere, {"device": "cuda"}) == [("space.setting", "cpu")]

    def refused(space: dict, gpu: float, run: dict | None = None) -> str:
        with pytest.raises(SpecError) as caught:
            parse_sweep(
                {"run": {**base, **(run or {})}, "space": space, "resources": {"gpu": gpu}},
                name="t",
                source="t.yaml",
            )
        assert "\n" not in str(caught.value)
        return str(caught.value)

    assert refused({"device": {"grid": ["cpu", "cuda"]}}, 0) == (
        "t.yaml: device cuda (space.device) needs resources.gpu > 0; allowed: gpu auto or above 0, "
        "or device auto or cpu without a GPU"
    )
    assert "device cuda (space.setting) needs resources.gpu > 0" in refused(joint, 0)
    assert (
        "device cpu (space.device) with resources.gpu 0.5 reserves a GPU no trial uses"
        in refused({"device": {"grid": ["cpu"]}}, 0.5)
    )
    assert "run.device cuda needs resources.gpu > 0" in refused({}, 0, {"device": "cuda"})
    for gpu in (0.5, AUTO):  # cpu and cuda side by side: the cpu trials' shares are the cost
        parse_sweep(
            {
                "run": base,
                "space": {"device": {"grid": ["cpu", "cuda"]}},
                "resources": {"gpu": gpu},
            },
            name="t",
        )


@pytest.mark.parametrize(
    ("given", "expected"), [(None, AUTO), ("auto", AUTO), ("0.25", 0.25), (2, 2.0)]
)
def test_resources_gpu_in_a_file_or_on_the_command_line(given, expected):
    resources = {} if given is None else {"gpu": given}
    assert parse_sweep({"name": "x", "resources": resources}, name="x").resources.gpu == expected


@pytest.mark.parametrize(
    ("given", "message"),
    [
        ("lots", "resources.gpu must be auto or a number >= 0; got 'lots'"),
        (-1, "resources.gpu must be auto or a finite number >= 0; got -1"),
        (1.5, "resources.gpu above 1 must be a whole number"),
        (True, "resources.gpu must be auto or a number >= 0, not true/false"),
    ],
)
def test_a_bad_gpu_amount_is_one_line_naming_it(given, message):
    with pytest.raises(SpecError, match=re.escape(message)):
        parse_sweep({"name": "x", "resources": {"gpu": given}}, name="x", source="x.yaml")


def test_the_cli_refuses_a_bad_gpus_per_trial_with_exit_2(tmp_path):
    command = [
        str(Path(sys.executable).parent / "robusttune"),
        "sweep",
        str(ROOT / "search_spaces" / "quickstart.yaml"),
        "--dry-run",
        "--gpus-per-trial",
        "half",
    ]
    child = subprocess.run(
        command, capture_output=True, text=True, cwd=tmp_path, timeout=120, check=False
    )
    assert child.returncode == 2, child.stderr
    assert "resources.gpu must be auto or a number >= 0; got 'half'" in child.stderr
    assert "Traceback" not in child.stderr
    dry = subprocess.run(
        [*command[:-1], "auto"],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        timeout=120,
        check=False,
    )
    assert dry.returncode == 0, dry.stderr
    assert "gpu auto" in dry.stdout


# -- Tune places each trial with its run's share ------------------------------------------------
def probe_trainable(config, sweep):
    """Reports what Ray gave the trial instead of training (no CUDA on the test machine)."""
    import ray
    from ray import tune

    resources = tune.get_context().get_trial_resources().required_resources
    tune.report(
        {
            sweep.search.metric: 0.0,
            "gpu": float(resources.get("GPU", 0.0)),
            "cpu": float(resources.get("CPU", 0.0)),
            "gpu_ids": json.dumps(ray.get_gpu_ids()),
            "model": sweep.resolve(config)["model"],
        }
    )


def run_child(out: Path) -> None:
    import ray

    from robusttune.experiments.sweep.runner import run_sweep

    ray.init(
        num_cpus=4,
        num_gpus=1,
        resources={"accelerator_type:H100": 1.0},
        include_dashboard=False,
        logging_level="WARNING",
    )
    try:
        spec = parse_sweep(
            {
                "run": {"dataset": "cifar10", "clients": 20, "participation": 1.0, "rounds": 1},
                "space": {"model": {"grid": ["mlp", "resnet18"]}, "seed": {"grid": [1, 2]}},
            },
            name="auto_gpu",
        )
        outcome = run_sweep(
            spec, storage=str(out / "results"), verbose=0, trainable=probe_trainable
        )
        rows = [
            {key: result.metrics[key] for key in ("model", "gpu", "cpu", "gpu_ids")}
            for result in outcome.result_grid
        ]
        (out / "facts.json").write_text(json.dumps({"rows": rows, "finished": outcome.finished}))
    finally:
        ray.shutdown()


def test_tune_gives_each_trial_the_share_of_its_own_run(tmp_path):
    ray_tmp = tempfile.mkdtemp(prefix="rtg-", dir="/tmp")  # a Ray of its own, short socket paths
    env = {
        **os.environ,
        "RAY_AUTH_MODE": "disabled",
        "RAY_TMPDIR": ray_tmp,
        "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),
    }
    env.pop("RAY_ADDRESS", None)
    try:
        child = subprocess.run(
            [sys.executable, __file__, str(tmp_path)],
            env=env,
            capture_output=True,
            text=True,
            timeout=240,
            check=False,
        )
    finally:
        shutil.rmtree(ray_tmp, ignore_errors=True)
    assert child.returncode == 0, child.stdout[-3000:] + child.stderr[-6000:]
    facts = json.loads((tmp_path / "facts.json").read_text())
    assert facts["finished"] == 4
    node = GpuNode(cpus_per_gpu=4.0, memory_bytes=80 * GIB)
    for row in facts["rows"]:
        run = RunSpec.from_dict(
            {"dataset": "cifar10", "clients": 20, "participation": 1.0, "model": row["model"]}
        )
        assert row["gpu"] == gpu_share(run, [node], 1.0) > 0, row
        assert row["cpu"] == 1.0 and json.loads(row["gpu_ids"]) == [0]
    shares = {row["model"]: row["gpu"] for row in facts["rows"]}
    # the MLP run: 4 CPUs per GPU bound it; resnet18's memory bounds it to fewer a GPU
    assert shares["mlp"] == 0.25 and shares["resnet18"] > shares["mlp"]


if __name__ == "__main__":
    run_child(Path(sys.argv[1]))
