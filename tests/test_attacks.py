"""Attacks: one hand-computed case per attack (numbers a reader can check on paper) plus shared
properties of every registry entry (shape, dtype, device, n_byzantine = 0, h = 0)."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy.stats import norm

from robusttune.core.registry import SpecError
from robusttune.methods.aggregators import make_rule
from robusttune.methods.attacks import ATTACKS, alie_z, alie_z_swbdm, make_attack

ALL = ATTACKS.names()
DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])

# A small hand case: 4 honest clients, 3 coordinates.
X = np.array([[1.0, 2.0, -1.0], [3.0, 0.0, -1.0], [2.0, 4.0, 1.0], [6.0, 2.0, 1.0]])


def honest64() -> torch.Tensor:
    return torch.tensor(X, dtype=torch.float64)


def call(name: str, honest: torch.Tensor, n_byzantine: int, n_total: int, **ctx):
    """The attack with its context; a rule-aware one is handed the median (told f = 1) unless the
    case names a rule, as the round loop hands it the deployed rule."""
    if ATTACKS[name].needs_rule:
        ctx = {"rule": make_rule("median"), "rule_f": 1, **ctx}
    return make_attack(name)(honest, n_byzantine=n_byzantine, n_total=n_total, **ctx)


def context_for(name: str, honest: torch.Tensor, n_byzantine: int, seed: int = 0) -> dict:
    """Everything a round loop could pass: own, a cache with its Byzantine mask, a generator."""
    gen = torch.Generator().manual_seed(seed)
    d = honest.shape[1]
    own = torch.randn(n_byzantine, d, generator=gen, dtype=torch.float64).to(honest)
    cache = torch.cat(
        [honest, own, torch.randn(3, d, generator=gen, dtype=torch.float64).to(honest)]
    )
    mask = torch.zeros(cache.shape[0], dtype=torch.bool, device=honest.device)
    mask[honest.shape[0] : honest.shape[0] + n_byzantine] = True
    return {
        "own": own,
        "cache": cache,
        "cache_byzantine": mask,
        "generator": torch.Generator(device=honest.device).manual_seed(seed),
    }


# --- ALIE ---------------------------------------------------------------------------------------


def test_alie_z_for_25_clients_5_byzantine_is_0_2533():
    # Baruch et al.: s = floor(25/2 + 1) - 5 = 8, z = Phi^-1((25 - 5 - 8) / 20) = Phi^-1(0.6)
    assert round(alie_z(25, 5), 4) == 0.2533
    assert alie_z(25, 5) == pytest.approx(norm.ppf(0.6), abs=1e-12)


def test_alie_quantiles_keep_scipy_stats_bits_for_every_small_n_and_f():
    # the attacks call scipy.special.ndtri (0.5 s less to import in every Ray worker than
    # scipy.stats); the recorded golden runs used norm.ppf: the same bits for every (n, f) a
    # map of up to 120 aggregator inputs can ask for
    for n in range(1, 121):
        for f in range(n + 1):
            honest, s = n - f, math.floor(n / 2 + 1) - f
            cdf = (honest - s) / honest if honest > 0 else 1.0
            assert alie_z(n, f) == float(norm.ppf(min(max(cdf, 1 / (2 * n)), 1 - 1 / (2 * n))))
            swb = min(max((n / 2 - f) / max(n - f, 1), 1e-3), 1 - 1e-3)
            assert alie_z_swbdm(n, f) == float(norm.ppf(swb))


def test_alie_vector_matches_numpy_hand_case():
    # n = 7, f = 3: s = floor(4.5) - 3 = 1, z = Phi^-1((7 - 3 - 1) / 4) = Phi^-1(0.75) = 0.6745
    mu, sigma = X.mean(axis=0), X.std(axis=0, ddof=1)  # unbiased std, as torch.std / epfml
    z = norm.ppf(0.75)
    for strength in (1.0, 2.5):
        out = make_attack("alie", attack_strength=strength)(honest64(), n_byzantine=3, n_total=7)
        assert out.shape == (3, 3)
        np.testing.assert_allclose(
            out.numpy(), np.tile(mu - strength * z * sigma, (3, 1)), rtol=1e-12
        )


def test_alie_uses_f_context_over_n_byzantine():
    # f = 2 with n = 7: s = 2, z = Phi^-1(3/5); the number of rows is still n_byzantine
    out = call("alie", honest64(), n_byzantine=3, n_total=7, f=2)
    expected = X.mean(axis=0) - norm.ppf(0.6) * X.std(axis=0, ddof=1)
    np.testing.assert_allclose(out.numpy(), np.tile(expected, (3, 1)), rtol=1e-12)


def test_alie_z_unchanged_where_finite_and_clamped_elsewhere():
    for n in range(3, 80):
        for f in range(n + 1):
            s = math.floor(n / 2 + 1) - f
            if n - f > 0 and 0 < (n - f - s) / (n - f) < 1:
                assert alie_z(n, f) == pytest.approx(norm.ppf((n - f - s) / (n - f)), abs=1e-12)
            else:  # Byzantine majority: the most extreme quantile n samples resolve
                assert alie_z(n, f) == pytest.approx(norm.ppf(1 - 1 / (2 * n)), abs=1e-12)
    assert (
        math.isfinite(alie_z(1, 0)) and math.isfinite(alie_z(2, 1)) and math.isfinite(alie_z(2, 2))
    )


# --- IPM, sign flip, bit flip, Gaussian ----------------------------------------------------------


def test_ipm_is_minus_eps_mu_and_zero_at_strength_zero():
    out = call("ipm", honest64(), n_byzantine=2, n_total=6)  # default eps = 0.1
    np.testing.assert_allclose(out.numpy(), np.tile(-0.1 * X.mean(axis=0), (2, 1)), rtol=1e-12)
    out = make_attack("ipm", attack_strength=0.5)(honest64(), n_byzantine=2, n_total=6)
    np.testing.assert_allclose(out.numpy(), np.tile(-0.5 * X.mean(axis=0), (2, 1)), rtol=1e-12)
    zero = make_attack("ipm", attack_strength=0)(honest64(), n_byzantine=2, n_total=6)
    assert torch.count_nonzero(zero) == 0


@pytest.mark.parametrize("name", ["sign_flip", "bit_flip"])
def test_sign_flip_negates_own_update(name):
    own = torch.tensor([[1.0, -2.0, 0.5], [0.0, 3.0, -4.0]], dtype=torch.float64)
    out = call(name, honest64(), n_byzantine=2, n_total=6, own=own)
    assert torch.equal(out, -own)
    out = make_attack(name, attack_strength=3.0)(honest64(), n_byzantine=2, n_total=6, own=own)
    assert torch.equal(out, -3.0 * own)
    # without own: the negated honest mean, the same for every Byzantine client
    out = make_attack(name, attack_strength=2.0)(honest64(), n_byzantine=2, n_total=6)
    np.testing.assert_allclose(out.numpy(), np.tile(-2.0 * X.mean(axis=0), (2, 1)), rtol=1e-12)


def test_gaussian_noise_statistics_and_reproducibility():
    d, s = 40_000, 0.7
    gen = torch.Generator().manual_seed(1)
    honest = torch.randn(5, d, generator=gen, dtype=torch.float64) + 0.3
    own = torch.randn(2, d, generator=gen, dtype=torch.float64)
    atk = make_attack("gaussian", attack_strength=s)

    def run(seed: int) -> torch.Tensor:
        return atk(
            honest, n_byzantine=2, n_total=7, own=own, generator=torch.Generator().manual_seed(seed)
        )

    out = run(5)
    noise = (out - own).numpy()
    rms = float(np.sqrt(np.mean(honest.numpy().mean(axis=0) ** 2)))
    assert abs(noise.mean()) < 4 * s * rms / math.sqrt(noise.size)
    assert noise.std() == pytest.approx(s * rms, rel=0.02)
    assert abs(np.corrcoef(noise[0], noise[1])[0, 1]) < 0.03  # independent per client
    assert torch.equal(run(5), out)  # same seed, same output
    assert not torch.equal(run(6), out)


def test_gaussian_without_own_adds_noise_to_the_honest_mean_and_strength_zero_is_honest():
    own = torch.tensor([[1.0, 2.0, 3.0]], dtype=torch.float64)
    zero = make_attack("gaussian", attack_strength=0)
    assert torch.equal(zero(honest64(), n_byzantine=1, n_total=5, own=own), own)
    out = zero(honest64(), n_byzantine=2, n_total=6)
    np.testing.assert_allclose(out.numpy(), np.tile(X.mean(axis=0), (2, 1)), rtol=1e-12)
    with pytest.raises(SpecError, match="attack_strength"):
        make_attack("gaussian", attack_strength=-1.0)


# --- data side, adaptive, mimic ------------------------------------------------------------------

# --- the SWB-DM study's variants ------------------------------------------------------------------


def test_alie_swbdm_z_and_vector_match_the_study_formula():
    """z = Phi^-1(clamp((n/2 - f)/(n - f), 1e-3, 1 - 1e-3)) with the population std: at
    n = 10, f = 2 it is Phi^-1(3/8) = -0.319 where Baruch's z is 0."""
    assert round(alie_z_swbdm(10, 2), 3) == -0.319 and alie_z(10, 2) == pytest.approx(
        0.0, abs=1e-12
    )
    assert alie_z_swbdm(4, 2) == pytest.approx(norm.ppf(1e-3))  # a Byzantine half
    assert alie_z_swbdm(10, 0) == pytest.approx(norm.ppf(0.5))  # no corruption: z = 0
    assert alie_z_swbdm(3, 3) == pytest.approx(norm.ppf(1e-3))  # n - f floored at 1
    out = call("alie_swbdm", honest64(), n_byzantine=2, n_total=10)
    expected = X.mean(axis=0) - norm.ppf(3 / 8) * X.std(axis=0, ddof=0)
    np.testing.assert_allclose(out.numpy(), np.tile(expected, (2, 1)), rtol=1e-12)
    strong = make_attack("alie_swbdm", attack_strength=3.0)(
        honest64(), n_byzantine=1, n_total=10, f=2
    )
    np.testing.assert_allclose(
        strong[0].numpy(), X.mean(axis=0) - 3 * norm.ppf(3 / 8) * X.std(axis=0, ddof=0)
    )
    one = call("alie_swbdm", honest64()[:1], n_byzantine=1, n_total=10)  # population std of one: 0
    np.testing.assert_allclose(one[0].numpy(), X[0])


