"""Rule-aware attacks: MinMax and MinSum's constraint holds and is tight at the returned gamma
(checked with numpy's own distances), MinSum's gamma against its closed form, Fang et al.'s
intervals on a hand case and its Krum attack selected by Krum, and optimal ALIE / IPM against
ByzFL 0.0.11 on random inputs."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from robusttune.core.registry import SpecError
from robusttune.methods.aggregators import make_aggregator, make_rule
from robusttune.methods.attacks import ATTACKS, make_attack
from robusttune.methods.attacks.rule_aware import halving_search, line_maximise

RULE_AWARE = ("minmax", "minsum", "fang_trmean", "fang_krum", "optimal_alie", "optimal_ipm")


def honest_rows(h: int = 9, d: int = 12, seed: int = 0) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    return torch.randn(h, d, generator=gen, dtype=torch.float64) * 0.5 + 0.3


def direction(x: np.ndarray, name: str) -> np.ndarray:
    """The paper's deviations, written out with numpy (negated: m = mu + gamma p)."""
    mu = x.mean(axis=0)
    return {"std": -x.std(axis=0, ddof=1), "unit": -mu / np.linalg.norm(mu), "sign": -np.sign(mu)}[
        name
    ]


def minmax_ok(x: np.ndarray, m: np.ndarray) -> bool:
    pair = np.linalg.norm(x[:, None, :] - x[None, :, :], axis=-1).max()
    return np.linalg.norm(m - x, axis=1).max() <= pair * (1 + 1e-12)


def minsum_ok(x: np.ndarray, m: np.ndarray) -> bool:
    worst = (np.linalg.norm(x[:, None, :] - x[None, :, :], axis=-1) ** 2).sum(axis=1).max()
    return (np.linalg.norm(m - x, axis=1) ** 2).sum() <= worst * (1 + 1e-12)


@pytest.mark.parametrize(("name", "holds"), [("minmax", minmax_ok), ("minsum", minsum_ok)])
@pytest.mark.parametrize("how", ["std", "unit", "sign"])
@pytest.mark.parametrize("seed", [0, 1])
def test_distance_budget_holds_and_is_tight_at_the_returned_gamma(name, holds, how, seed):
    x = honest_rows(seed=seed)
    out = make_attack(name, attack_direction=how)(x, n_byzantine=3, n_total=12)
    assert torch.equal(out[0], out[1]) and torch.equal(out[0], out[2])
    xn, m = x.numpy(), out[0].numpy()
    mu, p = xn.mean(axis=0), direction(xn, how)
    gamma = float((m - mu) @ p / (p @ p))
    np.testing.assert_allclose(m, mu + gamma * p, rtol=1e-12, atol=1e-12)  # on the line mu + g p
    assert gamma > 0
    assert holds(xn, m)  # the constraint holds ...
    assert not holds(xn, mu + gamma * (1 + 1e-4) * p)  # ... and is tight


def test_minsum_gamma_matches_its_closed_form():
    x = honest_rows(h=7, d=30, seed=3)
    xn = x.numpy()
    mu, p = xn.mean(axis=0), direction(xn, "std")
    total = (np.linalg.norm(mu - xn, axis=1) ** 2).sum()
    worst = (np.linalg.norm(xn[:, None] - xn[None], axis=-1) ** 2).sum(axis=1).max()
    expected = np.sqrt((worst - total) / (len(xn) * (p @ p)))
    m = make_attack("minsum")(x, n_byzantine=1, n_total=8)[0].numpy()
    assert float((m - mu) @ p / (p @ p)) == pytest.approx(expected, rel=1e-5)


@pytest.mark.parametrize("limit", [3.7, 1e-6, 12345.0])
def test_halving_search_finds_the_largest_accepted_value_at_any_scale(limit):
    found = halving_search(lambda g: g <= limit)
    assert found <= limit and found == pytest.approx(limit, rel=1e-5)
    assert halving_search(lambda g: False) == 0.0


