"""Parallel bisection of breakdown points on toy evaluators whose boundaries are known, and the
spec evaluator on a fake runner (no training, no Ray)."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from robusttune.core.records import RunSummary
from robusttune.core.registry import SpecError
from robusttune.experiments.breakdown import (
    Cell,
    Outcome,
    Point,
    bisect_breakdown,
    lattice_top,
    load_plan,
    spec_evaluator,
    write_breakdown,
)


class Counting:
    """Wraps a point -> verdict function; records every batch it is handed."""

    def __init__(self, verdict):
        self.verdict = verdict
        self.batches: list[list[Point]] = []

    def __call__(self, points):
        self.batches.append(list(points))
        return [self.verdict(p) for p in points]

    @property
    def points(self):
        return [p for batch in self.batches for p in batch]


def monotone_cells():
    # (aggregator, attack, p) -> true breakdown k on N=20 clients (lattice 0..10 at max 0.5)
    truth = {}
    for i, aggregator in enumerate(["mean", "median", "trimmed_mean", "krum"]):
        for j, attack in enumerate(["sign_flip", "ipm"]):
            for p in (0.1, 0.5):
                truth[Cell.of(20, aggregator=aggregator, attack=attack, participation=p)] = (
                    3 * i + 2 * j + int(p * 10)
                ) % 11
    return truth


def test_monotone_boundaries_found_exactly_with_fewer_evaluations():
    truth = monotone_cells()
    # accuracies: 0.9 clean, 0.8 up to the boundary, 0.1 above (collapsed from there)
    evaluator = Counting(
        lambda p: Outcome(
            0.9 if p.byzantine == 0 else (0.8 if p.byzantine <= truth[p.cell] else 0.1),
            collapsed=p.byzantine > truth[p.cell],
        )
    )
    result = bisect_breakdown(truth, evaluator)
    for cell in result.cells:
        assert cell.breakdown == truth[cell.cell], cell.cell.label
        assert cell.status == ("survives_all" if truth[cell.cell] == 10 else "ok")
        assert cell.clean_accuracy == 0.9 and cell.bar == pytest.approx(0.45)
    assert result.points_used == len(evaluator.points)
    assert result.grid_points == 11 * len(truth)
    assert result.points_used < result.grid_points / 2
    # every wave is one batch holding every unfinished cell, never a point twice
    assert len(evaluator.batches) == result.waves <= 6
    assert len(evaluator.batches[0]) == 2 * len(truth)
    assert len(set(evaluator.points)) == len(evaluator.points)
    frame = result.to_frame()
    assert list(frame["breakdown_fraction"]) == [truth[c.cell] / 20 for c in result.cells]
    assert frame["monotone"].all()
    assert "against" in result.cost_line()


def test_threshold_rule_relative_and_absolute():
    cell = Cell.of(10, aggregator="median")
    # accuracy falls by 0.1 per Byzantine client from 0.9; half of clean = 0.45 -> k <= 4
    accuracy = lambda points: [Outcome(0.9 - 0.1 * p.byzantine) for p in points]
    assert bisect_breakdown([cell], accuracy).cells[0].breakdown == 4
    assert bisect_breakdown([cell], accuracy, relative_threshold=0.8).cells[0].breakdown == 1
    assert bisect_breakdown([cell], accuracy, threshold=0.65).cells[0].breakdown == 2
    # a cell whose clean run collapses has no breakdown point
    result = bisect_breakdown([cell], lambda ps: [Outcome(0.1, collapsed=True) for _ in ps])
    assert result.cells[0].status == "fails_clean" and result.cells[0].breakdown is None


def test_bool_verdicts_and_lattice():
    assert lattice_top(20, 0.5) == 10 and lattice_top(10, 0.3) == 3 and lattice_top(7, 0.5) == 3
    cells = {Cell.of(n, rule="x"): b for n, b in ((7, 2), (13, 0), (25, 12))}
    result = bisect_breakdown(cells, lambda points: [p.byzantine <= cells[p.cell] for p in points])
    assert [c.breakdown for c in result.cells] == [2, 0, 12]
    assert [c.status for c in result.cells] == ["ok", "ok", "survives_all"]


def test_non_monotone_cell_is_flagged_not_hidden():
    monotone = Cell.of(20, aggregator="median")
    dip = Cell.of(20, aggregator="krum")
    # krum fails at 3 but survives again at 4 (an ALIE-style dip); bisection lands on b=2 and the
    # verification point b+2 = 4 contradicts it
    survive = {monotone: lambda k: k <= 6, dip: lambda k: k in (0, 1, 2, 4)}
    evaluator = Counting(lambda p: survive[p.cell](p.byzantine))
    result = bisect_breakdown([monotone, dip], evaluator)
    by_cell = {c.cell: c for c in result.cells}
    assert by_cell[monotone].status == "ok" and by_cell[monotone].breakdown == 6
    flagged = by_cell[dip]
    assert flagged.status == "non_monotone"
    assert flagged.breakdown == 2 and 4 in flagged.violations
    assert flagged.conservative == 2 and flagged.largest_survivor == 4
    row = result.to_frame().set_index("aggregator").loc["krum"]
    assert not row["monotone"] and "4+" in row["evaluated"]

    # "scan" evaluates the rest of a flagged cell's lattice, so its largest survivor is exact
    late = Cell.of(20, aggregator="bulyan")
    scanned = bisect_breakdown(
        [late], lambda ps: [p.byzantine in (0, 1, 2, 4, 8) for p in ps], on_non_monotone="scan"
    )
    cell = scanned.cells[0]
    assert cell.status == "non_monotone" and len(cell.outcomes) == 11
    assert cell.largest_survivor == 8 and cell.conservative == 2


def test_bad_arguments():
    cell = Cell.of(10, a=1)
    with pytest.raises(SpecError):
        bisect_breakdown([cell], lambda ps: [True] * len(ps), max_fraction=1.0)
    with pytest.raises(SpecError):
        bisect_breakdown([cell, cell], lambda ps: [True] * len(ps))
    with pytest.raises(ValueError, match="verdicts for"):
        bisect_breakdown([cell], lambda ps: [True])


def fake_runner(log):
    """Runs nothing: accuracy = 0.9 - (beta - 0.4 * trim_ratio) (a trim buys robustness), worst
    for the largest attack_strength; records every batch of RunSpecs."""

    def run(specs):
        log.append(list(specs))
        out = []
        for s in specs:
            strength = s.attack_strength or 1.0
            damage = max(0.0, s.byzantine_fraction * strength - 0.4 * (s.trim_ratio or 0.0))
            accuracy = max(0.05, 0.9 - 2 * damage)
            out.append(
                RunSummary.from_dict(
                    {
                        "final_accuracy": accuracy,
                        "collapsed": accuracy <= 0.105,
                        "run_dir": f"runs/{len(out)}",
                    }
                )
            )
        return out

    return run


def test_spec_evaluator_seeds_adversary_and_tuning():
    log: list = []
    base = {"dataset": "synthetic", "clients": 10, "rounds": 1, "participation": 1.0}
    cells = [Cell.of(10, aggregator="mean", attack="sign_flip")]  # the fake runner ignores the rule
    evaluate = spec_evaluator(
        base,
        fake_runner(log),
        seeds=[1, 2],
        adversary={"attack_strength": [0.5, 1.0]},
        staged=False,
    )
    result = bisect_breakdown(cells, evaluate)
    # no trim: survives while 0.9 - 2 beta >= 0.45, i.e. beta <= 0.225 -> k = 2
    assert result.cells[0].breakdown == 2
    first = log[0]
    assert {s.seed for s in first} == {1, 2}
    clean = [s for s in first if s.byzantine_fraction == 0]
    assert len(clean) == 2  # no adversary variants at k = 0
    attacked = [s for s in first if s.byzantine_fraction > 0]
    assert {s.attack_strength for s in attacked} == {0.5, 1.0} and len(attacked) == 4
    assert result.trials_used == sum(len(batch) for batch in log)

    # tuning trim_ratio per point with Optuna (ask/tell, one runner call per trial round)
    from robusttune.experiments.sweep.space import Domain

    log.clear()
    tuned = spec_evaluator(
        base,
        fake_runner(log),
        seeds=[1],
        budget=6,
        tune={"trim_ratio": Domain("uniform", low=0.0, high=0.45)},
        adversary={"attack_strength": [1.0]},
    )
    result = bisect_breakdown(cells, tuned)
    # a trim up to 0.45 buys up to 0.18 of beta: the tuned boundary lies above the untuned one
    assert result.cells[0].breakdown >= 3
    assert all(len({s.byzantine_fraction for s in batch}) == len(batch) for batch in log)
    assert result.trials_used == sum(len(batch) for batch in log)


def test_the_default_adversary_is_the_worst_over_the_attacks_ladder():
    """No adversary given: each attacked point runs sign_flip at every strength of its ladder,
    the outcome is the worst and the map says which strength broke the first failing point."""
    from robusttune.experiments.breakdown import adversary_variants
    from robusttune.methods.attacks import ATTACKS

    assert ATTACKS["sign_flip"].strength_ladder == (1.0, 3.0, 10.0, 100.0)
    assert adversary_variants("sign_flip", None) == [
        {"attack_strength": s} for s in (1.0, 3.0, 10.0, 100.0)
    ]
    assert adversary_variants("mimic", None) == [{}]  # nothing to scale
    assert adversary_variants("sign_flip", {"attack": ["alie", "mimic"]}) == [
        {"attack": "alie", "attack_strength": s} for s in (1.0, 2.0, 4.0, 8.0)
    ] + [{"attack": "mimic"}]
    log: list = []
    cells = [Cell.of(10, aggregator="mean", attack="sign_flip")]
    base = {"dataset": "synthetic", "clients": 10, "rounds": 1, "participation": 1.0}
    result = bisect_breakdown(cells, spec_evaluator(base, fake_runner(log), staged=False))
    # at k = 1 (beta 0.1) strengths 10 and 100 both collapse the run (accuracy 0.05): the
    # breakdown is 0 and the weakest strength that did the worst is named
    assert result.cells[0].breakdown == 0
    assert result.cells[0].broken_by == "attack_strength=10.0"
    attacked = [s for batch in log for s in batch if s.byzantine_fraction > 0]
    assert {s.attack_strength for s in attacked} == {1.0, 3.0, 10.0, 100.0}
    assert result.to_frame().loc[0, "broken_by"] == "attack_strength=10.0"


def test_write_breakdown(tmp_path):
    cells = {
        Cell.of(10, aggregator=a, attack=t, participation=p): b
        for (a, t, p), b in {
            ("mean", "ipm", 0.5): 0,
            ("median", "ipm", 0.5): 3,
            ("mean", "alie", 0.5): 1,
            ("median", "alie", 1.0): 4,
        }.items()
    }
    result = bisect_breakdown(cells, lambda ps: [p.byzantine <= cells[p.cell] for p in ps])
    path = write_breakdown(result, tmp_path)
    text = path.read_text()
    assert "| aggregator |" in text and "Cost:" in text
    for name in ("breakdown.csv", "breakdown_points.csv", "breakdown.png"):
        assert (tmp_path / name).stat().st_size > 0
    import pandas as pd

    table = pd.read_csv(tmp_path / "breakdown.csv")
    assert math.isclose(
        table.set_index(["aggregator", "attack"]).loc[("median", "ipm"), "breakdown_fraction"], 0.3
    )


SPACE = """
# mean vs coordinate-wise rules under a strong sign flip on digits (4 short rounds, full participation)
name: e2e
run: {dataset: digits, model: mlp, clients: 10, rounds: 4, participation: 1.0, local_epochs: 1,
      trainer: sequential, attack_strength: 20}
