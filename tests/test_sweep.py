"""Sweeps end to end on the session's local Ray: a small grid, a reproducible Optuna study, an
interrupted sweep resumed without re-running finished trials (and its interrupted trial
continuing bit for bit from its checkpoint), and the TensorBoard files read back with
TensorBoard's own reader. Tiny runs: synthetic data, an MLP, 4 clients, 2-4 rounds."""

from __future__ import annotations

import csv
import json
import math
import os
import signal
import sys
from pathlib import Path

import pytest
import torch
from ray.tune import Callback

from robusttune.core.registry import SpecError
from robusttune.core.runspec import RunSpec
from robusttune.experiments.sweep.space import parse_sweep
from robusttune.experiments.sweep.trainable import trial_device, trial_threads

TINY = {
    "dataset": "synthetic",
    "model": "mlp",
    "clients": 4,
    "participation": 1.0,
    "synthetic_samples": 240,
    "synthetic_shape": "16",
    "local_epochs": 1,
    "rounds": 2,
}
THREATS = {
    "grid": [
        {"attack": "none", "byzantine_fraction": 0.0},
        {"attack": "sign_flip", "byzantine_fraction": 0.25},
    ]
}


def rows(path: Path) -> list[dict[str, str]]:
    with path.open(newline="") as handle:
        return list(csv.DictReader(handle))


def trial_folders(outcome) -> list[Path]:
    return sorted(Path(p) for p in outcome.table["path"])


# -- unit pieces --------------------------------------------------------------------------------
def test_device_follows_the_trials_resources_not_the_machine():
    assert trial_device("auto", []) == "cpu"
    assert trial_device("auto", ["0"]) == "cuda"
    assert trial_device("cuda:0", ["0"]) == "cuda:0"
    assert trial_device("cuda:1", ["3"]) == "cuda"  # the trial sees its one GPU as cuda:0
    assert trial_device("cuda:1", ["2", "3"]) == "cuda:1"
    assert trial_device("cpu", ["0"]) == "cpu"
    assert trial_threads({"CPU": 1.0}) == 1 and trial_threads({"CPU": 2.0}) == 2
    assert trial_threads({"CPU": 0.5}) == 1 and trial_threads({}) == 1


# -- a small grid end to end ------------------------------------------------------------------
@pytest.fixture(scope="module")
def grid_sweep(ray_session, tmp_path_factory):
    from robusttune.experiments.sweep.runner import run_sweep

    spec = parse_sweep(
        {
            "run": {**TINY, "checkpoint_every": 1},
            "space": {"seed": {"grid": [1, 2]}, "threat": THREATS},
        },
        name="grid",
    )
    storage = tmp_path_factory.mktemp("grid")
    return run_sweep(spec, storage=str(storage), verbose=0)


def test_small_grid_end_to_end(grid_sweep):
    outcome = grid_sweep
    assert (outcome.finished, outcome.errored, outcome.unfinished) == (4, 0, 0)
    table = outcome.table
    # sorted by the default metric, the validation part's accuracy (not the test set's)
    assert len(table) == 4 and list(table["validation_accuracy"]) == sorted(
        table["validation_accuracy"], reverse=True
    )
    assert "accuracy" not in table.columns and table["last_accuracy"].notna().all()
    assert set(zip(table["seed"], table["attack"])) == {
        (1, "none"),
        (1, "sign_flip"),
        (2, "none"),
        (2, "sign_flip"),
    }
    root = Path(outcome.path)
    assert (root / "sweep.yaml").exists() and (root / "trials.csv").exists()
    for folder in trial_folders(outcome):
        assert folder.parent == root and "_s" in folder.name  # e.g. 00001_1a2b3_s1_sign_flip-0.25
        records = rows(folder / "rounds.csv")
        assert [int(r["round"]) for r in records] == [1, 2]
        summary = json.loads((folder / "summary.json").read_text())
        assert summary["rounds_run"] == 2 and summary["spec"]["model"] == "mlp"
        assert summary["spec"]["device"] == "cpu"
        reported = [json.loads(line) for line in (folder / "result.json").read_text().splitlines()]
        assert len(reported) == 2  # one tune.report per round
        last = reported[-1]
        for key in records[0]:  # every RoundRecord field ...
            assert key in last, key
        for key in (
            "seed",
            "attack",
            "byzantine_fraction",
            "method",
            "last_accuracy",
        ):  # ... + config
            assert key in last, key
        assert float(records[-1]["param_norm"]) == last["param_norm"]
        assert len(list(folder.glob("checkpoint_*"))) == 1  # one per round, the latest kept


