"""Robust tuning (robusttune.experiments.tuning): each proposal scored by the shared worst case, the Pareto
front by brute force, attack strength never a knob, a resumed study re-running nothing, and the
`tune` command end to end on real runs."""

from __future__ import annotations

import math

import numpy as np
import pytest
from typer.testing import CliRunner

from robusttune.core.records import RunSummary
from robusttune.core.registry import SpecError
from robusttune.core.runspec import RunSpec
from robusttune.experiments.breakdown.store import MapStore, StoredRunner
from robusttune.experiments.tuning import pareto_front, parse_tuning, run_study
from robusttune.methods.adversary import Adversary

SPACE = {
    "run": {
        "dataset": "synthetic",
        "model": "mlp",
        "clients": 10,
        "participation": 1.0,
        "method": "trimmed_mean",
        "rounds": 1,
        "byzantine_fraction": 0.2,
    },
    "space": {"trim_ratio": {"uniform": [0.0, 0.45]}},
    "tuning": {
        "num_samples": 8,
        "batch": 2,
        "population": 4,
        "seed": 1,
        "adversary": {"attack": ["sign_flip", "ipm"]},
    },
}


def toy_accuracy(spec: RunSpec) -> tuple[float, bool]:
    """Trimming costs clean accuracy (0.9 - 0.4 r); a trim dropping fewer rows per side than the
    k Byzantine clients falls to sign_flip from strength 10 and to ipm from 1000."""
    k, dropped = spec.n_byzantine, int(spec.clients * spec.trim_ratio + 1e-9)
    breaks = k > dropped and (
        (spec.attack == "sign_flip" and spec.attack_strength >= 10)
        or (spec.attack == "ipm" and spec.attack_strength >= 1000)
    )
    weak = 0.05 * k * (spec.attack == "ipm")  # ipm's weak strengths dent accuracy a little
    return (0.1 if breaks else 0.9 - 0.4 * spec.trim_ratio - weak), breaks


def toy_runner(log: list):
    def run(specs):
        out = []
        for spec in specs:
            log.append(spec)
            accuracy, breaks = toy_accuracy(spec)
            out.append(
                RunSummary.from_dict(
                    {
                        "final_validation_accuracy": accuracy,
                        "final_accuracy": accuracy - 0.01,
                        "collapsed": breaks,
                        "spec": spec.to_dict(),
                    }
                )
            )
        return out

    return run


def plan(**tuning):
    return parse_tuning(
        {**SPACE, "tuning": {**SPACE["tuning"], **tuning}}, source="t.yaml", default_name="t"
    )


def test_each_proposal_is_scored_by_the_worst_case_of_the_shared_adversary():
    study = plan()
    result = run_study(study, toy_runner([]))
    assert len(result.proposals) == 8
    variants = Adversary.default(["sign_flip", "ipm"]).variants("none")
    for proposal in result.proposals:
        assert set(proposal.knobs) == {"trim_ratio"}  # strength is never a knob
        base = {**SPACE["run"], "attack": "none", **proposal.knobs}
        clean, _ = toy_accuracy(RunSpec.from_dict({**base, "byzantine_fraction": 0.0}))
        # independent worst case: every variant at k = 2 of 10, collapse counting as 0
        worst = min(
            0.0 if broke else acc
            for acc, broke in (toy_accuracy(RunSpec.from_dict({**base, **v})) for v in variants)
        )
        assert proposal.values == pytest.approx((clean, worst))
        assert proposal.worst.test_accuracy == pytest.approx((0.1 if worst == 0 else worst) - 0.01)
    # the front by brute force, and the recommendation survives (trims at least k = 2 rows)
    points = [p.values for p in result.proposals]
    for point, on_front in zip(points, result.front):
        dominated = any(o[0] >= point[0] and o[1] >= point[1] and o != point for o in points)
        assert on_front == (not dominated)
    best = result.recommended
    assert best.values[1] == max(p[1] for p in points)
    if best.values[1] > 0:
        assert int(10 * best.knobs["trim_ratio"] + 1e-9) >= 2


