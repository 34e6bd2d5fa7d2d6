"""The staged adversary (robusttune.methods.adversary): a point tries the attacks cheapest first and stops
at the first that breaks it. On a small map with the ladders and the rule-aware attacks it gives
every cell the breakdown the unstaged adversary (every variant of every point run) gives, for
fewer runs, and names the family that broke each cell. Runs are modelled (nothing trains)."""

from __future__ import annotations

import pytest

from robusttune.core.records import RunSummary
from robusttune.core.registry import SpecError
from robusttune.experiments.breakdown import Cell, bisect_breakdown, spec_evaluator
from robusttune.experiments.breakdown.answer import breakdown_table
from robusttune.methods.adversary import Adversary, default_attacks, family_of, staged_order
from robusttune.methods.attacks import ATTACKS

LADDERS = ("sign_flip", "ipm")
RULE_AWARE = ("minmax", "minsum", "fang_trmean", "fang_krum", "optimal_alie", "optimal_ipm")


def test_the_default_adversary_runs_the_ladders_first_and_the_rule_calling_attacks_last():
    attacks = default_attacks()
    assert set(attacks) == set(LADDERS + RULE_AWARE)
    stages = [ATTACKS[a].adversary_stage for a in attacks]
    assert stages == sorted(stages)
    assert set(attacks[:2]) == set(LADDERS) and set(attacks[-2:]) == {"optimal_alie", "optimal_ipm"}
    assert [family_of(a) for a in attacks] == ["ladder"] * 2 + ["rule-aware"] * 6
    # a listed order is kept within a stage and sorted across stages
    assert staged_order(["optimal_ipm", "minsum", "ipm", "minmax", "sign_flip"]) == (
        "ipm",
        "sign_flip",
        "minsum",
        "minmax",
        "optimal_ipm",
    )
    threat = Adversary.of({"attack": ["optimal_ipm", "sign_flip"]})
    assert [v["attack"] for v in threat.variants("none")] == ["sign_flip"] * 4 + ["optimal_ipm"]
    assert family_of("alie") == "ladder" and family_of("none") == "ladder"
    with pytest.raises(SpecError, match="adversary attack must be one of"):
        staged_order(["sign_flip", "nope"])


# What each attack does to each rule in the model: damage = (beta - robustness) x weight x a
# strength factor; below the survival bar (half the clean 0.9) when damage > 0.45, collapsed past
# 0.6. Fang's trimmed-mean attack breaks the median sooner than every ladder, Fang's Krum attack
# Krum; the optimal IPM is strongest against the trimmed mean; the mean falls to the ladders.
ROBUST = {"mean": 0.0, "median": 0.28, "krum": 0.23, "trimmed_mean": 0.2}
WEIGHT = {"sign_flip": 2.0, "ipm": 3.0, "minmax": 2.5, "minsum": 2.0, "optimal_alie": 3.0}
SPECIAL = {
    ("median", "fang_trmean"): 12.0,
    ("krum", "fang_krum"): 15.0,
    ("trimmed_mean", "optimal_ipm"): 9.0,
}


def modelled_runner(log: list):
    from robusttune.problem.sampling import byzantine_ever_sampled

    def run(specs):
        log.extend(specs)
        out = []
        for s in specs:
            weight = SPECIAL.get((s.aggregator, s.attack), WEIGHT.get(s.attack, 1.0))
            strength = min(s.attack_strength or 4.0, 16.0) ** 0.5 if s.attack in LADDERS else 2.0
            hit = byzantine_ever_sampled(s) and s.attack != "none"
            damage = (
                max(0.0, s.byzantine_fraction - ROBUST[s.aggregator]) * weight * strength
                if hit
                else 0.0
            )
            accuracy = max(0.9 - damage, 0.1)
            out.append(
                RunSummary.from_dict(
                    {
                        "final_accuracy": accuracy,
                        "collapsed": damage > 0.6,
                        "run_dir": f"runs/{abs(hash(s.to_json()))}",
                    }
                )
            )
        return out

    return run


def _map(staged: bool):
    log: list = []
    cells = [
        Cell.of(20, aggregator=a, participation=1.0, participation_mode=mode)
        for a in ROBUST
        for mode in ("fixed", "bernoulli")
    ]
    evaluate = spec_evaluator(
        {"dataset": "synthetic", "clients": 20, "rounds": 1},
        modelled_runner(log),
        seeds=[1],
        adversary=Adversary.default(),
        staged=staged,
        survival=(None, 0.5) if staged else None,
    )
    return bisect_breakdown(cells, evaluate, relative_threshold=0.5), log


