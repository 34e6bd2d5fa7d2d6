"""Seeds as replicates (robusttune.experiments.breakdown.replicates) and survival read above
chance: each seed's answer is the one its own one-seed map gives on monotone cells, the summary
is the lower median with the seeds' range, a clean run that does not learn gives no breakdown
point, and later seeds cost less than maps of their own. Toy worlds (a breakdown point per cell
and seed) and tiny real maps in process."""

from __future__ import annotations

import random

import pandas as pd
import pytest
import yaml
from typer.testing import CliRunner

from robusttune.commands.cli import app
from robusttune.core.records import RunSummary
from robusttune.engine.runners import InProcessRunner
from robusttune.experiments.breakdown import Cell, Outcome, bisect_breakdown, survival_bar
from robusttune.experiments.breakdown.answer import breakdown_table
from robusttune.experiments.breakdown.bisection import learned
from robusttune.experiments.breakdown.cell_search import CellResult
from robusttune.experiments.breakdown.frontier import (
    frontier_table,
    ordering_table,
    regime_ordering_table,
)
from robusttune.experiments.breakdown.replicates import (
    ReplicatedMap,
    bisect_replicates,
    lower_median,
    replicate,
    summarise,
)
from robusttune.experiments.breakdown.report import write_breakdown
from robusttune.experiments.breakdown.store import RUNS_FILE

CHANCE = 0.1


def world_evaluator(truth: dict, log: list | None = None, clean: dict | None = None):
    """Points of seeded cells judged by a step function: accuracy 0.9 (clean: ``clean`` or 0.9)
    while k <= truth[(cell, seed)], 0.1 (collapsed) above it; ``truth`` may instead hold a set
    of surviving k (a non-monotone world)."""

    def evaluate(points):
        out = []
        for point in points:
            values = point.cell.as_dict()
            seed = values.pop("seed")
            base = Cell.of(point.cell.clients, **values)
            if log is not None:
                log.append((base, seed, point.byzantine))
            if point.byzantine == 0:
                out.append(Outcome((clean or {}).get((base, seed), 0.9), chance=CHANCE))
                continue
            edge = truth[(base, seed)]
            alive = point.byzantine in edge if isinstance(edge, set) else point.byzantine <= edge
            out.append(Outcome(0.9 if alive else 0.1, collapsed=not alive, chance=CHANCE))
        return out

    return evaluate


# -- survival above chance -------------------------------------------------------------------
def test_the_relative_bar_reads_the_margin_above_chance():
    # chance + r (clean - chance): a clean 0.15 on 10 classes asks 0.125, not 0.075
    assert survival_bar(None, 0.5, 0.15, 0.1) == pytest.approx(0.125)
    assert survival_bar(None, 0.5, 0.9, 0.1) == pytest.approx(0.5)
    assert survival_bar(None, 0.5, 0.9) == pytest.approx(0.45)  # no chance: as before
    assert survival_bar(0.3, 0.5, 0.9, 0.1) == 0.3  # absolute: as it was
    assert learned(0.21, 0.1, 0.1) and not learned(0.19, 0.1, 0.1)
    assert not learned(float("nan"), 0.1, 0.0)


def test_a_clean_run_at_chance_has_no_breakdown_point_and_never_survives():
    cell = Cell.of(10, aggregator="krum")
    truth = {(cell, 1): 5}
    # clean 0.15: the old bar 0.075 would let every run that did not collapse survive
    result = bisect_breakdown(
        [replicate(cell, 1)], world_evaluator(truth, clean={(cell, 1): 0.15}), clean_margin=0.1
    ).cells[0]
    assert result.status == "clean_at_chance" and result.breakdown is None
    row = summarise(cell, [result])
    assert row["status"] == "clean_at_chance" and row["breakdown_fraction"] is None
    assert not row["seeds_agree"]
    # the same clean run with the margin off is judged, with the bar above chance
    judged = bisect_breakdown(
        [replicate(cell, 1)], world_evaluator(truth, clean={(cell, 1): 0.15}), clean_margin=0.0
    ).cells[0]
    assert judged.bar == pytest.approx(0.125) and judged.breakdown == 5