def test_single_objective_uses_the_worst_case_alone():
    result = run_study(plan(objectives="worst", num_samples=4), toy_runner([]))
    assert len(result.proposals) == 4
    assert pareto_front([(0.5, 0.2), (0.6, 0.1), (0.4, 0.1)]) == [True, True, False]


def test_attack_keys_are_never_knobs_and_bad_sections_are_one_line():
    for key, domain in (
        ("attack_strength", {"uniform": [0.5, 4.0]}),
        ("attack", {"choice": ["ipm"]}),
    ):
        with pytest.raises(SpecError, match=f"space.{key} is the adversary's"):
            parse_tuning(
                {**SPACE, "space": {**SPACE["space"], key: domain}},
                source="t.yaml",
                default_name="t",
            )
    with pytest.raises(SpecError, match=r"run.attack 'alie'"):
        parse_tuning(
            {**SPACE, "run": {**SPACE["run"], "attack": "alie"}}, source="t.yaml", default_name="t"
        )
    with pytest.raises(SpecError, match=r"tuning.objectives"):
        plan(objectives="best")
    with pytest.raises(SpecError, match="no Byzantine client"):
        parse_tuning(
            {**SPACE, "run": {**SPACE["run"], "byzantine_fraction": 0.0}},
            source="t.yaml",
            default_name="t",
        )


def test_a_resumed_study_replays_its_proposals_and_runs_nothing_again(tmp_path):
    study = plan()
    first_log: list = []
    store = MapStore(tmp_path, kind="tuning study", result_file="tuning.csv")
    finished = store.open(study, resume=False, command="test")
    first = run_study(study, StoredRunner(toy_runner(first_log), store, finished))
    again_log: list = []
    store = MapStore(tmp_path, kind="tuning study", result_file="tuning.csv")
    finished = store.open(study, resume=True, command="test")
    again = run_study(study, StoredRunner(toy_runner(again_log), store, finished))
    assert first_log and not again_log
    assert [p.knobs for p in again.proposals] == [p.knobs for p in first.proposals]
    assert [p.values for p in again.proposals] == [p.values for p in first.proposals]
    with pytest.raises(SpecError, match="holds a different plan"):
        MapStore(tmp_path, kind="tuning study").open(plan(seed=2), resume=True, command="test")


def test_a_study_run_unstaged_is_the_staged_study():
    """On Ray a wave's adversary variants go to Tune at once (staged=False): the same outcomes,
    the same told values and so the same proposals as the staged ladder, in one runner call per
    wave, while the staged ladder stops a proposal's ladder at its first zero score."""
    calls = {"staged": [], "unstaged": []}

    def calling(log, name):
        run = toy_runner(log)

        def call(specs):
            calls[name].append(len(specs))
            return run(specs)

        return call

    staged_log: list = []
    unstaged_log: list = []
    staged = run_study(plan(), calling(staged_log, "staged"))
    unstaged = run_study(plan(), calling(unstaged_log, "unstaged"), staged=False)
    assert [
        (p.knobs, p.values, p.worst.breaker, p.worst.test_accuracy) for p in unstaged.proposals
    ] == [(p.knobs, p.values, p.worst.breaker, p.worst.test_accuracy) for p in staged.proposals]
    assert len(calls["unstaged"]) == 4  # 8 proposals, 2 per wave
    assert len(calls["staged"]) > len(calls["unstaged"])
    # some proposal broke (zero score) before the end of its ladder: staging saved its later runs
    assert any(p.values[1] == 0 for p in staged.proposals)
    assert len(staged_log) < len(unstaged_log)


