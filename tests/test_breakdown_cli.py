"""``robusttune breakdown`` as a user drives it: the folder STORAGE/NAME, ``--set``, ``--dry-run``,
and ``--resume`` after a kill, which must run no finished run again and end in the map an
uninterrupted command gives. Tiny synthetic runs, in process (``--local``); the same resume on
Ray is in tests/test_sweep.py."""

from __future__ import annotations

import functools
import json
from pathlib import Path

import pandas as pd
import pytest
import yaml
from typer.testing import CliRunner

from robusttune.commands.cli import app
from robusttune.core.records import RunSummary
from robusttune.core.runspec import RunSpec
from robusttune.engine.runners import InProcessRunner
from robusttune.experiments.breakdown.store import (
    PLAN_FILE,
    RUNS_FILE,
    MapStore,
    StoredRunner,
    interrupted_lines,
    open_stored_runner,
    run_key,
)

# 2 cells on N = 10 (lattice 0..5), 2 seeds, one attack strength: 2 runs per point, 0.1 s each
TINY = """
name: tiny
run: {dataset: synthetic, model: mlp, clients: 10, rounds: 3, lr: 0.1, local_epochs: 1,
      synthetic_samples: 300, trainer: sequential}
space:
  aggregator: {grid: [mean, median]}
  attack: {grid: [sign_flip]}
breakdown: {seeds: [1, 2], adversary: {attack_strength: [3.0]}}
"""


@pytest.fixture
def space(tmp_path: Path) -> Path:
    path = tmp_path / "tiny.yaml"
    path.write_text(TINY)
    return path


class CountingRuns:
    """Replaces InProcessRunner.__call__: records the key of every run it is handed and, from the
    ``kill_at``-th run on, raises KeyboardInterrupt (Ctrl-C) instead of running it."""

    def __init__(self) -> None:
        self.keys: list[str] = []
        self.kill_at: int | None = None
        self.real = InProcessRunner.__call__

    def __call__(self, runner: InProcessRunner, specs):
        for spec in specs:
            if self.kill_at is not None and len(self.keys) >= self.kill_at:
                raise KeyboardInterrupt
            self.keys.append(run_key(spec))
        return self.real(runner, specs)


@pytest.fixture
def runs(monkeypatch) -> CountingRuns:
    counting = CountingRuns()
    # a function, so the instance binds to it as a method would (a callable object would not)
    monkeypatch.setattr(InProcessRunner, "__call__", lambda self, specs: counting(self, specs))  # noqa: PLW0108
    return counting


def breakdown(*args: str) -> object:
    return CliRunner().invoke(app, ["breakdown", *map(str, args)])


def kill_after_first_wave(monkeypatch) -> None:
    """The bisection's evaluator raises KeyboardInterrupt when it is asked for a second wave."""
    import robusttune.experiments.breakdown.replicates as replicates

    real = replicates.bisect_breakdown

    def bisect(cells, evaluate, **options):
        waves = []

        def killed(points):
            waves.append(points)
            if len(waves) > 1:
                raise KeyboardInterrupt
            return evaluate(points)

        return real(cells, killed, **options)

    monkeypatch.setattr(replicates, "bisect_breakdown", bisect)


COMPARED = [
    "aggregator",
    "breakdown_fraction",
    "status",
    "evaluated",
    "points_evaluated",
    "trials",
    "clean_accuracy",
]


TUNED = TINY.replace(
    "aggregator: {grid: [mean, median]}",
    "aggregator: {grid: [trimmed_mean]}\n  trim_ratio: {uniform: [0.0, 0.4]}",
).replace("seeds: [1, 2]", "seeds: [1], budget: 2")


# the ladder and two rule-aware attacks, listed out of their staged order (optimal IPM is run last)
STAGED = TINY.replace(
    "adversary: {attack_strength: [3.0]}", "adversary: {attack: [optimal_ipm, sign_flip, minmax]}"
).replace("  attack: {grid: [sign_flip]}\n", "")