def test_tensorboard_scalars_and_hparams_read_back(grid_sweep):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    from tensorboard.plugins.hparams import plugin_data_pb2

    folder = trial_folders(grid_sweep)[0]
    events = EventAccumulator(str(folder))
    events.Reload()
    records = rows(folder / "rounds.csv")
    accuracy = events.Scalars("round/accuracy")
    assert [e.step for e in accuracy] == [1, 2]
    assert [e.value for e in accuracy] == pytest.approx(
        [float(r["accuracy"]) for r in records], rel=1e-6
    )
    assert "round/param_norm" in events.Tags()["scalars"]

    content = events.PluginTagToContent("hparams")
    data = plugin_data_pb2.HParamsPluginData.FromString(content["_hparams_/session_start_info"])
    hparams = data.session_start_info.hparams
    summary = json.loads((folder / "summary.json").read_text())
    assert hparams["seed"].number_value == summary["spec"]["seed"]
    assert hparams["attack"].string_value == summary["spec"]["attack"]
    assert hparams["method"].string_value == "fedavg"
    assert "_hparams_/experiment" not in content  # the sweep declares the experiment, not a trial


def test_the_sweep_declares_its_hparams_experiment_swept_keys_first(grid_sweep):
    """TensorBoard orders HParams columns by (differs, name) and shows the first few: the sweep
    folder's experiment lists the swept keys first, marked as differing, and names the metrics.
    TensorBoard's own backend reads it from the sweep folder."""
    from tensorboard.backend.event_processing import plugin_event_multiplexer
    from tensorboard.plugins.hparams import metadata

    multiplexer = plugin_event_multiplexer.EventMultiplexer()
    multiplexer.AddRunsFromDirectory(str(grid_sweep.path))
    multiplexer.Reload()
    experiments = [
        content[metadata.EXPERIMENT_TAG]
        for content in multiplexer.PluginRunToTagToContent("hparams").values()
        if metadata.EXPERIMENT_TAG in content
    ]
    assert len(experiments) == 1
    experiment = metadata.parse_experiment_plugin_data(experiments[0])
    swept = [info.name for info in experiment.hparam_infos if info.differs]
    assert set(swept) == {"seed", "attack", "byzantine_fraction"}
    assert [info.name for info in experiment.hparam_infos][:3] == swept
    assert [m.name.tag for m in experiment.metric_infos] == [
        "final/accuracy",
        "final/validation_accuracy",
        "final/loss",
        "final/collapsed",
    ]
    assert all(m.display_name for m in experiment.metric_infos)


# -- Optuna -----------------------------------------------------------------------------------
def optuna_trials(ray_session, storage: Path, name: str, seed: int):
    from robusttune.experiments.sweep.runner import run_sweep

    spec = parse_sweep(
        {
            "run": {**TINY, "attack": "sign_flip", "byzantine_fraction": 0.25},
            "space": {
                "lr": {"loguniform": [0.005, 0.2]},
                "momentum": {"uniform": [0.0, 0.9]},
                "seed": {"choice": [1, 2, 3]},
            },
            "search": {"algorithm": "optuna", "sampler": "tpe", "seed": seed, "num_samples": 3},
            "max_concurrent": 1,
        },
        name=name,
    )
    outcome = run_sweep(spec, storage=str(storage), verbose=0)
    assert outcome.finished == 3
    ordered = outcome.table.sort_values("trial")  # trial ids number the proposals in order
    return [
        (row.lr, row.momentum, row.seed, row.validation_accuracy, row.last_accuracy)
        for row in ordered.itertuples()
    ]