def test_a_resume_may_grow_the_study_and_ends_as_a_fresh_study_of_that_size(tmp_path):
    """num_samples is the one key a resume may change: the seeded study replays from its first
    proposal, so 4 proposals resumed as 8 run only the new proposals' runs and give the study a
    fresh 8-proposal study gives."""
    small = plan(num_samples=4)
    store = MapStore(tmp_path, kind="tuning study", result_file="tuning.csv")
    first_log: list = []
    run_study(
        small,
        StoredRunner(toy_runner(first_log), store, store.open(small, resume=False, command="test")),
    )
    grown_log: list = []
    store = MapStore(tmp_path, kind="tuning study", result_file="tuning.csv")
    grown = run_study(
        plan(),
        StoredRunner(toy_runner(grown_log), store, store.open(plan(), resume=True, command="test")),
    )
    fresh_log: list = []
    fresh = run_study(plan(), toy_runner(fresh_log))
    assert [(p.knobs, p.values) for p in grown.proposals] == [
        (p.knobs, p.values) for p in fresh.proposals
    ]
    kept = {RunSpec.to_json(s) for s in first_log}
    assert grown_log and not kept & {RunSpec.to_json(s) for s in grown_log}
    assert len(first_log) + len(grown_log) == len({RunSpec.to_json(s) for s in fresh_log})
    with pytest.raises(SpecError, match=r"tuning.population"):
        MapStore(tmp_path, kind="tuning study").open(
            plan(population=6), resume=True, command="test"
        )


def test_dry_run_prints_the_run_bound_and_writes_nothing(tmp_path):
    from robusttune.commands.cli import app
    from robusttune.methods.attacks import ATTACKS

    space = tmp_path / "tune.yaml"
    import yaml

    space.write_text(yaml.safe_dump(SPACE))
    result = CliRunner().invoke(
        app,
        [
            "tune",
            str(space),
            "--dry-run",
            "--storage",
            str(tmp_path),
            "--cpus-per-trial",
            "0.5",
            "--max-concurrent",
            "3",
        ],
    )
    assert result.exit_code == 0, result.output
    ladders = len(ATTACKS["sign_flip"].strength_ladder) + len(ATTACKS["ipm"].strength_ladder)
    assert f"1 clean run and {ladders} attacked at k = 2 of 10" in result.output
    assert f"runs: at most {8 * (1 + ladders)} " in result.output  # 8 proposals, 1 seed
    assert "0.5 CPU" in result.output and "at most 3 at once" in result.output
    assert list(tmp_path.iterdir()) == [space]
    bad = CliRunner().invoke(app, ["tune", str(space), "--dry-run", "--cpus-per-trial", "-1"])
    assert bad.exit_code == 2 and "resources.cpu" in bad.output and "Traceback" not in bad.output


