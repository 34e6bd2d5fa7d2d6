"""analysis/findings/claim_tables.py's claim 6 and 7 helpers on hand-built runs whose per-seed
means, spreads and pairwise verdicts are written out by hand."""

from __future__ import annotations

import math
from pathlib import Path

import pandas as pd
import pytest

from tests.scripts import loaded_script

SCRIPT = Path(__file__).resolve().parents[1] / "analysis" / "findings" / "claim_tables.py"


@pytest.fixture(scope="module")
def tables():
    with loaded_script(SCRIPT, "claim_tables_script") as module:
        yield module


def _frame() -> pd.DataFrame:
    """Two methods x two attacks x seeds 1-3. A's accuracy: 80 + seed (alie), 60 + seed (ipm);
    B's: 70 + 2 seed (alie), 60 + seed (ipm)."""
    rows = []
    for seed in (1, 2, 3):
        rows += [
            {"method": "A", "threat": "alie", "seed": seed, "accuracy": 80 + seed},
            {"method": "A", "threat": "ipm", "seed": seed, "accuracy": 60 + seed},
            {"method": "B", "threat": "alie", "seed": seed, "accuracy": 70 + 2 * seed},
            {"method": "B", "threat": "ipm", "seed": seed, "accuracy": 60 + seed},
        ]
    return pd.DataFrame(rows)


def test_over_seeds_spreads_the_per_seed_means(tables):
    out = tables._over_seeds(_frame(), ["method"], "accuracy")
    # A's per-seed means over the two attacks: 71, 72, 73 -> mean 72, sd 1
    assert out.loc["A", "runs"] == 6 and out.loc["A", "mean"] == pytest.approx(72.0)
    assert out.loc["A", "seed_sd"] == pytest.approx(1.0)
    assert (out.loc["A", "seed_min"], out.loc["A", "seed_max"]) == (71.0, 73.0)
    # B's: 66.5, 68, 69.5 -> sd 1.5
    assert out.loc["B", "seed_sd"] == pytest.approx(1.5)


def test_pairs_count_cells_beyond_the_larger_seed_sd(tables):
    out = tables._pairs(_frame(), "method", ["A"], ["B"], "accuracy", ["threat"])
    row = out.loc[("A", "B")]
    # alie: 82 against 74, bar max(1, 2) = 2 -> above; ipm: 62 against 62 -> within
    assert (row["cells"], row["above"], row["within"], row["below"]) == (2, 1, 1, 0)
    assert row["mean difference"] == pytest.approx((8 + 0) / 2)
    flipped = tables._pairs(_frame(), "method", ["B"], ["A"], "accuracy", ["threat"])
    assert flipped.loc[("B", "A"), "below"] == 1


def test_majority_effect_splits_trained_rounds_by_majority(tables):
    runs = pd.DataFrame(
        [
            {
                "run_id": "r",
                "method": "fedsgd+cclip",
                "dirichlet_alpha": math.inf,
                "participation": 0.1,
                "num_classes": 10,
                "attack": "alie",
                "attack_strength": None,
            }
        ]
    )
    accuracy = [0.3, 0.6, 0.7, 0.2, 0.65, 0.7]
    majority = [False, False, False, True, False, True]
    rounds = pd.DataFrame(
        {"run_id": "r", "round": range(1, 7), "accuracy": accuracy, "byzantine_majority": majority}
    )
    out = tables._majority_effect(runs, rounds, trained=50.0).loc[(0.1, "IID", "fedsgd+cclip")]
    # trained before: rounds 3 (60), 4 (70), 6 (65); round 5 starts from 20: left out
    assert out["majority rounds"] == 2 and out["other rounds"] == 1
    assert out["mean change (majority)"] == pytest.approx((-50 + 5) / 2)
    assert out["worst change (majority)"] == pytest.approx(-50)
    assert out["mean change (other)"] == pytest.approx(10)


def test_majority_effect_counts_a_majority_round_between_evaluations_in_its_step(tables):
    """Evaluated every 2 rounds: the majority round 3 is not evaluated; the step from round 2 to
    round 4 holds it, so that step's change is a majority change; round 6's step holds none."""
    runs = pd.DataFrame(
        [
            {
                "run_id": "r",
                "method": "demoa",
                "dirichlet_alpha": math.inf,
                "participation": 0.5,
                "num_classes": 10,
                "attack": "alie",
                "attack_strength": None,
            }
        ]
    )
    nan = float("nan")
    rounds = pd.DataFrame(
        {
            "run_id": "r",
            "round": range(1, 7),
            "accuracy": [nan, 0.6, nan, 0.05, nan, 0.7],
            "byzantine_majority": [False, False, True, False, False, False],
        }
    )
    out = tables._majority_effect(runs, rounds, trained=50.0).loc[(0.5, "IID", "demoa")]
    assert out["majority rounds"] == 1 and out["mean change (majority)"] == pytest.approx(-55)
    assert out["ended at chance (majority)"] == 1
    # 5 -> 70 starts from an untrained model: no other step is counted
    assert out["other rounds"] == 0
    assert tables._evaluation_interval(rounds) == 2


