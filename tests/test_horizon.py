"""A map's horizon (issue 27, item 5): the plateau round of each cell's clean run, and the map
written again at those rounds."""

from __future__ import annotations

import csv
import gzip
import json
import math
from pathlib import Path

import numpy as np
import pytest
import yaml
from typer.testing import CliRunner

from robusttune.commands.cli import app
from robusttune.experiments.breakdown.horizon import plateau_round
from robusttune.experiments.breakdown.plan import load_plan
from tests.scripts import loaded_script


def independent_plateau(rounds, accuracies, window, tolerance):
    """The definition again, with numpy: a trailing mean by convolution, counts at the start."""
    a = np.nan_to_num(np.asarray(accuracies, dtype=float), nan=0.0, posinf=0.0, neginf=0.0)
    sums = np.convolve(a, np.ones(window))[: a.size]
    counts = np.minimum(np.arange(1, a.size + 1), window)
    smoothed = sums / counts
    first = int(np.asarray(rounds)[np.argmax(smoothed >= smoothed.max() - tolerance)])
    return first, smoothed.max()


def test_a_saturating_curve_plateaus_where_it_comes_within_the_tolerance():
    rounds = list(range(5, 105, 5))
    curve = [0.9 * (1 - math.exp(-r / 15)) for r in rounds]
    plateau = plateau_round(rounds, curve, window=1, tolerance=0.02)
    # by hand: max = 0.9 (1 - e^{-100/15}) = 0.89885; 0.9 (1 - e^{-r/15}) >= 0.87885 needs
    # e^{-r/15} <= 0.02350, r >= 15 ln(1 / 0.02350) = 56.3: the first evaluation after is 60
    assert plateau.round == 60 and plateau.reached
    assert plateau.level == pytest.approx(curve[-1])
    assert (plateau.round, plateau.level) == pytest.approx(
        independent_plateau(rounds, curve, 1, 0.02)
    )


def test_smoothing_ignores_one_lucky_evaluation_and_a_climbing_curve_is_not_reached():
    rounds = [2, 4, 6, 8, 10, 12]
    lucky = [0.2, 0.9, 0.3, 0.5, 0.6, 0.6]
    assert plateau_round(rounds, lucky, window=1, tolerance=0.01).round == 4
    smoothed = plateau_round(rounds, lucky, window=3, tolerance=0.01)
    # trailing means: 0.2, 0.55, 0.467, 0.567, 0.467, 0.567 -> best 0.567 at round 8
    assert smoothed.round == 8 and smoothed.level == pytest.approx(0.5666666, abs=1e-6)
    assert smoothed.reached  # 8 <= (2/3) 12
    climbing = plateau_round(rounds, [0.1, 0.2, 0.3, 0.4, 0.5, 0.6], window=2, tolerance=0.02)
    assert climbing.round == 12 and not climbing.reached
    rng = np.random.default_rng(5)
    for _ in range(20):
        noisy = list(rng.random(12))
        got = plateau_round(list(range(1, 13)), noisy, window=3, tolerance=0.05)
        assert (got.round, got.level) == pytest.approx(
            independent_plateau(range(1, 13), noisy, 3, 0.05)
        )


def test_a_diverged_curve_has_no_plateau_and_a_non_finite_evaluation_counts_as_zero():
    assert plateau_round([1, 2], [math.nan, math.nan]).round is None
    # a NaN evaluation in the middle pulls its window down instead of being skipped
    # (trailing means 0.5, 0.65, 0.4, 0.4; skipped, the NaN would give 0.5, 0.65, 0.8, 0.8)
    got = plateau_round([1, 2, 3, 4], [0.5, 0.8, math.nan, 0.8], window=2, tolerance=0.05)
    assert got.round == 2 and got.level == pytest.approx(0.65)
    with pytest.raises(ValueError, match="one accuracy per evaluated round"):
        plateau_round([1, 2], [0.5])


