"""A map started from an earlier map's answers (``breakdown.start_from``): on toy cells whose
boundary is known, every prior gives the answer a cold bisection gives, and a prior that holds
costs the clean point, b0 and b0 + 1; the earlier map's rows are matched to cells as the module
says; a bad start_from is one line."""

from __future__ import annotations

import math

import pandas as pd
import pytest
from typer.testing import CliRunner

from robusttune.commands.cli import app
from robusttune.core.registry import SpecError
from robusttune.experiments.breakdown import Cell, bisect_breakdown, prior_starts, read_prior


@pytest.mark.parametrize("radius", [0, 1])
def test_every_prior_finds_the_cold_answer_and_a_right_one_costs_three_points(radius):
    cells = {Cell.of(20, rule="x", b=b): b for b in range(11)}  # k_max = 10
    cold = bisect_breakdown(
        cells, lambda ps: [p.byzantine <= cells[p.cell] for p in ps], verify_radius=radius
    )
    for b0 in range(11):
        batches = []

        def evaluate(points):
            batches.append(list(points))  # noqa: B023 - called within this iteration
            return [p.byzantine <= cells[p.cell] for p in points]

        warm = bisect_breakdown(
            cells, evaluate, verify_radius=radius, starts=dict.fromkeys(cells, b0)
        )
        for before, after in zip(cold.cells, warm.cells):
            assert (after.breakdown, after.status) == (before.breakdown, before.status), (
                b0,
                after.cell,
            )
        right = next(c for c in warm.cells if c.breakdown == b0)
        expected = {0, b0, b0 + 1} | (set(range(b0 - radius, b0 + radius + 2)) if radius else set())
        assert set(right.outcomes) == {k for k in expected if 0 <= k <= 10}
        # the first wave holds every cell's clean point, b0 and b0 + 1
        assert {(p.cell, p.byzantine) for p in batches[0]} == {
            (c, k) for c in cells for k in (0, b0, b0 + 1) if k <= 10
        }
    # a right prior at radius 0 is one wave: nothing is left to bisect or verify
    one = bisect_breakdown(
        [Cell.of(20, rule="y")],
        lambda ps: [p.byzantine <= 4 for p in ps],
        verify_radius=0,
        starts={Cell.of(20, rule="y"): 4},
    )
    assert one.waves == 1 and one.points_used == 3


def test_a_prior_does_not_hide_a_non_monotone_cell():
    dip = Cell.of(20, rule="krum")
    survive = lambda k: k in (0, 1, 2, 4)  # fails at 3, survives again at 4
    result = bisect_breakdown(
        [dip], lambda ps: [survive(p.byzantine) for p in ps], starts={dip: 3}
    )  # b0 = 3 fails, b0 + 1 = 4 survives
    cell = result.cells[0]
    assert cell.status == "non_monotone" and cell.breakdown == 2 and 4 in cell.violations


def _prior_csv(tmp_path, rows):
    base = {
        "participation_mode": "fixed",
        "rounds": 5,
        "clients": 20,
        "status": "ok",
        "breakdown_byzantine": 0,
        "lattice_points": 11,
    }
    frame = pd.DataFrame([{**base, **row} for row in rows])
    path = tmp_path / "earlier"
    path.mkdir()
    frame.to_csv(path / "breakdown.csv", index=False)
    return path