def test_optuna_study_is_reproducible_with_its_seed(ray_session, tmp_path):
    first = optuna_trials(ray_session, tmp_path, "study_a", seed=3)
    again = optuna_trials(ray_session, tmp_path, "study_b", seed=3)
    assert first == again  # same proposals, same results, bit for bit
    assert len({t[0] for t in first}) == 3


# -- interruption and resume ------------------------------------------------------------------
class InterruptOnce(Callback):
    """Presses Ctrl-C (SIGINT to the driver) when the second trial reports round 2, once: a
    marker file survives the pickled copy of this callback that Tuner.restore brings back."""

    def __init__(self, marker: Path) -> None:
        self.marker = str(marker)

    def on_trial_result(self, iteration, trials, trial, result, **info):
        if os.path.exists(self.marker):
            return
        if trial.trial_id.endswith("_00001") and result["round"] == 2:
            Path(self.marker).write_text("fired")
            os.kill(os.getpid(), signal.SIGINT)


@pytest.fixture(scope="module")
def resumed_sweep(ray_session, tmp_path_factory):
    from robusttune.experiments.sweep.runner import run_sweep

    storage = tmp_path_factory.mktemp("resume")
    run = {**TINY, "rounds": 4, "checkpoint_every": 1}
    spec = parse_sweep(
        {"run": run, "space": {"seed": {"grid": [1, 2, 3]}}, "max_concurrent": 1},
        name="interrupted",
    )
    first = run_sweep(
        spec, storage=str(storage), verbose=0, callbacks=[InterruptOnce(storage / "fired")]
    )
    finished = first.table[first.table["status"] == "TERMINATED"]
    before = {Path(p).name: (Path(p) / "summary.json").stat().st_mtime_ns for p in finished["path"]}
    second = run_sweep(spec, storage=str(storage), verbose=0, resume=True)
    return first, before, second, run


def test_interrupted_sweep_resumes_without_rerunning_finished_trials(resumed_sweep):
    first, before, second, _ = resumed_sweep
    # Interrupted while the second trial ran (one at a time): the third, perhaps not even
    # created yet, is unfinished as well (the sweep is not done).
    assert (first.finished, first.errored, first.unfinished) == (1, 0, 2)
    not_created = 3 - len(first.table)
    assert list(first.table["status"]).count("UNFINISHED") + not_created == first.unfinished
    assert (second.finished, second.errored, second.unfinished) == (3, 0, 0)
    folders = trial_folders(second)
    assert len(folders) == 3
    done_first = folders[0]
    assert list(before) == [done_first.name]
    # Not run again: same summary.json, one TensorBoard file, one report per round.
    assert (done_first / "summary.json").stat().st_mtime_ns == before[done_first.name]
    assert len(list(done_first.glob("events.out.tfevents.*"))) == 1
    assert len((done_first / "result.json").read_text().splitlines()) == 4
    for folder in folders:
        assert [int(r["round"]) for r in rows(folder / "rounds.csv")] == [1, 2, 3, 4]


def test_resumed_trial_continues_bit_for_bit(resumed_sweep):
    from robusttune.core.runspec import RunSpec
    from robusttune.engine.simulation import Simulation

    _, _, second, run = resumed_sweep
    folder = trial_folders(second)[1]  # the trial interrupted at round 2
    reported = [json.loads(line) for line in (folder / "result.json").read_text().splitlines()]
    assert reported[-1]["training_iteration"] == 4
    assert reported[-1]["iterations_since_restore"] < 4  # it continued from a checkpoint
    # and its summary says from which round; the trials that ran in one go say none
    summary = json.loads((folder / "summary.json").read_text())
    assert summary["restored_from_rounds"] == [4 - reported[-1]["iterations_since_restore"]]
    others = [f for f in trial_folders(second) if f != folder]
    restored = [
        json.loads((f / "summary.json").read_text())["restored_from_rounds"] for f in others
    ]
    assert restored == [[], []]

    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # as in the trial
    try:
        reference = list(Simulation(RunSpec.from_dict({**run, "seed": 2, "device": "cpu"})))
    finally:
        torch.set_num_threads(threads)
    records = rows(folder / "rounds.csv")
    for expected, got in zip(reference, records):
        for key in ("accuracy", "loss", "param_norm", "max_class_share"):
            assert float(got[key]) == getattr(expected, key), (expected.round, key)

    # TensorBoard shows every round once, the re-run rounds replacing the interrupted ones.
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(folder))
    events.Reload()
    norms = events.Scalars("round/param_norm")
    assert [e.step for e in norms] == [1, 2, 3, 4]
    assert [e.value for e in norms] == pytest.approx([r.param_norm for r in reference], rel=1e-6)


