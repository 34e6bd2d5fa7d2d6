"""analysis/findings/map_part.py: the parts of a breakdown YAML hold the whole map's cells, each
once, planned as the whole map plans them."""

from __future__ import annotations

from pathlib import Path

import pytest

from robusttune.breakdown.command import prepare_plan
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


def test_a_bad_part_is_one_line(map_part, capsys):
    with pytest.raises(SystemExit) as stop:
        map_part.main(["space.yaml", "3/3", "out.yaml"])
    assert stop.value.code == 2
    assert "part K/M needs 0 <= K < M; got '3/3'" in capsys.readouterr().err