# -- the summary over seeds ------------------------------------------------------------------
def finished(
    cell: Cell,
    seed: int,
    breakdown: int | None,
    status: str = "ok",
    k_max: int = 10,
    clean: float = 0.9,
) -> CellResult:
    result = CellResult(replicate(cell, seed), k_max)
    result.outcomes[0] = Outcome(clean, chance=CHANCE)
    result.status, result.lo = status, breakdown if breakdown is not None else 0
    if breakdown is not None and breakdown < k_max:
        result.outcomes[breakdown + 1] = Outcome(0.1, collapsed=True, chance=CHANCE)
    return result


def test_the_summary_is_the_lower_median_with_the_seeds_range():
    assert lower_median([7, 3, 2]) == 3 and lower_median([4, 1]) == 1 and lower_median([5]) == 5
    cell = Cell.of(20, aggregator="geometric_median")
    # the cell: 0.35, 0.15, 0.10, 0.05, 0.20 over five seeds
    row = summarise(cell, [finished(cell, s, k) for s, k in zip(range(1, 6), [7, 3, 2, 1, 4])])
    assert row["breakdown_fraction"] == pytest.approx(0.15)
    assert (row["breakdown_min"], row["breakdown_max"]) == (
        pytest.approx(0.05),
        pytest.approx(0.35),
    )
    assert row["status"] == "seeds_disagree" and not row["seeds_agree"]
    assert row["seed_breakdowns"] == "0.35 0.15 0.1 0.05 0.2" and row["seeds"] == 5
    # within one lattice step: they agree; a median at the top survives all
    close = summarise(cell, [finished(cell, 1, 3), finished(cell, 2, 4), finished(cell, 3, 3)])
    assert close["status"] == "ok" and close["seeds_agree"] and close["breakdown_byzantine"] == 3
    top = summarise(
        cell, [finished(cell, s, 10, "survives_all") for s in (1, 2)] + [finished(cell, 3, 9)]
    )
    assert top["status"] == "survives_all" and top["breakdown_byzantine"] == 10


def test_a_cell_needs_a_majority_of_its_seeds_to_have_learned():
    cell = Cell.of(20, aggregator="krum")
    one_of_three = summarise(
        cell,
        [finished(cell, 1, 4)]
        + [finished(cell, s, None, "clean_at_chance", clean=0.12) for s in (2, 3)],
    )
    assert (
        one_of_three["status"] == "clean_at_chance" and one_of_three["breakdown_fraction"] is None
    )
    two_of_three = summarise(
        cell,
        [
            finished(cell, 1, 4),
            finished(cell, 2, 5),
            finished(cell, 3, None, "clean_at_chance", clean=0.12),
        ],
    )
    assert two_of_three["status"] == "ok" and two_of_three["breakdown_byzantine"] == 4
    assert two_of_three["seeds_answered"] == 2