def test_demoa_comparison_headings_count_the_attacks_seeds_and_cells_it_was_given(tables):
    """Two attacks x two seeds x one p x one split (a space unlike demoa.yaml's 5 x 3 x 2 x 2):
    the headings must say 2 attacks, 2 seeds and 2 cells, not demoa.yaml's fixed figures."""
    runs = pd.DataFrame(
        [
            {
                "run_id": f"{method}-{attack}-{seed}",
                "method": method,
                "dirichlet_alpha": math.inf,
                "participation": 0.5,
                "num_classes": 10,
                "attack": attack,
                "attack_strength": None,
                "seed": seed,
                "byzantine_fraction": 0.2,
                "final_accuracy": 0.8 + 0.01 * seed,
                "collapsed": False,
            }
            for method in ("demoa", "fedsgd+cclip")
            for attack in ("alie", "ipm")
            for seed in (1, 2)
        ]
    )
    rounds = pd.DataFrame(
        {"run_id": runs["run_id"], "round": 1, "accuracy": 0.8, "byzantine_majority": False}
    )
    lines = tables.demoa_comparison(runs, rounds)
    assert "## Accuracy (%) per method x split x p over the 2 attacks x 2 seeds" in lines
    assert "## DeMoA against each baseline, per attack x split x p (2 cells)" in lines
    assert "At p = 0.5 (2 cells):" in lines


def _aftermath_runs() -> tuple[pd.DataFrame, pd.DataFrame]:
    """Three runs evaluated every 2 rounds of 6. alie, seed 1: majority round 3, 80 -> 30 -> 90;
    strategic_skip, seed 1: majority round 4 (an evaluated one), 70 -> 5 (chance) -> 60; ipm,
    seed 2: no majority round."""
    nan = float("nan")
    curves = {
        "alie": ([nan, 0.8, nan, 0.3, nan, 0.9], 3, 1),
        "strategic_skip": ([nan, 0.7, nan, 0.05, nan, 0.6], 4, 1),
        "ipm": ([nan, 0.5, nan, 0.6, nan, 0.7], None, 2),
    }
    runs, rounds = [], []
    for attack, (accuracy, majority_round, seed) in curves.items():
        runs.append(
            {
                "run_id": attack,
                "method": "fedsgd+cclip",
                "dirichlet_alpha": 0.5,
                "participation": 0.5,
                "num_classes": 10,
                "attack": attack,
                "attack_strength": None,
                "seed": seed,
                "byzantine_fraction": 0.2,
                "final_accuracy": accuracy[-1],
                "collapsed": False,
            }
        )
        majority = [r == majority_round for r in range(1, 7)]
        rounds.append(
            pd.DataFrame(
                {
                    "run_id": attack,
                    "round": range(1, 7),
                    "accuracy": accuracy,
                    "byzantine_majority": majority,
                }
            )
        )
    return pd.DataFrame(runs), pd.concat(rounds, ignore_index=True)


def test_majority_aftermath_reads_the_evaluations_around_the_first_majority_round(tables):
    runs, rounds = _aftermath_runs()
    events = tables.majority_aftermath_runs(runs, rounds).set_index("attack")
    assert list(events.index) == ["alie", "strategic_skip"]  # ipm never had a majority round
    alie, skip = events.loc["alie"], events.loc["strategic_skip"]
    assert (alie["before_round"], alie["after_round"], alie["first_majority"]) == (2, 4, 3)
    assert alie["change"] == pytest.approx(30 - 80) and alie["lowest_after"] == pytest.approx(30)
    assert not alie["at_chance_after"] and alie["final"] == pytest.approx(90)
    # the majority round is itself evaluated: it is the first evaluation after
    assert (skip["before_round"], skip["after_round"]) == (2, 4)
    assert skip["change"] == pytest.approx(5 - 70) and skip["at_chance_after"]


def test_majority_aftermath_keeps_the_aimed_attack_apart_and_lists_the_drops(tables):
    runs, rounds = _aftermath_runs()
    text = "\n".join(tables.majority_aftermath(runs, rounds, drop=5.0))
    assert (
        "| Dir(0.5) / paper's attacks / fedsgd+cclip | 1 | 3 | 80.0 (80.0-80.0) | -50.0, -50.0 "
        "| 30.0-30.0 | 1 | 0 | 90.0-90.0 |"
    ) in text
    assert (
        "| Dir(0.5) / strategic_skip / fedsgd+cclip | 1 | 4 | 70.0 (70.0-70.0) | -65.0, -65.0 "
        "| 5.0-5.0 | 1 | 1 | 60.0-60.0 |"
    ) in text
    assert (
        "- fedsgd+cclip, Dir(0.5), strategic_skip, seed 1: 70.0 -> 5.0% (round 2 -> 4; "
        "majority round 4), lowest after 5.0%, final 60.0%"
    ) in text
    assert "more than 5 points below the last one before (2):" in text
    # per seed: the paper's attacks averaged (seed 1: alie alone; seed 2: ipm), the aimed one apart
    assert "| Dir(0.5) / fedsgd+cclip | 90.0 | 70.0 | 60.0 |" in text
    assert "| Dir(0.5) / ipm | 70.0 (70.0-70.0) |" in text