MAP = {
    "name": "tiny",
    "run": {
        "dataset": "synthetic",
        "synthetic_samples": 300,
        "synthetic_shape": "16",
        "model": "mlp",
        "clients": 6,
        "local_epochs": 1,
        "lr": 0.05,
    },
    "space": {
        "setting": {"grid": [{"method": "fedavg", "rounds": 3}, {"method": "median", "rounds": 4}]},
        "regime": {"grid": [{"participation": 0.5, "participation_mode": "fixed"}]},
    },
    "breakdown": {"seeds": [3], "adversary": {"attack": ["sign_flip"]}},
}


def test_horizon_writes_each_cells_plateau_and_a_map_at_it_that_resumes(tmp_path):
    space = tmp_path / "tiny.yaml"
    space.write_text(yaml.safe_dump(MAP))
    runner = CliRunner()
    args = [
        "horizon",
        str(space),
        "--storage",
        str(tmp_path / "out"),
        "--local",
        "--max-rounds",
        "16",
        "--eval-every",
        "2",
    ]
    result = runner.invoke(app, args)
    assert result.exit_code == 0, result.output
    folder = tmp_path / "out" / "tiny_horizon"
    rows = list(csv.DictReader((folder / "horizon.csv").open()))
    assert [r["method"] for r in rows] == ["fedavg", "median"]
    # each horizon is the definition applied to the run's own evaluated validation accuracies
    runs = [json.loads(line) for line in (folder / "runs.jsonl").read_text().splitlines()]
    assert len(runs) == 2
    kept_curves = list(csv.DictReader((folder / "curves.csv").open()))
    for row, run in zip(rows, runs):
        curve = list(csv.DictReader((Path(run["summary"]["run_dir"]) / "rounds.csv").open()))
        evaluated = [r for r in curve if r["validation_accuracy"] not in ("", "nan")]
        assert [int(r["round"]) for r in evaluated] == list(range(2, 17, 2))
        expected, level = independent_plateau(
            [int(r["round"]) for r in evaluated],
            [float(r["validation_accuracy"]) for r in evaluated],
            3,
            0.02,
        )
        assert int(row["plateau_round"]) == expected
        assert float(row["plateau_level"]) == pytest.approx(level)
        # curves.csv keeps exactly the points the plateau was read from
        mine = [c for c in kept_curves if (c["cell"], c["seed"]) == (row["cell"], row["seed"])]
        assert [(int(c["round"]), float(c["selection_accuracy"])) for c in mine] == [
            (int(r["round"]), float(r["validation_accuracy"])) for r in evaluated
        ]
    assert len(kept_curves) == 2 * 8
    # the map again, each cell at its horizon: a plan breakdown loads, same cells otherwise
    plan = load_plan(folder / "at_plateau.yaml")
    assert [c.as_dict() for c in plan.cells] == [
        {
            "method": "fedavg",
            "rounds": int(rows[0]["plateau_round"]),
            "participation": 0.5,
            "participation_mode": "fixed",
        },
        {
            "method": "median",
            "rounds": int(rows[1]["plateau_round"]),
            "participation": 0.5,
            "participation_mode": "fixed",
        },
    ]
    assert plan.seeds == [3] and plan.adversary == {"attack": ["sign_flip"]}
    assert plan.name == "tiny_at_plateau"
    assert "| horizon |" in (folder / "horizon.md").read_text()
    # a resume runs nothing again; a changed measurement is refused in one line
    again = runner.invoke(app, [*args, "--resume"])
    assert again.exit_code == 0 and "resumed: 2 runs kept from before, 0 new" in again.output
    changed = runner.invoke(app, [*args[:-1], "4", "--resume"])
    assert changed.exit_code == 2 and "different plan" in changed.output
    assert "horizon.eval_every: 2 there, 4 now" in changed.output


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        ("tiny_horizon", "tiny_at_plateau"),
        ("tiny_fashion_horizon", "tiny_fashion_at_plateau"),
        ("my_measurement", "my_measurement_at_plateau"),
    ],
)
def test_the_map_at_the_plateau_is_named_after_the_measurement(tmp_path, name, expected):
    """Two measurements of one map (say --set dataset=...) give maps that can share a storage."""
    from robusttune.experiments.breakdown.horizon import HorizonPlan, at_plateau

    space = tmp_path / "tiny.yaml"
    space.write_text(yaml.safe_dump(MAP))
    measurement = HorizonPlan(load_plan(space), max_rounds=16, eval_every=2, name=name)
    mapping = at_plateau(measurement, {0: 6, 1: 8})
    assert mapping["name"] == expected
    assert [entry["rounds"] for entry in mapping["space"]["cell"]["grid"]] == [6, 8]