def test_fang_trmean_draws_just_beyond_the_extreme_opposite_the_change_direction():
    # mu = (3, 2, 0): coordinates 0 and 1 move up (s = +1) so the message goes below the
    # minimum; coordinate 2 has mu = 0, counted as s = +1 too.
    x = torch.tensor(
        [[1.0, 2.0, -1.0], [3.0, 0.0, -1.0], [2.0, 4.0, 1.0], [6.0, 2.0, 1.0]], dtype=torch.float64
    )
    flipped = torch.tensor(
        [[-1.0, -2.0, 1.0], [-3.0, 0.0, 1.0], [-2.0, -4.0, -1.0], [-6.0, -2.0, -1.0]],
        dtype=torch.float64,
    )  # mu = (-3, -2, 0)
    for b in (2.0, 3.0):
        attack = make_attack("fang_trmean", attack_strength=b)
        out = attack(x, n_byzantine=200, n_total=204, generator=torch.Generator().manual_seed(0))
        # min 1 > 0: U[1/b, 1]; min 0 <= 0: U[0, 0]; min -1 <= 0: U[-b, -1]
        for j, (low, high) in enumerate([(1 / b, 1.0), (0.0, 0.0), (-b, -1.0)]):
            assert bool((out[:, j] >= low).all() and (out[:, j] <= high).all()), (b, j)
        assert out[:, 0].std() > 0 and out[:, 2].std() > 0  # independent draws per client
        out = attack(
            flipped, n_byzantine=200, n_total=204, generator=torch.Generator().manual_seed(0)
        )
        # s = -1 on 0 and 1: above the maximum, max -1 <= 0: U[-1, -1/b]; max 0: U[0, 0];
        # coordinate 2 (mu = 0, s = +1): min -1: U[-b, -1]
        for j, (low, high) in enumerate([(-1.0, -1 / b), (0.0, 0.0), (-b, -1.0)]):
            assert bool((out[:, j] >= low).all() and (out[:, j] <= high).all()), (b, j)
    with pytest.raises(SpecError, match="attack_strength must be >= 1"):
        make_attack("fang_trmean", attack_strength=0.5)


@pytest.mark.parametrize(("h", "c", "d", "seed"), [(8, 2, 20, 0), (15, 4, 50, 1), (7, 1, 5, 2)])
def test_fang_krum_message_is_selected_by_krum_and_barely(h, c, d, seed):
    x = honest_rows(h=h, d=d, seed=seed)
    f = c
    out = make_attack("fang_krum")(x, n_byzantine=c, n_total=h + c, rule_f=f)
    m = out[0]
    assert torch.equal(out, m.expand(c, d)) and bool((m != 0).any())
    krum = make_aggregator("krum", f=f)
    assert torch.equal(krum(torch.cat([x, out]), f=f), m)  # Krum selects it
    farther = torch.cat([x, 1.01 * out])
    assert any(torch.equal(krum(farther, f=f), row) for row in x)  # 1% farther it is rejected
    # the search starts at Fang et al.'s bound (computed here with numpy) and, when the bound is
    # selected, bisects up to twice it
    xn = x.numpy()
    dist = np.linalg.norm(xn[:, None] - xn[None], axis=-1)
    np.fill_diagonal(dist, np.inf)
    k = max(h + c - c - 2, 1)
    first = np.sort(dist, axis=1)[:, : min(k, h - 1)].sum(axis=1).min() / ((h - c - 1) * np.sqrt(d))
    bound = first + np.linalg.norm(xn, axis=1).max() / np.sqrt(d)
    lam = float(m.abs().max())
    assert 0 < lam <= 2 * bound * (1 + 1e-12)


# -- optimal ALIE and IPM: ByzFL 0.0.11 as the reference ---------------------------------------

# ByzFL is imported where it is used, not at the top: the import costs each collection 3 s
BYZFL = {
    "optimal_alie": "Optimal_ALittleIsEnough",
    "optimal_ipm": "Optimal_InnerProductManipulation",
}