space:
  aggregator: {grid: [mean, median, trimmed_mean]}
  attack: {grid: [sign_flip]}
breakdown: {seeds: [42], max_fraction: 0.5}
"""


def test_end_to_end_breakdown_on_digits(tmp_path):
    """`robusttune breakdown --local`: mean under sign_flip breaks at a lower fraction than median
    and trimmed_mean (which trims f = k per side)."""
    import pandas as pd
    from typer.testing import CliRunner

    from robusttune.commands.cli import app

    space = tmp_path / "e2e.yaml"
    space.write_text(SPACE)
    result = CliRunner().invoke(
        app, ["breakdown", str(space), "--local", "--storage", str(tmp_path), "--name", "out"]
    )
    assert result.exit_code == 0, result.output
    table = pd.read_csv(tmp_path / "out" / "breakdown.csv").set_index("aggregator")
    fraction = table["breakdown_fraction"]
    assert fraction["mean"] < fraction["median"] and fraction["mean"] < fraction["trimmed_mean"]
    assert (table["points_evaluated"] < table["lattice_points"]).any()
    points = pd.read_csv(tmp_path / "out" / "breakdown_points.csv")
    assert len(points) == table["points_evaluated"].sum()
    assert all(
        (tmp_path / "out" / d.split()[0] / "summary.json").exists()
        or (Path(d.split()[0]) / "summary.json").exists()
        for d in points["detail"]
    )
    assert (tmp_path / "out" / "breakdown.png").exists()


def test_breakdown_cli_bad_input(tmp_path):
    from typer.testing import CliRunner

    from robusttune.commands.cli import app

    space = tmp_path / "bad.yaml"
    space.write_text(SPACE.replace("max_fraction: 0.5", "max_fraction: 0.5, colour: red"))
    result = CliRunner().invoke(app, ["breakdown", str(space), "--local"])
    assert result.exit_code == 2 and "breakdown.colour" in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1
    space.write_text(
        SPACE.replace("attack: {grid: [sign_flip]}", "byzantine_fraction: {grid: [0.1]}")
    )
    result = CliRunner().invoke(app, ["breakdown", str(space), "--local"])
    assert result.exit_code == 2 and "lattice" in result.stderr


REAL = {
    "dataset": "digits",
    "model": "mlp",
    "clients": 10,
    "participation": 1.0,
    "rounds": 4,
    "dirichlet_alpha": float("inf"),  # IID: the bound, not heterogeneity, is under test
    "local_epochs": 2,
    "eval_every": 4,
}


def _real_map(tmp_path, aggregator: str, attack: str):
    from robusttune.engine.runners import InProcessRunner
    from robusttune.experiments.breakdown.answer import breakdown_table

    cells = [Cell.of(10, aggregator=aggregator, attack=attack)]
    result = bisect_breakdown(cells, spec_evaluator(REAL, InProcessRunner()), verify_radius=0)
    return result, breakdown_table(result, REAL).iloc[0]


def test_the_mean_breaks_at_the_first_byzantine_client_under_the_default_adversary(tmp_path):
    _result, row = _real_map(tmp_path, "mean", "sign_flip")
    assert row["breakdown_byzantine"] == 0 and row["theory_fraction"] == 0.0
    assert row["broken_by"].startswith("attack_strength=")
    assert row["breakdown"] == "0"


def test_the_median_does_not_break_before_its_bound(tmp_path):
    """Median of n = 10 inputs holds while 2f < n: theory 0.4; the measured breakdown under the
    worst of IPM's ladder is at least that."""
    _result, row = _real_map(tmp_path, "median", "ipm")
    assert row["theory_fraction"] == pytest.approx(0.4) and row["inputs"] == 10
    assert row["breakdown_fraction"] >= row["theory_fraction"] - 1e-9