@pytest.mark.parametrize(
    ("flag", "value", "message"),
    [
        ("--eval-every", "0", "--eval-every must be an integer >= 1; got 0"),
        ("--eval-every", "500", "--eval-every 500 exceeds --max-rounds 200"),
        ("--tolerance", "1.5", "--tolerance must be a number in [0, 1); got 1.5"),
    ],
)
def test_bad_horizon_settings_are_one_line_and_start_nothing(tmp_path, flag, value, message):
    space = tmp_path / "tiny.yaml"
    space.write_text(yaml.safe_dump(MAP))
    result = CliRunner().invoke(
        app, ["horizon", str(space), "--storage", str(tmp_path / "out"), "--local", flag, value]
    )
    assert result.exit_code == 2 and message in result.output
    assert len(result.output.strip().splitlines()) == 1
    assert not (tmp_path / "out").exists()


KEPT = Path(__file__).resolve().parents[1] / "analysis" / "findings" / "horizon_maps"


def kept_curves(folder: Path) -> dict[tuple[str, str], tuple[np.ndarray, np.ndarray]]:
    """A kept measurement's curves.csv.gz: (cell, seed) -> (evaluated rounds, accuracies)."""
    points: dict[tuple[str, str], list[tuple[int, float]]] = {}
    with gzip.open(folder / "curves.csv.gz", "rt") as rows:
        for point in csv.DictReader(rows):
            points.setdefault((point["cell"], point["seed"]), []).append(
                (int(point["round"]), float(point["selection_accuracy"]))
            )
    return {key: tuple(map(np.asarray, zip(*curve))) for key, curve in points.items()}


@pytest.fixture(scope="module")
def default_map():
    return load_plan(Path(__file__).resolve().parents[1] / "search_spaces" / "breakdown.yaml")


@pytest.mark.parametrize("kept", sorted(p.name for p in KEPT.glob("*_horizon")))
def test_a_kept_map_at_the_horizon_is_the_map_with_each_cell_at_its_measured_plateau(
    kept, default_map
):
    """analysis/findings/horizon_maps/*_horizon: at_plateau.yaml holds breakdown.yaml's cells, in
    its order, each at the plateau round horizon.csv measured for it, everything else as
    breakdown.yaml (with the measurement's --set keys in its run)."""
    folder = KEPT / kept
    rows = list(csv.DictReader((folder / "horizon.csv").open()))
    plan = load_plan(folder / "at_plateau.yaml")
    whole = default_map
    assert len(rows) == len(plan.cells) == len(whole.cells) == 100
    for index, (row, cell, original) in enumerate(zip(rows, plan.cells, whole.cells)):
        assert int(row["cell"]) == index
        assert cell.as_dict() == {**original.as_dict(), "rounds": int(row["plateau_round"])}
        assert int(row["cell_rounds"]) == original.as_dict()["rounds"]
    # kept at breakdown.yaml's first seed (measured before maps ran several; a longer seeds
    # list on --resume adds the others' replicates)
    assert whole.seeds[: len(plan.seeds)] == plan.seeds and plan.adversary == whole.adversary
    assert {k: v for k, v in plan.base.items() if k not in ("dataset", "train_samples")} == {
        k: v for k, v in whole.base.items() if k not in ("dataset", "train_samples")
    }