def test_a_restored_trial_counts_every_restart_its_checkpoints_carry(tmp_path, monkeypatch):
    """`restore_checkpoint` returns the rounds the trial has continued from, the earlier
    restarts read from beside the checkpoint (`save_checkpoint`), this one's last; a checkpoint
    from before restarts were recorded counts this one only; no checkpoint, a first start."""
    import pyarrow.fs
    from ray import tune

    from robusttune.engine.simulation import Simulation
    from robusttune.experiments.sweep.trainable import (
        RESTORED_FILE,
        restore_checkpoint,
        save_checkpoint,
    )

    spec = RunSpec.from_dict({**TINY, "rounds": 4, "device": "cpu"})
    ran = Simulation(spec)
    ran.step(), ran.step(), ran.step()
    saved = tmp_path / "checkpoint"
    saved.mkdir()
    save_checkpoint(ran, (1,), saved)  # taken at round 3 by a trial restored once, after round 1

    class Storage:  # the trial folder is local: no run files to fetch
        storage_filesystem = pyarrow.fs.LocalFileSystem()
        trial_fs_path = str(tmp_path)

    class Context:
        def get_storage(self):
            return Storage()

    def restored(checkpoint):
        monkeypatch.setattr(tune, "get_checkpoint", lambda: checkpoint)
        simulation = Simulation(spec)
        return restore_checkpoint(simulation, Context(), tmp_path), simulation.rounds_done

    assert restored(tune.Checkpoint.from_directory(str(saved))) == ((1, 3), 3)
    (saved / RESTORED_FILE).unlink()
    assert restored(tune.Checkpoint.from_directory(str(saved))) == ((3,), 3)
    assert restored(None) == ((), 0)


# -- failing early ----------------------------------------------------------------------------
def test_gpu_request_without_gpus_fails_with_one_line(ray_session, tmp_path):
    from robusttune.experiments.sweep.runner import run_sweep

    gpus = ray_session.cluster_resources().get("GPU", 0)
    wanted = 0.5 if not gpus else int(gpus) + 1  # more than a GPU machine has, too
    spec = parse_sweep({"run": TINY, "resources": {"gpu": wanted}}, name="gpu")
    with pytest.raises(
        SpecError, match=rf"resources.gpu {wanted:g} per trial, but the Ray cluster has"
    ):
        run_sweep(spec, storage=str(tmp_path), verbose=0)
    assert not any((tmp_path / "gpu").glob("*/result.json"))


def test_a_device_axis_with_cuda_under_gpu_auto_without_gpus_fails_before_any_trial(
    ray_session, tmp_path, monkeypatch
):
    # a trial whose axis says cuda would otherwise get no GPU share and train on the CPU
    from robusttune.experiments.sweep import runner

    monkeypatch.setattr(runner, "cluster_gpu_nodes", lambda joined: [])  # whatever this machine has
    spec = parse_sweep(
        {"run": TINY, "space": {"device": {"grid": ["cpu", "cuda"]}}, "resources": {"gpu": "auto"}},
        name="axis",
    )
    with pytest.raises(
        SpecError,
        match=r"^device cuda \(space.device\) with resources.gpu auto, "
        r"but the Ray cluster has no GPU",
    ):
        runner.run_sweep(spec, storage=str(tmp_path), verbose=0)
    assert not (tmp_path / "axis" / "sweep.yaml").exists()


def test_joined_cluster_short_of_gpus_waits_for_the_autoscaler(ray_session):
    from robusttune.experiments.sweep.cluster import check_cluster

    gpus = ray_session.cluster_resources().get("GPU", 0)
    spec = parse_sweep({"run": TINY, "resources": {"gpu": int(gpus) + 1}}, name="autoscale")
    notes: list[str] = []
    check_cluster(spec, joined=True, announce=notes.append)  # no cluster config: may autoscale
    assert len(notes) == 1 and "autoscaler" in notes[0]
    with pytest.raises(SpecError):
        check_cluster(spec, joined=False)


