"""Calibration figures against scipy directly and against a seeded Monte Carlo of the sampling
itself (clients drawn as the simulation draws them, not through the laws being tested)."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
from scipy import stats
from typer.testing import CliRunner

from robusttune.core.registry import SpecError
from robusttune.problem.byzantine_law import (
    Deployment,
    analyze,
    byzantine_law,
    p_any_round,
    p_exceeds_trim_round,
    p_majority_round,
    smallest_safe_trim,
)

CASES = [
    # the issue's case: N=20, p=0.1, beta=0.2 (B=4), T=10; fixed draws n=2
    {"clients": 20, "participation": 0.1, "byzantine_fraction": 0.2, "rounds": 10},
    # a larger sample where the trim matters: N=30, p=0.4 (n=12), beta=0.3 (B=9), T=25
    {"clients": 30, "participation": 0.4, "byzantine_fraction": 0.3, "rounds": 25},
]


def monte_carlo(d: Deployment, trim: float, replicates: int = 20_000, seed: int = 0):
    """Per-round and over-T frequencies of a Byzantine-majority round and of K > floor(n r),
    from explicit client draws: clients 0..B-1 are Byzantine."""
    rng = np.random.default_rng(seed)
    N, B, T = d.clients, d.n_byzantine, d.rounds
    if d.mode == "fixed":
        # a uniformly random n-subset: the n smallest of N iid uniforms
        u = rng.random((replicates, T, N))
        chosen = np.argsort(u, axis=-1)[..., : d.n_sampled]
        k = (chosen < B).sum(-1)
        n = np.full_like(k, d.n_sampled)
    else:
        picked = rng.random((replicates, T, N)) < d.participation
        k = picked[..., :B].sum(-1)
        n = picked.sum(-1)
    majority = (k >= 1) & (2 * k >= n)
    exceeds = k > np.floor(n * trim + 1e-9)
    return majority.mean(), majority.any(-1).mean(), exceeds.mean(), exceeds.any(-1).mean()


@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("mode", ["fixed", "bernoulli"])
def test_matches_scipy_and_monte_carlo(case, mode):
    d = Deployment(mode=mode, **case)
    N, B, T = d.clients, d.n_byzantine, d.rounds
    trim = 0.25
    if mode == "fixed":
        n = max(1, round(d.participation * N))
        law = stats.hypergeom(N, B, n)
        q = sum(law.pmf(k) for k in range(1, n + 1) if 2 * k >= n)
        e = 1 - law.cdf(math.floor(n * trim))
        assert np.allclose(byzantine_law(d)["pmf"], law.pmf(np.arange(min(B, n) + 1)))
    else:
        byz, hon = stats.binom(B, d.participation), stats.binom(N - B, d.participation)
        q = e = 0.0
        for k in range(B + 1):  # plain double loop over the two independent binomials
            for h in range(N - B + 1):
                w = byz.pmf(k) * hon.pmf(h)
                q += w * (k >= 1 and 2 * k >= k + h)
                e += w * (k > math.floor((k + h) * trim + 1e-9))
        assert np.allclose(byzantine_law(d)["pmf"], byz.pmf(np.arange(B + 1)))
    assert p_majority_round(d) == pytest.approx(q, abs=1e-12)
    assert p_exceeds_trim_round(d, trim) == pytest.approx(e, abs=1e-12)
    assert p_any_round(p_majority_round(d), T) == pytest.approx(1 - (1 - q) ** T, abs=1e-12)

    mc_q, mc_q_any, mc_e, mc_e_any = monte_carlo(d, trim)
    assert p_majority_round(d) == pytest.approx(mc_q, abs=1e-2)
    assert p_any_round(p_majority_round(d), T) == pytest.approx(mc_q_any, abs=1e-2)
    assert p_exceeds_trim_round(d, trim) == pytest.approx(mc_e, abs=1e-2)
    assert p_any_round(p_exceeds_trim_round(d, trim), T) == pytest.approx(mc_e_any, abs=1e-2)


def test_issue_case_by_hand():
    # N=20, B=4, n=2: a majority round needs at least one Byzantine client among the two,
    # P = 1 - C(16,2)/C(20,2) = 1 - 120/190; over 10 rounds 1 - (120/190)^10.
    d = Deployment(clients=20, participation=0.1, byzantine_fraction=0.2, rounds=10)
    assert p_majority_round(d) == pytest.approx(70 / 190)
    assert analyze(d)["p_majority_round_any"] == pytest.approx(1 - (120 / 190) ** 10)
    # trim r = 0.25 of n=2 drops 0 per side: any Byzantine client exceeds it
    assert p_exceeds_trim_round(d, 0.25) == pytest.approx(70 / 190)


@pytest.mark.parametrize("mode", ["fixed", "bernoulli"])
def test_with_cache_is_deterministic(mode):
    d = Deployment(clients=20, participation=0.1, byzantine_fraction=0.2, rounds=10, mode=mode)
    # 4 of 20 slots: no majority; trim floor(20 * 0.25) = 5 >= 4, floor(20 * 0.15) = 3 < 4
    assert p_majority_round(d, cache=True) == 0.0
    assert p_exceeds_trim_round(d, 0.25, cache=True) == 0.0
    assert p_exceeds_trim_round(d, 0.15, cache=True) == 1.0
    report = analyze(d, [0.25, 0.15])
    assert report["p_majority_round_any_cache"] == 0.0
    assert [t["p_exceeds_trim_any_cache"] for t in report["trims"]] == [0.0, 1.0]
    half = Deployment(clients=10, participation=0.5, byzantine_fraction=0.5, rounds=3, mode=mode)
    assert p_majority_round(half, cache=True) == 1.0


def test_safe_trim_and_validation():
    # N=30, B=3, n=12: a trim of 3 per side (r = 3/12) can never be exceeded; 2 per side is
    # exceeded when all 3 Byzantine clients are drawn, which 25 rounds make likely
    d = Deployment(clients=30, participation=0.4, byzantine_fraction=0.1, rounds=25)
    assert smallest_safe_trim(d, risk=0.05) == pytest.approx(3 / 12)
    assert p_any_round(p_exceeds_trim_round(d, 2 / 12), 25) > 0.05
    assert smallest_safe_trim(d, cache=True) == pytest.approx(3 / 30)  # floor(30 r) >= 3
    assert (
        smallest_safe_trim(
            Deployment(clients=30, participation=0.4, byzantine_fraction=0.3, rounds=25)
        )
        is None
    )  # B=9 of n=12 beats any r < 0.5
    for bad in (
        {"participation": 0.0},
        {"byzantine_fraction": 1.0},
        {"rounds": 0},
        {"sample_size": 31},
        {"mode": "poisson"},
    ):
        with pytest.raises(SpecError):
            Deployment(
                **{
                    "clients": 30,
                    "participation": 0.4,
                    "byzantine_fraction": 0.3,
                    "rounds": 5,
                    **bad,
                }
            )
    with pytest.raises(SpecError):
        p_exceeds_trim_round(d, 0.5)


# trim_sweep against the shared worst case: tests/test_worst_case.py


def test_cli_calibrate_json_and_bad_input():
    from robusttune.commands.cli import app

    runner = CliRunner()
    result = runner.invoke(
        app,
        [
            "calibrate",
            "--clients",
            "20",
            "--participation",
            "0.1",
            "--byzantine",
            "0.2",
            "--rounds",
            "10",
            "--analytic-only",
            "--json",
        ],
    )
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert data["p_majority_round_any"] == pytest.approx(1 - (120 / 190) ** 10)
    assert data["recommended_trim_ratio"] is None
    assert "p_exceeds_trim_any" in data and data["p_majority_round_any_cache"] == 0.0
    result = runner.invoke(
        app,
        [
            "calibrate",
            "--clients",
            "20",
            "--participation",
            "1.5",
            "--byzantine",
            "0.2",
            "--rounds",
            "10",
            "--analytic-only",
        ],
    )
    assert result.exit_code == 2
    assert len(result.stderr.strip().splitlines()) == 1 and "participation" in result.stderr
    result = runner.invoke(
        app,
        [
            "calibrate",
            "--clients",
            "20",
            "--participation",
            "0.5",
            "--byzantine",
            "0.2",
            "--rounds",
            "10",
            "--trim",
            "0.7",
            "--analytic-only",
        ],
    )
    assert result.exit_code == 2 and "trim" in result.stderr


def test_trim_grid_is_the_distinct_trims():
    from robusttune.experiments.calibration import default_trim_grid

    # n_in = 10: floor(10 r) changes only at multiples of 0.1; beta 0.2 + margin 0.1 + 0.1 -> 0.4
    assert default_trim_grid(0.2, 0.1, 10) == [0.0, 0.1, 0.2, 0.3, 0.4]
    assert default_trim_grid(0.4, 0.1, 4) == [0.0, 0.25]  # r < 0.5 always


def test_cli_calibrate_with_local_sweep(tmp_path):
    from robusttune.commands.cli import app

    result = CliRunner().invoke(
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
            "--local",
            "--json",
            "--out",
            str(tmp_path),
            "--set",
            "synthetic_samples=240",
            "--set",
            "local_epochs=1",
        ],
    )
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    rows = data["sweep"]["rows"]
    # 2 trims x (beta 0.17 and 0.27: both k = 1 of 6, one lattice point), each over the
    # default three seeds
    assert len(rows) == 4 and {r["trim_ratio"] for r in rows} == {0.0, 0.34}
    assert {r["byzantine_clients"] for r in rows} == {1} and {r["seeds"] for r in rows} == {3}
    for row in rows:  # a trim survives only in every seed
        assert row["survived"] == (row["seeds_survived"] == 3)
    assert data["recommended_trim_ratio"] in (None, 0.0, 0.34)
    # per seed each trim's clean run, then sign_flip's ladder (1, 3, 10, 100) at k = 1, staged:
    # a trim stops at the first strength that breaks it
    trials = len(list((tmp_path / "trials").iterdir()))
    assert 3 * (2 + 2) <= trials <= 3 * (2 + 2 * 4)
