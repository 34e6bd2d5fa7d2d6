"""Autoscaling, exercised (issue 26): ``robusttune sweep --address auto`` and ``robusttune
breakdown --address auto`` on a cluster that grows from no worker, loses one mid-run and shrinks.

The cluster is Ray 2.60's fake multi-node provider run by the real autoscaler
(tests/autoscaling_support: `fake_cluster.FakeCluster`, `terminable_provider`): the head holds
cluster.yaml's head resources (0 CPUs: it runs no trial), one worker type of 1 CPU, min 0, max 2,
and an idle timeout of IDLE_TIMEOUT_MINUTES. The commands run as a user runs them, in child
processes joined through ``--address auto`` (RAY_ADDRESS names this cluster, so no other Ray on
the machine is found); every round is slowed by ROUND_DELAY_S in the cluster's processes
(autoscaling_support/sitecustomize.py) so that a worker is lost while trials run. One module
fixture runs the story once, in order, and the tests read what it saw:

1. per-trial shapes no node type can hold are refused in one line before anything runs;
2. with no worker up, a sweep of 4 trials and a breakdown map start side by side (two users on
   one cluster); the autoscaler adds two workers as their trials wait;
3. the sweep loses the worker of a trial mid-run (terminated through the provider), a
   replacement comes, and every trial finishes once with a complete folder and the results of an
   uninterrupted run;
4. the map loses a worker mid-wave, then its driver is killed in a later wave; ``--resume``
   replays the finished runs, runs only the missing ones and ends in the map an uninterrupted
   ``--local`` run gives;
5. once all of it is done, the workers go after the idle timeout.

The cluster's processes carry a marker in their environment and are ended by it in the
fixture's ``finally`` (never ``ray stop``, which would end every Ray on the machine)."""

from __future__ import annotations

import csv
import json
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pandas as pd
import pytest
import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent / "autoscaling_support"))
import itertools

from fake_cluster import ROOT, FakeCluster
from watching import Watcher, running_trials, wait_for

WORKER_TYPE = "cpu_worker"
MAX_WORKERS = 2
IDLE_TIMEOUT_MINUTES = 0.25  # 15 s: longer than a breakdown takes between two waves
ROUND_DELAY_S = 0.4
ROUNDS = 6
SEEDS = [1, 2, 3, 4]
# A worker is terminated when one of its trials has reported at least LOSE_AFTER_ROUND rounds to
# Tune (checkpointed every round) and has at least LOSE_BEFORE_END rounds still to run. Tune
# registers a function trainable's checkpoint in a save step after it writes the round to
# result.json, so a node lost in between restores the round before: the restart's first round is
# LOSE_AFTER_ROUND or later, never round 1 (`first_round_after_restart_is_checkpointed`).
LOSE_AFTER_ROUND = 2
LOSE_BEFORE_END = 2
TINY = {
    "dataset": "synthetic",
    "model": "mlp",
    "clients": 4,
    "participation": 1.0,
    "synthetic_samples": 240,
    "synthetic_shape": "16",
    "local_epochs": 1,
    "trainer": "sequential",
    "rounds": ROUNDS,
    "checkpoint_every": 1,
}
MAP = {
    "name": "map",
    "run": {**TINY, "lr": 0.1},
    "space": {"aggregator": {"grid": ["median"]}, "attack": {"grid": ["sign_flip"]}},
    "breakdown": {"seeds": [1], "adversary": {"attack_strength": [3.0]}},
}
FIRST_WAVE_RUNS = 2  # the map's first wave: two fractions of its lattice, one seed
COMMAND_TIMEOUT_S = 240
# The story took about 2 minutes alone on this 2-core machine and 4.5 at load 8, and 1 minute
# alone once maps streamed (most of it command and worker start-up; docs/how-to/cluster.md has
# the measured times): under load it can pass pytest's 300 s default.
pytestmark = pytest.mark.timeout(900)


# -- helpers --------------------------------------------------------------------------------------
def rows(path: Path) -> list[dict[str, str]]:
    with path.open(newline="") as handle:
        return list(csv.DictReader(handle))


def robusttune(*args: Any) -> list[str]:
    return [str(Path(sys.executable).with_name("robusttune")), *map(str, args)]


