"""Calibration of a deployment: how many Byzantine clients a round's sample holds, and what trim
ratio survives it.

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

The second half, `trim_sweep`, runs a short sweep over trim ratios through any
`robusttune.runners.Runner` (the Ray Tune sweep layer, or `robusttune.runners.InProcessRunner`)
against the shared worst case (`robusttune.adversary`, the breakdown map's), and recommends the
smallest trim ratio that survives every attack at the deployment's Byzantine fraction and at a
margin above it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Annotated, Any, Literal, Mapping, Sequence

import numpy as np
from scipy import stats

from pydantic import Field, model_validator

from robusttune.records import survives
from robusttune.registry import SpecError
from robusttune.schema import Checked, optional_int

if TYPE_CHECKING:  # the runners import torch; the calibration law needs only their protocol
    from robusttune.adversary import Adversary
    from robusttune.runners import Runner

__all__ = [
    "Deployment", "byzantine_law", "p_majority_round", "p_exceeds_trim_round", "p_any_round",
    "calibrated_trim_ratio", "smallest_safe_trim", "analyze", "trim_sweep", "TrimSweep",
    "aggregator_inputs", "default_trim_grid", "lattice_byzantine", "no_survivor_line",
]

# floor(x + EPS): the same tolerance as RunSpec.n_byzantine, so 0.3 * 10 counts as 3, not 2, and
# 0.29 * 100 trims 29 values; the aggregators receive the same integers.
EPS = 1e-9


def _floor(x: float | np.ndarray) -> Any:
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
    def _sample_size_fits(self) -> "Deployment":
        if self.sample_size is not None:
            if self.mode == "bernoulli":
                raise ValueError("sample_size applies to fixed sampling only; bernoulli draws each "
                                 "client with probability participation")
            if self.sample_size > self.clients:
                raise ValueError(f"sample_size must be in [1, clients={self.clients}]; got "
                                 f"{self.sample_size}")
        return self

    @property
    def n_byzantine(self) -> int:
        """B = floor(beta N)."""
        return int(_floor(self.byzantine_fraction * self.clients))

    @property
    def n_sampled(self) -> int:
        """n for fixed sampling; the expected size round(p N) (at least 1) for bernoulli."""
        if self.sample_size is not None:
            return self.sample_size
        return max(1, int(round(self.participation * self.clients)))


def _check_trim(trim_ratio: float) -> None:
    if not 0 <= trim_ratio < 0.5:
        raise SpecError(f"trim ratio must be in [0, 0.5); got {trim_ratio}")


def byzantine_law(d: Deployment) -> dict[str, np.ndarray]:
    """The per-round law of K, the number of Byzantine clients in the sample.

    Returns ``{"k": 0..kmax, "pmf": P(K = k)}``: Hypergeometric(N, B, n) for fixed sampling
    (kmax = min(B, n)), Binomial(B, p) for bernoulli (kmax = B)."""
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
    _check_trim(trim_ratio)
    B, N = d.n_byzantine, d.clients
    if cache:
        return float(B > int(_floor(N * trim_ratio)))
    if d.mode == "fixed":
        n = d.n_sampled
        return float(stats.hypergeom.sf(int(_floor(n * trim_ratio)), N, B, n))
    trims = _floor(np.arange(N + 1) * trim_ratio)            # floor(n r) for n = 0..N
    k = np.arange(1, B + 1)
    # first sample size whose trim reaches k; every smaller n (>= k) leaves k > floor(n r)
    first_covering = np.searchsorted(trims, k, side="left")
    h_max = np.minimum(first_covering - 1 - k, N - B)        # may be < 0: never exceeds
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
    for j in range(0, math.ceil(n_in / 2)):
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
        _check_trim(r)
    law = byzantine_law(d)
    q = p_majority_round(d)
    q_cache = p_majority_round(d, cache=True)
    per_trim = []
    for r in trims:
        e = p_exceeds_trim_round(d, r)
        e_cache = p_exceeds_trim_round(d, r, cache=True)
        per_trim.append({
            "trim_ratio": r,
            "trimmed_per_side": int(_floor(d.n_sampled * r)),
            "trimmed_per_side_cache": int(_floor(d.clients * r)),
            "p_exceeds_trim_round": e,
            "p_exceeds_trim_any": p_any_round(e, d.rounds),
            "p_exceeds_trim_round_cache": e_cache,
            "p_exceeds_trim_any_cache": p_any_round(e_cache, d.rounds),
        })
    return {
        "clients": d.clients, "participation": d.participation, "mode": d.mode,
        "byzantine_fraction": d.byzantine_fraction, "n_byzantine": d.n_byzantine,
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


# -- the trim sweep ---------------------------------------------------------------------------
@dataclass
class TrimSweep:
    """Outcome of `trim_sweep`. ``rows``: one per (trim ratio, Byzantine fraction) with the worst
    case's mean final accuracy over seeds (``accuracy``: the selection accuracy, validation when
    the runs hold a validation part; ``test_accuracy``: the same runs on the test part, what the
    recommendation is reported with), whether a seed collapsed, ``survived``
    and ``attack`` (the adversary setting behind the number: the worst, or the weakest that broke
    the point); ``clean_accuracy`` and ``threshold``: each trim's clean accuracy and survival bar;
    ``recommended``: the smallest trim ratio that survives at every Byzantine fraction swept
    (None if none does); ``cost``: each larger trim's accuracy loss against it, in points, at the
    deployment's own fraction; ``adversary``: what the worst case ran."""

    rows: list[dict[str, Any]] = field(default_factory=list)
    recommended: float | None = None
    clean_accuracy: dict[float, float] = field(default_factory=dict)
    threshold: dict[float, float] = field(default_factory=dict)
    cost: dict[float, float] = field(default_factory=dict)
    adversary: str = ""