def test_ipm_swbdm_negates_the_mean_and_matches_the_mean_honest_norm():
    out = call("ipm_swbdm", honest64(), n_byzantine=2, n_total=6)
    mu = X.mean(axis=0)
    eps = np.linalg.norm(X, axis=1).mean() / np.linalg.norm(mu)
    np.testing.assert_allclose(out.numpy(), np.tile(-eps * mu, (2, 1)), rtol=1e-12)
    assert np.linalg.norm(out[0].numpy()) == pytest.approx(np.linalg.norm(X, axis=1).mean())
    double = make_attack("ipm_swbdm", attack_strength=2.0)(honest64(), n_byzantine=1, n_total=6)
    np.testing.assert_allclose(double[0].numpy(), -2 * eps * mu, rtol=1e-12)
    cancelling = torch.tensor([[1.0, -2.0], [-1.0, 2.0]], dtype=torch.float64)  # mu = 0
    assert torch.equal(
        call("ipm_swbdm", cancelling, n_byzantine=1, n_total=3),
        torch.zeros(1, 2, dtype=torch.float64),
    )


def test_strategic_skip_decides_on_the_sampled_count_not_the_scope():
    """Under the inputs scope n_total is the N aggregator inputs; the skip decision is the
    sample's (2 Byzantine of 3 sampled is a majority even among 25 inputs)."""
    atk = make_attack("strategic_skip")
    own = torch.tensor([[1.0, 1.0, 1.0], [2.0, 0.0, -2.0]], dtype=torch.float64)
    out = atk(honest64(), n_byzantine=2, n_total=25, n_sampled=3, own=own)
    np.testing.assert_allclose(out.numpy(), np.tile(-10.0 * X.mean(axis=0), (2, 1)), rtol=1e-12)
    assert torch.equal(atk(honest64(), n_byzantine=2, n_total=4, n_sampled=5, own=own), own)