def test_the_earlier_rows_are_matched_to_cells(tmp_path):
    nan = math.nan
    folder = _prior_csv(
        tmp_path,
        [
            {
                "method": "median",
                "pre_aggregator": nan,
                "participation": 0.5,
                "breakdown_fraction": 0.15,
            },
            {
                "method": "median",
                "pre_aggregator": "nnm",
                "participation": 0.5,
                "breakdown_fraction": 0.3,
            },
            {
                "method": "krum",
                "pre_aggregator": nan,
                "participation": 0.5,
                "breakdown_fraction": 0.1,
            },
            {
                "method": "krum",
                "pre_aggregator": nan,
                "participation": 0.5,
                "breakdown_fraction": 0.05,
                "attack": "ipm",
            },
            {
                "method": "fltrust",
                "pre_aggregator": nan,
                "participation": 0.5,
                "breakdown_fraction": 0.5,
                "status": "survives_all",
            },
            {
                "method": "swb",
                "pre_aggregator": nan,
                "participation": 0.5,
                "breakdown_fraction": nan,
                "status": "fails_clean",
            },
        ],
    )
    prior = read_prior(folder)
    assert read_prior(folder / "breakdown.csv").equals(prior)
    mode = {"participation_mode": "fixed"}
    median = Cell.of(20, method="median", participation=0.5, rounds=60, **mode)  # another horizon
    nnm = Cell.of(20, method="median", pre_aggregator="nnm", participation=0.5, rounds=5, **mode)
    krum = Cell.of(20, method="krum", participation=0.5, **mode)
    fltrust = Cell.of(20, method="fltrust", participation=0.5, dataset="fashion_mnist", **mode)
    swb = Cell.of(20, method="swb", participation=0.5, **mode)
    unseen = Cell.of(20, method="median", participation=0.1, **mode)
    coarse = Cell.of(10, method="median", participation=0.5, **mode)  # N = 10: 1.5 -> 1
    starts = prior_starts(
        prior, [median, nnm, krum, fltrust, swb, unseen, coarse], max_fraction=0.5
    )
    assert starts[median] == 3 and starts[nnm] == 6  # the blank pre_aggregator is its own cell
    assert starts[krum] == 1  # two rows (attacks): the lower answer
    assert starts[fltrust] == 10  # never broke: the lattice top
    assert swb not in starts and unseen not in starts  # failed clean / no earlier row
    assert starts[coarse] == 1
    assert prior_starts(prior, [coarse], max_fraction=0.1) == {coarse: 1}  # clamped to k_max


def test_a_bad_start_from_is_one_line_and_writes_nothing(tmp_path):
    with pytest.raises(SpecError, match=r"breakdown.start_from: .*neither a map folder"):
        read_prior(tmp_path / "nowhere")
    (tmp_path / "foreign.csv").write_text("a,b\n1,2\n")
    with pytest.raises(SpecError, match="lacks status, breakdown_fraction"):
        read_prior(tmp_path / "foreign.csv")

    space = tmp_path / "map.yaml"
    space.write_text(SPACE)
    result = CliRunner().invoke(
        app,
        [
            "breakdown",
            str(space),
            "--local",
            "--storage",
            str(tmp_path / "out"),
            "--start-from",
            str(tmp_path / "nowhere"),
        ],
    )
    assert result.exit_code == 2 and len(result.stderr.strip().splitlines()) == 1
    assert "breakdown.start_from" in result.stderr and not (tmp_path / "out").exists()


SPACE = """
name: warm
run: {dataset: digits, model: mlp, clients: 10, rounds: 2, participation: 1.0, local_epochs: 1,
      trainer: sequential, eval_every: 2}
space:
  aggregator: {grid: [mean]}
  attack: {grid: [sign_flip]}
breakdown: {seeds: [42], max_fraction: 0.5}
"""


def test_the_map_starts_from_an_earlier_answer_and_records_it(tmp_path):
    """The mean breaks at the first Byzantine client under the sign flip's ladder; started from an
    earlier map that says so, at radius 0 the map evaluates the clean point and k = 1 only."""
    import yaml

    earlier = tmp_path / "earlier.csv"
    pd.DataFrame(
        [
            {
                "aggregator": "mean",
                "attack": "sign_flip",
                "clients": 10,
                "status": "ok",
                "breakdown_fraction": 0.0,
            }
        ]
    ).to_csv(earlier, index=False)
    space = tmp_path / "map.yaml"
    space.write_text(SPACE)
    dry = CliRunner().invoke(
        app, ["breakdown", str(space), "--dry-run", "--start-from", str(earlier)]
    )
    assert dry.exit_code == 0 and "1 of 1 cells have an earlier answer" in dry.output
    result = CliRunner().invoke(
        app,
        [
            "breakdown",
            str(space),
            "--local",
            "--storage",
            str(tmp_path),
            "--start-from",
            str(earlier),
            "--verify-radius",
            "0",
        ],
    )
    assert result.exit_code == 0, result.output
    table = pd.read_csv(tmp_path / "warm" / "breakdown.csv")
    assert table.loc[0, "breakdown_byzantine"] == 0 and table.loc[0, "evaluated"] == "0+ 1-"
    plan = yaml.safe_load((tmp_path / "warm" / "plan.yaml").read_text())
    assert (
        plan["breakdown"]["start_from"] == str(earlier) and plan["breakdown"]["verify_radius"] == 0
    )