@pytest.mark.parametrize(
    "kill",
    [
        "after the first wave",
        "in the middle of a wave",
        "in the middle of a tuned wave",
        "in the middle of a staged adversary",
    ],
)
def test_a_killed_map_resumes_without_running_a_finished_run_again(
    tmp_path, space, runs, monkeypatch, kill
):
    """The map is a deterministic function of its plan and its runs (a seeded Optuna study asks
    the same knobs once told the same scores), so the resumed map replays it and only the runs
    that never finished reach the runner."""
    if "tuned" in kill:
        space.write_text(TUNED)
    if "staged" in kill:
        space.write_text(STAGED)
    whole = breakdown(space, "--local", "--storage", tmp_path, "--name", "whole")
    assert whole.exit_code == 0, whole.output
    uninterrupted = list(runs.keys)
    runs.keys.clear()

    with monkeypatch.context() as patch:
        if kill == "after the first wave":
            kill_after_first_wave(patch)
        else:
            # the first seed's wave cut after its third run; staged: inside the ladders
            runs.kill_at = 15 if "staged" in kill else 3
        killed = breakdown(space, "--local", "--storage", tmp_path, "--name", "map")
    assert killed.exit_code == 130, killed.output
    assert "--resume" in killed.stderr.splitlines()[-1]
    before = list(runs.keys)
    kept = (tmp_path / "map" / RUNS_FILE).read_text().splitlines()
    # the first wave: each cell's first seed at its clean point and first midpoint (2 x 2 runs)
    assert len(kept) == len(before) == {"after the first wave": 4}.get(kill, runs.kill_at)
    if "tuned" in kill:  # the kept runs are Optuna's: their trim ratios differ
        assert len({json.loads(line)["summary"]["spec"]["trim_ratio"] for line in kept}) > 1
    assert not (tmp_path / "map" / "breakdown.csv").exists()

    runs.keys.clear()
    runs.kill_at = None
    resumed = breakdown(space, "--local", "--storage", tmp_path, "--name", "map", "--resume")
    assert resumed.exit_code == 0, resumed.output
    after = list(runs.keys)
    assert after and not set(after) & set(before)  # no finished run ran again
    assert sorted(before + after) == sorted(uninterrupted)  # and every run the map needs ran once
    assert f"{len(before)} runs kept from before" in resumed.output
    same = pd.read_csv(tmp_path / "map" / "breakdown.csv")[COMPARED]
    pd.testing.assert_frame_equal(same, pd.read_csv(tmp_path / "whole" / "breakdown.csv")[COMPARED])
    if "staged" in kill:  # a point stopped at its first break: fewer runs than every variant
        table = pd.read_csv(tmp_path / "whole" / "breakdown.csv")
        attacked = table["points_evaluated"].sum() - len(table)
        assert len(uninterrupted) < 2 * (len(table) + attacked * (4 + 2))
        assert set(table["attack_family"].dropna()) <= {"ladder", "rule-aware"}


def test_name_storage_and_set_place_and_record_the_map(tmp_path, space, runs):
    result = breakdown(
        space, "--local", "--storage", tmp_path / "store", "--name", "placed", "--set", "rounds=2"
    )
    assert result.exit_code == 0, result.output
    folder = tmp_path / "store" / "placed"
    assert (folder / "breakdown.csv").exists() and not (tmp_path / "results").exists()
    text = (folder / PLAN_FILE).read_text()
    assert text.startswith("# robusttune breakdown") and "--set rounds=2" in text.splitlines()[0]
    plan = yaml.safe_load(text)
    assert plan["name"] == "placed" and plan["run"]["rounds"] == 2
    summaries = [
        json.loads(line)["summary"] for line in (folder / RUNS_FILE).read_text().splitlines()
    ]
    assert len(summaries) == len(runs.keys)
    assert {s["rounds_run"] for s in summaries} == {2} and {
        s["spec"]["rounds"] for s in summaries
    } == {2}
    # one progress line per wave off a terminal, none of Ray's tables
    progress = [line for line in result.stderr.splitlines() if line.startswith("breakdown: ")]
    assert progress and "4/4 cell-seeds done" in progress[-1] and "left 0s" in progress[-1]

    # what a user may do next, and what is refused in one line
    def refused(*args: str, words: tuple[str, ...]) -> None:
        again = breakdown(space, "--local", "--storage", tmp_path / "store", *args)
        lines = again.output.strip().splitlines()
        assert again.exit_code == 2 and len(lines) == 1, again.output
        assert all(word in lines[0] for word in words), lines[0]

    refused("--name", "placed", "--set", "rounds=2", words=("already holds", "--resume", "--name"))
    refused(
        "--name",
        "placed",
        "--resume",
        words=("different plan", "run.rounds: 2 there, 3 now", "--name"),
    )
    refused(
        "--name",
        "placed",
        "--set",
        "rounds=2",
        "--max-fraction",
        "0.3",
        "--resume",
        words=("different plan", "breakdown", "--name"),
    )
    refused("--name", "nothing", "--resume", words=("holds no breakdown map",))
    refused("--name", "placed", "--dry-run", "--resume", words=("exclude",))
    assert not (tmp_path / "store" / "nothing").exists()

    # the same plan with more CPUs per trial is the same map: nothing runs again
    runs.keys.clear()
    again = breakdown(
        space,
        "--local",
        "--storage",
        tmp_path / "store",
        "--name",
        "placed",
        "--set",
        "rounds=2",
        "--cpus-per-trial",
        "2",
        "--resume",
    )
    assert again.exit_code == 0, again.output
    assert runs.keys == []