@pytest.mark.parametrize(
    ("over_seeds", "one_seed"),
    [
        ("digits_seeds", "digits_horizon/at_plateau.yaml"),
        ("fashion_seeds", "fashion_at_plateau_1200.yaml"),
    ],
)
def test_a_map_at_the_horizon_over_seeds_is_the_kept_plan_at_the_default_seeds(
    default_map, over_seeds, one_seed
):
    """horizon_maps/digits_seeds.yaml and fashion_seeds.yaml (issue 56): the map at the horizon's
    cells, each at the plateau round seed 42 measured, over breakdown.yaml's seeds and clean
    margin, all else as the one-seed plan it extends; its two part maps hold every cell once
    between them."""
    kept = load_plan(KEPT / one_seed)
    seeds = load_plan(KEPT / f"{over_seeds}.yaml")
    assert [c.as_dict() for c in seeds.cells] == [c.as_dict() for c in kept.cells]
    assert seeds.seeds == default_map.seeds and len(seeds.seeds) >= 3
    assert seeds.clean_margin == default_map.clean_margin
    assert seeds.base == kept.base and seeds.adversary == kept.adversary
    assert seeds.name == f"{kept.name}_seeds"
    parts = [load_plan(KEPT / f"{over_seeds}_part{k}of2.yaml") for k in range(2)]
    dealt = sorted(json.dumps(c.as_dict(), sort_keys=True) for part in parts for c in part.cells)
    assert dealt == sorted(json.dumps(c.as_dict(), sort_keys=True) for c in seeds.cells)
    assert all(part.seeds == seeds.seeds for part in parts)


@pytest.mark.parametrize("kept", sorted(p.name for p in KEPT.glob("*_horizon")))
def test_a_kept_horizon_is_the_plateau_rule_applied_to_its_kept_curves(kept):
    """curves.csv.gz holds every evaluated point of the kept clean curves; the plateau rule
    (independent_plateau, at the measurement's window 3 and tolerance 0.02) applied to them
    gives horizon.csv's plateau round, and the curve's points give its accuracies."""
    folder = KEPT / kept
    rows = list(csv.DictReader((folder / "horizon.csv").open()))
    curves = kept_curves(folder)
    assert sorted(curves) == sorted((row["cell"], row["seed"]) for row in rows)
    for row in rows:
        rounds, accuracies = curves[row["cell"], row["seed"]]
        # every 5 rounds to 400, or to the round a diverged run stopped at
        assert (
            list(rounds[:-1]) == list(range(5, 5 * len(rounds), 5))
            and rounds[-2] < rounds[-1] <= 400
        )
        first, level = independent_plateau(rounds, accuracies, 3, 0.02)
        assert int(row["plateau_round"]) == first, row["cell"]
        assert float(row["plateau_level"]) == pytest.approx(level)
        assert float(row["accuracy_at_plateau"]) == pytest.approx(
            dict(zip(rounds, accuracies))[first]
        )
        assert float(row["accuracy_at_max_rounds"]) == pytest.approx(accuracies[-1])


def test_fashions_unreached_horizons_at_p_one_tenth_are_curves_still_climbing():
    """horizon.md (session 15): every Fashion-MNIST cell at p = 0.1 not at a plateau within 400
    rounds gains more than the rule's tolerance (0.02) from the middle third of its curve to the
    last: still climbing, not a noisy flat curve whose best trailing mean fell late by chance."""
    folder = KEPT / "fashion_horizon"
    rows = list(csv.DictReader((folder / "horizon.csv").open()))
    curves = kept_curves(folder)
    unreached = [
        row
        for row in rows
        if row["plateau_reached"] == "False" and float(row["participation"]) == 0.1
    ]
    assert len(unreached) == 26
    for row in unreached:
        rounds, accuracies = curves[row["cell"], row["seed"]]
        middle = accuracies[(rounds > 400 / 3) & (rounds <= 800 / 3)].mean()
        last = accuracies[rounds > 800 / 3].mean()
        assert last - middle > 0.02, (row["cell"], row["method"], last - middle)


ROOT = Path(__file__).resolve().parents[1]
SHORT_MAPS = ROOT / "analysis" / "findings" / "claim10_fashion"

