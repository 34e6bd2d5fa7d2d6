"""Scale-out on a Ray cluster (issue 7).

- ``cluster.yaml`` (AWS) and ``cluster.local.yaml`` (on-premise) pass the cluster launcher's own
  preparation and schema validation, offline (the AWS bootstrap step, which talks to AWS, is not
  run), and say what the cluster guide (docs/how-to/cluster.md) promises: a head that runs no trials, GPU workers from 0 up.
- A sweep on a real multi-node Ray cluster on this machine (``ray.cluster_utils.Cluster``: a head
  with no CPUs and two 1-CPU worker nodes, joined through ``address`` like ``--address``) loses a
  worker node while both workers run a trial: every trial still finishes, none is lost or run
  twice, and the trial that was on the lost node continued from its last checkpoint, not round 0.
- The per-trial CUDA memory cap follows the trial's GPU fraction (no GPU needed to check).

The cluster runs in a child process (this file run as a script) with its own ``RAY_TMPDIR``: it
never meets the test session's local Ray (conftest.py), and no ``ray.init()`` elsewhere on the
machine finds it through Ray's "latest cluster" address file.
"""

from __future__ import annotations

import csv
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import pytest
import torch
import yaml

from robusttune.experiments.sweep.trainable import cuda_memory_fraction, place_trial

ROOT = Path(__file__).resolve().parents[1]
TINY = {
    "dataset": "synthetic",
    "model": "mlp",
    "clients": 4,
    "participation": 1.0,
    "synthetic_samples": 240,
    "synthetic_shape": "16",
    "local_epochs": 1,
}
SEEDS = [1, 2, 3, 4]
ROUNDS = 10
ROUND_DELAY_S = 0.4  # tiny rounds take milliseconds: slowed so the node is lost mid-trial
# The node goes when both running trials have checkpoints at least REMOVE_AFTER_ROUND rounds in
# and at least REMOVE_BEFORE_END rounds still to run, whichever node it is.
REMOVE_AFTER_ROUND = 2
REMOVE_BEFORE_END = 3


# -- the launcher files ---------------------------------------------------------------------------
def prepared(name: str) -> dict[str, Any]:
    """What ``ray up NAME`` checks before it contacts the provider: defaults filled in, setup
    commands merged, node types normalised (prepare_config), then the JSON schema and the
    cross-field checks (validate_config). Both raise on a bad file."""
    from ray.autoscaler._private.util import prepare_config, validate_config

    config = yaml.safe_load((ROOT / name).read_text())
    config = prepare_config(config)
    validate_config(config)
    return config


def test_aws_cluster_yaml_is_valid_and_scales_gpu_workers_from_zero():
    config = prepared("cluster.yaml")
    assert config["provider"]["type"] == "aws"
    head = config["available_node_types"][config["head_node_type"]]
    assert head["resources"].get("CPU") == 0 and head["resources"].get("GPU", 0) == 0  # no trials
    workers = {
        name: t
        for name, t in config["available_node_types"].items()
        if name != config["head_node_type"]
    }
    gpu_workers = [t for t in workers.values() if t["resources"].get("GPU", 0) >= 1]
    assert gpu_workers and all(
        t.get("min_workers", 0) == 0 and t["max_workers"] >= 1 for t in gpu_workers
    )
    commands = "\n".join(config["setup_commands"])
    assert_tested_versions(commands)
    assert re.search(
        r"pip install .*-e ~/robusttune", commands
    )  # this package, copied by file_mounts
    assert config["file_mounts"] == {"~/robusttune": ".", **TOKEN_MOUNT}
    # Commands are merged by prepare_config: the head also gets the common setup.
    assert set(config["setup_commands"]) <= set(config["head_setup_commands"])
    assert_token_authentication(config)


def assert_tested_versions(commands: str) -> None:
    """Every pip install of the setup takes its versions from the copied checkout's
    constraints.txt (the versions `make install` tests with), none pinned by hand; torch and
    torchvision come first, before Ray and this package, and constraints.txt pins all three."""
    installs = [
        line for line in commands.splitlines() if "pip install" in line and " -U pip" not in line
    ]
    assert installs and all("-c ~/robusttune/constraints.txt" in line for line in installs)
    assert not any("==" in line for line in installs)
    assert "torch torchvision" in installs[0] and '"ray[default,tune]"' in installs[1]
    assert installs[-1].endswith("-e ~/robusttune")
    pinned = (ROOT / "constraints.txt").read_text().splitlines()
    assert {"torch", "torchvision", "ray"} <= {line.split("==")[0] for line in pinned}