def test_a_cell_with_no_attack_is_refused(tmp_path):
    space = tmp_path / "b.yaml"
    space.write_text(
        "run: {dataset: synthetic, clients: 4}\n"
        "space: {aggregator: {grid: [mean, median]}, attack: {grid: [none, ipm]}}\n"
    )
    with pytest.raises(SpecError, match="has no attack"):
        load_plan(space)


def test_the_map_reads_at_a_glance():
    """A cell that never broke reads '>= top', and breakdown.md opens with sentences from the
    numbers."""
    from robusttune.experiments.breakdown.answer import answer, breakdown_table

    cells = {
        Cell.of(10, aggregator=a, attack="ipm"): b for a, b in {"mean": 0, "median": 9}.items()
    }
    result = bisect_breakdown(
        list(cells), lambda points: [p.byzantine <= cells[p.cell] for p in points]
    )
    table = breakdown_table(result)
    assert list(table["breakdown"]) == ["0", ">= 0.5"]
    lines = answer(table)
    assert lines[0] == "Breaks at the first Byzantine client (1 cells): mean."
    assert lines[1].startswith("Never broke on the lattice (1 cells") and lines[1].endswith(
        ": median."
    )


def test_the_answer_names_cells_by_method_and_regime():
    """Two methods x two regimes x two attacks: a method with every cell picked reads 'every
    cell', a regime with both attacks picked is named alone, one with a single attack names it."""
    import pandas as pd

    from robusttune.experiments.breakdown.answer import cells_by_method

    table = pd.DataFrame(
        [
            {"method": m, "participation": p, "participation_mode": mode, "attack": a}
            for m in ("median", "krum")
            for p, mode in ((0.1, "fixed"), (1.0, "fixed"))
            for a in ("sign_flip", "ipm")
        ]
    )
    picked = table[
        (table["method"] == "median")
        | ((table["participation"] == 0.1) & (table["attack"] == "ipm"))
        | (table["participation"] == 1.0)
    ]
    assert (
        cells_by_method(picked, table) == "median: every cell; krum: p=0.1 fixed (ipm), p=1 fixed"
    )


