"""The axes a report follows: keys that vary between runs, less those another key already fixes;
on hand-built runs frames whose expected tables are written out by hand."""

from __future__ import annotations

import math

import pandas as pd
import pytest

from robusttune.reports.axes import row_axes, seed_table, split_label, varying_axes
from robusttune.reports.paper_tables import attack_table

INF = math.inf


def demoa_like_runs() -> pd.DataFrame:
    """2 methods x 2 rates (alpha coupled to p) x 2 splits x 2 attacks x 2 seeds; accuracy is
    a sum of known parts so every cell's mean is known."""
    rows = []
    method_of = {"fedsgd+cclip": ("fedsgd", "cclip", 0.2), "demoa+krum": ("demoa", "krum", 0.2)}
    for method, (algorithm, aggregator, eta) in method_of.items():
        for p, alpha in ((0.1, 0.5), (0.5, 0.1)):
            for split in (INF, 0.5):
                for attack in ("alie", "ipm"):
                    for seed in (1, 2):
                        accuracy = (
                            0.5
                            + 0.2 * (method == "demoa+krum")
                            + 0.1 * (p == 0.5)
                            + 0.05 * (split == INF)
                            - 0.02 * (attack == "ipm")
                            + 0.01 * seed
                        )
                        rows.append(
                            {
                                "run_id": f"{method}-{p}-{split}-{attack}-{seed}",
                                "dataset": "digits",
                                "method": method,
                                "algorithm": algorithm,
                                "aggregator": aggregator,
                                "server_lr": eta,
                                "participation": p,
                                "demoa_alpha": alpha,
                                "marina_p": p * 1.0,
                                "dirichlet_alpha": split,
                                "attack": attack,
                                "attack_strength": None,
                                "byzantine_fraction": 0.2,
                                "seed": seed,
                                "data_root": f"/tmp/{seed}",
                                "final_accuracy": accuracy,
                                "collapsed": accuracy < 0.55,
                            }
                        )
    return pd.DataFrame(rows)


def test_varying_axes_drop_constants_seeds_and_keys_fixed_by_earlier_ones():
    runs = demoa_like_runs()
    # algorithm/aggregator follow method, demoa_alpha and marina_p follow participation, seed
    # and data_root are never axes, dataset/server_lr/byzantine_fraction are constant
    assert varying_axes(runs) == ["method", "attack", "participation", "dirichlet_alpha"]
    # without method, the pair (aggregator, algorithm) labels the runs: aggregator first
    # (alphabetical among the keys outside AXIS_ORDER), algorithm then fixed by it
    assert varying_axes(runs.drop(columns=["method"])) == [
        "attack",
        "participation",
        "dirichlet_alpha",
        "aggregator",
    ]


def test_a_key_that_varies_within_a_kept_group_is_kept():
    runs = demoa_like_runs()
    # demoa_alpha no longer coupled: half the p = 0.1 runs take another alpha
    runs.loc[(runs["participation"] == 0.1) & (runs["seed"] == 2), "demoa_alpha"] = 0.9
    assert "demoa_alpha" in varying_axes(runs)
    assert varying_axes(runs.iloc[:1]) == []  # one run: nothing varies


def test_split_labels():
    assert split_label(INF) == "IID" and split_label(0.5) == "Dir(0.5)"
    assert row_axes(demoa_like_runs()) == ["participation", "split", "method"]


def test_attack_table_follows_rate_split_and_method():
    runs = demoa_like_runs()
    table = attack_table(runs)
    assert list(table.index.names) == ["participation", "split", "method"]
    assert len(table) == 2 * 2 * 2 and list(table.columns) == ["alie", "ipm", "worst"]
    # demoa+krum at p = 0.5, IID, ipm: mean over seeds 1, 2 of 0.5 + 0.2 + 0.1 + 0.05 - 0.02 + 0.01 s
    expected = 100 * (0.5 + 0.2 + 0.1 + 0.05 - 0.02 + 0.015)
    assert table.loc[(0.5, "IID", "demoa+krum"), "ipm"] == pytest.approx(expected)
    assert table.loc[(0.1, "Dir(0.5)", "fedsgd+cclip"), "worst"] == pytest.approx(
        100 * (0.5 - 0.02 + 0.015)
    )


def test_seed_table_mean_spread_and_collapses_per_cell():
    table = seed_table(demoa_like_runs())
    assert list(table.index.names) == ["participation", "split", "threat", "method"]
    assert len(table) == 16 and (table["runs"] == 2).all()
    row = table.loc[(0.1, "Dir(0.5)", "alie", "fedsgd+cclip")]
    # seeds give 0.51 and 0.52: mean 51.5, sample sd of (51, 52) = 0.7071
    assert row["mean"] == pytest.approx(51.5) and row["sd"] == pytest.approx(math.sqrt(0.5))
    assert (row["min"], row["max"]) == pytest.approx((51.0, 52.0))
    assert row["collapsed"] == 2  # both below the made-up 0.55 bar


def test_a_diverged_run_counts_as_zero_in_the_seed_mean():
    runs = demoa_like_runs()
    first = runs.index[0]
    runs.loc[first, "final_accuracy"] = math.nan
    cell = runs.loc[first]
    table = seed_table(runs)
    row = table.loc[
        (
            cell["participation"],
            split_label(cell["dirichlet_alpha"]),
            cell["attack"],
            cell["method"],
        )
    ]
    other = runs[
        (runs["run_id"] != cell["run_id"])
        & (runs["method"] == cell["method"])
        & (runs["participation"] == cell["participation"])
        & (runs["dirichlet_alpha"] == cell["dirichlet_alpha"])
        & (runs["attack"] == cell["attack"])
    ]["final_accuracy"].iloc[0]
    assert row["mean"] == pytest.approx(100 * other / 2) and row["min"] == 0.0


def test_distinct_runs_count_a_configuration_once_keeping_the_run_with_more_figures():
    from robusttune.reports.axes import distinct_runs

    runs = demoa_like_runs().assign(mean_honest_input_spread=math.nan)
    repeat = runs.iloc[[0, 5]].copy()
    repeat["run_id"] = ["z-" + r for r in repeat["run_id"]]
    repeat["data_root"] = "/elsewhere"  # where the data lived is no configuration
    repeat["mean_honest_input_spread"] = [1.5, 2.5]  # the newer sweep records it
    other_seed = runs.iloc[[1]].assign(run_id="y-other", seed=9)  # not a repeat: its seed differs
    both = pd.concat([runs, repeat, other_seed], ignore_index=True)
    kept, dropped = distinct_runs(both)
    assert dropped == 2 and len(kept) == len(runs) + 1
    assert set(kept["run_id"]) == (set(runs["run_id"]) - set(runs["run_id"].iloc[[0, 5]])) | set(
        repeat["run_id"]
    ) | {"y-other"}
    assert distinct_runs(runs)[1] == 0


def test_an_ablated_demoa_run_is_labelled_by_its_ablation():
    from robusttune.reports.axes import ablation_labelled

    runs = pd.DataFrame(
        {
            "method": ["demoa", "demoa", "demoa+mean", "fedcm"],
            "demoa_ablation": ["none", "no_decay", "coefficient_swap", "none"],
        }
    )
    assert list(ablation_labelled(runs)["method"]) == [
        "demoa",
        "demoa[no_decay]",
        "demoa+mean[coefficient_swap]",
        "fedcm",
    ]
    plain = runs.assign(demoa_ablation="none")
    assert list(ablation_labelled(plain)["method"]) == list(plain["method"])
