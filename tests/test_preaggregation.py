"""NNM and ARC in front of any rule: hand cases, agreement with ByzFL 0.0.11's pre-aggregations,
the centre ARC clips around, the guarantee they report, the RunSpec key that deploys them, and
the round loop handing a rule-aware attack the deployed rule (extreme messages, order
invariance, dtypes and host syncs: the shared tests of every registered rule)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from robusttune.core.registry import SpecError
from robusttune.core.runspec import RunSpec
from robusttune.engine.simulation import Simulation, simulate
from robusttune.methods.aggregators import make_aggregator, make_rule


def t(rows) -> torch.Tensor:
    return torch.tensor(rows, dtype=torch.float64)


def test_nnm_hand_case_replaces_each_row_by_the_mean_of_its_n_minus_f_nearest():
    x = t([[0.0], [1.0], [3.0], [10.0]])
    nnm = make_aggregator("nnm", inner="mean")
    # n - f = 3 nearest, itself included: {0, 1, 3} for the first three rows, {10, 3, 1} for 10
    mixed = nnm.premap(x, 1, None)
    torch.testing.assert_close(mixed, t([[4 / 3], [4 / 3], [4 / 3], [14 / 3]]))
    assert nnm(x, f=1).item() == pytest.approx((3 * 4 / 3 + 14 / 3) / 4)
    assert make_rule("median", pre_aggregator="nnm")(x, f=1).item() == pytest.approx(4 / 3)


def test_arc_hand_case_clips_the_k_largest_to_the_next_norm():
    # n = 5, f = 1: k = floor(2 * (1/5) * 4) = 1, the norm 10 row is clipped to the next norm, 5
    x = t([[3.0, 4.0], [0.0, 1.0], [6.0, 8.0], [1.0, 0.0], [0.0, 2.0]])
    arc = make_aggregator("arc", inner="mean")
    out = arc.premap(x, 1, None)
    torch.testing.assert_close(out, t([[3.0, 4.0], [0.0, 1.0], [3.0, 4.0], [1.0, 0.0], [0.0, 2.0]]))
    assert torch.equal(arc.premap(x, 0, None), x)  # f = 0: k = 0, nothing clipped
    # around previous: the same clip of the rows' offsets from it
    centre = t([100.0, -50.0])
    torch.testing.assert_close(arc.premap(x + centre, 1, centre), out + centre)


@pytest.mark.parametrize(("n", "f", "seed"), [(10, 2, 0), (13, 4, 1), (7, 3, 2)])
def test_pre_aggregations_agree_with_byzfl(n, f, seed):
    from byzfl import ARC, NNM  # here, not at the top: importing ByzFL costs each collection 3 s

    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 17, generator=gen, dtype=torch.float64) * torch.linspace(0.5, 3, n)[:, None]
    nnm = make_aggregator("nnm").premap(x, f, None)
    np.testing.assert_allclose(nnm.numpy(), NNM(f=f)(x.numpy().copy()), rtol=1e-12, atol=1e-12)
    arc = make_aggregator("arc").premap(x, f, None)
    np.testing.assert_allclose(arc.numpy(), ARC(f=f)(x.numpy().copy()), rtol=1e-12, atol=1e-12)


def test_guarantee_is_the_inner_rules_within_two_f_below_n():
    assert make_rule("median", pre_aggregator="nnm").theoretical_breakdown(10) == pytest.approx(0.4)
    assert make_rule("krum", pre_aggregator="arc").theoretical_breakdown(10) == pytest.approx(0.3)
    assert make_rule("mean", pre_aggregator="nnm").theoretical_breakdown(10) == 0.0
    assert make_rule("fltrust", pre_aggregator="arc").theoretical_breakdown(10) is None
    nnm = make_rule("cclip", pre_aggregator="nnm")
    assert nnm.precondition(11, 5) and not nnm.precondition(10, 5)
    assert make_rule("fltrust", pre_aggregator="nnm").needs_reference


def test_pre_aggregator_key_builds_the_wrapper_and_bad_values_are_one_line():
    spec = RunSpec(aggregator="krum", pre_aggregator="nnm", bucket_size=2)
    rule = make_rule(spec.aggregator, **spec.aggregator_params())
    assert rule.name == "nnm" and rule.inner.name == "bucketing" and rule.inner.inner.name == "krum"
    with pytest.raises(SpecError) as err:
        RunSpec(pre_aggregator="clipping")
    assert "pre_aggregator" in str(err.value) and "\n" not in str(err.value)
    with pytest.raises(SpecError, match="inner 'nnm' is not allowed"):
        make_aggregator("arc", inner="nnm")


FAST = {
    "dataset": "synthetic",
    "model": "mlp",
    "clients": 8,
    "rounds": 3,
    "participation": 0.5,
    "local_epochs": 1,
    "synthetic_samples": 400,
}


def test_the_round_loop_hands_a_rule_aware_attack_the_deployed_rule_and_its_f():
    spec = RunSpec(
        **FAST,
        method="demoa",
        aggregator="median",
        attack="optimal_alie",
        byzantine_fraction=0.25,
        pre_aggregator="arc",
    )
    sim = Simulation(spec)
    seen = []
    craft = sim.attack.craft
    sim.attack.craft = lambda rnd: seen.append(rnd) or craft(rnd)
    while not seen and sim.rounds_done < spec.rounds:
        sim.step()
    assert seen, "no Byzantine client sampled in any round"
    rnd = seen[0]
    assert rnd.rule is sim.aggregator and rnd.rule.name == "arc"
    assert rnd.n_total == spec.clients  # the cache: all N rows are the rule's input
    assert rnd.rule_f == spec.assumed_f(spec.clients)


def test_the_mean_under_optimal_ipm_collapses():
    records = [
        r.to_dict()
        for r in simulate(
            RunSpec(**FAST, aggregator="mean", attack="optimal_ipm", byzantine_fraction=0.25)
        )
    ]
    assert records[-1]["collapsed"] or records[-1]["accuracy"] <= 0.15  # chance is 0.1
