"""The shared worst case (robusttune.methods.adversary) and calibrate's trim sweep against it: the
variants an adversary runs, the mean never recommended where a ladder attack breaks it, and
calibrate's answer agreeing with a breakdown map of the same rule and setting."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from robusttune.core.records import RunSummary
from robusttune.core.registry import SpecError
from robusttune.experiments.breakdown import Cell, Outcome, bisect_breakdown, spec_evaluator
from robusttune.experiments.calibration import trim_sweep
from robusttune.methods.adversary import Adversary, default_attacks, worst_of
from robusttune.methods.attacks import ATTACKS

BASE = {
    "dataset": "synthetic",
    "model": "mlp",
    "clients": 10,
    "participation": 1.0,
    "method": "trimmed_mean",
    "rounds": 1,
    "attack": "none",
}


def test_default_attacks_are_those_marked_and_run_over_their_ladders():
    marked = {name for name in ATTACKS.names() if ATTACKS[name].default_adversary}
    assert {"sign_flip", "ipm"} <= marked and "bit_flip" not in marked  # bit_flip = sign_flip
    assert set(default_attacks()) == marked
    variants = Adversary.default(["sign_flip", "ipm"]).variants("alie")
    expected = [
        {"attack": "sign_flip", "attack_strength": s} for s in ATTACKS["sign_flip"].strength_ladder
    ] + [{"attack": "ipm", "attack_strength": s} for s in ATTACKS["ipm"].strength_ladder]
    assert variants == expected
    # without settings: the cell's own attack over its ladder; a fixed strength narrows it
    assert Adversary().variants("alie") == [{"attack_strength": s} for s in (1.0, 2.0, 4.0, 8.0)]
    assert Adversary.of({"attack_strength": [3.0]}).variants("alie") == [{"attack_strength": 3.0}]
    # one adaptive search per attack whose ladder spans a range
    threat = Adversary.default(["sign_flip", "ipm", "label_flip"], adaptive=2)
    assert [group for group, _ in threat.searches("none")] == [
        {"attack": "sign_flip"},
        {"attack": "ipm"},
    ]
    assert threat.runs_per_point("none") == 4 + 4 + 1 + 2 * 2


def test_bad_adversary_is_one_line():
    with pytest.raises(SpecError, match=r"adversary attack must be one of .*got 'nope'"):
        Adversary.default(["nope"])
    with pytest.raises(SpecError, match="attack_strength"):
        Adversary.of({"attack_strength": [1.0]}, adaptive=2)


def test_worst_is_the_first_lowest_score_with_collapse_as_zero():
    outcomes = [Outcome(0.5), Outcome(0.9, collapsed=True), Outcome(0.0), Outcome(0.3)]
    assert worst_of(outcomes) == 1


def toy_runner(calls: list):
    """A world where a trimmed mean dropping t = floor(N r) rows per side survives k Byzantine
    clients when k <= t; beyond it, sign_flip breaks it from strength 10 on and ipm from 1000,
    while the weak strengths (sign_flip 1 and 3, ipm 0.1 to 10) leave it near clean: the mild
    fixed attacker the old calibrate used would have recommended the mean."""

    def run(specs):
        calls.append(len(specs))
        out = []
        for s in specs:
            k, t = s.n_byzantine, int(s.clients * s.trim_ratio + 1e-9)
            breaks = k > t and (
                (s.attack == "sign_flip" and s.attack_strength >= 10)
                or (s.attack == "ipm" and s.attack_strength >= 1000)
            )
            accuracy = 0.1 if breaks else 0.9 - 0.2 * s.trim_ratio - 0.01 * k
            # selection reads validation; the test part reads 0.02 lower here, to tell them apart
            out.append(
                RunSummary.from_dict(
                    {
                        "final_validation_accuracy": accuracy,
                        "final_accuracy": accuracy - 0.02,
                        "collapsed": breaks,
                        "spec": s.to_dict(),
                    }
                )
            )
        return out

    return run


@pytest.mark.parametrize("beta", [0.1, 0.2, 0.3])
def test_the_mean_is_never_recommended_where_a_ladder_attack_breaks_it(beta):
    trims = [0.0, 0.1, 0.2, 0.3, 0.4]
    sweep = trim_sweep(
        BASE,
        trims,
        [beta, round(beta + 0.1, 10)],
        toy_runner([]),
        adversary=Adversary.default(["sign_flip", "ipm"]),
    )
    assert sweep.recommended is not None and sweep.recommended > 0
    # the smallest r with floor(10 r) >= k at beta + margin (k = 10 (beta + 0.1))
    assert sweep.recommended == pytest.approx(beta + 0.1)
    for row in sweep.rows:  # survival read validation; the test figure is reported beside it
        assert row["test_accuracy"] == pytest.approx(row["accuracy"] - 0.02)
    broken = [row for row in sweep.rows if row["trim_ratio"] == 0.0]
    assert all(
        not row["survived"] and row["attack"].startswith("attack=sign_flip") for row in broken
    )
    # narrowed to the weak strength only, the same sweep would have kept the mean: the worst
    # case, not the one mild attacker, is what rules it out
    mild = trim_sweep(
        BASE,
        trims,
        [beta, round(beta + 0.1, 10)],
        toy_runner([]),
        adversary=Adversary.of({"attack": ["sign_flip"], "attack_strength": [1.0]}),
    )
    assert mild.recommended == 0.0


def test_no_surviving_trim_is_one_line_naming_the_analytic_bound():
    from robusttune.experiments.calibration import no_survivor_line
    from robusttune.problem.byzantine_law import Deployment, analyze

    sweep = trim_sweep(
        BASE, [0.0, 0.1], [0.3, 0.4], toy_runner([]), adversary=Adversary.default(["sign_flip"])
    )
    assert sweep.recommended is None
    figures = analyze(Deployment(clients=10, participation=1.0, byzantine_fraction=0.3, rounds=1))
    line = no_survivor_line(figures, [0.0, 0.1])
    assert "\n" not in line and "r >= 0.3 over the sample" in line


def test_calibrate_agrees_with_a_breakdown_map_of_the_same_rule_and_setting():
    """Calibrate's per-(trim, k) verdicts are a map's: a trim survives k Byzantine clients in
    calibrate iff the map's breakdown point of the cell {trim_ratio: r} is >= k."""
    trims, fractions = [0.0, 0.1, 0.2, 0.3, 0.4], [0.2, 0.3]
    threat = Adversary.default(["sign_flip", "ipm"])
    sweep = trim_sweep(BASE, trims, fractions, toy_runner([]), adversary=threat)
    evaluate = spec_evaluator(BASE, toy_runner([]), adversary=threat, survival=(None, 0.5))
    result = bisect_breakdown(
        [Cell.of(10, trim_ratio=r) for r in trims],
        evaluate,
        max_fraction=0.5,
        relative_threshold=0.5,
    )
    breakdown = {cell.cell["trim_ratio"]: cell.breakdown for cell in result.cells}
    for row in sweep.rows:
        assert row["survived"] == (breakdown[row["trim_ratio"]] >= row["byzantine_clients"]), row
    from_map = min(r for r in trims if breakdown[r] >= 3)  # k at beta + margin = 3
    assert sweep.recommended == from_map