def test_label_flip_maps_y_to_k_minus_1_minus_y():
    atk = make_attack("label_flip")
    assert atk.data_side
    y = torch.tensor([0, 1, 2, 9, 5])
    assert atk.poison_labels(y, 10).tolist() == [9, 8, 7, 0, 4]
    assert not make_attack("ipm").data_side and make_attack("ipm").poison_labels(y, 10) is y


def test_strategic_skip_is_honest_in_minority_and_attacks_from_half():
    atk = make_attack("strategic_skip")
    own = torch.tensor([[1.0, 1.0, 1.0], [2.0, 0.0, -2.0]], dtype=torch.float64)
    # 2 Byzantine of 5 sampled: a minority, the honest messages go out unchanged
    assert torch.equal(atk(honest64()[:3], n_byzantine=2, n_total=5, own=own), own)
    # 2 of 4 (exactly half) and 2 of 3: -10 * mu from every Byzantine client
    for h in (2, 1):
        out = atk(honest64()[:h], n_byzantine=2, n_total=h + 2, own=own)
        np.testing.assert_allclose(
            out.numpy(), np.tile(-10.0 * X[:h].mean(axis=0), (2, 1)), rtol=1e-12
        )
    assert not atk.data_side
    with pytest.raises(ValueError, match="own"):
        atk(honest64(), n_byzantine=1, n_total=5)