def test_joined_cluster_whose_autoscaler_has_no_gpus_is_an_error(ray_session, monkeypatch):
    from robusttune.experiments.sweep import cluster

    gpus = ray_session.cluster_resources().get("GPU", 0)
    spec = parse_sweep({"run": TINY, "resources": {"gpu": int(gpus) + 1}}, name="no-gpu-nodes")
    monkeypatch.setattr(cluster, "autoscaling_ceiling", lambda: {"CPU": 64, "GPU": int(gpus)})
    with pytest.raises(SpecError, match=r"resources.gpu"):
        cluster.check_cluster(spec, joined=True, announce=lambda text: None)
    monkeypatch.setattr(cluster, "autoscaling_ceiling", lambda: {"CPU": 64, "GPU": int(gpus) + 8})
    notes: list[str] = []
    cluster.check_cluster(spec, joined=True, announce=notes.append)
    assert len(notes) == 1


def test_resume_without_a_sweep_is_an_error(ray_session, tmp_path):
    from robusttune.experiments.sweep.runner import run_sweep

    spec = parse_sweep({"run": TINY}, name="nothing")
    with pytest.raises(SpecError, match="--resume: no sweep to resume"):
        run_sweep(spec, storage=str(tmp_path), verbose=0, resume=True)


def test_param_space_maps_domains_to_tune(ray_session):
    from ray.tune.search.sample import Categorical, Float, Integer

    spec = parse_sweep(
        {
            "run": {**TINY, "attack": "sign_flip", "byzantine_fraction": 0.25},
            "space": {
                "lr": {"loguniform": [0.01, 0.1]},
                "local_epochs": {"int": [1, 3]},
                "seed": {"grid": [1, 2]},
            },
            "search": {"algorithm": "optuna"},
        }
    )
    space = spec.param_space()
    assert isinstance(space["lr"], Float) and isinstance(space["seed"], Categorical)
    assert isinstance(space["local_epochs"], Integer)
    assert (space["local_epochs"].lower, space["local_epochs"].upper) == (
        1,
        4,
    )  # randint excludes 4
    assert not math.isnan(space["lr"].lower)


def test_streamed_runs_are_tune_trials_with_the_in_process_figures(ray_session, tmp_path):
    """breakdown, calibrate, horizon and tune hand their runs to one streaming Tune experiment
    (TuneStreamRunner): its trials must give the figures an in-process run of the same RunSpecs
    gives, in the order asked, from any thread, an identical spec once; a body that asks for
    nothing starts no experiment."""
    from concurrent.futures import ThreadPoolExecutor

    from robusttune.engine.runners import InProcessRunner, drive
    from robusttune.experiments.sweep.stream import TuneStreamRunner

    specs = [RunSpec.from_dict({**TINY, **threat}) for threat in THREATS["grid"]]
    runner = TuneStreamRunner(tmp_path / "tune")

    def from_two_threads():
        with ThreadPoolExecutor(2) as pool:
            first, second = pool.submit(runner, specs), pool.submit(runner, specs[::-1])
            return first.result(), second.result()

    through_tune, reversed_order = drive(runner, from_two_threads)
    in_process = InProcessRunner(tmp_path / "local")(specs)
    assert [s.final_accuracy for s in through_tune] == [s.final_accuracy for s in in_process]
    assert [s.spec["attack"] for s in through_tune] == ["none", "sign_flip"]
    assert reversed_order == through_tune[::-1]
    trials = list((tmp_path / "tune").glob("runs000/*/summary.json"))
    assert len(trials) == len(specs)  # each spec one trial, however often asked
    assert drive(runner, lambda: 7) == 7
    assert sorted(p.name for p in (tmp_path / "tune").iterdir()) == ["runs000"]
    with pytest.raises(RuntimeError, match="only inside its drive"):
        runner(specs)