def test_theory_columns_name_the_rules_bound_and_the_sampling_law():
    from robusttune.experiments.breakdown.theory import theory_columns
    from robusttune.problem.byzantine_law import Deployment, p_majority_round

    base = {"dataset": "synthetic", "clients": 20, "participation": 0.1, "rounds": 30}
    cells = [Cell.of(20, aggregator="krum", attack="ipm")]
    result = bisect_breakdown(cells, lambda points: [p.byzantine <= 1 for p in points])
    columns = theory_columns(base, result.cells[0])
    # n = round(0.1 * 20) = 2 sampled: Krum needs n > 2f + 2, so no f is covered
    assert columns["inputs"] == 2 and columns["theory_fraction"] == 0.0
    q = p_majority_round(
        Deployment(clients=20, participation=0.1, byzantine_fraction=2 / 20, rounds=30)
    )
    assert columns["p_majority_round"] == pytest.approx(q)
    assert columns["p_majority_run"] == pytest.approx(1 - (1 - q) ** 30)
    # SWB-DM's trim follows the assumed corruption (r = min(0.45, beta + 0.05)), so told f of its
    # 20 cached rows it covers f = 9 (trim 0.45: 9 rows, and 2 x 9 < 20) but not f = 10 (2f = n)
    cached = theory_columns(
        {**base, "method": "swb_dm"},
        bisect_breakdown(
            [Cell.of(20, attack="ipm")], lambda points: [p.byzantine <= 1 for p in points]
        ).cells[0],
    )
    assert cached["inputs"] == 20 and cached["p_majority_round"] == 0.0  # 2 of 20 cached rows
    assert cached["theory_fraction"] == pytest.approx(9 / 20)


# -- the p-frontier ----------------------------------------------------------------------------
def test_the_p_frontier_has_one_value_per_method_and_p():
    """beta*(method, p) is the minimum over the cells of that method at that p: here over two
    attacks and two sampling modes, worked by hand."""
    from robusttune.experiments.breakdown.answer import breakdown_table
    from robusttune.experiments.breakdown.frontier import frontier_table

    truth = {
        ("mean", 0.5, "sign_flip", "fixed"): 0,
        ("mean", 0.5, "ipm", "fixed"): 1,
        ("mean", 0.5, "sign_flip", "bernoulli"): 2,
        ("mean", 0.5, "ipm", "bernoulli"): 3,
        ("median", 0.5, "sign_flip", "fixed"): 4,
        ("median", 0.5, "ipm", "fixed"): 3,
        ("median", 0.5, "sign_flip", "bernoulli"): 5,
        ("median", 0.5, "ipm", "bernoulli"): 5,
        ("median", 1.0, "sign_flip", "fixed"): 5,
        ("median", 1.0, "ipm", "fixed"): 5,
        ("mean", 1.0, "sign_flip", "fixed"): 2,
        ("mean", 1.0, "ipm", "fixed"): -1,
    }
    cells = {
        Cell.of(10, method=m, participation=p, attack=a, participation_mode=mode): b
        for (m, p, a, mode), b in truth.items()
    }
    # b = -1: the clean run fails (no baseline); b = 5 = k_max: never broke on the lattice
    result = bisect_breakdown(
        list(cells), lambda points: [p.byzantine <= cells[p.cell] for p in points]
    )
    frontier = frontier_table(breakdown_table(result)).set_index(["method", "participation"])
    assert len(frontier) == 4 and frontier.index.is_unique
    assert frontier.loc[("mean", 0.5), "breakdown_fraction"] == pytest.approx(0.0)
    assert frontier.loc[("mean", 0.5), "worst"] == "attack=sign_flip, participation_mode=fixed"
    assert frontier.loc[("median", 0.5), "breakdown_fraction"] == pytest.approx(0.3)
    assert frontier.loc[("median", 0.5), "worst"] == "attack=ipm, participation_mode=fixed"
    assert not frontier.loc[("median", 0.5), "never_broke"]
    # every median cell at p = 1 survived its lattice: a floor at the top, read ">= 0.5"
    assert frontier.loc[("median", 1.0), "never_broke"]
    assert frontier.loc[("median", 1.0), "label"] == ">= 0.5"
    # a cell without a baseline is counted, not taken as the minimum
    assert frontier.loc[("mean", 1.0), "breakdown_fraction"] == pytest.approx(0.2)
    assert frontier.loc[("mean", 1.0), "fails_clean"] == 1
    assert list(frontier.reset_index()["method"]) == ["mean", "mean", "median", "median"]


def test_write_breakdown_draws_the_frontier(tmp_path):
    cells = {
        Cell.of(10, method=m, participation=p, attack="ipm"): b
        for (m, p), b in {
            ("mean", 0.1): 0,
            ("mean", 1.0): 0,
            ("median", 0.1): 1,
            ("median", 1.0): 5,
        }.items()
    }
    result = bisect_breakdown(list(cells), lambda ps: [p.byzantine <= cells[p.cell] for p in ps])
    text = write_breakdown(result, tmp_path).read_text()
    assert "## The p-frontier" in text and "frontier.png" in text and "| median |" in text
    assert (tmp_path / "frontier.png").stat().st_size > 0
    import pandas as pd

    frontier = pd.read_csv(tmp_path / "frontier.csv")
    assert len(frontier) == 4 and set(frontier["participation"]) == {0.1, 1.0}


# -- savings that never change an answer -------------------------------------------------------
def ladder_runner(log):
    """Runs nothing: accuracy falls with beta x strength, IPM harder than the sign flip, a
    collapse past a damage of 0.45; where no round samples a Byzantine client (none exists, or
    the sampling stream never draws one) the attack plays no part, as in a real run, so such
    points may be shared. Records every batch."""
    from robusttune.problem.sampling import byzantine_ever_sampled

    def run(specs):
        log.append(list(specs))
        out = []
        for s in specs:
            weight = {"sign_flip": 1.0, "ipm": 1.6}.get(s.attack, 0.0)
            robust = {"mean": 0.0, "median": 0.3, "trimmed_mean": 0.2}[s.aggregator]
            strength = s.attack_strength or 1.0
            damage = (
                0.0
                if not byzantine_ever_sampled(s)
                else max(0.0, s.byzantine_fraction - robust) * weight * min(strength, 12.0) ** 0.5
            )
            accuracy = 0.9 - damage if damage < 0.45 else 0.1
            out.append(
                RunSummary.from_dict(
                    {
                        "final_accuracy": accuracy,
                        "collapsed": accuracy <= 0.105,
                        "run_dir": f"runs/{s.to_json().__hash__()}",
                    }
                )
            )
        return out

    return run


def _map(share: bool, staged: bool):
    log: list = []
    cells = [
        Cell.of(20, aggregator=a, attack=t, participation=p)
        for a in ("mean", "median", "trimmed_mean")
        for t in ("sign_flip", "ipm")
        for p in (0.1, 1.0)
    ]
    evaluate = spec_evaluator(
        {"dataset": "synthetic", "clients": 20, "rounds": 1},
        ladder_runner(log),
        seeds=[1, 2],
        share=share,
        staged=staged,
    )
    return bisect_breakdown(cells, evaluate), log