# -- replicates against one-seed maps ----------------------------------------------------------
@pytest.mark.parametrize("trial", range(6))
def test_each_seed_gets_the_answer_its_own_one_seed_map_gives(trial):
    """Random monotone worlds: a map over seeds [s1, ..., sS] gives every (cell, seed) the answer
    a one-seed map at that seed gives, lock step and concurrent alike, with fewer points than
    the S one-seed maps (later seeds start from the first seed's answer)."""
    rng = random.Random(trial)
    cells = [Cell.of(rng.choice([10, 20, 30]), aggregator=name) for name in ("a", "b", "c", "d")]
    seeds = [3, 1, 4]
    truth = {}
    for cell in cells:
        centre = rng.randint(0, cell.clients // 2)
        for seed in seeds:  # seeds scatter around the cell's centre, a few far off
            spread = rng.choice([0, 0, 1, 1, 2, 5])
            truth[(cell, seed)] = max(0, centre + rng.randint(-spread, spread))
    options = {"max_fraction": 0.5, "verify_radius": 1, "clean_margin": 0.1}
    log: list = []
    together = bisect_replicates(cells, seeds, world_evaluator(truth, log), **options)
    streamed = bisect_replicates(cells, seeds, world_evaluator(truth), concurrent=True, **options)
    alone_points = 0
    for seed in seeds:
        alone_log: list = []
        alone = bisect_breakdown(
            [replicate(c, seed) for c in cells], world_evaluator(truth, alone_log), **options
        )
        alone_points += len(alone_log)
        for cell, result in zip(cells, alone.cells):
            expected = min(truth[(cell, seed)], result.k_max)
            assert result.breakdown == expected
            position = seeds.index(seed)
            assert together.results[cell][position].breakdown == expected
            assert streamed.results[cell][position].breakdown == expected
    assert len(log) < alone_points
    frame = together.seeds_frame()
    assert list(frame["seed"]) == seeds * len(cells)


def test_the_outward_search_finds_every_edge_from_every_start():
    """A later seed's search (gallop) on every monotone world of small lattices, from every
    start: the edge a bisection from scratch finds; from a start at the edge at most two points
    beside the clean one, from a step above or below it at most three; and from a start at or
    above the edge, within LINEAR_FALLS steps, no survivor but the edge itself (survivors run
    every adversary setting, failures mostly one)."""
    from robusttune.experiments.breakdown.cell_search import LINEAR_FALLS

    for clients in range(1, 11):
        cell = Cell.of(clients, aggregator="x")
        k_max = clients // 2
        for edge in range(k_max + 1):
            truth = {(cell, 1): edge}
            for start in range(k_max + 1):
                log: list = []
                result = bisect_breakdown(
                    [replicate(cell, 1)],
                    world_evaluator(truth, log),
                    starts={replicate(cell, 1): start},
                    gallop=True,
                    max_fraction=0.5,
                ).cells[0]
                assert result.breakdown == edge and result.status in ("ok", "survives_all")
                probes = [k for _, _, k in log if k > 0]
                survivors = [k for k in probes if k <= edge]
                if k_max > 0 and start == edge:
                    assert len(probes) <= 2, (clients, edge, start, log)
                if k_max > 0 and abs(start - edge) <= 1:
                    assert len(probes) <= 3, (clients, edge, start, log)
                if edge <= start < edge + LINEAR_FALLS:
                    assert survivors in ([], [edge]), (clients, edge, start, log)


def test_a_non_monotone_seed_is_flagged_in_the_summary():
    cell = Cell.of(10, aggregator="odd")
    # the first seed survives 0..2 and 4 again: its verification sees the survivor above a
    # failure; the later seeds search from its answer 2 and are monotone
    truth = {(cell, 1): {1, 2, 4}, (cell, 2): 3, (cell, 3): 2}
    result = bisect_replicates([cell], [1, 2, 3], world_evaluator(truth), verify_radius=1)
    replicates = result.results[cell]
    assert [r.status for r in replicates] == ["non_monotone", "ok", "ok"]
    assert [r.breakdown for r in replicates] == [2, 3, 2]
    assert result.to_frame().iloc[0]["status"] == "non_monotone"
    # a later seed evaluates only what its search asks: b1 + 1 and b1 where b1 holds
    assert sorted(replicates[2].outcomes) == [0, 2, 3]


def test_seeds_listed_twice_or_a_seeded_cell_are_refused():
    from robusttune.core.registry import SpecError

    with pytest.raises(SpecError, match="twice"):
        bisect_replicates([Cell.of(10, aggregator="a")], [1, 1], world_evaluator({}))
    with pytest.raises(SpecError, match="sets seed itself"):
        replicate(Cell.of(10, seed=3), 1)


# -- the report -----------------------------------------------------------------------------------
def test_the_report_shows_the_spread_and_how_firmly_methods_are_ordered(tmp_path):
    cells = [Cell.of(20, method=m, participation=p) for m in ("gm", "krum") for p in (0.5, 1.0)]
    truth = {}
    edges = {
        ("gm", 0.5): [7, 3, 2],
        ("krum", 0.5): [1, 4, 0],
        ("gm", 1.0): [5, 5, 6],
        ("krum", 1.0): [2, 2, 2],
    }
    for cell in cells:
        for seed, edge in zip((1, 2, 3), edges[(cell["method"], cell["participation"])]):
            truth[(cell, seed)] = edge
    result = bisect_replicates(cells, [1, 2, 3], world_evaluator(truth))
    table = breakdown_table(result).set_index(["method", "participation"])
    assert table.loc[("gm", 0.5), "breakdown"] == "0.15 [0.1, 0.35] (seeds disagree)"
    assert table.loc[("krum", 1.0), "breakdown"] == "0.1"
    frontier = frontier_table(breakdown_table(result), seeds_table=result.seeds_frame())
    order = ordering_table(frontier).set_index(["participation", "higher"])
    # at p = 0.5 gm (0.15) is above krum (0.05) in seeds 1 and 3, below in seed 2
    row = order.loc[(0.5, "gm")]
    assert (row["lower"], row["holds"], row["reversed"], row["seeds"]) == ("krum", 2, 1, 3)
    assert order.loc[(1.0, "gm"), "holds"] == 3
    # gm's own frontier: p = 1 (0.25) above p = 0.5 (0.15) in seeds 2 and 3 (0.25 > 0.15,
    # 0.3 > 0.1), below in seed 1 (0.25 < 0.35); krum's 0.1 above 0.05 in seeds 1 and 3
    regimes = regime_ordering_table(frontier).set_index("method")
    assert tuple(regimes.loc["gm", ["higher_p", "holds", "reversed"]]) == (1.0, 2, 1)
    assert tuple(regimes.loc["krum", ["higher_p", "holds", "reversed"]]) == (1.0, 2, 1)
    text = write_breakdown(result, tmp_path).read_text()
    assert "How firmly the frontier orders the methods" in text and "2 of 3 (1 reversed)" in text
    assert "Seeds [1, 2, 3] are replicates" in text and "each method's regimes" in text
    seeds = pd.read_csv(tmp_path / "breakdown_seeds.csv")
    assert len(seeds) == 4 * 3 and set(seeds["seed"]) == {1, 2, 3}
    one_seed = ReplicatedMap.of(bisect_breakdown([replicate(cells[0], 1)], world_evaluator(truth)))
    assert "One seed" in write_breakdown(one_seed, tmp_path / "one").read_text()


# -- real maps in process ----------------------------------------------------------------------
TINY = """
name: tiny
run: {dataset: synthetic, model: mlp, clients: 10, rounds: 3, lr: 0.1, local_epochs: 1,
      synthetic_samples: 300, trainer: sequential}
space:
  aggregator: {grid: [mean, median]}
  attack: {grid: [sign_flip]}
breakdown: {seeds: SEEDS, adversary: {attack_strength: [3.0]}, clean_margin: 0.0}
"""


def breakdown(*args) -> object:
    return CliRunner().invoke(app, ["breakdown", *map(str, args)])


def test_a_longer_seeds_list_on_resume_runs_only_the_new_seeds_runs(tmp_path, monkeypatch):
    made: list[int] = []
    real = InProcessRunner.__call__

    def counting(self, specs):
        made.extend(spec.seed for spec in specs)
        return real(self, specs)

    monkeypatch.setattr(InProcessRunner, "__call__", counting)
    space = tmp_path / "tiny.yaml"
    space.write_text(TINY.replace("SEEDS", "[1]"))
    first = breakdown(space, "--local", "--storage", tmp_path, "--name", "grown")
    assert first.exit_code == 0, first.output
    assert set(made) == {1}
    made.clear()
    space.write_text(TINY.replace("SEEDS", "[1, 2]"))
    grown = breakdown(space, "--local", "--storage", tmp_path, "--name", "grown", "--resume")
    assert grown.exit_code == 0, grown.output
    assert made and set(made) == {2}
    assert yaml.safe_load((tmp_path / "grown" / "plan.yaml").read_text())["breakdown"]["seeds"] == [
        1,
        2,
    ]
    # the grown map is the map run over both seeds at once, and seed 2's rows are a one-seed
    # map's at seed 2 wherever that seed's cell is monotone
    made.clear()
    whole = breakdown(space, "--local", "--storage", tmp_path, "--name", "whole")
    assert whole.exit_code == 0, whole.output
    compared = ["aggregator", "breakdown_fraction", "breakdown_min", "breakdown_max", "status"]
    pd.testing.assert_frame_equal(
        pd.read_csv(tmp_path / "grown" / "breakdown.csv")[compared],
        pd.read_csv(tmp_path / "whole" / "breakdown.csv")[compared],
    )
    space.write_text(TINY.replace("SEEDS", "[2]"))
    alone = breakdown(space, "--local", "--storage", tmp_path, "--name", "alone")
    assert alone.exit_code == 0, alone.output
    per_seed = pd.read_csv(tmp_path / "whole" / "breakdown_seeds.csv")
    second = per_seed[per_seed["seed"] == 2].set_index("aggregator")
    one = pd.read_csv(tmp_path / "alone" / "breakdown_seeds.csv").set_index("aggregator")
    for name in second.index:
        if second.loc[name, "monotone"] and one.loc[name, "monotone"]:
            assert second.loc[name, "breakdown_fraction"] == one.loc[name, "breakdown_fraction"]
    kept = (tmp_path / "grown" / RUNS_FILE).read_text().splitlines()
    assert len(kept) == len(set(kept))


def test_a_seed_listed_twice_is_one_line_before_anything_is_written(tmp_path):
    space = tmp_path / "twice.yaml"
    space.write_text(TINY.replace("SEEDS", "[1, 1]"))
    result = breakdown(space, "--local", "--storage", tmp_path / "store")
    lines = result.output.strip().splitlines()
    assert result.exit_code == 2 and len(lines) == 1 and "lists a seed twice" in lines[0]
    assert not (tmp_path / "store").exists()


def test_a_space_may_not_make_the_seed_a_cell_axis(tmp_path):
    space = tmp_path / "axis.yaml"
    space.write_text(
        TINY.replace("SEEDS", "[1]").replace(
            "  attack: {grid: [sign_flip]}", "  attack: {grid: [sign_flip]}\n  seed: {grid: [1, 2]}"
        )
    )
    result = breakdown(space, "--local", "--storage", tmp_path, "--dry-run")
    assert result.exit_code == 2 and "breakdown.seeds" in result.output
    assert len(result.output.strip().splitlines()) == 1


def test_robust_tuning_takes_the_worst_case_over_seeds():
    from robusttune.experiments.tuning import parse_tuning, run_study

    def runner(specs):  # seed 7 breaks every proposal at k > 0, seed 5 never
        out = []
        for s in specs:
            broken = s.seed == 7 and s.n_byzantine > 0
            accuracy = 0.1 if broken else 0.8
            out.append(
                RunSummary.from_dict(
                    {
                        "final_accuracy": accuracy,
                        "final_validation_accuracy": accuracy,
                        "collapsed": broken,
                        "num_classes": 10,
                        "spec": s.to_dict(),
                    }
                )
            )
        return out

    plan = parse_tuning(
        {
            "run": {
                "dataset": "synthetic",
                "clients": 10,
                "byzantine_fraction": 0.2,
                "method": "trimmed_mean",
            },
            "space": {"trim_ratio": {"uniform": [0.0, 0.4]}},
            "tuning": {
                "num_samples": 2,
                "seeds": [5, 7],
                "adversary": {"attack": ["sign_flip"], "attack_strength": [1.0]},
            },
        },
        source="t.yaml",
        default_name="t",
    )
    result = run_study(plan, runner)
    for proposal in result.proposals:
        assert proposal.worst_seed == 7 and proposal.worst.collapsed
        assert proposal.clean.accuracy == pytest.approx(0.8)
