"""analysis/findings/map_part.py: the parts of a breakdown YAML hold the whole map's cells, each
once, planned as the whole map plans them."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from robusttune.commands.breakdown import prepare_plan
from robusttune.experiments.breakdown.horizon import HorizonPlan, at_plateau
from tests.scripts import loaded_script

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "analysis" / "findings" / "map_part.py"


@pytest.fixture(scope="module")
def map_part():
    with loaded_script(SCRIPT, "map_part_script") as module:
        yield module


def test_the_parts_of_the_map_hold_its_cells_each_once(map_part, tmp_path):
    whole_space = ROOT / "search_spaces" / "breakdown.yaml"
    whole = prepare_plan(whole_space)
    cells = []
    for part in range(3):
        out = tmp_path / f"part{part}.yaml"
        assert map_part.main([str(whole_space), f"{part}/3", str(out)]) == 0
        plan = prepare_plan(out)
        assert plan.name == f"breakdown_part{part}of3"
        # everything but the cells is the whole map's
        assert plan.raw["breakdown"] == whole.raw["breakdown"] and plan.base == whole.base
        cells += plan.cells
    assert sorted(c.label for c in cells) == sorted(c.label for c in whole.cells)
    assert len(cells) == len(whole.cells) == 100


def test_the_parts_of_a_map_at_the_horizon_hold_its_cells_each_once_balanced_by_rounds(
    map_part, tmp_path
):
    whole_space = ROOT / "search_spaces" / "breakdown.yaml"
    plan = prepare_plan(whole_space)
    # made-up horizons, one per cell: 25 to 400 rounds, uneven across the cells
    horizons = {i: 25 + (i * 37) % 376 for i in range(len(plan.cells))}
    at_horizon = tmp_path / "at_plateau.yaml"
    at_horizon.write_text(
        yaml.safe_dump(at_plateau(HorizonPlan(plan, max_rounds=400), horizons), sort_keys=False)
    )
    whole = prepare_plan(at_horizon)
    cells, totals = [], []
    for part in range(2):
        out = tmp_path / f"part{part}.yaml"
        assert map_part.main([str(at_horizon), f"{part}/2", str(out)]) == 0
        part_plan = prepare_plan(out)
        assert part_plan.name == f"{whole.name}_part{part}of2" and part_plan.base == whole.base
        cells += part_plan.cells
        totals.append(sum(cell.as_dict()["rounds"] for cell in part_plan.cells))
    assert sorted(c.label for c in cells) == sorted(c.label for c in whole.cells)
    assert len(cells) == 100 and sum(totals) == sum(horizons.values())
    assert abs(totals[0] - totals[1]) <= max(horizons.values())


def test_cells_are_dealt_longest_first_to_the_lightest_part(map_part):
    entries = [{"rounds": r} for r in (10, 40, 30, 20, 5)]
    # 40 -> part 0; 30 -> 1; 20 -> 1 (30 < 40); 10 -> 0 (40 < 50); 5 -> 0 (50 = 50, lower part)
    assert map_part.cells_by_rounds(entries, 2) == [[0, 1, 4], [2, 3]]


def test_a_bad_part_is_one_line(map_part, capsys):
    with pytest.raises(SystemExit) as stop:
        map_part.main(["space.yaml", "3/3", "out.yaml"])
    assert stop.value.code == 2
    assert "part K/M needs 0 <= K < M; got '3/3'" in capsys.readouterr().err