def test_the_savings_change_no_answer():
    """The map with sharing and with the staged ladder, each alone and both, gives the same
    table (every answer: breakdown, status, broken_by, evaluated points) and the same point
    outcomes as the map without them, for fewer runs; the trial count is the runs made."""
    plain, plain_log = _map(False, False)
    answer_columns = [c for c in plain.to_frame().columns if c != "trials"]
    point_columns = ["byzantine", "survived", "accuracy", "collapsed", "adversary"]
    for share, staged in ((True, False), (False, True), (True, True)):
        saved, log = _map(share, staged)
        assert saved.to_frame()[answer_columns].equals(plain.to_frame()[answer_columns])
        assert saved.points_frame()[point_columns].equals(plain.points_frame()[point_columns])
        assert saved.grid_trials == plain.grid_trials
        assert saved.trials_used == sum(
            len({s.to_json() for s in b}) if share else len(b) for b in log
        )
        assert saved.trials_used < plain.trials_used
    assert plain.trials_used == sum(len(b) for b in plain_log)
    # the full lattice: per cell 2 clean runs + 10 points x 4 strengths x 2 seeds
    assert plain.grid_trials == 12 * (2 + 10 * 4 * 2)
    both, log = _map(True, True)
    # sharing: one clean run per seed for the two attacks of each (aggregator, p)
    clean = {s.to_json() for b in log for s in b if s.byzantine_fraction == 0}
    assert len(clean) == 6 * 2
    assert both.trial_ratio == both.trials_used / both.grid_trials < plain.trial_ratio


def test_cells_bisected_each_on_its_own_give_the_lock_step_map():
    """The streaming driver (`bisect_concurrently`: every cell in a thread of its own, asking
    for its next points as soon as its last ones are judged) against the lock-step waves on the
    same plan, with sharing, the staged ladder and verification, through a runner whose answers
    come back in a shuffled order: every answer and every point outcome the same, the same
    runs made (a run two cells need at once is made once), no barrier between the cells."""
    import random
    import threading
    import time

    from robusttune.experiments.breakdown import bisect_concurrently

    cells = [
        Cell.of(20, aggregator=a, attack=t, participation=p)
        for a in ("mean", "median", "trimmed_mean")
        for t in ("sign_flip", "ipm")
        for p in (0.1, 1.0)
    ]
    base = {"dataset": "synthetic", "clients": 20, "rounds": 1}
    lock_step_log: list = []
    lock_step = bisect_breakdown(
        cells, spec_evaluator(base, ladder_runner(lock_step_log), seeds=[1, 2])
    )
    inner_log: list = []
    inner = ladder_runner(inner_log)
    delays = random.Random(45)
    lock = threading.Lock()
    steps: dict = {}

    def shuffled(specs):
        with lock:
            wait = delays.uniform(0.0, 0.01)
        time.sleep(wait)
        return inner(specs)

    def counted(points):
        with lock:
            for cell in {p.cell for p in points}:
                steps[cell] = steps.get(cell, 0) + 1
        return evaluate(points)

    evaluate = spec_evaluator(base, shuffled, seeds=[1, 2])
    done: list = []
    streamed = bisect_concurrently(cells, counted, on_cell_done=lambda c: done.append(c.cell))
    frame, expected = streamed.to_frame(), lock_step.to_frame()
    assert frame.drop(columns="trials").equals(expected.drop(columns="trials"))
    assert (
        streamed.points_frame()
        .drop(columns=["trials", "detail"])
        .equals(lock_step.points_frame().drop(columns=["trials", "detail"]))
    )
    made = [s.to_json() for batch in inner_log for s in batch]
    assert sorted(made) == sorted(s.to_json() for batch in lock_step_log for s in batch)
    assert streamed.trials_used == lock_step.trials_used == len(made)
    assert sorted(done, key=cells.index) == cells and streamed.waves == max(steps.values())
    with pytest.raises(SpecError, match="listed twice"):
        bisect_concurrently([cells[0], cells[0]], counted)


def test_the_staged_ladder_stops_at_the_first_collapse():
    """At k = 10 of 20 the mean collapses at the weakest sign-flip strength: the point runs one
    variant, not four, and names it."""
    log: list = []
    evaluate = spec_evaluator(
        {"dataset": "synthetic", "clients": 20, "rounds": 1, "participation": 1.0},
        ladder_runner(log),
    )
    cell = Cell.of(20, aggregator="mean", attack="sign_flip")
    outcome = evaluate([Point(cell, 10)])[0]
    assert outcome.collapsed and outcome.trials == 1 and outcome.runs == 4
    assert outcome.breaker == (("attack_strength", 1.0),)
    # a point that never reaches 0 runs the whole ladder and keeps the worst
    outcome = evaluate([Point(cell, 1)])[0]
    assert outcome.trials == 4 and not outcome.collapsed
    assert outcome.breaker == (("attack_strength", 100.0),)
    # the same point again is shared: no new run
    assert evaluate([Point(cell, 1)])[0].trials == 0


def test_a_run_without_byzantine_clients_ignores_its_attack():
    """`canonical_spec`'s rule, checked on real runs: with no Byzantine client the attack, its
    strength and its scope change nothing, bit for bit (a data-side attack included)."""
    import torch

    from robusttune.core.runspec import RunSpec
    from robusttune.engine.simulation import Simulation
    from robusttune.experiments.breakdown import canonical_spec

    base = {
        "dataset": "synthetic",
        "clients": 6,
        "rounds": 2,
        "participation": 0.5,
        "byzantine_fraction": 0.0,
        "local_epochs": 1,
        "checkpoint_every": 0,
    }
    for attack in ("ipm", "label_flip", "gaussian"):
        spec = RunSpec.from_dict(
            {**base, "attack": attack, "attack_strength": 7.0, "attack_scope": "sample"}
        )
        assert spec.n_byzantine == 0
        canonical = canonical_spec(spec)
        assert canonical.attack == "none" and canonical.attack_strength is None
        runs = [Simulation(s) for s in (spec, canonical)]
        records = [[r.to_dict() for r in run] for run in runs]
        for a, b in zip(*records):
            assert _comparable(a) == _comparable(b)
        assert torch.equal(runs[0].params, runs[1].params)
    attacked = RunSpec.from_dict({**base, "byzantine_fraction": 0.34, "attack": "ipm"})
    assert canonical_spec(attacked) is attacked