def lose_a_worker_mid_run(cluster: FakeCluster, folder: Path) -> tuple[Callable, Callable]:
    """When a trial is mid-run (at least LOSE_AFTER_ROUND rounds in, LOSE_BEFORE_END to go):
    terminate its node through the provider. The node is found from the trial's process id
    (Tune's ``pid`` in result.json) and that process's environment (`FakeCluster.node_of`)."""
    mid_run = range(LOSE_AFTER_ROUND, ROUNDS - LOSE_BEFORE_END + 1)
    chosen: dict[str, Any] = {}

    def ready() -> bool:
        for trial, done in running_trials(folder).items():
            try:
                last = json.loads((Path(trial) / "result.json").read_text().splitlines()[-1])
            except (OSError, IndexError, ValueError):
                continue
            # rounds.csv runs ahead of Tune: what the driver received is what can be restored
            received = min(done, int(last["round"]))
            node = cluster.node_of(int(last["pid"]))
            if received in mid_run and node in cluster.live_workers():
                chosen.update(trial=trial, node_id=node, rounds=received)
                return True
        return False

    def act() -> dict[str, Any]:
        cluster.terminate(chosen["node_id"])
        return {**chosen, "time": time.time()}

    return ready, act


def reference_rounds(spec_keys: dict[str, Any]) -> list[Any]:
    """The uninterrupted run, in this process (one torch thread, as in a trial)."""
    import torch

    from robusttune.core.runspec import RunSpec
    from robusttune.engine.simulation import Simulation

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        return list(Simulation(RunSpec.from_dict({**spec_keys, "device": "cpu"})))
    finally:
        torch.set_num_threads(threads)