# (the finished map at the horizon, the plan it ran, the same cells at the map's rounds)
KEPT_HORIZON_MAPS = {
    "digits": ("breakdown_at_plateau", "digits_horizon/at_plateau.yaml", "breakdown_digits"),
    "fashion_mnist": (
        "breakdown_fashion_at_plateau",
        "fashion_at_plateau_1200.yaml",
        "breakdown_fashion",
    ),
}


def _map_summary(folder: Path, other: Path):
    """claim10_map's per-method summary of map ``folder`` against map ``other``, cell by cell."""
    with loaded_script(
        ROOT / "analysis" / "findings" / "claim10_map.py", "claim10_map_horizon"
    ) as tool:
        return tool.dataset_summary(
            tool.read_map_csv(folder / "breakdown.csv"), tool.read_map_csv(other / "breakdown.csv")
        )


def _horizon_md() -> str:
    return " ".join((ROOT / "analysis" / "findings" / "horizon.md").read_text().split())


def _cell_key(cell: dict) -> tuple:
    """A map cell's identity without its rounds, from a plan's cell or a breakdown.csv row (where
    a cell without a pre-aggregator has it blank)."""
    return (
        cell["method"],
        float(cell["participation"]),
        cell["participation_mode"],
        cell.get("pre_aggregator") or "none",
    )


@pytest.mark.parametrize("dataset", list(KEPT_HORIZON_MAPS))
def test_a_kept_map_at_the_horizon_is_the_plan_it_ran_and_its_moves_are_horizon_md_s(dataset):
    """horizon_maps/<map> (a finished map at the horizon): one row per cell of the plan it ran
    at its plateau round, as many runs kept as its cells' trials; set beside the map at the map's
    rounds (claim10_map's per-method summary), the cells that move up and down, and the runs and
    lattice points, are what horizon.md states."""
    kept_map, horizon, short = KEPT_HORIZON_MAPS[dataset]
    folder = KEPT / kept_map
    plan = load_plan(KEPT / horizon)
    cells = list(csv.DictReader((folder / "breakdown.csv").open()))
    assert len(cells) == len(plan.cells) == 100
    planned = sorted((*_cell_key(c.as_dict()), int(c.as_dict()["rounds"])) for c in plan.cells)
    kept = sorted((*_cell_key(c), int(c["rounds"])) for c in cells)
    assert kept == planned
    with gzip.open(folder / "runs.jsonl.gz", "rt") as lines:
        runs = sum(1 for _ in lines)
    assert runs == sum(int(c["trials"]) for c in cells)
    points = sum(int(c["points_evaluated"]) for c in cells)
    summary = _map_summary(folder, SHORT_MAPS / short)
    up, down = int(summary["higher"].sum()), int(summary["lower"].sum())
    text = _horizon_md()
    assert f"{up + down} of the 100 answers move with the horizon: {up} up, {down} down" in text
    assert f"{runs:,} runs ({points} lattice points in" in text


def test_fashion_mnist_against_digits_at_the_horizon_is_what_horizon_md_states():
    """The two kept maps at the horizon, cell by cell: the answers higher and lower on
    Fashion-MNIST are horizon.md's counts, and fewer than between the maps at the map's rounds
    (the short maps' rise on Fashion-MNIST was in part the lower survival bar)."""
    fashion, digits = KEPT / "breakdown_fashion_at_plateau", KEPT / "breakdown_at_plateau"
    summary = _map_summary(fashion, digits)
    up, down = int(summary["higher"].sum()), int(summary["lower"].sum())
    assert (
        f"{up + down} of the 100 answers differ with the data at the horizon: {up} higher on "
        f"Fashion-MNIST, {down} lower"
    ) in _horizon_md()
    short = _map_summary(SHORT_MAPS / "breakdown_fashion", SHORT_MAPS / "breakdown_digits")
    assert up < int(short["higher"].sum()) and up + down < int(
        (short["higher"] + short["lower"]).sum()
    )


