"""The law of a round's Byzantine share: how many Byzantine clients a round's sample holds, and
which trim ratio it exceeds.

The population-level fraction beta says little about one round: with N clients of which
B = floor(beta N) are Byzantine, a sample of n clients holds K Byzantine clients with

    fixed-size sampling (SWB-DM: n clients without replacement)
        K ~ Hypergeometric(N, B, n),   P(K = k) = C(B, k) C(N - B, n - k) / C(N, n)
    bernoulli sampling (DeMoA: each client independently with probability p)
        K ~ Binomial(B, p) and H ~ Binomial(N - B, p) independent; the sample size is K + H.

A round is a *Byzantine-majority round* when K >= 1 and 2K >= n (the Byzantine clients are at
least half of the sampled set; the simulation's RoundRecord.byzantine_majority), and *exceeds the
trim* r when K > floor(n r) (a trimmed statistic dropping floor(n r) values on each side cannot
remove them all). Rounds are independent, so over T rounds P(any) = 1 - (1 - q)^T.

With a cache (SWB-DM's state cache, DeMoA's momenta) the aggregator's input is all N slots, of
which at most B are Byzantine whatever the sample: the per-round quantities become deterministic
bounds, majority iff B >= 1 and 2B >= N, exceeds the trim iff B > floor(N r).

`robusttune.experiments.calibration` runs the trim sweep that checks these figures against the
worst case; the breakdown map's theory column (`robusttune.experiments.breakdown.theory`) reads
them too.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Annotated, Any, Literal

import numpy as np
from pydantic import Field, model_validator

from robusttune.core.registry import SpecError
from robusttune.core.validation import Checked, optional_int

__all__ = [
    "EPS",
    "Deployment",
    "aggregator_inputs",
    "analyze",
    "byzantine_law",
    "calibrated_trim_ratio",
    "check_trim",
    "lattice_byzantine",
    "p_any_round",
    "p_exceeds_trim_round",
    "p_majority_round",
    "smallest_safe_trim",
]

# floor(x + EPS): the same tolerance as RunSpec.n_byzantine, so 0.3 * 10 counts as 3, not 2, and
# 0.29 * 100 trims 29 values; the aggregators receive the same integers.
EPS = 1e-9


def floor_eps(x: float | np.ndarray) -> Any:
    return np.floor(np.asarray(x, dtype=float) + EPS).astype(int)


class Deployment(Checked):
    """A deployment to calibrate: N clients, participation p (mode fixed|bernoulli), Byzantine
    fraction beta, T rounds, and for fixed sampling an optional sample size n (default
    max(1, round(p N)), as RunSpec.expected_sample_size)."""

    clients: Annotated[int, Field(ge=1)]
    participation: Annotated[float, Field(gt=0, le=1)]
    byzantine_fraction: Annotated[float, Field(ge=0, lt=1)]
    rounds: Annotated[int, Field(ge=1)]
    sample_size: optional_int(ge=1) = None
    mode: Literal["fixed", "bernoulli"] = "fixed"

    @model_validator(mode="after")
    def _sample_size_fits(self) -> Deployment:
        if self.sample_size is not None:
            if self.mode == "bernoulli":
                raise ValueError(
                    "sample_size applies to fixed sampling only; bernoulli draws each "
                    "client with probability participation"
                )
            if self.sample_size > self.clients:
                raise ValueError(
                    f"sample_size must be in [1, clients={self.clients}]; got {self.sample_size}"
                )
        return self

    @property
    def n_byzantine(self) -> int:
        """B = floor(beta N)."""
        return int(floor_eps(self.byzantine_fraction * self.clients))

    @property
    def n_sampled(self) -> int:
        """n for fixed sampling; the expected size round(p N) (at least 1) for bernoulli."""
        if self.sample_size is not None:
            return self.sample_size
        return max(1, round(self.participation * self.clients))


def check_trim(trim_ratio: float) -> None:
    if not 0 <= trim_ratio < 0.5:
        raise SpecError(f"trim ratio must be in [0, 0.5); got {trim_ratio}")


def byzantine_law(d: Deployment) -> dict[str, np.ndarray]:
    """The per-round law of K, the number of Byzantine clients in the sample.

    Returns ``{"k": 0..kmax, "pmf": P(K = k)}``: Hypergeometric(N, B, n) for fixed sampling
    (kmax = min(B, n)), Binomial(B, p) for bernoulli (kmax = B)."""
    from scipy import stats  # 0.4-0.9 s to import: only the commands that compute the law pay it

    B = d.n_byzantine
    if d.mode == "fixed":
        n = d.n_sampled
        k = np.arange(min(B, n) + 1)
        return {"k": k, "pmf": stats.hypergeom.pmf(k, d.clients, B, n)}
    k = np.arange(B + 1)
    return {"k": k, "pmf": stats.binom.pmf(k, B, d.participation)}


def p_majority_round(d: Deployment, cache: bool = False) -> float:
    """q = P(a round is Byzantine-majority): K >= 1 and 2K >= (sample size).

    fixed:      q = sum_{k >= max(1, ceil(n/2))} Hypergeom(N, B, n).pmf(k)
    bernoulli:  q = sum_{k >= 1} Binom(B, p).pmf(k) * Binom(N - B, p).cdf(k)
                (2K >= K + H  <=>  H <= K, with K and H independent)
    cache:      q = 1 if B >= 1 and 2B >= N else 0 (the input is all N slots)."""
    from scipy import stats

    B, N = d.n_byzantine, d.clients
    if cache:
        return float(B >= 1 and 2 * B >= N)
    if d.mode == "fixed":
        n = d.n_sampled
        k = np.arange(max(1, math.ceil(n / 2)), min(B, n) + 1)
        return float(stats.hypergeom.pmf(k, N, B, n).sum())
    k = np.arange(1, B + 1)
    p = d.participation
    return float((stats.binom.pmf(k, B, p) * stats.binom.cdf(k, N - B, p)).sum())


def p_exceeds_trim_round(d: Deployment, trim_ratio: float, cache: bool = False) -> float:
    """P(a round's Byzantine count exceeds the trim): K > floor(n r).

    fixed:      Hypergeom(N, B, n).sf(floor(n r))
    bernoulli:  sum_k Binom(B, p).pmf(k) * Binom(N - B, p).cdf(h_max(k)), with the realised
                n = k + h: h_max(k) = the largest h with floor((k + h) r) < k (floor(n r) is
                non-decreasing in n, so the admissible h form a prefix 0..h_max)
    cache:      1 if B > floor(N r) else 0."""
    from scipy import stats

    check_trim(trim_ratio)
    B, N = d.n_byzantine, d.clients
    if cache:
        return float(int(floor_eps(N * trim_ratio)) < B)
    if d.mode == "fixed":
        n = d.n_sampled
        return float(stats.hypergeom.sf(int(floor_eps(n * trim_ratio)), N, B, n))
    trims = floor_eps(np.arange(N + 1) * trim_ratio)  # floor(n r) for n = 0..N
    k = np.arange(1, B + 1)
    # first sample size whose trim reaches k; every smaller n (>= k) leaves k > floor(n r)
    first_covering = np.searchsorted(trims, k, side="left")
    h_max = np.minimum(first_covering - 1 - k, N - B)  # may be < 0: never exceeds
    p = d.participation
    inside = np.where(h_max >= 0, stats.binom.cdf(np.maximum(h_max, 0), N - B, p), 0.0)
    return float((stats.binom.pmf(k, B, p) * inside).sum())


def p_any_round(q: float, rounds: int) -> float:
    """P(at least one of T independent rounds has probability-q event) = 1 - (1 - q)^T,
    computed as -expm1(T log1p(-q)) so small q keep their digits."""
    if q >= 1.0:
        return 1.0
    return float(-math.expm1(rounds * math.log1p(-q)))


def calibrated_trim_ratio(byzantine_fraction: float) -> float:
    """SWB-DM, Section IV: r = min(0.45, beta + 0.05)."""
    return round(min(0.45, byzantine_fraction + 0.05), 10)


def smallest_safe_trim(d: Deployment, risk: float = 0.05, cache: bool = False) -> float | None:
    """The smallest trim ratio r on the lattice {j / n_in} (n_in = n, or N over a cache) with
    P(some round among T exceeds the trim) <= risk; None when no r < 0.5 achieves it.
    An analytic lower bound on what the trim sweep recommends: it ignores what an attack does
    inside the trimmed band."""
    n_in = d.clients if cache else d.n_sampled
    for j in range(math.ceil(n_in / 2)):
        r = j / n_in
        if r >= 0.5:
            break
        if p_any_round(p_exceeds_trim_round(d, r, cache=cache), d.rounds) <= risk:
            return r
    return None


def analyze(d: Deployment, trim_ratios: Sequence[float] = (), risk: float = 0.05) -> dict[str, Any]:
    """Every analytic figure of a deployment, JSON-ready.

    ``trim_ratios`` defaults to the calibrated r = min(0.45, beta + 0.05); the headline
    ``p_exceeds_trim_any`` is for the first trim ratio given. Keys ending in ``_cache`` assume the
    aggregator runs over all N cached slots."""
    trims = [float(r) for r in trim_ratios] or [calibrated_trim_ratio(d.byzantine_fraction)]
    for r in trims:
        check_trim(r)
    law = byzantine_law(d)
    q = p_majority_round(d)
    q_cache = p_majority_round(d, cache=True)
    per_trim = []
    for r in trims:
        e = p_exceeds_trim_round(d, r)
        e_cache = p_exceeds_trim_round(d, r, cache=True)
        per_trim.append(
            {
                "trim_ratio": r,
                "trimmed_per_side": int(floor_eps(d.n_sampled * r)),
                "trimmed_per_side_cache": int(floor_eps(d.clients * r)),
                "p_exceeds_trim_round": e,
                "p_exceeds_trim_any": p_any_round(e, d.rounds),
                "p_exceeds_trim_round_cache": e_cache,
                "p_exceeds_trim_any_cache": p_any_round(e_cache, d.rounds),
            }
        )
    return {
        "clients": d.clients,
        "participation": d.participation,
        "mode": d.mode,
        "byzantine_fraction": d.byzantine_fraction,
        "n_byzantine": d.n_byzantine,
        "sample_size": d.n_sampled if d.mode == "fixed" else None,
        "expected_sample_size": d.n_sampled if d.mode == "fixed" else d.participation * d.clients,
        "rounds": d.rounds,
        "law": "hypergeometric" if d.mode == "fixed" else "binomial",
        "byzantine_pmf": {int(k): float(p) for k, p in zip(law["k"], law["pmf"])},
        "expected_byzantine": float((law["k"] * law["pmf"]).sum()),
        "p_majority_round": q,
        "p_majority_round_any": p_any_round(q, d.rounds),
        "p_majority_round_cache": q_cache,
        "p_majority_round_any_cache": p_any_round(q_cache, d.rounds),
        "trim_ratio": trims[0],
        "p_exceeds_trim_round": per_trim[0]["p_exceeds_trim_round"],
        "p_exceeds_trim_any": per_trim[0]["p_exceeds_trim_any"],
        "p_exceeds_trim_any_cache": per_trim[0]["p_exceeds_trim_any_cache"],
        "trims": per_trim,
        "risk": risk,
        "analytic_safe_trim": smallest_safe_trim(d, risk),
        "analytic_safe_trim_cache": smallest_safe_trim(d, risk, cache=True),
    }


def aggregator_inputs(spec: Any) -> int:
    """n_in, the number of rows the aggregator sees: all N slots for the algorithms that
    aggregate their cache, the (expected) sample size otherwise."""
    return spec.clients if spec.aggregates_cache else spec.expected_sample_size


def lattice_byzantine(byzantine_fraction: float, clients: int) -> int:
    """k = floor(beta N): the breakdown map's lattice point a Byzantine fraction stands for."""
    return int(floor_eps(byzantine_fraction * clients))