def test_cache_alie_uses_the_cache_statistics():
    honest = honest64()
    gen = torch.Generator().manual_seed(3)
    cache = torch.randn(9, 3, generator=gen, dtype=torch.float64) * 5 + 1  # differs from honest
    mask = torch.tensor([False, True, False, False, True, False, False, False, False])
    out = call("cache_alie", honest, n_byzantine=2, n_total=6, cache=cache, cache_byzantine=mask)
    rows = cache.numpy()[~mask.numpy()]
    # N = 9, B = 2: s = floor(5.5) - 2 = 3, z = Phi^-1((9 - 2 - 3) / 7)
    expected = rows.mean(axis=0) - norm.ppf(4 / 7) * rows.std(axis=0, ddof=1)
    np.testing.assert_allclose(out.numpy(), np.tile(expected, (2, 1)), rtol=1e-12)
    plain = call("alie", honest, n_byzantine=2, n_total=6)
    assert not torch.allclose(out, plain)
    # without a cache it is plain ALIE
    assert torch.equal(call("cache_alie", honest, n_byzantine=2, n_total=6), plain)
    assert make_attack("cache_alie").needs_cache and not make_attack("alie").needs_cache


def test_mimic_copies_the_honest_client_farthest_along_the_top_direction():
    gen = torch.Generator().manual_seed(0)
    honest = torch.randn(6, 50, generator=gen) * 0.1
    honest[:, 0] += torch.tensor([0.0, 1.0, -1.0, 0.5, -0.5, 3.0])  # spread along e0; row 5 extreme
    out = call("mimic", honest, n_byzantine=3, n_total=9)
    for row in out:
        assert torch.equal(row, honest[5])
    # strength is unused: still an exact copy
    out = make_attack("mimic", attack_strength=7.0)(honest, n_byzantine=2, n_total=8)
    assert all(torch.equal(row, honest[5]) for row in out)


@settings(max_examples=25, deadline=None)
@given(h=st.integers(1, 7), d=st.integers(1, 9), seed=st.integers(0, 10_000))
def test_mimic_returns_a_copy_of_an_honest_row(h, d, seed):
    honest = torch.randn(h, d, generator=torch.Generator().manual_seed(seed))
    out = call("mimic", honest, n_byzantine=2, n_total=h + 2)
    assert any(torch.equal(out[0], row) for row in honest)
    assert torch.equal(out[0], out[1])