def _comparable(record: dict) -> dict:
    """A round record without its timings, NaN spelled out (a round with no honest input has a
    NaN aggregation error, and NaN != NaN would fail an equality of identical runs)."""
    import math

    return {
        k: ("nan" if isinstance(v, float) and math.isnan(v) else v)
        for k, v in record.items()
        if "seconds" not in k
    }


def _same_run(a, b) -> list:
    """Both specs' runs, asserting equal records (timings aside) and final parameters."""
    import torch

    from robusttune.engine.simulation import Simulation

    runs = [Simulation(s) for s in (a, b)]
    records = [[r.to_dict() for r in run] for run in runs]
    for x, y in zip(*records):
        assert _comparable(x) == _comparable(y)
    assert torch.equal(runs[0].params, runs[1].params)
    return records[0]


@pytest.mark.parametrize(
    ("mode", "seed", "method"),
    [
        ("fixed", 43, "median"),
        ("bernoulli", 42, "krum"),
        ("fixed", 45, "swb_dm"),
        ("bernoulli", 45, "demoa"),
    ],
)
def test_a_run_that_never_samples_a_byzantine_client_ignores_its_attack(mode, seed, method):
    """With Byzantine clients that the sampling stream never draws, the attack changes nothing
    either (a cache and a momentum method included): `byzantine_ever_sampled` replays the
    run's samples, and the run with attack none is the same bit for bit; beta stays."""
    from robusttune.core.runspec import RunSpec
    from robusttune.experiments.breakdown import canonical_spec
    from robusttune.problem.sampling import byzantine_ever_sampled

    values = {
        "dataset": "synthetic",
        "clients": 10,
        "participation": 0.2,
        "rounds": 3,
        "participation_mode": mode,
        "byzantine_fraction": 0.1,
        "seed": seed,
        "method": method,
        "local_epochs": 1,
        "checkpoint_every": 0,
        "synthetic_shape": "16",
        "synthetic_samples": 240,
    }
    for attack, strength in (("ipm", 1000.0), ("label_flip", None), ("sign_flip", 3.0)):
        spec = RunSpec.from_dict({**values, "attack": attack, "attack_strength": strength})
        assert not byzantine_ever_sampled(spec)
        canonical = canonical_spec(spec)
        assert canonical.attack == "none" and canonical.byzantine_fraction == 0.1
        records = _same_run(spec, canonical)
        assert all(r["byzantine_sampled"] == 0 for r in records)
    # one seed on, a Byzantine client is sampled: the attack matters and the spec is its own
    sampled = RunSpec.from_dict({**values, "seed": 42 if mode == "fixed" else 43, "attack": "ipm"})
    assert byzantine_ever_sampled(sampled) and canonical_spec(sampled) is sampled
    from robusttune.engine.simulation import Simulation

    assert any(r.byzantine_sampled > 0 for r in Simulation(sampled))


def test_the_ladder_stops_at_the_first_failure_without_changing_a_verdict():
    """With the survival bar (here 0.9 x clean, so a point fails long before it collapses) a
    failed point stops at the weakest strength below the bar: every breakdown, status and
    point verdict is the map's without it, for fewer runs, and (the cell's earlier breakers
    not run first) a failed point names the first strength of the ladder whose accuracy (the
    runner's formula, worked out here) is below it."""
    from robusttune.methods.attacks import ATTACKS

    plain, _ = _bar_map(None, prioritise=False)
    stopped, log = _bar_map((None, 0.9), prioritise=False)
    answer = ["breakdown_fraction", "status", "evaluated", "violations"]
    assert stopped.to_frame()[answer].equals(plain.to_frame()[answer])
    assert stopped.points_frame()["survived"].equals(plain.points_frame()["survived"])
    assert stopped.trials_used < plain.trials_used
    assert stopped.trials_used == sum(len(b) for b in log)
    bar = 0.9 * 0.9  # every clean run scores 0.9
    weight = {"sign_flip": 1.0, "ipm": 1.6}
    robust = {"mean": 0.0, "median": 0.3, "trimmed_mean": 0.2}
    for _, point in stopped.points_frame().iterrows():
        if point["survived"]:
            continue
        ladder = ATTACKS[point["attack"]].strength_ladder
        damage = [
            max(0.0, point["byzantine_fraction"] - robust[point["aggregator"]])
            * weight[point["attack"]]
            * min(s, 12.0) ** 0.5
            for s in ladder
        ]
        accuracy = [0.9 - d if d < 0.45 else 0.1 for d in damage]
        first = next(i for i, a in enumerate(accuracy) if a < bar)
        assert point["adversary"] == f"attack_strength={ladder[first]}"
        assert point["accuracy"] == pytest.approx(accuracy[first])
        assert point["trials"] == first + 1


def _bar_map(survival, prioritise: bool = True):
    """Six cells of the ladder runner judged by 0.9 x the clean accuracy, with ``survival``
    given to the evaluator (the staged ladder stops at the bar) or not."""
    log: list = []
    cells = [
        Cell.of(20, aggregator=a, attack=t, participation=1.0)
        for a in ("mean", "median", "trimmed_mean")
        for t in ("sign_flip", "ipm")
    ]
    evaluate = spec_evaluator(
        {"dataset": "synthetic", "clients": 20, "rounds": 1},
        ladder_runner(log),
        seeds=[1],
        survival=survival,
        prioritise=prioritise,
    )
    return bisect_breakdown(cells, evaluate, relative_threshold=0.9), log