def byzfl_cases(f: int):
    """(our rule, the f we tell it, ByzFL's aggregator, ByzFL's pre-aggregations). ByzFL's Krum
    scores a row over its n - f - 1 nearest others where Blanchard et al. (and ours) take
    n - f - 2, so ours is told f - 1 to compute the same rule."""
    from byzfl import ARC, NNM, Average, Median, TrMean
    from byzfl import Krum as ByzFLKrum

    return [
        (make_rule("mean"), f, Average(), []),
        (make_rule("median"), f, Median(), []),
        (make_rule("trimmed_mean"), f, TrMean(f=f), []),
        (make_rule("krum"), f - 1, ByzFLKrum(f=f), []),
        (make_rule("median", pre_aggregator="nnm"), f, Median(), [NNM(f=f)]),
        (make_rule("trimmed_mean", pre_aggregator="arc"), f, TrMean(f=f), [ARC(f=f)]),
    ]


def attack_line(name: str, honest: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(origin, direction) of an optimal attack's messages, origin + tau direction: optimal IPM
    sends -tau mu, optimal ALIE mu + tau sigma (mu, sigma the honest mean and unbiased std)."""
    mu, sigma = honest.mean(axis=0), honest.std(axis=0, ddof=1)
    return (np.zeros_like(mu), -mu) if name == "optimal_ipm" else (mu, sigma)


@pytest.mark.parametrize("name", sorted(BYZFL))
@pytest.mark.parametrize("seed", [0, 1])
def test_optimal_attacks_agree_with_byzfl(name, seed):
    # Our message is ByzFL's, or, where the objective is flat between the two (ARC clips every
    # copy to one norm, Krum keeps an honest row), one ByzFL itself scores as harmful to the last
    # bits: on such a plateau ByzFL's search follows last-bit noise, so its tau moves with the
    # machine's BLAS (seen: 13.36 on an AVX-512 EPYC, 10 on an AVX2 one, against ARC + trimmed
    # mean), and only the objective's value is a property of the attack (issue 21).
    import byzfl

    h, f, d = 9, 3, 15
    x = honest_rows(h=h, d=d, seed=10 + seed)
    origin, direction = attack_line(name, x.numpy().astype(np.float64))
    same_message = 0
    for rule, rule_f, agg, pre in byzfl_cases(f):
        ours = make_attack(name)(x, n_byzantine=f, n_total=h + f, rule=rule, rule_f=rule_f)[
            0
        ].numpy()
        reference = getattr(byzfl, BYZFL[name])(agg=agg, pre_agg_list=pre, f=f)
        theirs = np.asarray(reference(x.numpy().copy()))
        tau, their_tau = (
            float((m - origin) @ direction / (direction @ direction)) for m in (ours, theirs)
        )
        np.testing.assert_allclose(
            ours,
            origin + tau * direction,
            rtol=1e-5,
            atol=1e-6,
            err_msg=f"{name} against {rule!r}: not on the attack's line",
        )
        if np.allclose(ours, theirs, rtol=1e-9, atol=1e-12):
            same_message += 1
            continue
        # ByzFL's own objective, ||agg(pre(X, f x m)) - mean(X)||, at our tau and at its own
        objective = [
            reference._evaluate(x.numpy().copy(), x.numpy().mean(axis=0), t)
            for t in (tau, their_tau)
        ]
        assert objective[0] == pytest.approx(objective[1], rel=1e-6), (
            f"{name} against {rule!r}: tau {tau:.6g} scores {objective[0]:.9g}, ByzFL's "
            f"{objective[1]:.9g}"
        )
    # the mean, median and trimmed mean have no plateau: there the messages are ByzFL's
    assert same_message >= 3


def test_line_maximise_follows_the_expansion_and_contraction_schedule():
    # a peak at 37: expansion tries 10, 30 (better, delta 20 -> 40), 70 (worse: delta 32),
    # then contraction tries 30 + 32 (worse, delta 25.6), 30 + 25.6 ...: every try is recorded
    tried = []

    def peak(t):
        return -abs(t - 37.0)

    def objective(t):
        tried.append(t)
        return peak(t)

    best = line_maximise(objective)
    assert len(tried) == 20 and tried[:4] == [0.0, 10.0, 30.0, 70.0]
    assert tried[4] == pytest.approx(62.0)
    # contraction steps only to the right of the best, as ByzFL's does: from 30 the deltas
    # 32, 25.6, 20.48, 16.384 overshoot the peak by more than 7, and 30 + 13.1072 is the first
    # closer one; no later step from 43.1072 comes closer still
    assert best == max(tried, key=peak) == pytest.approx(43.1072)


def test_optimal_ipm_against_the_mean_grows_without_bound_and_against_the_median_stays():
    x = honest_rows(seed=5)
    mean_out = make_attack("optimal_ipm")(x, n_byzantine=2, n_total=11, rule=make_rule("mean"))
    # the mean's error grows with tau: the search expands all 20 evaluations, tau = 10 (2^19 - 1)
    tau = float(-(mean_out[0] @ x.mean(0)) / (x.mean(0) @ x.mean(0)))
    assert tau == pytest.approx(10 * (2**19 - 1))
    median_out = make_attack("optimal_ipm")(
        x, n_byzantine=2, n_total=11, rule=make_rule("median"), rule_f=2
    )
    assert float(median_out.norm()) < float(mean_out.norm()) / 1e4


def test_every_attack_declares_whether_it_is_in_the_default_worst_case():
    default = {name for name in ATTACKS if ATTACKS[name].default_adversary}
    assert default == {"sign_flip", "ipm", *RULE_AWARE}
    assert all(isinstance(ATTACKS[name].default_adversary, bool) for name in ATTACKS)
    assert all(ATTACKS[name].strength_ladder == () for name in RULE_AWARE)


@pytest.mark.parametrize(
    ("name", "strength"),
    [
        ("ipm", -1.0),
        ("sign_flip", -2.0),
        ("ipm_swbdm", -0.5),
        ("strategic_skip", -10.0),
        ("gaussian", -1.0),
    ],
)
def test_a_strength_that_helps_the_honest_clients_is_a_one_line_error(name, strength):
    with pytest.raises(SpecError) as err:
        make_attack(name, attack_strength=strength)
    message = str(err.value)
    assert "attack_strength" in message and name in message and "\n" not in message
    assert make_attack(name, attack_strength=0.0).strength == 0.0


def test_bad_direction_is_a_one_line_error():
    with pytest.raises(SpecError, match="attack_direction must be one of std, unit, sign"):
        make_attack("minmax", attack_direction="up")


def test_optimal_attacks_need_the_rule():
    with pytest.raises(ValueError, match="rule="):
        make_attack("optimal_alie")(honest_rows(), n_byzantine=1, n_total=10)


def test_run_command_refuses_ipm_with_a_negative_strength_in_one_line(tmp_path):
    from typer.testing import CliRunner

    from robusttune.commands.cli import app

    out = tmp_path / "helper"
    result = CliRunner().invoke(
        app,
        [
            "run",
            "--set",
            "attack=ipm",
            "--set",
            "attack_strength=-1",
            "--set",
            "byzantine_fraction=0.2",
            "--out",
            str(out),
        ],
    )
    assert result.exit_code == 2
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert len(lines) == 1 and "attack_strength must be >= 0" in lines[0]
    assert not out.exists()  # no half-written run folder


@pytest.mark.parametrize("name", ["optimal_alie", "optimal_ipm"])
def test_optimal_attacks_search_against_fltrust_as_the_round_calls_it(name):
    """FLTrust scores rows against the server's own update, so the rule handed to a line-searched
    attack carries this round's server message (before, every such run raised "fltrust needs the
    server's own message"); the attacked run completes and its messages differ from honest ones."""
    from robusttune.core.runspec import RunSpec
    from robusttune.engine.simulation import Simulation

    spec = RunSpec.from_dict(
        {
            "dataset": "synthetic",
            "clients": 10,
            "rounds": 2,
            "participation": 1.0,
            "method": "fltrust",
            "attack": name,
            "byzantine_fraction": 0.2,
            "local_epochs": 1,
            "checkpoint_every": 0,
            "synthetic_samples": 300,
        }
    )
    records = list(Simulation(spec))
    assert len(records) == 2 and all(r.byzantine_sampled == 2 for r in records)
    assert all(np.isfinite(r.aggregation_error) for r in records)


# -- the line search's objective with the honest rows' work done once (Aggregator.with_fixed_rows)
@pytest.mark.parametrize(
    ("rotation", "chunk", "d"),
    [("haar", 64, 1_000), ("shared", 512, 5_000), ("hadamard", 128, 3_001)],
)
def test_swb_with_fixed_rows_is_the_rule_on_the_appended_rows(rotation, chunk, d):
    """SWB keeps the honest rows rotated between the line search's calls; the result is the rule
    on cat[honest, copies x message] with a fresh generator seeded 0. The appended row is rotated
    alone, where one GEMM row can differ from the batched one in its last bit, so the two agree
    to float32 rounding of that row, not bit for bit; a message of infinities is kept out as
    before."""
    from robusttune.methods.aggregators.appended import appended_rows

    rule = make_aggregator("swb", trim_ratio=0.25, swb_chunk=chunk, swb_rotation=rotation)
    honest = honest_rows(h=16, d=d, seed=4).float()  # a run's messages
    fast, plain = rule.with_fixed_rows(honest, f=4), appended_rows(rule, honest, f=4)
    mu, sigma = honest.mean(0), honest.std(0)
    for copies in (4, 6):  # another n: its own block plan and trim count
        for tau in (0.0, 0.7, 5.0, 1e30):
            message = mu + tau * sigma
            # the appended row's rotation errs by its rounding, which scales with its size
            torch.testing.assert_close(
                fast(message, copies),
                plain(message, copies),
                rtol=1e-5,
                atol=1e-6 * max(1.0, float(message.abs().max())),
            )
        nonfinite = torch.full((d,), float("inf"))
        assert (
            torch.isfinite(fast(nonfinite, copies)).all()
            == torch.isfinite(plain(nonfinite, copies)).all()
        )


def test_swb_beyond_its_memory_bound_takes_the_plain_call(monkeypatch):
    import robusttune.methods.aggregators.swb as swb_module
    from robusttune.methods.aggregators.appended import appended_rows

    monkeypatch.setattr(swb_module, "FIXED_ROWS_ELEMENTS", 100)
    rule = make_aggregator("swb", trim_ratio=0.25, swb_chunk=64, swb_rotation="shared")
    honest = honest_rows(h=16, d=500, seed=6).float()
    message = honest.mean(0) + 2.0 * honest.std(0)
    assert torch.equal(
        rule.with_fixed_rows(honest, f=4)(message, 4), appended_rows(rule, honest, f=4)(message, 4)
    )


@pytest.mark.parametrize("name", ["optimal_alie", "optimal_ipm"])
def test_optimal_attacks_on_swb_choose_as_with_the_plain_rule(name):
    """The deployed SWB takes its fixed-rows path; the same rule handed over as a plain callable
    (no shortcut) gives the same line search: the messages agree to float32 rounding."""
    rule = make_aggregator("swb", trim_ratio=0.25, swb_chunk=128, swb_rotation="shared")
    x = honest_rows(h=16, d=2_000, seed=8).float()
    fast = make_attack(name)(x, n_byzantine=4, n_total=20, rule=rule, rule_f=4)
    # the rule behind a plain function: the attack cannot see it is SWB, so takes no shortcut
    plain = make_attack(name)(
        x,
        n_byzantine=4,
        n_total=20,
        rule_f=4,
        rule=lambda rows, **context: rule(rows, **context),  # noqa: PLW0108
    )
    torch.testing.assert_close(fast, plain, rtol=1e-5, atol=1e-6)