def test_cli_calibrate_agrees_with_the_breakdown_command_on_real_runs(tmp_path):
    """Real runs (synthetic, N = 6): `calibrate --attack sign_flip --seed 42` and `breakdown` of
    the cells trim_ratio in {0, 1/3} under adversary {attack: [sign_flip]} (its one seed, 42)
    give the same verdicts."""
    from robusttune.commands.cli import app

    runner = CliRunner()
    setting = ["--set", "synthetic_samples=240", "--set", "local_epochs=1", "--set", "model=mlp"]
    result = runner.invoke(
        app,
        [
            "calibrate",
            "--clients",
            "6",
            "--participation",
            "1.0",
            "--byzantine",
            "0.17",
            "--rounds",
            "2",
            "--dataset",
            "synthetic",
            "--attack",
            "sign_flip",
            "--trim",
            "0.0",
            "--trim",
            "0.34",
            "--margin",
            "0.0",
            "--local",
            "--json",
            "--out",
            str(tmp_path / "c"),
            "--seed",
            "42",
            *setting,
        ],
    )
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    verdicts = {row["trim_ratio"]: row["survived"] for row in data["sweep"]["rows"]}
    space = tmp_path / "map.yaml"
    space.write_text(
        "run: {dataset: synthetic, model: mlp, clients: 6, participation: 1.0,\n"
        "      method: trimmed_mean, rounds: 2, local_epochs: 1, synthetic_samples: 240}\n"
        "space: {trim_ratio: {grid: [0.0, 0.34]}}\n"
        "breakdown: {adversary: {attack: [sign_flip]}, verify_radius: 0,\n"
        "            max_fraction: 0.17}\n"
    )
    result = runner.invoke(app, ["breakdown", str(space), "--local", "--out", str(tmp_path / "m")])
    assert result.exit_code == 0, result.output
    import pandas as pd

    table = pd.read_csv(tmp_path / "m" / "breakdown.csv")
    for _, row in table.iterrows():
        assert verdicts[float(row["trim_ratio"])] == (row["breakdown_byzantine"] >= 1), (
            row.to_dict()
        )
    # the mean falls to one sign-flipping client at strength 10 and beyond
    assert verdicts[0.0] is False
    assert data["recommended_trim_ratio"] == (0.34 if verdicts[0.34] else None)


@pytest.mark.parametrize("validation_fraction", [0.5, 0.0])
def test_collapse_is_judged_on_validation_accuracy_where_there_is_a_validation_part(
    validation_fraction,
):
    # collapse decides survival in every selection, so it must not read the test part; a run
    # without a validation part has only its test accuracy to be judged on
    from robusttune.core.runspec import RunSpec
    from robusttune.engine.simulation import Simulation

    simulation = Simulation(
        RunSpec.from_dict(
            {
                "dataset": "synthetic",
                "model": "mlp",
                "clients": 4,
                "synthetic_samples": 200,
                "synthetic_shape": "8",
                "rounds": 1,
                "checkpoint_every": 0,
                "device": "cpu",
                "validation_fraction": validation_fraction,
            }
        )
    )
    list(simulation)
    chance = 1.0 / simulation.num_classes
    verdicts = {}
    for test, validation in ((chance, 0.9), (0.9, chance)):
        simulation.last_accuracy, simulation.last_validation_accuracy = test, validation
        verdicts[(test, validation)] = simulation.summary(0.0).collapsed
    if validation_fraction:
        assert verdicts == {(chance, 0.9): False, (0.9, chance): True}
    else:
        assert verdicts == {(chance, 0.9): True, (0.9, chance): False}
