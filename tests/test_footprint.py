"""A run's estimated device memory (robusttune.problem.footprint): every part against a hand count,
the declared dataset shapes against the loaded datasets, the meta-device model profile against the
real model, and the estimate against the training peaks measured on a GPU."""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

import numpy as np
import pytest
import torch

from robusttune.core.registries import DATASETS
from robusttune.core.runspec import RunSpec
from robusttune.problem.data.base import DataShape
from robusttune.problem.evaluation import EVALUATION_CHUNK
from robusttune.problem.footprint import (
    ACTIVATION_COPIES,
    CACHED_COPIES,
    CUDA_CONTEXT_BYTES,
    SAMPLED_COPIES,
    data_shape,
    model_profile,
    round_clients,
    run_footprint,
)
from robusttune.problem.models import make_model

ROOT = Path(__file__).resolve().parents[1]
GPU_RECORD = ROOT / "bench" / "results" / "gpu_h200_2026-12-04.txt"


@pytest.mark.parametrize(
    "values",
    [
        {"dataset": "digits"},
        {
            "dataset": "synthetic",
            "synthetic_shape": "3x5x4",
            "synthetic_classes": 7,
            "synthetic_samples": 90,
        },
        {"dataset": "synthetic", "synthetic_shape": "20", "synthetic_samples": 12},
        {"dataset": "mnist_10k"},
    ],
)
def test_a_declared_shape_is_what_the_dataset_loads(values):
    spec = RunSpec.from_dict(values)
    raw = DATASETS[spec.dataset](spec)
    declared = data_shape(spec)
    assert declared == DataShape(
        tuple(raw.train_x.shape[1:]), raw.num_classes, len(raw.train_y) + len(raw.test_y)
    )


def test_every_built_in_dataset_declares_its_shape():
    for name in DATASETS.names():
        assert data_shape(RunSpec.from_dict({"dataset": name})) is not None, name


@pytest.mark.parametrize("name", ["mlp", "cnn2", "convnet", "resnet18"])
def test_the_meta_profile_is_the_real_models(name):
    """d from the meta device equals the built model's parameter count; a and a_max equal the
    leaf outputs of a real forward pass of one input."""
    shape = (3, 32, 32)
    d, total, largest = model_profile(name, shape, 10)
    model = make_model(name, shape, 10, seed=0)
    sizes = []
    hooks = [
        m.register_forward_hook(lambda m, i, o: sizes.append(o.numel()))
        for m in model.modules()
        if not list(m.children())
    ]
    with torch.no_grad():
        model(torch.zeros(1, *shape))
    for hook in hooks:
        hook.remove()
    assert d == sum(p.numel() for p in model.parameters())
    assert (total, largest) == (sum(sizes), max(sizes))


def test_the_mlp_profile_by_hand():
    """flatten -> 200 -> ReLU -> 200 -> ReLU -> K: d = (f + 1) 200 + 201 * 200 + 201 K, and the
    leaf outputs 200 + 200 + 200 + 200 + K."""
    d, total, largest = model_profile("mlp", (1, 28, 28), 10)
    assert d == 785 * 200 + 201 * 200 + 201 * 10
    assert (total, largest) == (4 * 200 + 10, 200)


def test_the_clients_a_round_trains():
    def n(**values):
        return round_clients(RunSpec.from_dict({"clients": 100, **values}))

    assert n(participation=0.1) == 10 and n(participation=1.0) == 100
    assert n(participation=0.1, sample_size=7) == 7
    # Bernoulli: the mean plus three standard deviations, sqrt(N p (1 - p)) = 3, at most N
    assert n(participation=0.1, participation_mode="bernoulli") == 10 + 9
    assert n(participation=0.99, participation_mode="bernoulli") == 100


def test_the_footprint_of_a_digits_run_by_hand():
    spec = RunSpec.from_dict(
        {
            "dataset": "digits",
            "model": "mlp",
            "clients": 20,
            "batch_size": 16,
            "participation": 0.5,
            "fltrust_root_size": 100,
        }
    )
    d = 65 * 200 + 201 * 200 + 201 * 10
    per_input, largest = 4 * 200 + 10, 200
    footprint = run_footprint(spec)
    assert footprint.parameters == d
    assert footprint.context == CUDA_CONTEXT_BYTES
    assert footprint.data == 4 * (1797 + 100) * 64
    assert footprint.state == 4 * (SAMPLED_COPIES * 10 + CACHED_COPIES * 20) * d
    assert footprint.training == 4 * ACTIVATION_COPIES * 10 * 16 * per_input
    assert footprint.evaluation == 4 * 2 * EVALUATION_CHUNK * largest
    assert footprint.total == (
        CUDA_CONTEXT_BYTES
        + footprint.data
        + footprint.state
        + max(footprint.training, footprint.evaluation)
    )