def test_a_run_that_depends_on_the_last_is_handed_out_before_tune_would_sleep(
    monkeypatch, tmp_path
):
    """With no trial in flight, Tune sleeps a second after each None from its searcher
    (`TuneController._update_trial_queue`); a cell bisecting alone asks for each run only after
    the previous one is back. The searcher must wait for that next run instead of answering None.
    Tune is played here by a loop with one slot that counts the Nones it would have slept on."""
    from robusttune.core.records import RunSummary
    from robusttune.experiments.sweep import stream

    runner = stream.TuneStreamRunner(tmp_path)
    chain = [RunSpec.from_dict({**TINY, "seed": seed}) for seed in range(1, 6)]
    slept: list[int] = []

    def one_slot_tune(self):
        searcher = stream.RunQueue(self)
        for number in range(100):
            config = searcher.suggest(f"t{number}")
            if config == searcher.FINISHED:
                return
            if config is None:
                slept.append(number)  # Tune: time.sleep(1), then ask again
                continue
            done = RunSpec.from_dict({**TINY, **config[stream.SPEC_KEY]})
            searcher.on_trial_complete(
                f"t{number}",
                {
                    stream.SUMMARY_KEY: json.dumps(
                        RunSummary.failed("played", spec=done.to_dict()).to_dict()
                    )
                },
            )

    def bisect_alone():
        answers = []
        for spec in chain:  # each run asked only once the last one is back
            answers += runner([spec])
        return answers

    monkeypatch.setattr(stream.TuneStreamRunner, "_experiment", one_slot_tune)
    answers = runner.drive(bisect_alone)
    assert [a.spec["seed"] for a in answers] == [1, 2, 3, 4, 5]
    assert slept == []
    # with a trial in flight the searcher must not hold Tune's event loop: an empty queue is None
    assert runner.next_run(in_flight=True) is None


def test_a_breakdown_map_killed_on_ray_resumes_without_running_a_finished_trial(
    ray_session, tmp_path, monkeypatch
):
    """`robusttune breakdown` on Ray (its cells bisected each on its own through one streaming
    Tune experiment), Ctrl-C after the cell's first step, then `--resume`: no RunSpec reaches Ray
    Tune twice, and the map is the one an in-process (lock-step) map of the same plan gives."""
    import pandas as pd
    from typer.testing import CliRunner

    import robusttune.experiments.breakdown.replicates as replicates
    from robusttune.commands.cli import app
    from robusttune.experiments.breakdown.store import run_key
    from robusttune.experiments.sweep.stream import TuneStreamRunner

    space = tmp_path / "map.yaml"
    space.write_text(
        "run: {dataset: synthetic, model: mlp, clients: 4, rounds: 1, local_epochs: 1,\n"
        "      synthetic_samples: 200, trainer: sequential}\n"
        "space: {aggregator: {grid: [mean]}, attack: {grid: [sign_flip]}}\n"
        "breakdown: {seeds: [1], adversary: {attack_strength: [3.0]}, verify_radius: 0}\n"
    )
    handed: list[str] = []
    real_call, real_bisect = TuneStreamRunner.__call__, replicates.bisect_breakdown

    def counted(self, specs):
        handed.extend(run_key(s) for s in specs)
        return real_call(self, specs)

    def killed_after_one_wave(cells, evaluate, **options):
        waves: list = []

        def one_wave(points):
            waves.append(points)
            if len(waves) > 1:
                raise KeyboardInterrupt
            return evaluate(points)

        return real_bisect(cells, one_wave, **options)

    monkeypatch.setattr(TuneStreamRunner, "__call__", counted)
    args = ["breakdown", str(space), "--storage", str(tmp_path), "--name", "ray"]
    with monkeypatch.context() as patch:
        # each cell's thread bisects its seeds through bisect_breakdown
        patch.setattr(replicates, "bisect_breakdown", killed_after_one_wave)
        first = CliRunner().invoke(app, args)
    assert first.exit_code == 130, first.output
    before = list(handed)
    assert len(before) == 2  # k = 0 and k = 2 of the lattice 0..2
    assert "Trial status" not in first.output  # no Tune tables, the one progress line
    handed.clear()
    resumed = CliRunner().invoke(app, [*args, "--resume"])
    assert resumed.exit_code == 0, resumed.output
    assert handed and not set(handed) & set(before)
    local = CliRunner().invoke(
        app, ["breakdown", str(space), "--local", "--storage", str(tmp_path), "--name", "local"]
    )
    assert local.exit_code == 0, local.output
    columns = ["breakdown_fraction", "status", "evaluated", "trials", "clean_accuracy"]
    pd.testing.assert_frame_equal(
        pd.read_csv(tmp_path / "ray" / "breakdown.csv")[columns],
        pd.read_csv(tmp_path / "local" / "breakdown.csv")[columns],
    )


