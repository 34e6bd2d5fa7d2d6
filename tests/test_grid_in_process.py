"""analysis/findings/grid_in_process.py: the grid's trials by index, split into shards, a finished
trial kept and a killed one started over."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from robusttune.experiments.sweep.space import load_sweep
from tests.scripts import loaded_script

SCRIPT = Path(__file__).resolve().parents[1] / "analysis" / "findings" / "grid_in_process.py"


@pytest.fixture(scope="module")
def grid():
    with loaded_script(SCRIPT, "grid_in_process_script") as module:
        yield module


@pytest.mark.parametrize(
    ("start", "end", "shards"), [(0, None, 1), (0, None, 3), (2, 7, 2), (5, 100, 4)]
)
def test_shards_split_the_index_range_without_overlap(grid, start, end, shards):
    total = 9
    parts = [grid.shard_indices(total, start, end, k, shards) for k in range(shards)]
    flat = sorted(i for part in parts for i in part)
    assert flat == list(range(start, min(total if end is None else end, total)))
    for k, part in enumerate(parts):
        assert all(i % shards == k for i in part)


def test_bad_shard_is_one_line(grid, capsys):
    with pytest.raises(SystemExit) as stop:
        grid.main(["space.yaml", "out", "--shard", "2/2"])
    assert stop.value.code == 2
    assert "--shard K/M needs 0 <= K < M; got '2/2'" in capsys.readouterr().err


def test_shards_run_the_sweeps_trials_and_a_rerun_keeps_finished_ones(grid, tmp_path, capsys):
    space = tmp_path / "space.yaml"
    space.write_text(
        "run: {dataset: synthetic, model: mlp, clients: 4, rounds: 2,\n"
        "      local_epochs: 1, synthetic_samples: 200, trainer: sequential,\n"
        "      attack: sign_flip, byzantine_fraction: 0.25}\n"
        "space: {aggregator: {grid: [mean, median]}, seed: {grid: [1, 2]}}\n"
        "search: {algorithm: grid}\n"
    )
    out = tmp_path / "out"
    sweep = load_sweep(space)
    points = sweep.expand().points
    assert len(points) == 4
    assert grid.main([str(space), str(out), "--from", "1", "--shard", "0/2"]) == 0
    assert grid.main([str(space), str(out), "--from", "1", "--shard", "1/2"]) == 0
    folders = sorted((out / "trials").iterdir())
    # index 0 is before --from; 1, 2, 3 are run, each named by its grid index and RunSpec
    assert [f.name[:5] for f in folders] == ["00001", "00002", "00003"]
    for folder in folders:
        index = int(folder.name[:5])
        assert folder == grid.trial_folder(out, index, sweep.run_spec(points[index]))
        summary = json.loads((folder / "summary.json").read_text())
        assert summary["rounds_run"] == 2
    capsys.readouterr()

    # a killed run leaves a folder without summary.json: the rerun trains it again, keeps the rest
    kept = folders[0] / "summary.json"
    before = kept.stat().st_mtime_ns
    (folders[1] / "summary.json").unlink()
    assert grid.main([str(space), str(out), "--from", "1"]) == 0
    log = capsys.readouterr().err
    assert "1: kept" in log and "3: kept" in log and "2: kept" not in log
    assert (folders[1] / "summary.json").is_file()
    assert kept.stat().st_mtime_ns == before