def test_fashions_slow_cells_at_1200_rounds_repeat_the_400_round_curves_and_plateau():
    """horizon_maps/fashion_p01_at_1200 (session 20): the 26 climbing cells' clean runs again, to
    1200 rounds. Their first 400 rounds are the 400-round curves exactly (same RunSpec but the
    rounds, portable numerics); the plateau rule on the kept curves gives horizon.csv, every cell
    reaches it; fashion_p01_at_plateau.yaml re-runs exactly the cells whose plateau moved, at it."""
    slow = KEPT / "fashion_p01_at_1200"
    rows = list(csv.DictReader((slow / "horizon.csv").open()))
    earlier = {
        (r["method"], r["pre_aggregator"], r["participation_mode"]): r
        for r in csv.DictReader((KEPT / "fashion_horizon" / "horizon.csv").open())
        if float(r["participation"]) == 0.1
    }
    long_curves, short_curves = kept_curves(slow), kept_curves(KEPT / "fashion_horizon")
    assert len(rows) == 26
    moved = {}
    for row in rows:
        before = earlier[row["method"], row["pre_aggregator"], row["participation_mode"]]
        assert before["plateau_reached"] == "False"
        rounds, accuracies = long_curves[row["cell"], row["seed"]]
        short_rounds, short_accuracies = short_curves[before["cell"], before["seed"]]
        assert list(rounds[: len(short_rounds)]) == list(short_rounds)
        assert list(accuracies[: len(short_rounds)]) == list(short_accuracies)
        first, _ = independent_plateau(rounds, accuracies, 3, 0.02)
        assert int(row["plateau_round"]) == first and row["plateau_reached"] == "True"
        if first != int(before["plateau_round"]):
            moved[row["method"], row["pre_aggregator"] or "none", row["participation_mode"]] = first
    rerun = load_plan(KEPT / "fashion_p01_at_plateau.yaml")
    assert {
        (
            c.as_dict()["method"],
            c.as_dict().get("pre_aggregator", "none"),
            c.as_dict()["participation_mode"],
        ): int(c.as_dict()["rounds"])
        for c in rerun.cells
    } == moved
    assert len(moved) == 15


def test_fashions_map_at_the_horizon_takes_the_slow_cells_at_their_1200_round_plateau():
    """fashion_at_plateau_1200.yaml (the plan the kept Fashion-MNIST map ran): fashion_horizon's
    cells at their 400-round plateau, but the 15 whose plateau moved at fashion_p01_at_plateau.yaml's
    round. Its start (fashion_at_plateau_1200_start.csv) is the map at the map's rounds, row for
    row, but for those 15 cells' answers (the map at the 400-round plateau they were re-run from):
    each cell starts where its kept runs were searched from, so the joined runs are the map."""
    cells = lambda name: {
        _cell_key(c.as_dict()): int(c.as_dict()["rounds"]) for c in load_plan(KEPT / name).cells
    }
    at_400, final = cells("fashion_horizon/at_plateau.yaml"), cells("fashion_at_plateau_1200.yaml")
    slow = cells("fashion_p01_at_plateau.yaml")
    assert len(final) == len(at_400) == 100 and len(slow) == 15
    assert final == {**at_400, **slow}
    assert all(slow[key] > at_400[key] for key in slow)

    short = list(csv.DictReader((SHORT_MAPS / "breakdown_fashion" / "breakdown.csv").open()))
    start = list(csv.DictReader((KEPT / "fashion_at_plateau_1200_start.csv").open()))
    assert len(start) == len(short) == 100
    answers = ("status", "breakdown_fraction")
    moved = set()
    for mapped, started in zip(short, start):
        assert {k: v for k, v in mapped.items() if k not in answers} == {
            k: v for k, v in started.items() if k not in answers
        }
        if any(
            float(mapped[k]) != float(started[k])
            if k == "breakdown_fraction"
            else mapped[k] != started[k]
            for k in answers
        ):
            moved.add(_cell_key(started))
    assert moved and moved <= set(slow)
    plan = load_plan(KEPT / "breakdown_fashion_at_plateau" / "plan.yaml")
    assert plan.start_from == "analysis/findings/horizon_maps/fashion_at_plateau_1200_start.csv"