def test_a_tuning_study_runs_on_ray_like_in_process_and_resumes(ray_session, tmp_path, monkeypatch):
    """`robusttune tune` on Ray: every run one Tune trial, a wave of proposals one Tune
    experiment (all its adversary variants at once), the study complete (tuning.csv, tuning.md,
    pareto.png, a run folder per trial) and equal to the in-process study of the same plan;
    `--resume` replays it without handing Ray Tune a single run."""
    import pandas as pd
    from typer.testing import CliRunner

    from robusttune.commands.cli import app
    from robusttune.experiments.breakdown.store import run_key
    from robusttune.experiments.sweep.stream import TuneStreamRunner

    space = tmp_path / "tune.yaml"
    space.write_text(
        "run: {dataset: synthetic, model: mlp, clients: 5, participation: 1.0,\n"
        "      method: trimmed_mean, rounds: 2, local_epochs: 1, synthetic_samples: 200,\n"
        "      synthetic_shape: '16', byzantine_fraction: 0.2, trainer: sequential}\n"
        "space: {trim_ratio: {uniform: [0.0, 0.45]}}\n"
        "tuning: {num_samples: 2, batch: 2, adversary: {attack: [sign_flip],\n"
        "         attack_strength: [3.0, 100.0]}}\n"
    )
    handed: list[list[str]] = []
    real_call = TuneStreamRunner.__call__

    def counted(self, specs):
        handed.append([run_key(s) for s in specs])
        return real_call(self, specs)

    monkeypatch.setattr(TuneStreamRunner, "__call__", counted)
    args = [
        "tune",
        str(space),
        "--storage",
        str(tmp_path),
        "--name",
        "ray",
        "--cpus-per-trial",
        "1",
    ]
    first = CliRunner().invoke(app, args)
    assert first.exit_code == 0, first.output
    # one wave of 2 proposals: 2 clean runs and 2 x 2 attacked ones, one Tune experiment
    assert [len(wave) for wave in handed] == [6] and len(set(handed[0])) == 6
    folder = tmp_path / "ray"
    experiments = sorted((folder / "trials").glob("runs*"))
    assert [e.name for e in experiments] == ["runs000"]
    assert len(list(experiments[0].glob("*/summary.json"))) == 6
    table = pd.read_csv(folder / "tuning.csv")
    assert len(table) == 2 and table["recommended"].sum() == 1 and table["pareto"].any()
    assert (folder / "tuning.md").exists() and (folder / "pareto.png").exists()
    handed.clear()
    resumed = CliRunner().invoke(app, [*args, "--resume"])
    assert resumed.exit_code == 0, resumed.output
    assert handed == [] and "6 runs kept from before, 0 new" in resumed.output
    pd.testing.assert_frame_equal(pd.read_csv(folder / "tuning.csv"), table)
    local = CliRunner().invoke(
        app, ["tune", str(space), "--local", "--storage", str(tmp_path), "--name", "local"]
    )
    assert local.exit_code == 0, local.output
    pd.testing.assert_frame_equal(pd.read_csv(tmp_path / "local" / "tuning.csv"), table)