def test_the_staged_adversary_gives_every_cell_the_unstaged_breakdown_for_fewer_runs():
    staged, staged_log = _map(True)
    plain, plain_log = _map(False)
    columns = ["aggregator", "participation_mode", "breakdown_fraction", "status", "evaluated"]
    assert staged.to_frame()[columns].equals(plain.to_frame()[columns])
    assert staged.trials_used == len({s.to_json() for s in staged_log}) < plain.trials_used
    expensive = [
        sum(s.attack.startswith("optimal") for s in log) for log in (staged_log, plain_log)
    ]
    assert expensive[0] < expensive[1]
    # each verdict is the model's: the first fraction on the lattice past the survival bar
    table = breakdown_table(staged).set_index(["aggregator", "participation_mode"])
    for (aggregator, p), row in table.iterrows():
        worst = max(
            SPECIAL.get((aggregator, a), WEIGHT.get(a, 1.0)) * (4.0 if a in LADDERS else 2.0)
            for a in LADDERS + RULE_AWARE
        )
        first_broken = next(k for k in range(1, 11) if (k / 20 - ROBUST[aggregator]) * worst > 0.45)
        assert row["breakdown_fraction"] == pytest.approx((first_broken - 1) / 20), (aggregator, p)
        # the family: a ladder where a ladder breaks the first failing point, else rule-aware
        ladder = max(WEIGHT[a] * 4.0 for a in LADDERS)
        by_ladder = (first_broken / 20 - ROBUST[aggregator]) * ladder > 0.45
        assert row["attack_family"] == ("ladder" if by_ladder else "rule-aware"), (aggregator, p)
    assert set(table["attack_family"]) == {"ladder", "rule-aware"}
    # unstaged, the breaker is the worst variant; staged, the first that broke the point
    assert set(breakdown_table(plain)["attack_family"]) <= {"ladder", "rule-aware"}


def test_set_overrides_a_cell_that_sets_the_key_itself():
    """``--set rounds=2`` reaches the cells of a joint axis that set their own rounds (and a
    plain grid axis of that name); min_client_rounds still raises rounds after it."""
    from robusttune.experiments.breakdown.plan import parse_plan

    mapping = {
        "run": {"dataset": "synthetic", "clients": 10, "attack": "sign_flip"},
        "space": {
            "setting": {
                "grid": [
                    {"aggregator": "mean", "rounds": 5},
                    {"aggregator": "median", "rounds": 15},
                ]
            },
            "participation": {"grid": [0.2, 1.0]},
        },
    }
    plan = parse_plan(mapping, source="m.yaml", default_name="m")
    assert sorted(c["rounds"] for c in plan.cells) == [5, 5, 15, 15]
    moved = plan.with_overrides(run={"rounds": 2})
    assert [c["rounds"] for c in moved.cells] == [2, 2, 2, 2] and len(moved.cells) == 4
    assert moved.raw["space"]["setting"]["grid"][1] == {"aggregator": "median", "rounds": 2}
    assert [c["participation"] for c in plan.with_overrides(run={"participation": 0.5}).cells] == [
        0.5
    ] * 2
    floored = plan.with_overrides(run={"rounds": 2}, min_client_rounds=2.0)
    assert sorted(c["rounds"] for c in floored.cells) == [2, 2, 10, 10]  # ceil(2 / 0.2) at p = 0.2


def test_the_report_names_pre_aggregated_cells_apart_and_prints_no_nan(tmp_path):
    """A key only some cells set (pre_aggregator) is left out of the others' names in the
    non-monotone list, and NNM in front of the median is its own method in the frontier."""
    from robusttune.experiments.breakdown import write_breakdown

    cells = [
        Cell.of(10, method="median", pre_aggregator="nnm", attack="ipm"),
        Cell.of(10, method="median", attack="ipm"),
    ]
    # with NNM the median breaks after 3; without, it survives 0-1 and 3, fails 2: non-monotone
    verdict = {
        0: {k: k <= 3 for k in range(6)},
        1: {0: True, 1: True, 2: False, 3: True, 4: False, 5: False},
    }
    result = bisect_breakdown(
        cells,
        lambda ps: [verdict[cells.index(p.cell)][p.byzantine] for p in ps],
        on_non_monotone="scan",
    )
    text = write_breakdown(result, tmp_path).read_text()
    flagged = text.split("## Non-monotone cells")[1].split("##")[0]
    assert "- method=median, attack=ipm:" in flagged and "nan" not in flagged
    import pandas as pd

    frontier = pd.read_csv(tmp_path / "frontier.csv").set_index("method")
    assert set(frontier.index) == {"median", "nnm+median"}
    assert frontier.loc["nnm+median", "breakdown_fraction"] == pytest.approx(0.3)