def test_tune_command_end_to_end_on_real_runs(tmp_path):
    from robusttune.commands.cli import app

    space = tmp_path / "tune.yaml"
    space.write_text(
        "run: {dataset: synthetic, model: mlp, clients: 5, participation: 1.0,\n"
        "      method: trimmed_mean, rounds: 2, local_epochs: 1, synthetic_samples: 200,\n"
        "      byzantine_fraction: 0.2}\n"
        "space: {trim_ratio: {uniform: [0.0, 0.45]}}\n"
        "tuning: {num_samples: 2, batch: 2, adversary: {attack: [sign_flip]}}\n"
    )
    result = CliRunner().invoke(app, ["tune", str(space), "--local", "--storage", str(tmp_path)])
    assert result.exit_code == 0, result.output
    folder = tmp_path / "tune"
    assert (folder / "tuning.md").exists() and (folder / "pareto.png").exists()
    assert "recommended:" in result.output and "Pareto front" in result.output
    import pandas as pd

    table = pd.read_csv(folder / "tuning.csv")
    assert len(table) == 2 and table["pareto"].any()
    assert all(math.isfinite(v) for v in table["clean_test"])
    # the same folder again without --resume is refused in one line
    again = CliRunner().invoke(app, ["tune", str(space), "--local", "--storage", str(tmp_path)])
    assert again.exit_code == 2 and "already holds a tuning study" in again.output
    # the report of the study's folder shows its front, the recommendation and the figure
    reported = CliRunner().invoke(app, ["report", str(folder)])
    assert reported.exit_code == 0, reported.output
    text = (folder / "report" / "report.md").read_text()
    assert "## Robust tuning: tune" in text and "![Pareto front](pareto.png)" in text
    assert (folder / "report" / "pareto.png").stat().st_size > 0
    shown = pd.read_csv(folder / "report" / "tuning_front.csv")
    on_front = [
        p
        for p, ok in zip(
            table["proposal"],
            pareto_front(list(zip(table["clean_validation"], table["worst_validation"]))),
        )
        if ok
    ]
    assert sorted(shown["proposal"]) == sorted(on_front)
    assert {"trim_ratio", "clean_validation", "worst_validation", "worst_attack"} <= set(shown)
    # the recommended knobs' test accuracy is that of their own runs, read from the run folders
    from robusttune.reports.results import load_runs

    best = table[table["recommended"]].iloc[0]
    runs = load_runs(folder)
    # the same knob read from two files: pandas before 3.1 reads a 17-digit float 1 ulp off
    same_knob = np.isclose(runs["trim_ratio"], best["trim_ratio"], rtol=1e-12, atol=0)
    clean_run = runs[(runs["byzantine_fraction"] == 0) & same_knob]
    assert len(clean_run) == 1
    assert (
        f"clean validation {best['clean_validation']:.3f}; test accuracy of the same runs: "
        f"worst case {best['worst_test']:.3f}, clean {clean_run['final_accuracy'].iloc[0]:.3f}"
        in text
    )


def test_the_front_and_recommendation_of_a_hand_made_table():
    import pandas as pd

    from robusttune.reports.tuning import front_table, recommended_line

    table = pd.DataFrame(
        {
            "proposal": [0, 1, 2, 3],
            "pareto": [True, True, False, True],
            "recommended": [False, True, False, False],
            "trim_ratio": [0.1, 0.3, 0.2, 0.05],
            "demoa_alpha": [0.5, 0.2, 0.1, 0.9],
            "clean_validation": [0.9, 0.8, 0.7, 0.95],
            "worst_validation": [0.3, 0.6, 0.2, 0.0],
            "worst_attack": [
                "attack=ipm attack_strength=10.0",
                "attack=minmax",
                "attack=ipm attack_strength=1.0",
                "attack=sign_flip",
            ],
            "clean_test": [0.88, 0.79, 0.7, 0.94],
            "worst_test": [0.31, 0.57, 0.2, 0.1],
            "worst_collapsed": [False, False, False, True],
        }
    )
    front = front_table(table)
    assert list(front["proposal"]) == [1, 0, 3]  # highest worst case first
    assert list(front.columns[:3]) == ["proposal", "trim_ratio", "demoa_alpha"]
    assert recommended_line(table) == (
        "**Recommended:** trim_ratio=0.3, demoa_alpha=0.2 (proposal 1): worst-case validation "
        "0.600 (by attack=minmax), clean validation 0.800; test accuracy of the same runs: worst "
        "case 0.570, clean 0.790."
    )
    with pytest.raises(SpecError, match="no recommended column"):
        recommended_line(table.drop(columns=["recommended"]))
    with pytest.raises(SpecError, match="2 rows are marked recommended"):
        recommended_line(table.assign(recommended=[True, True, False, False]))


def test_the_shipped_study_loads_and_never_tunes_the_attacker():
    from pathlib import Path

    from robusttune.experiments.tuning import load_tuning

    plan = load_tuning(Path(__file__).resolve().parents[1] / "search_spaces" / "tune_defence.yaml")
    assert plan.name == "tune_defence" and plan.byzantine == 4  # 20% of 20 clients
    assert set(plan.knobs) == {"trim_ratio", "demoa_alpha"}
    assert not {"attack", "attack_strength", "attack_scope"} & set(plan.knobs)
    assert plan.objectives == "clean_and_worst"