@pytest.mark.parametrize("sampler", ["tpe", "gp", "nsga2", "cmaes"])
def test_every_optuna_sampler_is_seeded_by_the_search_seed(sampler):
    import optuna

    from robusttune.experiments.sweep.tuner import make_sampler

    def proposals(seed):
        spec = parse_sweep(
            {
                "run": TINY,
                "space": {"lr": {"loguniform": [0.001, 0.1]}, "momentum": {"uniform": [0.0, 0.9]}},
                "search": {
                    "algorithm": "optuna",
                    "sampler": sampler,
                    "seed": seed,
                    "num_samples": 6,
                },
            },
            name="samplers",
        )
        study = optuna.create_study(sampler=make_sampler(spec))
        study.optimize(
            lambda t: (
                (t.suggest_float("lr", 1e-3, 0.1, log=True) - 0.01) ** 2
                + t.suggest_float("momentum", 0.0, 0.9)
            ),
            n_trials=6,
        )
        return [tuple(t.params.values()) for t in study.trials]

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    assert proposals(3) == proposals(3)
    assert proposals(3) != proposals(4)


def test_unreadable_stored_sweep_is_a_one_line_error(tmp_path):
    from robusttune.experiments.sweep.storage import SWEEP_FILE, stored_sweep, write_text

    folder = tmp_path / "broken"
    write_text(str(folder), SWEEP_FILE, "run: [unclosed\n")
    assert sorted(p.name for p in folder.iterdir()) == [SWEEP_FILE]  # no temporary left behind
    with pytest.raises(SpecError, match=r"sweep.yaml: not valid YAML"):
        stored_sweep(str(folder))
    write_text(str(folder), SWEEP_FILE, "- a list\n")
    with pytest.raises(SpecError, match=r"sweep.yaml: a search space is a mapping"):
        stored_sweep(str(folder))


def test_ctrl_c_stops_a_streamed_map_cleanly_and_resume_finishes_it(tmp_path):
    """A real SIGINT to `robusttune breakdown` on Ray while its one streaming experiment runs
    (Tune in the command's main thread): exit status 130, the one-line hint, the finished runs
    kept in runs.jsonl; `--resume` then runs only what is missing and writes the map."""
    import shutil
    import subprocess
    import tempfile
    import time

    space = tmp_path / "map.yaml"
    space.write_text(
        "run: {dataset: synthetic, model: mlp, clients: 8, rounds: 3, local_epochs: 1,\n"
        "      synthetic_samples: 200, trainer: sequential}\n"
        "space: {aggregator: {grid: [mean, median, trimmed_mean]},\n"
        "        attack: {grid: [sign_flip]}}\n"
        "breakdown: {seeds: [1, 2]}\n"
    )
    command = [
        str(Path(sys.executable).parent / "robusttune"),
        "breakdown",
        str(space),
        "--storage",
        str(tmp_path),
        "--name",
        "map",
        "--cpus-per-trial",
        "1",
    ]
    env = {**os.environ, "RAY_AUTH_MODE": "disabled"}
    env.pop("RAY_ADDRESS", None)
    ray_tmp = tempfile.mkdtemp(prefix="rtc-", dir="/tmp")  # a Ray of its own, short socket paths
    env["RAY_TMPDIR"] = ray_tmp
    runs = tmp_path / "map" / "runs.jsonl"
    try:
        driver = subprocess.Popen(
            command, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
        )
        deadline = time.monotonic() + 180
        while time.monotonic() < deadline and driver.poll() is None:
            if runs.exists() and runs.read_text().count("\n") >= 2:
                break
            time.sleep(0.2)
        assert driver.poll() is None, "the map ended before it could be interrupted"
        driver.send_signal(signal.SIGINT)
        output, _ = driver.communicate(timeout=120)
        assert driver.returncode == 130, output[-3000:]
        assert "interrupted: the finished runs are kept in" in output
        kept = runs.read_text().splitlines()
        resumed = subprocess.run(
            [*command, "--resume"],
            env=env,
            capture_output=True,
            text=True,
            timeout=240,
            check=False,
        )
    finally:
        shutil.rmtree(ray_tmp, ignore_errors=True)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert f"resumed: {len(kept)} runs kept from before" in resumed.stdout
    after = runs.read_text().splitlines()
    assert after[: len(kept)] == kept
    keys = [json.loads(line)["key"] for line in after]
    assert len(keys) == len(set(keys)) and (tmp_path / "map" / "breakdown.csv").exists()