def test_dry_run_prints_cells_lattices_and_the_bound_and_writes_nothing(tmp_path, space, runs):
    result = breakdown(space, "--dry-run", "--storage", tmp_path / "store")
    assert result.exit_code == 0, result.output
    out = result.output
    assert "mean" in out and "median" in out and "{0, 1/10, ..., 5/10}" in out
    assert "1: attack_strength=3.0" in out
    # per cell: clean 2 seeds + 5 attacked points x 2 seeds x 1 variant = 12; bisection: the
    # first seed 1 clean + ceil(log2 6) = 3 midpoints + 2 verification points = 6, the whole
    # lattice here; the second seed 1 clean + b1 + b1 + 1 = 3: 9 a cell
    assert "at most 24" in out and "about 18" in out
    assert not (tmp_path / "store").exists() and runs.keys == []

    # the default adversary (the attack's ladder) and a tuned knob multiply the trials
    tuned = space.with_name("tuned.yaml")
    tuned.write_text(
        TINY.replace("clients: 10", "clients: 20")
        .replace("adversary: {attack_strength: [3.0]}", "budget: 3")
        .replace(
            "attack: {grid: [sign_flip]}",
            "attack: {grid: [sign_flip]}\n  trim_ratio: {uniform: [0.0, 0.4]}",
        )
    )
    out = breakdown(tuned, "--dry-run", "--storage", tmp_path / "store").output
    assert "4: attack_strength=1.0 | attack_strength=3.0 | attack_strength=10.0" in out
    # per cell: 2 seeds x 3 budget x (1 + 10 x 4 variants) = 246; bisection: the first seed
    # 1 + 4 + 2 = 7 points, the second 3; a clean point takes 3 trials, an attacked one 3 x 4
    assert "at most 492" in out and "about 2 x" not in out
    assert f"about {2 * (2 * 3 + (7 + 3 - 2) * 3 * 4)}" in out
    assert "budget 3 Optuna trials per point for trim_ratio" in out


def test_bad_command_line_values_are_one_line_and_named_as_typed(tmp_path, space):
    for args, words in [
        (["--set", "rounds=0"], ("with --set rounds=0", "rounds must be")),
        (["--cpus-per-trial", "-1"], ("--cpus-per-trial -1", "resources.cpu")),
        (["--max-concurrent", "-2"], ("--max-concurrent -2", "max_concurrent")),
        (["--name", "a b"], ("--name a b", "name")),
        (["--storage", "s3://bucket/maps"], ("--storage s3://bucket/maps",)),
    ]:
        result = (
            breakdown(space, "--local", "--storage", tmp_path, *args)
            if args[0] != "--storage"
            else breakdown(space, "--local", *args)
        )
        lines = result.output.strip().splitlines()
        assert result.exit_code == 2 and len(lines) == 1, result.output
        assert all(word in lines[0] for word in words), lines[0]
    assert list(tmp_path.iterdir()) == [space]


def test_a_flag_may_settle_what_the_file_alone_leaves_wrong(tmp_path, space):
    # the command line is written into the file's mapping before it is validated, not after
    from robusttune.commands.breakdown import prepare_plan
    from robusttune.core.registry import SpecError

    mapping = yaml.safe_load(space.read_text())
    cuda = tmp_path / "cuda.yaml"
    cuda.write_text(
        yaml.safe_dump(
            {**mapping, "run": {**mapping["run"], "device": "cuda"}, "resources": {"gpu": 0}}
        )
    )
    with pytest.raises(SpecError, match=r"^cuda.yaml: run.device cuda needs resources.gpu > 0"):
        prepare_plan(cuda)
    assert prepare_plan(cuda, gpus_per_trial="auto").resources["gpu"] == "auto"
    assert prepare_plan(cuda, assignments=["device=cpu"]).base["device"] == "cpu"
    with pytest.raises(SpecError, match=r"^cuda.yaml with --gpus-per-trial -1: resources.gpu"):
        prepare_plan(cuda, gpus_per_trial=-1)