# the cluster's token, generated once on the laptop (`ray get-auth-token --generate`)
TOKEN_MOUNT = {"~/.ray/auth_token": "~/.ray/auth_token"}


def assert_token_authentication(config: dict[str, Any]) -> None:
    """Every Ray process a cluster file starts runs with token authentication, every node gets
    the laptop's token, and interactive shells (`ray attach`, a job's driver) have the mode."""
    assert config["file_mounts"].get("~/.ray/auth_token") == "~/.ray/auth_token"
    starts = [
        line
        for key in ("head_start_ray_commands", "worker_start_ray_commands")
        for line in config[key]
        if "ray start" in line
    ]
    assert len(starts) == 2 and all("RAY_AUTH_MODE=token ray start" in line for line in starts)
    assert not any(
        "RAY_AUTH_MODE=disabled" in line
        for key, lines in config.items()
        if key.endswith("_commands")
        for line in lines
    )
    assert any("export RAY_AUTH_MODE=token" in line for line in config["setup_commands"])


def test_local_cluster_yaml_is_valid():
    config = prepared("cluster.local.yaml")
    assert config["provider"]["type"] == "local"
    ips = config["provider"]["worker_ips"]
    assert config["provider"]["head_ip"] and ips
    # A fixed set of machines: the launcher brings up every listed worker, no more.
    (node_type,) = config["available_node_types"].values()
    assert node_type["min_workers"] == node_type["max_workers"] == len(ips)
    commands = "\n".join(config["setup_commands"])
    assert_tested_versions(commands)
    assert any("--num-cpus=0" in line for line in config["head_start_ray_commands"])
    assert_token_authentication(config)


def test_validation_catches_a_broken_file():
    """The two tests above would pass vacuously if validation accepted anything."""
    from ray.autoscaler._private.util import prepare_config, validate_config

    config = yaml.safe_load((ROOT / "cluster.yaml").read_text())
    worker = next(n for n in config["available_node_types"] if n != config["head_node_type"])
    config["available_node_types"][worker]["resources"] = {"GPU": 0.5}  # must be integers
    with pytest.raises(Exception, match=r"0.5"):
        validate_config(prepare_config(config))


# -- per-trial shapes against node types --------------------------------------------------------
def test_a_trial_shape_fits_one_node_or_is_refused_naming_the_amount():
    """shape_problem: a trial is one bundle, placed on one node; the line names the amount no
    node type holds and what is allowed (the live refusal is in tests/test_autoscaling.py)."""
    from robusttune.experiments.sweep.cluster import shape_problem

    types = {
        "head": {"CPU": 0.0},
        "gpu_worker": {"CPU": 4.0, "GPU": 1.0},
        "cpu_worker": {"CPU": 16.0},
    }
    assert shape_problem({"CPU": 1, "GPU": 0.25}, [], types) is None
    assert shape_problem({"CPU": 16}, [], types) is None
    assert shape_problem({"CPU": 4, "GPU": 1}, [], types) is None
    more_cpus = shape_problem({"CPU": 32}, [], types)
    assert more_cpus.startswith("resources.cpu 32 per trial: no node") and "at most 16" in more_cpus
    # enough CPUs on one type and GPUs on another is no node for a trial that needs both
    together = shape_problem({"CPU": 8, "GPU": 1}, [], types)
    assert together.startswith("resources cpu 8, gpu 1 per trial") and "together" in together
    no_gpu = shape_problem({"CPU": 1, "GPU": 0.5}, [], {"head": {"CPU": 0.0}, "w": {"CPU": 1.0}})
    assert (
        no_gpu.startswith("resources.gpu 0.5 per trial") and "gpu 0 (--gpus-per-trial 0)" in no_gpu
    )
    # a node the cluster has now counts as much as a type it could add
    assert shape_problem({"CPU": 32}, [{"CPU": 64.0}], types) is None
    assert all("\n" not in line for line in (more_cpus, together, no_gpu))