def aggregator_inputs(spec: Any) -> int:
    """n_in, the number of rows the aggregator sees: all N slots for the algorithms that
    aggregate their cache, the (expected) sample size otherwise."""
    return spec.clients if spec.aggregates_cache else spec.expected_sample_size


def default_trim_grid(byzantine_fraction: float, margin: float, n_inputs: int) -> list[float]:
    """The distinct trims: r = j / n_in for j = 0, 1, ... while r < 0.5 and r <= beta + margin +
    0.1 (which brackets the calibrated r = beta + 0.05 and over-trims a little). Only floor(n_in r)
    matters to the rule, so a finer grid would rerun identical configurations."""
    top = min(0.49, byzantine_fraction + margin + 0.1)
    return [round(j / n_inputs, 10) for j in range(n_inputs) if j / n_inputs <= top + EPS]


def lattice_byzantine(byzantine_fraction: float, clients: int) -> int:
    """k = floor(beta N): the breakdown map's lattice point a Byzantine fraction stands for."""
    return int(_floor(byzantine_fraction * clients))


def trim_sweep(base: Mapping[str, Any], trims: Sequence[float], byzantine_fractions: Sequence[float],
               runner: Runner, seeds: Sequence[int] = (42,), adversary: Adversary | None = None,
               relative_threshold: float = 0.5, threshold: float | None = None) -> TrimSweep:
    """Judge ``base`` (RunSpec keys with the dataset, method and deployment; ``clients`` = N) at
    every trim ratio r against the shared worst case (``adversary``, default
    `Adversary.default()`: every default attack over its strength ladder), exactly as a breakdown
    map of the cells {trim_ratio: r} judges its lattice points: each r is a cell, its points
    k = 0 (clean) and k = floor(beta N) for each beta swept, through
    `robusttune.breakdown.spec_evaluator` (staged ladders, shared runs; one runner call per
    stage).

    A point survives when no seed collapsed and its worst case's mean accuracy reaches the bar:
    ``threshold`` if given, else ``relative_threshold`` x that trim's clean accuracy (the map's
    `survival_bar`). Recommended: the smallest r surviving at every beta swept (the deployment's
    fraction and the margin above it)."""
    from robusttune.adversary import Adversary
    from robusttune.breakdown import Cell, Point, spec_evaluator, survival_bar

    for r in trims:
        _check_trim(r)
    clients = int(base["clients"])
    threat = adversary or Adversary.default()
    evaluate = spec_evaluator({**base, "attack": base.get("attack", "none")}, runner, seeds=seeds,
                              adversary=threat, survival=(threshold, relative_threshold))
    cells = [Cell.of(clients, trim_ratio=float(r)) for r in trims]
    # the clean points first: from then on every point's survival bar is known (staged ladders
    # stop at the first variant below it, as in a map)
    clean = dict(zip(trims, evaluate([Point(cell, 0) for cell in cells])))
    counts = {beta: lattice_byzantine(beta, clients) for beta in byzantine_fractions}
    attacked_points = [Point(cell, k) for cell in cells for k in sorted(set(counts.values())) if k > 0]
    attacked = dict(zip(((p.cell["trim_ratio"], p.byzantine) for p in attacked_points),
                        evaluate(attacked_points)))
    result = TrimSweep(adversary=threat.describe(base.get("attack", "none")))
    for r in trims:
        result.clean_accuracy[r] = clean[r].accuracy
        result.threshold[r] = survival_bar(threshold, relative_threshold, clean[r].accuracy)
        for beta, k in counts.items():
            outcome = attacked.get((float(r), k), clean[r])
            result.rows.append({
                "trim_ratio": r, "byzantine_fraction": beta, "byzantine_clients": k,
                "accuracy": outcome.accuracy, "test_accuracy": outcome.test_accuracy,
                "collapsed": outcome.collapsed,
                "seeds": len(seeds),
                "survived": survives(outcome.accuracy, outcome.collapsed, result.threshold[r]),
                "attack": " ".join(f"{a}={b}" for a, b in outcome.breaker)})
    surviving = [r for r in trims
                 if all(row["survived"] for row in result.rows if row["trim_ratio"] == r)]
    result.recommended = min(surviving) if surviving else None
    if result.recommended is not None:
        own = byzantine_fractions[0]
        acc = {row["trim_ratio"]: row["accuracy"] for row in result.rows
               if row["byzantine_fraction"] == own}
        result.cost = {r: 100 * (acc[result.recommended] - acc[r])
                       for r in sorted(acc) if r > result.recommended}
    return result


def no_survivor_line(figures: Mapping[str, Any], trims: Sequence[float]) -> str:
    """The one line `calibrate` prints when no swept trim survives: the analytic bound (the
    smallest r with P(some round exceeds the trim) <= risk, `smallest_safe_trim`)."""
    def bound(value: float | None) -> str:
        return "none below 0.5" if value is None else f"r >= {value:g}"

    return (f"no trim ratio in {min(trims):g}..{max(trims):g} survives every attack at "
            f"beta={figures['byzantine_fraction']:g} and the margin; the analytic bound at risk "
            f"{figures['risk']:g}: {bound(figures['analytic_safe_trim'])} over the sample, "
            f"{bound(figures['analytic_safe_trim_cache'])} over a cache")