# --- shared properties of every registry entry ----------------------------------------------------


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("name", ALL)
def test_shape_dtype_device(name, dtype, device):
    honest = torch.randn(5, 7, generator=torch.Generator().manual_seed(0)).to(device, dtype)
    for n_byzantine in (0, 1, 3):
        out = call(
            name, honest, n_byzantine, 5 + n_byzantine, **context_for(name, honest, n_byzantine)
        )
        assert out.shape == (n_byzantine, 7)
        assert out.dtype == dtype and out.device.type == device
        assert torch.isfinite(out).all()
    # n_byzantine = 0 needs no context at all
    assert call(name, honest, 0, 5).shape == (0, 7)


@pytest.mark.parametrize("name", ALL)
def test_no_honest_client_sampled_uses_own(name):
    own = torch.randn(3, 4, generator=torch.Generator().manual_seed(2), dtype=torch.float64)
    empty = own.new_empty((0, 4))
    ctx = context_for(name, empty, 3)
    ctx["own"] = own
    out = call(name, empty, 3, 3, **ctx)
    assert out.shape == (3, 4) and torch.isfinite(out).all()
    if name in ("ipm", "strategic_skip"):  # honest statistics estimated from own
        expected = -make_attack(name).strength * own.mean(dim=0)
        torch.testing.assert_close(out, expected.expand(3, 4))
    if name == "mimic":
        assert any(torch.equal(out[0], row) for row in own)
    with pytest.raises(ValueError, match="own"):
        call(name, empty, 3, 3)


@pytest.mark.parametrize("name", [n for n in ALL if n not in ("none", "label_flip")])
def test_order_of_honest_clients_does_not_matter(name):
    honest = torch.randn(6, 5, generator=torch.Generator().manual_seed(4), dtype=torch.float64)
    own = torch.randn(2, 5, generator=torch.Generator().manual_seed(5), dtype=torch.float64)
    perm = torch.tensor([3, 0, 5, 1, 4, 2])
    a = call(name, honest, 2, 8, own=own, generator=torch.Generator().manual_seed(0))
    b = call(name, honest[perm], 2, 8, own=own, generator=torch.Generator().manual_seed(0))
    torch.testing.assert_close(a, b)


@settings(max_examples=30, deadline=None)
@given(
    name=st.sampled_from(ALL),
    h=st.integers(0, 6),
    n_byzantine=st.integers(0, 4),
    d=st.integers(1, 6),
    seed=st.integers(0, 10_000),
)
def test_every_attack_returns_n_byzantine_finite_rows(name, h, n_byzantine, d, seed):
    honest = torch.randn(h, d, generator=torch.Generator().manual_seed(seed))
    out = call(
        name, honest, n_byzantine, h + n_byzantine, **context_for(name, honest, n_byzantine, seed)
    )
    assert out.shape == (n_byzantine, d) and torch.isfinite(out).all()


def test_default_strengths_and_knob():
    assert make_attack("ipm").strength == 0.1
    assert make_attack("ipm", attack_strength=None).strength == 0.1
    assert make_attack("alie").strength == 1.0
    assert make_attack("strategic_skip").strength == 10.0
    assert make_attack("alie", attack_strength=2).strength == 2.0


def test_make_attack_rejects_unknown_names_and_keys():
    with pytest.raises(SpecError, match="epsilon"):
        make_attack("ipm", epsilon=0.5)
    with pytest.raises(SpecError) as err:
        make_attack("fall_of_empires")
    for name in ALL:
        assert name in str(err.value)
    with pytest.raises(SpecError, match="attack_strength"):
        make_attack("alie", attack_strength=float("nan"))
    # RunSpec keys the attack does not take are dropped (the round loop passes one dict of knobs)
    assert make_attack("ipm", attack_strength=0.5, trim_ratio=0.2).strength == 0.5


def test_bad_shapes_are_clear_errors():
    with pytest.raises(ValueError, match="own"):
        call("sign_flip", honest64(), 2, 6, own=torch.zeros(3, 3, dtype=torch.float64))
    with pytest.raises(ValueError, match="cache_byzantine"):
        call("cache_alie", honest64(), 2, 6, cache=torch.zeros(5, 3, dtype=torch.float64))
    with pytest.raises(ValueError, match="n_total"):
        call("alie", honest64(), 4, 3)