# -- the story ------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def story(tmp_path_factory) -> dict[str, Any]:
    """Runs steps 1-5 of the module docstring on one fake cluster; returns what it saw."""
    out = tmp_path_factory.mktemp("autoscaling")
    head = yaml.safe_load((ROOT / "cluster.yaml").read_text())
    head_resources = head["available_node_types"][head["head_node_type"]]["resources"]
    cluster = FakeCluster(
        head_resources,
        {WORKER_TYPE: {"resources": {"CPU": 1}, "min_workers": 0, "max_workers": MAX_WORKERS}},
        idle_timeout_minutes=IDLE_TIMEOUT_MINUTES,
        round_delay_s=ROUND_DELAY_S,
    )
    facts: dict[str, Any] = {"head_resources": head_resources}
    started = time.time()
    drivers: list[subprocess.Popen] = []

    def run(*args: Any, **options: Any) -> subprocess.CompletedProcess:
        return subprocess.run(
            robusttune(*args),
            env=cluster.env(),
            cwd=out,
            capture_output=True,
            text=True,
            timeout=COMMAND_TIMEOUT_S,
            **options,
            check=False,
        )

    try:
        cluster.start()
        facts["cluster_start_s"] = time.time() - started
        space = out / "space.yaml"
        space.write_text(yaml.safe_dump({"run": TINY, "space": {"seed": {"grid": SEEDS}}}))

        # 1. shapes no node type can hold: both asked in one child process (imports once)
        asked = [["--cpus-per-trial", "2"], ["--gpus-per-trial", "0.5"]]
        code = (
            "import json, sys; from typer.testing import CliRunner; from robusttune.commands.cli import app\n"
            f"for flags in {asked!r}:\n"
            f"    r = CliRunner().invoke(app, ['sweep', {str(space)!r}, '--name', 'refused', "
            f"'--storage', {str(out / 'results')!r}, '--address', 'auto', *flags])\n"
            "    print(json.dumps({'flag': flags[0], 'code': r.exit_code, 'output': r.output}))\n"
        )
        child = subprocess.run(
            [sys.executable, "-c", code],
            env=cluster.env(),
            cwd=out,
            capture_output=True,
            text=True,
            timeout=COMMAND_TIMEOUT_S,
            check=False,
        )
        assert child.returncode == 0, child.stderr[-3000:]
        facts["refused"] = {
            r["flag"]: r for r in map(json.loads, child.stdout.strip().splitlines())
        }
        facts["workers_after_refusals"] = sorted(cluster.live_workers())
        facts["refused_folder_exists"] = (out / "results" / "refused").exists()

        # 2 and 3 at once, both from no worker, as two users share a cluster: a sweep that loses
        # a worker mid-run, and a breakdown map that loses one mid-wave and has its driver killed
        # in a later wave, then resumed; the workers go once all of it is done and idle
        folder = out / "results" / "grow"
        plan = out / "map.yaml"
        plan.write_text(yaml.safe_dump(MAP))
        map_folder = out / "results" / "map"
        runs_file = map_folder / "runs.jsonl"

        def kept() -> int:
            return len(runs_file.read_text().splitlines()) if runs_file.exists() else 0

        def kept_folders() -> set[str]:
            lines = runs_file.read_text().splitlines() if runs_file.exists() else []
            return {json.loads(line)["summary"].get("run_dir") for line in lines}

        def later_wave_running() -> bool:
            # and the trial on the lost worker kept (one still running when its driver dies is
            # run again by the resume, from round 1, and its restart would not be seen)
            lost = map_watcher.done[0]["trial"]
            return (
                kept() >= FIRST_WAVE_RUNS
                and lost in kept_folders()
                and bool(running_trials(map_folder / "trials"))
            )

        def kill_driver() -> dict[str, Any]:
            driver.send_signal(signal.SIGKILL)  # the head's driver dies: no goodbye
            return {"kept": kept(), "time": time.time()}

        facts["workers_before_jobs"] = sorted(cluster.live_workers())
        sweep_watcher = Watcher([lose_a_worker_mid_run(cluster, folder)])
        map_watcher = Watcher(
            [
                lose_a_worker_mid_run(cluster, map_folder / "trials"),
                (later_wave_running, kill_driver),
            ]
        )
        started_jobs = time.time()
        # the sweep writes to files: nobody reads its pipes until the map is done
        sweep_out, sweep_err = out / "sweep.stdout", out / "sweep.stderr"
        with sweep_out.open("w") as stdout, sweep_err.open("w") as stderr:
            sweep = subprocess.Popen(
                robusttune(
                    "sweep",
                    space,
                    "--name",
                    "grow",
                    "--storage",
                    out / "results",
                    "--address",
                    "auto",
                ),
                env=cluster.env(),
                cwd=out,
                stdout=stdout,
                stderr=stderr,
                text=True,
            )
        driver = subprocess.Popen(
            robusttune("breakdown", plan, "--storage", out / "results", "--address", "auto"),
            env=cluster.env(),
            cwd=out,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        drivers += [sweep, driver]
        sweep_ended: list[float] = []

        def note_the_sweeps_end() -> None:  # it ends while the map goes on
            sweep.wait()
            sweep_ended.append(time.time())

        threading.Thread(target=note_the_sweeps_end, daemon=True).start()
        sweep_watcher.start()
        map_watcher.start()
        output, _ = driver.communicate(timeout=COMMAND_TIMEOUT_S)
        map_watcher.stop()
        facts["map"] = {
            "started": started_jobs,
            "code": driver.returncode,
            "output": output,
            "steps": map_watcher.done,
            "kept_lines": runs_file.read_text().splitlines() if runs_file.exists() else [],
            "waves_before_resume": sorted(p.name for p in (map_folder / "trials").glob("runs*")),
        }
        resumed = run(
            "breakdown", plan, "--storage", out / "results", "--address", "auto", "--resume"
        )
        facts["map"]["resumed"] = {
            "code": resumed.returncode,
            "stdout": resumed.stdout,
            "stderr": resumed.stderr,
            "ended": time.time(),
        }
        facts["map"]["lines_after"] = runs_file.read_text().splitlines()
        facts["map"]["folder"] = str(map_folder)
        sweep.wait(timeout=COMMAND_TIMEOUT_S)
        sweep_watcher.stop()
        facts["sweep"] = {
            "code": sweep.returncode,
            "stdout": sweep_out.read_text(),
            "stderr": sweep_err.read_text(),
            "folder": str(folder),
            "started": started_jobs,
            "ended": sweep_ended[0] if sweep_ended else time.time(),
            "lost": sweep_watcher.done[0] if sweep_watcher.done else None,
        }
        facts["idle_at"] = wait_for(
            lambda: not cluster.live_workers(), 90, "the idle workers to go"
        )
        facts["events"] = cluster.events()
        facts["seconds"] = time.time() - started
    finally:
        (out / "provider-events.jsonl").write_text(
            "".join(json.dumps(e) + "\n" for e in cluster.events())
        )
        for driver in drivers:
            if driver.poll() is None:
                driver.kill()
        cluster.stop()
        facts["left_behind"] = cluster.processes()
    # the same map, uninterrupted, in this process (rounds not slowed: no cluster environment)
    from typer.testing import CliRunner

    from robusttune.commands.cli import app

    whole = CliRunner().invoke(
        app, ["breakdown", str(out / "map.yaml"), "--storage", str(out / "whole"), "--local"]
    )
    assert whole.exit_code == 0, whole.output[-3000:]
    facts["whole_folder"] = str(out / "whole" / "map")
    (out / "facts.json").write_text(json.dumps(facts, indent=1, default=str))
    return facts


def restarts(folder: Path) -> list[int]:
    """The first round Tune received after each (re)start of the trial in ``folder``."""
    reported = [json.loads(line) for line in (folder / "result.json").read_text().splitlines()]
    return [r["round"] for r in reported if r["iterations_since_restore"] == 1]


def first_round_after_restart_is_checkpointed(first: int) -> bool:
    """A restart continued from a checkpoint taken after the trial had reported at least
    LOSE_AFTER_ROUND - 1 rounds (see LOSE_AFTER_ROUND), not from round 1. (The node is asked to
    go with LOSE_BEFORE_END rounds left, but it may take a round or two to die: the restart's
    first round can be as late as the last one.)"""
    return LOSE_AFTER_ROUND <= first <= ROUNDS


def assert_complete_and_uninterrupted(folder: Path, tune_log: bool = True) -> None:
    """One finished trial folder: each round once in rounds.csv; summary.json; the rounds of the
    uninterrupted run, bit for bit (the checkpoint holds the model, the caches and the RNG
    states); and with ``tune_log``, every round in Tune's result.json, in order from each
    (re)start, a restart repeating at most the one round whose checkpoint Tune had not yet
    registered (see LOSE_AFTER_ROUND), each restart continuing from the round the summary's
    ``restored_from_rounds`` names (the trial's own record of its restarts against Tune's)."""
    summary = json.loads((folder / "summary.json").read_text())
    if tune_log:
        reported = [json.loads(line) for line in (folder / "result.json").read_text().splitlines()]
        runs: list[list[int]] = []
        for report in reported:
            if report["iterations_since_restore"] == 1:
                runs.append([])
            runs[-1].append(report["round"])
        assert runs[0][0] == 1 and runs[-1][-1] == ROUNDS, (folder, runs)
        assert all(run == list(range(run[0], run[0] + len(run))) for run in runs), (folder, runs)
        assert all(
            later[0] in (earlier[-1], earlier[-1] + 1)
            for earlier, later in itertools.pairwise(runs)
        ), (folder, runs)
        assert summary["restored_from_rounds"] == [run[0] - 1 for run in runs[1:]], (folder, runs)
    recorded = rows(folder / "rounds.csv")
    assert [int(r["round"]) for r in recorded] == list(range(1, ROUNDS + 1)), folder
    assert summary["rounds_run"] == ROUNDS and summary.get("error") is None
    spec = {k: v for k, v in summary["spec"].items() if k not in ("device",)}
    reference = reference_rounds(spec)
    assert [float(r["param_norm"]) for r in recorded] == [r.param_norm for r in reference], folder
    assert [float(r["accuracy"]) for r in recorded] == [r.accuracy for r in reference], folder


def test_no_process_of_the_fake_cluster_is_left_behind(story):
    assert story["left_behind"] == []


def test_head_is_cluster_yamls_head_and_runs_no_trial(story):
    assert story["head_resources"] == {"CPU": 0}


# -- 1. shapes no node can hold -------------------------------------------------------------------
@pytest.mark.parametrize(
    ("flag", "key"),
    [("--cpus-per-trial", "resources.cpu 2"), ("--gpus-per-trial", "resources.gpu 0.5")],
)
def test_a_shape_no_node_type_holds_is_refused_in_one_line(story, flag, key):
    refused = story["refused"][flag]
    lines = refused["output"].strip().splitlines()
    assert refused["code"] == 2 and len(lines) == 1, lines
    assert key in lines[0] and WORKER_TYPE in lines[0] and "allowed" in lines[0], lines[0]
    # refused before any trial asked for a node: none was launched, nothing written
    assert story["workers_after_refusals"] == [] and not story["refused_folder_exists"]


# -- 2. a sweep -----------------------------------------------------------------------------------
def test_sweep_grows_from_no_worker_loses_one_and_every_trial_finishes_once(story):
    sweep = story["sweep"]
    assert sweep["code"] == 0, sweep["stderr"][-3000:]
    assert "trials: 4 finished, 0 errored, 0 unfinished" in sweep["stdout"]
    events = story["events"]
    assert story["workers_before_jobs"] == []
    assert all(e["time"] > sweep["started"] for e in events)  # no worker before the jobs
    lost = sweep["lost"]
    assert lost is not None, "no worker was lost mid-run (trials too fast?)"
    creates = [e for e in events if e["event"] == "create"]
    terminations = {e["node_id"]: e for e in events if e["event"] == "terminate"}
    assert terminations[lost["node_id"]]["by"] == "request"
    # two workers as trials waited, then a replacement for the lost one as trials waited
    assert len(creates) >= MAX_WORKERS + 1 and all(e["node_type"] == WORKER_TYPE for e in creates)
    assert any(e["time"] > lost["time"] for e in creates)
    live, most = set(), 0
    for event in events:
        (live.add if event["event"] == "create" else live.discard)(event["node_id"])
        most = max(most, len(live))
    assert most == MAX_WORKERS and not live  # never above max_workers; none left at the end

    folders = sorted(p.parent for p in Path(sweep["folder"]).glob("*/summary.json"))
    assert len(folders) == len(SEEDS)
    seeds = sorted(json.loads((f / "summary.json").read_text())["spec"]["seed"] for f in folders)
    assert seeds == SEEDS
    # the trial on the lost node (one CPU: one trial) continued from its checkpoint, not round
    # 1; no other trial, and no finished one, ran again
    started_again = {str(f): restarts(f) for f in folders if len(restarts(f)) > 1}
    assert len(started_again) == 1, started_again
    ((path, firsts),) = started_again.items()
    assert path == lost["trial"] and firsts[0] == 1 and len(firsts) == 2
    assert first_round_after_restart_is_checkpointed(firsts[1]), firsts
    for folder in folders:
        assert_complete_and_uninterrupted(folder)


def finished_trials(story: dict[str, Any]) -> list[Path]:
    """Every trial folder the sweep and the map (its resume included) finished."""
    return [
        p.parent
        for p in [
            *Path(story["sweep"]["folder"]).glob("*/summary.json"),
            *Path(story["map"]["folder"]).glob("trials/runs*/*/summary.json"),
        ]
    ]


def test_idle_workers_are_removed_after_the_idle_timeout(story):
    last_finished = max((f / "summary.json").stat().st_mtime for f in finished_trials(story))
    by_autoscaler = [
        e for e in story["events"] if e["event"] == "terminate" and e["by"] == "autoscaler"
    ]
    assert len(by_autoscaler) >= MAX_WORKERS
    # the last worker went once it had been idle for the timeout (not before: it ran the last trial)
    assert max(e["time"] for e in by_autoscaler) - last_finished >= IDLE_TIMEOUT_MINUTES * 60 - 1
    assert story["idle_at"] >= max(e["time"] for e in by_autoscaler)
    print(f"\nmeasured: {scaling_times(story)}")


def scaling_times(story: dict[str, Any]) -> str:
    """The cluster guide's measured times: from the sweep command to the first worker launched, from
    that launch to the first round reported, from the sweep's loss to the replacement's launch,
    and from the last trial's end (sweep or map) to the last idle worker's termination."""
    sweep, events = story["sweep"], story["events"]
    folders = [p.parent for p in Path(sweep["folder"]).glob("*/summary.json")]
    first_round = min(
        json.loads((f / "result.json").read_text().splitlines()[0])["timestamp"] for f in folders
    )  # Tune's timestamp: whole seconds
    creates = sorted(e["time"] for e in events if e["event"] == "create")
    lost = sweep["lost"]["time"]
    replacement = min(t for t in creates if t > lost)
    last_finished = max((f / "summary.json").stat().st_mtime for f in finished_trials(story))
    gone = max(e["time"] for e in events if e["event"] == "terminate" and e["by"] == "autoscaler")
    return (
        f"cluster up {story['cluster_start_s']:.0f} s; sweep command to first worker launched "
        f"{creates[0] - sweep['started']:.0f} s; launch to first round {first_round - creates[0]:.0f} s; "
        f"worker lost to replacement launched {replacement - lost:.0f} s; last trial to last "
        f"worker gone {gone - last_finished:.0f} s (idle timeout {IDLE_TIMEOUT_MINUTES * 60:.0f} s); "
        f"side by side: sweep {sweep['ended'] - sweep['started']:.0f} s, map with kill and resume "
        f"{story['map']['resumed']['ended'] - story['map']['started']:.0f} s; story {story['seconds']:.0f} s"
    )


# -- 3. a breakdown map ---------------------------------------------------------------------------
COMPARED = [
    "aggregator",
    "breakdown_fraction",
    "status",
    "evaluated",
    "points_evaluated",
    "trials",
    "clean_accuracy",
]


def test_map_loses_a_worker_mid_wave_and_resumes_after_a_driver_kill(story):
    facts = story["map"]
    assert len(facts["steps"]) == 2, facts["output"][
        -3000:
    ]  # a worker lost, then the driver killed
    lost, killed = facts["steps"]
    assert facts["code"] == -signal.SIGKILL
    events = story["events"]
    # the map started with no worker, and the autoscaler added them as its trials waited
    before = [e for e in events if e["time"] < facts["started"]]
    alive = {e["node_id"] for e in before if e["event"] == "create"} - {
        e["node_id"] for e in before if e["event"] == "terminate"
    }
    assert not alive and story["workers_before_jobs"] == []
    assert any(e["event"] == "create" and e["time"] > facts["started"] for e in events)
    assert any(
        e["event"] == "terminate" and e["by"] == "request" and e["node_id"] == lost["node_id"]
        for e in events
    )

    resumed = facts["resumed"]
    assert resumed["code"] == 0, resumed["stderr"][-3000:]
    kept, after = facts["kept_lines"], facts["lines_after"]
    assert len(kept) == killed["kept"] >= FIRST_WAVE_RUNS
    assert f"{len(kept)} finished runs kept" in resumed["stderr"] + resumed["stdout"]
    assert after[: len(kept)] == kept  # the finished runs were replayed ...
    keys = [json.loads(line)["key"] for line in after]
    assert len(keys) == len(set(keys))  # ... none ran twice
    whole_folder = Path(story["whole_folder"])
    whole = {
        json.loads(line)["key"]: json.loads(line)["summary"]
        for line in (whole_folder / "runs.jsonl").read_text().splitlines()
    }
    assert set(keys) == set(whole)  # every run the map needs ran once
    folder = Path(facts["folder"])
    new_waves = [
        p for p in (folder / "trials").glob("runs*") if p.name not in facts["waves_before_resume"]
    ]
    assert sum(1 for w in new_waves for _ in w.glob("*/summary.json")) == len(after) - len(kept)
    for line in after:
        entry = json.loads(line)
        mine, theirs = entry["summary"], whole[entry["key"]]
        assert (mine["final_accuracy"], mine["final_loss"], mine["rounds_run"]) == (
            theirs["final_accuracy"],
            theirs["final_loss"],
            theirs["rounds_run"],
        )
    same = pd.read_csv(folder / "breakdown.csv")[COMPARED]
    pd.testing.assert_frame_equal(same, pd.read_csv(whole_folder / "breakdown.csv")[COMPARED])
    # the trial on the lost worker continued from its checkpoint, with the uninterrupted rounds.
    # Its summary says where from: Tune's result.json is the driver's, copied into the trial
    # folder by a sync that the driver's SIGKILL can cut short, leaving it empty (seen).
    assert lost["trial"] in {json.loads(line)["summary"].get("run_dir") for line in kept}
    restored = {
        str(p.parent): json.loads(p.read_text())["restored_from_rounds"]
        for p in (folder / "trials").glob("runs*/*/summary.json")
    }
    restarted = {path: rounds for path, rounds in restored.items() if rounds}
    assert list(restarted) == [lost["trial"]], restored
    (rounds,) = restarted.values()
    assert len(rounds) == 1 and first_round_after_restart_is_checkpointed(rounds[0] + 1), rounds
    assert_complete_and_uninterrupted(Path(lost["trial"]), tune_log=False)