def test_no_declared_shape_is_no_estimate(monkeypatch):
    """A dataset that declares no DataShape (a plugin's) gets no estimate, not a guess."""
    monkeypatch.delattr(DATASETS["digits"], "data_shape")
    assert run_footprint(RunSpec.from_dict({"dataset": "digits"})) is None


def _measured_peak_mib(figure: str) -> float:
    match = re.search(rf"^{figure}: ([0-9.]+)$", GPU_RECORD.read_text(), re.MULTILINE)
    assert match, f"{figure} is not in {GPU_RECORD.name}"
    return float(match.group(1))


@pytest.mark.parametrize("clients", [10, 50])
def test_the_estimate_covers_the_training_peak_measured_on_a_gpu(clients):
    """bench/gpu.py's batched cnn2 training (~600 CIFAR-shaped images a client, batch 32, data on
    the device) peaked at the recorded MiB on an H200: the estimate's data, state and training
    parts cover it, by less than 2x (an estimate that large would waste most of a GPU)."""
    measured = _measured_peak_mib(f"train_batched_cnn2_{clients}_clients_peak_mib") * 2**20
    images = 600 * clients
    spec = RunSpec.from_dict(
        {
            "dataset": "synthetic",
            "synthetic_shape": "3x32x32",
            "synthetic_samples": round(images / 1.2),
            "model": "cnn2",
            "clients": clients,
            "participation": 1.0,
            "batch_size": 32,
            "fltrust_root_size": 1,
        }
    )
    footprint = run_footprint(spec)
    estimate = footprint.data + footprint.state + footprint.training
    assert measured <= estimate <= 2 * measured, (estimate / 2**20, measured / 2**20)
    assert math.isclose(footprint.data / (4 * 3 * 32 * 32), images + 1, rel_tol=0.01)


def test_a_plugin_dataset_declares_its_shape_from_its_own_knob(tmp_path):
    """examples/my_defence's dataset declares its shape from the file its ``arrays_path`` knob
    names, read from the headers; a missing file is no estimate (a whole GPU), not an error."""
    import subprocess
    import sys

    arrays = tmp_path / "arrays.npz"
    subprocess.run(
        [sys.executable, str(ROOT / "examples" / "make_arrays.py"), str(arrays)],
        check=True,
        capture_output=True,
        timeout=120,
    )
    script = (
        "import json, sys\n"
        "from robusttune.core.plugins import load_plugins\n"
        "load_plugins([sys.argv[1]])\n"
        "from robusttune.core.runspec import RunSpec\n"
        "from robusttune.problem.footprint import data_shape, run_footprint\n"
        "def spec(path): return RunSpec.from_dict({'dataset': 'my_arrays', 'arrays_path': path})\n"
        "shape = data_shape(spec(sys.argv[2]))\n"
        "print(json.dumps([list(shape.input_shape), shape.num_classes, shape.samples,\n"
        "                  run_footprint(spec(sys.argv[2])).data,\n"
        "                  run_footprint(spec(sys.argv[3])) is None]))\n"
    )
    child = subprocess.run(
        [
            sys.executable,
            "-c",
            script,
            str(ROOT / "examples" / "my_defence"),
            str(arrays),
            str(tmp_path / "absent.npz"),
        ],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert child.returncode == 0, child.stderr[-3000:]
    features, classes, samples, data, absent = json.loads(child.stdout.splitlines()[-1])
    with np.load(arrays) as loaded:
        assert features == list(loaded["x_train"].shape[1:])
        assert samples == len(loaded["x_train"]) + len(loaded["x_test"])
        assert classes == int(max(loaded["y_train"].max(), loaded["y_test"].max())) + 1
    assert data == 4 * (samples + 100) * math.prod(features) and absent


def test_a_models_profile_is_measured_once_per_model_shape_and_knobs():
    """A driver sizes every trial of a map: the meta-device build is kept, not redone per trial;
    knobs that cannot be hashed are measured each time, with the same answer."""
    from robusttune.problem import footprint

    footprint._kept_profile.cache_clear()
    first = model_profile("mlp", (1, 8, 8), 10)
    again = model_profile("mlp", [1, 8, 8], 10)
    info = footprint._kept_profile.cache_info()
    assert first == again and (info.misses, info.hits) == (1, 1)
    assert footprint._measured_profile(None, "mlp", (1, 8, 8), 10, ()) == first