def test_the_cells_earlier_breakers_run_first_without_changing_a_verdict():
    """``prioritise``: a point runs first the settings that broke its cell's nearest failed
    points. Every breakdown, status and point verdict is the map's without it, a survivor keeps
    its worst setting and accuracy, a failed point names a setting that broke it (its accuracy
    below the bar), and the failures cost fewer runs."""
    ladder_first, ladder_log = _bar_map((None, 0.9), prioritise=False)
    breakers_first, log = _bar_map((None, 0.9))
    answer = ["breakdown_fraction", "status", "evaluated", "violations"]
    assert breakers_first.to_frame()[answer].equals(ladder_first.to_frame()[answer])
    points, expected = breakers_first.points_frame(), ladder_first.points_frame()
    assert points["survived"].equals(expected["survived"])
    alive = points["survived"]
    columns = ["accuracy", "adversary", "trials"]
    assert points[alive][columns].equals(expected[alive][columns])
    bar = 0.9 * 0.9  # every clean run scores 0.9
    assert ((points[~alive]["accuracy"] < bar) | points[~alive]["collapsed"]).all()
    assert points[~alive]["trials"].sum() < expected[~alive]["trials"].sum()
    assert breakers_first.trials_used == sum(len(b) for b in log) < sum(len(b) for b in ladder_log)
    # some failed point names a stronger setting than the ladder's first that breaks it
    assert (points[~alive]["adversary"] != expected[~alive]["adversary"]).any()


def test_a_point_of_a_cell_whose_clean_run_did_not_learn_stops_at_its_first_setting():
    """``clean_margin``: the mean's clean run here reaches 0.15 on 10 classes (0.05 above
    chance), so its cell has no breakdown point; the point asked beside its clean point in the
    first wave then stops after one setting instead of running the ladder it survives. The
    other cells, every answer and status, and the learned cells' points are as without it."""
    from robusttune.methods.attacks import ATTACKS

    def runner(log):
        ladder = ladder_runner(log)

        def run(specs):
            out = []
            for spec, summary in zip(specs, ladder(specs)):
                accuracy = summary.final_accuracy
                if spec.aggregator == "mean":  # barely learns, and no attack hurts it further
                    accuracy = 0.15
                out.append(
                    RunSummary.from_dict(
                        {"final_accuracy": accuracy, "collapsed": False, "num_classes": 10}
                    )
                )
            return out

        return run

    def bisected(clean_margin):
        log: list = []
        cells = [
            Cell.of(20, aggregator=a, attack="sign_flip", participation=1.0)
            for a in ("mean", "median")
        ]
        evaluate = spec_evaluator(
            {"dataset": "synthetic", "clients": 20, "rounds": 1},
            runner(log),
            seeds=[1],
            survival=(None, 0.5),
            clean_margin=clean_margin,
        )
        result = bisect_breakdown(cells, evaluate, clean_margin=0.1)
        return result, sum(len(batch) for batch in log)

    full, full_runs = bisected(None)
    settled, runs = bisected(0.1)
    answer = ["aggregator", "breakdown_fraction", "status", "evaluated"]
    assert settled.to_frame()[answer].equals(full.to_frame()[answer])
    statuses = dict(zip(settled.to_frame()["aggregator"], settled.to_frame()["status"]))
    assert statuses["mean"] == "clean_at_chance" and statuses["median"] != "clean_at_chance"
    ladder = len(ATTACKS["sign_flip"].strength_ladder)
    assert runs == full_runs - (ladder - 1)  # the mean's first-wave point ran one setting
    points, expected = settled.points_frame(), full.points_frame()
    learned_cell = points["aggregator"] == "median"
    columns = ["byzantine", "survived", "accuracy", "adversary", "trials"]
    assert points[learned_cell][columns].equals(expected[learned_cell][columns])
    unread = points[~learned_cell & (points["byzantine"] > 0)]
    assert len(unread) == 1 and unread["trials"].tolist() == [1]


def test_under_tuning_the_ladder_stops_only_at_a_collapse():
    """A tuned point tells Optuna its worst variant's score, so ``survival`` is not used there:
    a point that fails the bar without collapsing still runs its whole ladder."""
    from robusttune.experiments.sweep.space import Domain

    log: list = []
    evaluate = spec_evaluator(
        {"dataset": "synthetic", "clients": 20, "rounds": 1, "participation": 1.0},
        ladder_runner(log),
        budget=1,
        tune={"trim_ratio": Domain("uniform", low=0.0, high=0.1)},
        survival=(0.85, 0.5),
    )
    cell = Cell.of(20, aggregator="mean", attack="sign_flip")
    outcome = evaluate([Point(cell, 1)])[0]  # 0.9 - 0.05 x sqrt(s): below 0.85 from s = 3 on
    assert not outcome.collapsed and outcome.accuracy < 0.85 and outcome.trials == 4


@pytest.mark.parametrize(
    ("participation", "mode", "sample_size", "rounds", "expected"),
    [
        (0.1, "fixed", None, 5, 25),  # n = 2 of 20: q = 0.1, ceil(2.5 / 0.1)
        (0.1, "bernoulli", None, 5, 25),
        (0.5, "fixed", None, 5, 5),  # ceil(2.5 / 0.5) = 5: already enough
        (0.5, "bernoulli", None, 15, 15),
        (0.3, "bernoulli", None, 5, 9),  # ceil(8.33)
        (0.1, "fixed", 3, 5, 17),  # sample_size 3 of 20: q = 0.15, ceil(16.7)
        (1.0, "fixed", None, 1, 3),
    ],
)
def test_min_client_rounds_gives_each_client_its_rounds(
    participation, mode, sample_size, rounds, expected
):
    from robusttune.core.runspec import RunSpec
    from robusttune.experiments.breakdown.plan import rounds_for_participation

    spec = RunSpec.from_dict(
        {
            "dataset": "synthetic",
            "clients": 20,
            "rounds": rounds,
            "participation": participation,
            "participation_mode": mode,
            "sample_size": sample_size,
        }
    )
    assert rounds_for_participation(spec, 2.5) == expected


def test_min_client_rounds_sets_each_cells_rounds_and_is_checked(tmp_path):
    space = tmp_path / "b.yaml"
    body = (
        "run: {dataset: synthetic, clients: 20, rounds: 4}\n"
        "space: {participation: {grid: [0.1, 1.0]}, attack: {grid: [ipm]}}\n"
    )
    space.write_text(body + "breakdown: {min_client_rounds: 2}\n")
    plan = load_plan(space)
    assert [c["rounds"] for c in plan.cells] == [20, 4]
    space.write_text(body)
    assert all("rounds" not in c.as_dict() for c in load_plan(space).cells)
    space.write_text(body + "breakdown: {min_client_rounds: -1}\n")
    with pytest.raises(SpecError, match="min_client_rounds"):
        load_plan(space)