# -- the store, on its own --------------------------------------------------------------------
def summary(accuracy: float, error: str | None = None) -> RunSummary:
    return RunSummary.from_dict(
        {"final_accuracy": accuracy, "collapsed": False, "rounds_run": 1, "error": error}
    )


def test_a_torn_last_line_is_skipped_with_a_note_and_never_misread(tmp_path):
    store = MapStore(tmp_path)
    specs = [RunSpec.from_dict({"dataset": "synthetic", "seed": s}) for s in (1, 2, 3)]
    store.append(specs[0], summary(0.5))
    store.append(specs[1], summary(float("nan")))
    # a kill in the middle of the third line's write
    line = json.dumps({"key": run_key(specs[2]), "summary": summary(0.7).to_dict()})
    with store.runs_path.open("a") as handle:
        handle.write(line[: len(line) // 2])
    finished = store.finished()
    assert set(finished) == {run_key(specs[0]), run_key(specs[1])}
    assert finished[run_key(specs[0])].final_accuracy == 0.5
    assert finished[run_key(specs[1])].final_accuracy != finished[run_key(specs[1])].final_accuracy
    assert len(store.notes) == 1 and "line 3" in store.notes[0] and "run again" in store.notes[0]
    # the run is run again and kept on a line of its own
    store.append(specs[2], summary(0.7))
    again = MapStore(tmp_path)
    assert again.finished()[run_key(specs[2])].final_accuracy == 0.7 and len(again.notes) == 1


def test_the_stored_runner_sends_a_wave_missing_runs_together_and_keeps_no_error(tmp_path):
    """On Ray a wave's missing runs go to TuneBatchRunner as one call (its trials run side by
    side); the kept ones never reach it; an errored run is not kept, so a resume retries it."""
    calls: list[list[int]] = []

    def wave(specs):
        calls.append([s.seed for s in specs])
        return [summary(0.1 * s.seed, error="lost node" if s.seed == 4 else None) for s in specs]

    store = MapStore(tmp_path)
    specs = [RunSpec.from_dict({"dataset": "synthetic", "seed": s}) for s in (1, 2, 3, 4)]
    store.append(specs[1], summary(0.9))
    runner = StoredRunner(wave, store, store.finished())
    out = runner([*specs, specs[0]])
    assert calls == [[1, 3, 4]]  # one call, the kept run left out, no run twice
    assert [s.final_accuracy for s in out] == pytest.approx([0.1, 0.9, 0.3, 0.4, 0.1])
    assert set(store.finished()) == {run_key(s) for s in specs[:3]}
    assert (runner.ran, runner.reused) == (3, 1)  # the repeated run was run once, not kept before


def test_the_map_the_horizon_and_the_study_open_their_store_through_one_helper(tmp_path, space):
    """open_stored_runner: in process each run is kept as it ends; a resume tells the store's
    notes and the count of kept runs; the refusal names the command's own kind of folder."""
    from robusttune.core.registry import SpecError
    from robusttune.experiments.breakdown import load_plan

    plan = load_plan(space)
    specs = [RunSpec.from_dict({"dataset": "synthetic", "seed": s}) for s in (1, 2)]
    calls: list[list[int]] = []
    told: list[str] = []

    def inner(batch):
        calls.append([s.seed for s in batch])
        return [summary(0.25 * s.seed) for s in batch]

    folder = tmp_path / "horizon"
    open_horizon = functools.partial(
        open_stored_runner,
        folder,
        plan,
        inner,
        command="cmd",
        say=told.append,
        kind="horizon measurement",
        result_file="horizon.csv",
    )
    first = open_horizon(resume=False, local=True)
    assert told == [] and [s.final_accuracy for s in first(specs)] == [0.25, 0.5]
    assert calls == [[1], [2]]  # in process: one run a call, each kept at once
    with (folder / RUNS_FILE).open("a") as handle:  # a kill in the middle of a third line
        handle.write('{"key": ')
    with pytest.raises(SpecError, match="already holds a horizon measurement"):
        open_horizon(resume=False, local=True)
    again = open_horizon(resume=True, local=False)
    assert len(told) == 2 and "line 3 is incomplete" in told[0]
    assert told[1] == f"resuming {folder}: 2 finished runs kept in {RUNS_FILE}"
    assert [s.final_accuracy for s in again(specs)] == [0.25, 0.5] and len(calls) == 2
    assert interrupted_lines(folder, "robusttune horizon x.yaml") == [
        f"interrupted: the finished runs are kept in {folder / RUNS_FILE}",
        "continue with: robusttune horizon x.yaml --resume",
    ]


def test_set_seed_maps_that_seed_where_the_file_names_seeds():
    # breakdown.yaml names breakdown.seeds [42, 43, 44]: `--set seed=7` must map seed 7 alone,
    # not those three silently
    from robusttune.experiments.breakdown import load_plan

    shipped = Path(__file__).resolve().parents[1] / "search_spaces" / "breakdown.yaml"
    plan = load_plan(shipped)
    assert plan.seeds == [42, 43, 44]
    moved = plan.with_overrides(run={"seed": 7})
    assert moved.seeds == [7] and moved.raw["breakdown"]["seeds"] == [7]
    assert moved.identity() != plan.identity()  # a resumed seed-42 map is not this one
    assert plan.with_overrides(run={"rounds": 3}).seeds == [42, 43, 44]
    # the seeds alone may change on a resume (a longer list adds replicates)
    grown = plan.with_overrides(seeds=[42, 43, 44, 45])
    assert grown.seeds == [42, 43, 44, 45] and grown.identity() == plan.identity()


# The RunSpec keys of every map kept before `KEYS_ADDED_LATER` existed (session 7): a key added
# since must be listed there, or every kept map and tuning study would re-run from scratch.
KEYS_OF_THE_FIRST_MAPS = frozenset(
    [
        "aggregate_weights",
        "aggregator",
        "algorithm",
        "assumed_byzantine_fraction",
        "attack",
        "attack_direction",
        "attack_scope",
        "attack_strength",
        "batch_size",
        "bucket_size",
        "byzantine_fraction",
        "cache_dtype",
        "cclip_iters",
        "cclip_scale",
        "cclip_tau",
        "checkpoint_every",
        "clients",
        "data_root",
        "dataset",
        "demoa_ablation",
        "demoa_alpha",
        "device",
        "dirichlet_alpha",
        "eval_every",
        "fltrust_root_size",
        "gm_iters",
        "guarded",
        "krum_m",
        "local_epochs",
        "lr",
        "marina_clip_multiplier",
        "marina_compress_ratio",
        "marina_compressor",
        "marina_p",
        "marina_variant",
        "median_even",
        "method",
        "model",
        "momentum",
        "numerics",
        "participation",
        "participation_mode",
        "partition_seed",
        "pre_aggregator",
        "rounds",
        "sample_size",
        "seed",
        "server_lr",
        "swb_chunk",
        "swb_rotation",
        "swb_views",
        "synthetic_classes",
        "synthetic_samples",
        "synthetic_shape",
        "trainer",
        "trim_ratio",
        "validation_fraction",
    ]
)


def test_every_runspec_key_added_since_the_first_maps_keeps_their_runs_resumable():
    from robusttune.core.schema import RunSchema
    from robusttune.experiments.breakdown.store import KEYS_ADDED_LATER

    added = set(RunSpec.from_dict({}).to_dict()) - KEYS_OF_THE_FIRST_MAPS
    assert added == set(KEYS_ADDED_LATER), (
        "a new RunSpec key needs its old-behaviour value in KEYS_ADDED_LATER"
    )
    for key, value in KEYS_ADDED_LATER.items():
        assert RunSchema.model_fields[key].default == value, key


def test_a_run_kept_before_a_key_was_added_answers_the_spec_at_that_keys_old_value(tmp_path):
    store = MapStore(tmp_path)
    spec = RunSpec.from_dict({"dataset": "synthetic", "seed": 3})
    # the lines an older version wrote: no train_samples in the key at all, and the added key
    # spelled at its old value; both are this run
    old_key = {k: v for k, v in json.loads(run_key(spec)).items() if k != "train_samples"}
    lines = [
        {"key": json.dumps(key, sort_keys=True), "summary": summary(0.625).to_dict()}
        for key in (old_key, {**old_key, "train_samples": None})
    ]
    store.runs_path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    finished = store.finished()
    assert set(finished) == {run_key(spec)} and finished[run_key(spec)].final_accuracy == 0.625
    # a spec that uses the new key is another run
    subset = RunSpec.from_dict({"dataset": "synthetic", "seed": 3, "train_samples": 500})
    assert run_key(subset) != run_key(spec) and json.loads(run_key(subset))["train_samples"] == 500
    calls = []
    runner = StoredRunner(
        lambda specs: calls.append(specs) or [summary(0.5) for _ in specs], store, finished
    )
    assert [s.final_accuracy for s in runner([spec, subset])] == [0.625, 0.5]
    assert [s.train_samples for s in calls[0]] == [500]