def test_readme_per_trial_flags_fit_cluster_yamls_gpu_workers():
    """The cluster guide's and cluster.yaml's suggested --gpus-per-trial/--cpus-per-trial fit a GPU
    worker of cluster.yaml (not the head), with the trials per node and the cluster size the
    guide states; node types read as robusttune reads the autoscaler's config."""
    from robusttune.experiments.sweep.cluster import holds, shape_problem
    from robusttune.experiments.sweep.ray_compat import config_node_types

    types = config_node_types(ROOT / "cluster.yaml")
    config = yaml.safe_load((ROOT / "cluster.yaml").read_text())
    head = config["head_node_type"]
    (gpu_type,) = [name for name, r in types.items() if r.get("GPU", 0) >= 1]
    worker = types[gpu_type]
    section = (ROOT / "docs" / "how-to" / "cluster.md").read_text()
    suggested = re.findall(r"--gpus-per-trial ([\d.]+)(?:\s+--cpus-per-trial ([\d.]+))?", section)
    suggested += re.findall(
        r"--gpus-per-trial ([\d.]+)(?: and --cpus-per-trial ([\d.]+))?",
        (ROOT / "cluster.yaml").read_text(),
    )
    assert len(suggested) >= 3
    for gpu, cpu in suggested:
        wanted = {"CPU": float(cpu or 1), "GPU": float(gpu)}  # cpu: the sweep's default, 1
        assert shape_problem(wanted, [], types) is None, wanted
        assert holds(worker, wanted) and not holds(types[head], wanted)
    claim = re.search(
        r"worker \((\d+) GPU, (\d+) CPUs\) holds (\d+)\s+trials with "
        r"`--gpus-per-trial ([\d.]+) --cpus-per-trial ([\d.]+)`",
        section,
    )
    assert claim, "the cluster guide no longer says how many trials a GPU worker holds"
    gpus, cpus, per_node, gpu, cpu = (float(x) for x in claim.groups())
    assert (gpus, cpus) == (worker["GPU"], worker["CPU"])
    assert per_node == min(gpus // gpu, cpus // cpu)
    size = re.search(r"(\d+) × ([\d.]+) / (\d+) = (\d+)", section)
    concurrent, fraction, per_gpu_node, workers = (float(x) for x in size.groups())
    assert concurrent * fraction / per_gpu_node == workers
    assert workers == config["available_node_types"][gpu_type]["max_workers"]


# -- GPU fractions --------------------------------------------------------------------------------
def test_cuda_memory_cap_matches_the_gpu_fraction():
    assert cuda_memory_fraction({"CPU": 1, "GPU": 0.25}) == 0.25  # four trials share one GPU
    assert cuda_memory_fraction({"CPU": 1, "GPU": 0.5}) == 0.5
    assert cuda_memory_fraction({"CPU": 1, "GPU": 1.0}) is None  # a whole GPU: no cap
    assert cuda_memory_fraction({"CPU": 1, "GPU": 2.0}) is None
    assert cuda_memory_fraction({"CPU": 1}) is None and cuda_memory_fraction({"GPU": 0}) is None


def test_trial_device_and_memory_cap_on_a_fake_gpu(monkeypatch):
    """On this CPU machine: torch is made to see one CUDA device, as a trial does once Ray has set
    CUDA_VISIBLE_DEVICES to its GPU, and the cap call is recorded (and checked against the device
    count, as torch does) instead of made."""
    import torch

    from robusttune.engine.simulation import resolve_device
    from robusttune.problem.training import resolve_trainer

    caps: list[tuple[float, int]] = []

    def cap(fraction: float, device: int) -> None:
        assert 0 <= device < torch.cuda.device_count(), f"no CUDA device {device}"
        caps.append((fraction, device))

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    monkeypatch.setattr(torch.cuda, "set_per_process_memory_fraction", cap)

    assert (
        place_trial("auto", {"CPU": 1, "GPU": 0.25}, ["3"]) == "cuda"
    )  # Ray's id 3 is cuda:0 here
    assert caps == [(0.25, 0)]
    assert place_trial("cuda:1", {"CPU": 1, "GPU": 0.5}, ["3"]) == "cuda"  # only one GPU visible
    assert caps[-1] == (0.5, 0)
    caps.clear()
    assert place_trial("auto", {"CPU": 1, "GPU": 1}, ["0"]) == "cuda"  # a whole GPU: no cap
    assert place_trial("auto", {"CPU": 2}, []) == "cpu"  # a CPU trial on a GPU node stays off it
    assert place_trial("cpu", {"CPU": 1, "GPU": 0.5}, ["0"]) == "cpu"
    assert caps == []
    # a run told device=auto outside Ray takes the (fake) GPU and trains batched there
    assert resolve_device("auto").type == "cuda"
    assert resolve_trainer("auto", resolve_device("auto")) == "batched"
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert resolve_device("auto").type == "cpu"
    assert resolve_trainer("auto", resolve_device("auto")) == "sequential"


# -- storage --------------------------------------------------------------------------------------
def test_storage_paths_and_uris():
    from robusttune.experiments.sweep.storage import experiment_path, is_local

    assert is_local("/mnt/nfs/results") and is_local("file:///mnt/nfs/results")
    assert experiment_path("file:///mnt/nfs/results", "q") == str(
        Path("/mnt/nfs/results/q").resolve()
    )
    assert not is_local("s3://bucket/results")
    assert experiment_path("s3://bucket/results/", "q") == "s3://bucket/results/q"
    assert (
        experiment_path("s3://bucket/results?region=us-west-2", "q")
        == "s3://bucket/results/q?region=us-west-2"
    )
    assert experiment_path("gs://bucket/r", "q") == "gs://bucket/r/q"


def test_a_trial_restored_elsewhere_gets_its_run_files_back(tmp_path):
    """Remote storage (s3://): the run folder is the trial's working directory, new and empty on
    the node that takes over a lost trial. Its uploaded rounds.csv and event files come back, so
    the rounds before the checkpoint are kept (RunWriter(..., resume_at=k) then cuts the rest)."""
    from types import SimpleNamespace

    import pyarrow.fs

    from robusttune.core.runspec import RunSpec
    from robusttune.engine.recording import RunWriter
    from robusttune.experiments.sweep.trainable import fetch_run_files

    stored = tmp_path / "bucket" / "sweep" / "00000_trial"  # stands in for s3://bucket/sweep/...
    stored.mkdir(parents=True)
    (stored / "rounds.csv").write_text("round,accuracy\n1,0.5\n2,0.6\n3,0.7\n")
    (stored / "events.out.tfevents.1.node-a.1.0").write_bytes(b"scalars")
    (stored / "result.json").write_text("{}\n")  # Tune's own file: not a run file
    (stored / "checkpoint_000001").mkdir()
    storage = SimpleNamespace(
        storage_filesystem=pyarrow.fs.LocalFileSystem(), trial_fs_path=str(stored)
    )
    context = SimpleNamespace(get_storage=lambda: storage)  # what tune.get_context() gives
    working = tmp_path / "node-b" / "working_dir"
    working.mkdir(parents=True)
    fetch_run_files(context, working)
    assert sorted(p.name for p in working.iterdir()) == [
        "events.out.tfevents.1.node-a.1.0",
        "rounds.csv",
    ]
    RunWriter(working, RunSpec(), tensorboard=False, resume_at=2).abort()
    assert [r["round"] for r in rows(working / "rounds.csv")] == ["1", "2"]
    # Shared or local storage: the run folder is the trial folder; nothing is copied.
    fetch_run_files(context, stored)
    assert (stored / "rounds.csv").read_text().count("\n") == 4


# -- a real multi-node cluster loses a node -------------------------------------------------------
def rows(path: Path) -> list[dict[str, str]]:
    with path.open(newline="") as handle:
        return list(csv.DictReader(handle))


@pytest.fixture(scope="module")
def failover(tmp_path_factory):
    """Runs the child (this file as a script, about 50 s) and returns the facts it wrote."""
    out = tmp_path_factory.mktemp("failover")
    # A short private Ray temp dir (unix socket paths are limited to 107 characters).
    ray_tmp = tempfile.mkdtemp(prefix="rtc-", dir="/tmp")
    env = {
        **os.environ,
        "RAY_AUTH_MODE": "disabled",
        "RAY_TMPDIR": ray_tmp,
        "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),
    }
    env.pop("RAY_ADDRESS", None)
    try:
        child = subprocess.run(
            [sys.executable, __file__, str(out)],
            env=env,
            capture_output=True,
            text=True,
            timeout=240,
            check=False,
        )
    finally:
        shutil.rmtree(ray_tmp, ignore_errors=True)
    if child.returncode != 0:
        pytest.fail(
            f"cluster child failed ({child.returncode}):\n{child.stdout[-3000:]}\n"
            f"{child.stderr[-6000:]}"
        )
    return json.loads((out / "facts.json").read_text())


def test_sweep_survives_losing_a_worker_node(failover):
    facts = failover
    removed = facts["removed"]
    assert removed is not None, "the worker node was never removed (trials too fast?)"
    # The cluster saw the node go: dead in the GCS, head and the other worker alive.
    assert facts["nodes"][removed["node_id"]] is False
    assert sorted(facts["nodes"].values()) == [False, True, True]
    # Every trial finished, each grid point exactly once: none lost, none duplicated.
    assert (facts["finished"], facts["errored"], facts["unfinished"]) == (len(SEEDS), 0, 0)
    assert sorted(t["seed"] for t in facts["trials"]) == SEEDS
    assert len({t["path"] for t in facts["trials"]}) == len(SEEDS)
    # Exactly the trial on the lost node failed once and was retried.
    failed = [t for t in facts["trials"] if t["num_failures"] > 0]
    assert len(failed) == 1 and failed[0]["num_failures"] == 1
    assert failed[0]["trial_id"] in removed["rounds_at_removal"]

    for trial in facts["trials"]:
        folder = Path(trial["path"])
        reported = [json.loads(line) for line in (folder / "result.json").read_text().splitlines()]
        assert [int(r["round"]) for r in rows(folder / "rounds.csv")] == list(range(1, ROUNDS + 1))
        summary = json.loads((folder / "summary.json").read_text())
        assert summary["rounds_run"] == ROUNDS and summary["spec"]["seed"] == trial["seed"]
        starts = [i for i, r in enumerate(reported) if r["iterations_since_restore"] == 1]
        if trial is not failed[0]:
            # One result per round, in order, each round once.
            assert starts == [0] and summary["restored_from_rounds"] == []
            assert [r["round"] for r in reported] == list(range(1, ROUNDS + 1)), trial["trial_id"]
            continue
        # Started at round 1, then restored from a checkpoint, not from round 1.
        assert len(starts) == 2 and starts[0] == 0, starts
        first, retry = reported[: starts[1]], reported[starts[1] :]
        assert [r["round"] for r in first] == list(range(1, len(first) + 1))
        resumed_at = retry[0]["round"]
        assert [r["round"] for r in retry] == list(range(resumed_at, ROUNDS + 1))
        assert summary["restored_from_rounds"] == [resumed_at - 1]  # the trial's own record
        # Tune logs a result (result.json, the callbacks) before it registers the checkpoint the
        # same report carries, so a node lost in between takes that one checkpoint with it and
        # the retry replays that round (seen: rounds 1, 2, 2, 3, ...). At most that one round is
        # replayed, and it is replayed bit for bit. (No bound from rounds_at_removal: the
        # driver's view of a trial's progress lags its reports.)
        assert len(first) - 1 <= resumed_at <= len(first) + 1, (len(first), resumed_at)
        assert resumed_at >= REMOVE_AFTER_ROUND, resumed_at
        replayed = {r["round"]: r for r in retry if r["round"] <= len(first)}
        for round_number, again in replayed.items():
            once = first[round_number - 1]
            # repr: NaN (a round not evaluated) equals itself
            assert [repr(once[k]) for k in ("accuracy", "loss", "param_norm")] == [
                repr(again[k]) for k in ("accuracy", "loss", "param_norm")
            ], round_number

    # The retried trial's run is the uninterrupted run, bit for bit (the checkpoint holds the
    # model, caches and RNG states), and its rounds.csv has each round once.
    from robusttune.core.runspec import RunSpec
    from robusttune.engine.simulation import Simulation

    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # as in the trial
    try:
        spec = RunSpec.from_dict(
            {**TINY, "rounds": ROUNDS, "seed": failed[0]["seed"], "device": "cpu"}
        )
        reference = list(Simulation(spec))
    finally:
        torch.set_num_threads(threads)
    records = rows(Path(failed[0]["path"]) / "rounds.csv")
    assert [float(r["param_norm"]) for r in records] == [r.param_norm for r in reference]
    assert [float(r["accuracy"]) for r in records] == [r.accuracy for r in reference]


# -- the child: run as a script -------------------------------------------------------------------
_CLUSTER = None  # the child's ray.cluster_utils.Cluster (a global: Tune pickles its callbacks)


def slowed_trainable(config: dict[str, Any], sweep: Any) -> None:
    """The federated trainable with every round made ROUND_DELAY_S slower (tiny rounds take
    milliseconds; a node must be lost while trials run). Defined in ``__main__`` of the child,
    so Ray ships it to the worker nodes by value."""
    import time as _time

    from robusttune.engine.simulation import Simulation
    from robusttune.experiments.sweep.trainable import federated_trainable

    if not getattr(Simulation, "_slowed_for_test", False):  # actors are reused: patch once
        step = Simulation.step

        def slowed(self):
            _time.sleep(ROUND_DELAY_S)
            return step(self)

        Simulation.step = slowed
        Simulation._slowed_for_test = True
    federated_trainable(config, sweep)


def _remove_worker_callback(marker: Path) -> Any:
    from ray.tune import Callback

    class RemoveWorkerMidTrial(Callback):
        """Removes one worker node once both workers run a trial (one CPU each, the head has
        none) and both trials are mid-run, so whichever node goes, a trial is lost mid-run."""

        def __init__(self) -> None:
            self.rounds: dict[str, int] = {}

        def on_trial_result(self, iteration, trials, trial, result, **info):
            self.rounds[trial.trial_id] = int(result["round"])
            if marker.exists():
                return
            running = [t for t in trials if t.status == "RUNNING"]
            mid_run = range(REMOVE_AFTER_ROUND, ROUNDS - REMOVE_BEFORE_END + 1)
            if len(running) == 2 and all(
                self.rounds.get(t.trial_id, 0) in mid_run for t in running
            ):
                # Looked up at call time: a pickled copy of this callback must not carry it.
                cluster = sys.modules["__main__"]._CLUSTER
                node = sorted(cluster.worker_nodes, key=lambda n: n.unique_id)[0]
                at = {t.trial_id: self.rounds[t.trial_id] for t in running}
                cluster.remove_node(node, allow_graceful=False)  # like a reclaimed spot node
                marker.write_text(
                    json.dumps(
                        {"node_id": node.node_id, "rounds_at_removal": at, "time": time.time()}
                    )
                )

    return RemoveWorkerMidTrial()


def run_child(out: Path) -> None:
    global _CLUSTER  # noqa: PLW0603 - Tune pickles the callbacks, which find it in __main__
    import ray
    from ray.cluster_utils import Cluster

    from robusttune.experiments.sweep.runner import run_sweep
    from robusttune.experiments.sweep.space import parse_sweep

    started = time.perf_counter()
    _CLUSTER = Cluster(
        initialize_head=True, head_node_args={"num_cpus": 0, "include_dashboard": False}
    )
    for _ in range(2):
        _CLUSTER.add_node(num_cpus=1)
    _CLUSTER.wait_for_nodes()
    print(f"cluster up in {time.perf_counter() - started:.1f} s", flush=True)
    marker = out / "removed.json"
    spec = parse_sweep(
        {
            "run": {**TINY, "rounds": ROUNDS, "checkpoint_every": 1},
            "space": {"seed": {"grid": SEEDS}},
        },
        name="failover",
    )
    try:
        outcome = run_sweep(
            spec,
            storage=str(out / "results"),
            address=_CLUSTER.address,
            verbose=0,
            trainable=slowed_trainable,
            callbacks=[_remove_worker_callback(marker)],
        )
        print(f"sweep done in {time.perf_counter() - started:.1f} s", flush=True)
        trials = []
        for trial in outcome.result_grid._experiment_analysis.trials:
            trials.append(
                {
                    "trial_id": trial.trial_id,
                    "path": trial.path,
                    "seed": trial.config["seed"],
                    "status": trial.status,
                    "num_failures": trial.run_metadata.num_failures,
                }
            )
        # The cluster itself noticed the loss: the removed node is dead in the GCS.
        removed = json.loads(marker.read_text()) if marker.exists() else None
        ray.init(address=_CLUSTER.address, logging_level="WARNING")
        deadline = time.time() + 45
        while True:
            nodes = {node["NodeID"]: node["Alive"] for node in ray.nodes()}
            if (
                removed is None
                or not nodes.get(removed["node_id"], False)
                or time.time() > deadline
            ):
                break
            time.sleep(0.5)
        if removed is not None:
            removed["dead_after_s"] = time.time() - removed["time"]
        ray.shutdown()
        facts = {
            "finished": outcome.finished,
            "errored": outcome.errored,
            "unfinished": outcome.unfinished,
            "trials": trials,
            "nodes": nodes,
            "removed": removed,
            "seconds": time.perf_counter() - started,
        }
        (out / "facts.json").write_text(json.dumps(facts, indent=1))
    finally:
        _CLUSTER.shutdown()


if __name__ == "__main__":
    run_child(Path(sys.argv[1]))
