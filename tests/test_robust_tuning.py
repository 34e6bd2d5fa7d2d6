"""Robust tuning (robusttune.tuning): each proposal scored by the shared worst case, the Pareto
front by brute force, attack strength never a knob, a resumed study re-running nothing, and the
`tune` command end to end on real runs."""

from __future__ import annotations

import math

import pytest
from typer.testing import CliRunner

from robusttune.adversary import Adversary
from robusttune.breakdown.store import MapStore, StoredRunner
from robusttune.config import RunSpec
from robusttune.records import RunSummary
from robusttune.registry import SpecError
from robusttune.tuning import pareto_front, parse_tuning, run_study

SPACE = {"run": {"dataset": "synthetic", "model": "mlp", "clients": 10, "participation": 1.0,
                 "method": "trimmed_mean", "rounds": 1, "byzantine_fraction": 0.2},
         "space": {"trim_ratio": {"uniform": [0.0, 0.45]}},
         "tuning": {"num_samples": 8, "batch": 2, "population": 4, "seed": 1,
                    "adversary": {"attack": ["sign_flip", "ipm"]}}}


def toy_accuracy(spec: RunSpec) -> tuple[float, bool]:
    """Trimming costs clean accuracy (0.9 - 0.4 r); a trim dropping fewer rows per side than the
    k Byzantine clients falls to sign_flip from strength 10 and to ipm from 1000."""
    k, dropped = spec.n_byzantine, int(spec.clients * spec.trim_ratio + 1e-9)
    breaks = k > dropped and ((spec.attack == "sign_flip" and spec.attack_strength >= 10)
                              or (spec.attack == "ipm" and spec.attack_strength >= 1000))
    weak = 0.05 * k * (spec.attack == "ipm")         # ipm's weak strengths dent accuracy a little
    return (0.1 if breaks else 0.9 - 0.4 * spec.trim_ratio - weak), breaks


def toy_runner(log: list):
    def run(specs):
        out = []
        for spec in specs:
            log.append(spec)
            accuracy, breaks = toy_accuracy(spec)
            out.append(RunSummary.from_dict({"final_validation_accuracy": accuracy,
                                             "final_accuracy": accuracy - 0.01, "collapsed": breaks,
                                             "spec": spec.to_dict()}))
        return out
    return run


def plan(**tuning):
    return parse_tuning({**SPACE, "tuning": {**SPACE["tuning"], **tuning}}, source="t.yaml",
                        default_name="t")


def test_each_proposal_is_scored_by_the_worst_case_of_the_shared_adversary():
    study = plan()
    result = run_study(study, toy_runner([]))
    assert len(result.proposals) == 8
    variants = Adversary.default(["sign_flip", "ipm"]).variants("none")
    for proposal in result.proposals:
        assert set(proposal.knobs) == {"trim_ratio"}       # strength is never a knob
        base = {**SPACE["run"], "attack": "none", **proposal.knobs}
        clean, _ = toy_accuracy(RunSpec.from_dict({**base, "byzantine_fraction": 0.0}))
        # independent worst case: every variant at k = 2 of 10, collapse counting as 0
        worst = min(0.0 if broke else acc for acc, broke in
                    (toy_accuracy(RunSpec.from_dict({**base, **v})) for v in variants))
        assert proposal.values == pytest.approx((clean, worst))
        assert proposal.worst.test_accuracy == pytest.approx(
            (0.1 if worst == 0 else worst) - 0.01)
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
    for key, domain in (("attack_strength", {"uniform": [0.5, 4.0]}), ("attack", {"choice": ["ipm"]})):
        with pytest.raises(SpecError, match=f"space.{key} is the adversary's"):
            parse_tuning({**SPACE, "space": {**SPACE["space"], key: domain}}, source="t.yaml",
                         default_name="t")
    with pytest.raises(SpecError, match="run.attack 'alie'"):
        parse_tuning({**SPACE, "run": {**SPACE["run"], "attack": "alie"}}, source="t.yaml",
                     default_name="t")
    with pytest.raises(SpecError, match="tuning.objectives"):
        plan(objectives="best")
    with pytest.raises(SpecError, match="no Byzantine client"):
        parse_tuning({**SPACE, "run": {**SPACE["run"], "byzantine_fraction": 0.0}},
                     source="t.yaml", default_name="t")


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


def test_tune_command_end_to_end_on_real_runs(tmp_path):
    from robusttune.cli import app

    space = tmp_path / "tune.yaml"
    space.write_text("run: {dataset: synthetic, model: mlp, clients: 5, participation: 1.0,\n"
                     "      method: trimmed_mean, rounds: 2, local_epochs: 1, synthetic_samples: 200,\n"
                     "      byzantine_fraction: 0.2}\n"
                     "space: {trim_ratio: {uniform: [0.0, 0.45]}}\n"
                     "tuning: {num_samples: 2, batch: 2, adversary: {attack: [sign_flip]}}\n")
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


def test_the_shipped_study_loads_and_never_tunes_the_attacker():
    from pathlib import Path

    from robusttune.tuning import load_tuning

    plan = load_tuning(Path(__file__).resolve().parents[1] / "search_spaces" / "tune_defence.yaml")
    assert plan.name == "tune_defence" and plan.byzantine == 4  # 20% of 20 clients
    assert set(plan.knobs) == {"trim_ratio", "demoa_alpha"}
    assert not {"attack", "attack_strength", "attack_scope"} & set(plan.knobs)
    assert plan.objectives == "clean_and_worst"