def test_the_default_map_has_every_method_at_every_regime():
    """search_spaces/breakdown.yaml (parsed, nothing run): each method at p = 0.1 and 0.5 in
    both sampling modes and at p = 1.0, every cell against every attack of the default worst
    case (the adversary's, run staged: the ladders first), and given at least
    min_client_rounds rounds per client."""
    from robusttune.core.runspec import RunSpec
    from robusttune.methods.attacks import ATTACKS

    plan = load_plan(Path(__file__).resolve().parent.parent / "search_spaces" / "breakdown.yaml")
    # a method is its rule behind its pre-aggregation: NNM in front of median, Krum and CCLIP
    methods = {(c["method"], c.as_dict().get("pre_aggregator", "none")) for c in plan.cells}
    attacks = plan.adversary["attack"]
    regimes = {
        (0.1, "fixed"),
        (0.1, "bernoulli"),
        (0.5, "fixed"),
        (0.5, "bernoulli"),
        (1.0, "fixed"),
    }
    found = {
        (
            c["method"],
            c.as_dict().get("pre_aggregator", "none"),
            c["participation"],
            c["participation_mode"],
        )
        for c in plan.cells
    }
    assert found == {(*m, p, mode) for m in methods for p, mode in regimes}
    assert len(plan.cells) == len(found) == 100 and len(methods) == 20
    assert all("attack" not in c.as_dict() for c in plan.cells)
    assert {m for m, pre in methods if pre == "nnm"} == {"median", "krum", "cclip"}
    # every attack of the default worst case is mapped, the ladders first
    assert set(attacks) == {name for name in ATTACKS if ATTACKS[name].default_adversary}
    assert attacks[:2] == ["sign_flip", "ipm"] and attacks[-2:] == ["optimal_alie", "optimal_ipm"]
    assert plan.min_client_rounds is not None
    for cell in plan.cells:
        spec = RunSpec.from_dict({**plan.base, **cell.as_dict()})
        q = (
            spec.expected_sample_size / spec.clients
            if spec.participation_mode == "fixed"
            else spec.participation
        )
        assert spec.rounds * q >= plan.min_client_rounds - 1e-9


def window_runner(log):
    """Runs nothing: the mean at k > 0 loses to the sign flip only in a window of strengths
    (15 to 60) that the ladder (1, 3, 10, 100) straddles: there accuracy 0.3, else 0.85."""

    def run(specs):
        log.append(list(specs))
        out = []
        for s in specs:
            strength = s.attack_strength or 1.0
            hit = s.byzantine_fraction > 0 and 15.0 <= strength <= 60.0
            out.append(
                RunSummary.from_dict({"final_accuracy": 0.3 if hit else 0.85, "collapsed": False})
            )
        return out

    return run


def test_the_adaptive_adversary_finds_a_strength_the_ladder_misses():
    """The ladder alone lets the point survive; the adaptive search (6 runs, seeded TPE over
    [1, 100]) finds a strength inside the window, runs no strength outside the ladder's range,
    and names what broke the point. A point the ladder already broke runs no search."""
    cell = Cell.of(20, aggregator="mean", attack="sign_flip")
    base = {"dataset": "synthetic", "clients": 20, "rounds": 1, "participation": 1.0}
    log: list = []
    ladder_only = spec_evaluator(base, window_runner(log), survival=(None, 0.5))
    bisect_ladder = bisect_breakdown([cell], ladder_only)
    assert bisect_ladder.cells[0].status == "survives_all"
    log.clear()
    adaptive = spec_evaluator(base, window_runner(log), survival=(None, 0.5), adaptive=6)
    outcome = adaptive([Point(cell, 0), Point(cell, 2)])[1]
    strengths = [s.attack_strength for batch in log for s in batch if s.byzantine_fraction > 0]
    assert strengths[:4] == [1.0, 3.0, 10.0, 100.0]  # the ladder first: the floor
    searched = strengths[4:]
    assert 1 <= len(searched) <= 6 and all(1.0 <= s <= 100.0 for s in searched)
    assert 15.0 <= searched[-1] <= 60.0 and all(not 15.0 <= s <= 60.0 for s in searched[:-1])
    assert outcome.accuracy == 0.3 and outcome.breaker == (("attack_strength", searched[-1]),)
    assert outcome.runs == 4 + 6 and outcome.trials == len(strengths)
    # a fresh evaluator proposes the same strengths (seeded TPE, the same told scores)
    again = spec_evaluator(base, window_runner([]), survival=(None, 0.5), adaptive=6)
    assert again([Point(cell, 0), Point(cell, 2)])[1].breaker == outcome.breaker
    # a point the ladder breaks (here: every strength, the runner's bar at 0.9) searches nothing
    log.clear()
    strict = spec_evaluator(base, window_runner(log), survival=(0.9, 0.5), adaptive=6)
    assert strict([Point(cell, 2)])[0].trials == 1


def test_adaptive_is_a_breakdown_adversary_choice(tmp_path):
    space = tmp_path / "b.yaml"
    body = "run: {dataset: synthetic, clients: 20}\nspace: {attack: {grid: [ipm]}}\n"
    space.write_text(body + "breakdown: {adversary: adaptive, adaptive_budget: 3}\n")
    plan = load_plan(space)
    assert plan.adaptive == 3 and plan.adversary == {}
    from robusttune.experiments.breakdown.plan import plan_costs

    assert plan_costs(plan)[0].attacked_trials == 4 + 3  # IPM's ladder + the search
    space.write_text(body + "breakdown: {adaptive_budget: 3}\n")
    with pytest.raises(SpecError, match="adaptive_budget applies to adversary: adaptive"):
        load_plan(space)
    space.write_text(body + "breakdown: {adversary: clever}\n")
    with pytest.raises(SpecError, match="adversary"):
        load_plan(space)
