"""Rule-aware attacks: the message is chosen, every round, against the rule the server deploys.
MinMax and MinSum (Shejwalkar and Houmansadr) stay inside what a distance test would accept;
optimal ALIE and optimal IPM (the line search of ByzFL) maximise the deployed rule's error.

The attacker's model of the rule's input is the honest rows of its scope (``attack_scope``) and
c = n_total - h copies of its message: under a cache at the default ``inputs`` scope those are
the N cached rows, the stale Byzantine slots counted as holding the current message too. The
rule is evaluated in update space with its centre at the origin (``previous=None``: for the state
algorithms that is the global model, as in the round loop) and unweighted, with ``rule_f`` (the f
the round loop tells it) and a generator seeded 0 for randomised rules (bucketing, SWB): the
attacker does not know the server's random draws, and the run's own streams stay untouched.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
from torch import Tensor

from robusttune.core.registry import SpecError
from robusttune.methods.aggregators.appended import appended_rows
from robusttune.methods.aggregators.base import Aggregator
from robusttune.methods.aggregators.geometry import distances_to, pairwise_sq_distances
from robusttune.methods.attacks.base import ATTACKS, Attack, AttackRound, mean_std


def perturbation(source: Tensor, direction: str) -> Tensor:
    """Shejwalkar and Houmansadr's deviation, negated, so that m = mu + gamma * p: ``std``
    p = -sigma (unbiased), ``unit`` p = -mu / ||mu|| (0 when mu = 0), ``sign`` p = -sign(mu)."""
    mu, sigma = mean_std(source)
    if direction == "std":
        return -sigma
    if direction == "unit":
        norm = torch.linalg.vector_norm(mu)
        return torch.where(norm > 0, -mu / norm.clamp_min(torch.finfo(mu.dtype).tiny), 0.0)
    if direction == "sign":
        return -torch.sign(mu)
    raise SpecError(f"attack_direction must be one of std, unit, sign; got {direction!r}")


def halving_search(
    accepts: Callable[[float], bool], *, tolerance: float = 2.0**-20, max_doublings: int = 64
) -> float:
    """The largest gamma >= 0 with ``accepts(gamma)`` True, for a monotone test (an interval
    [0, gamma*]), by Shejwalkar and Houmansadr's halving search (NDSS 2021, Algorithm 1):

        gamma <- gamma_init, step <- gamma_init, gamma_succ <- 0
        while |gamma_succ - gamma| > tau:
            if accepts(gamma): gamma_succ <- gamma; gamma <- gamma + step / 2
            else:              gamma <- gamma - step / 2
            step <- step / 2

    which reaches (0, 2 gamma_init). The paper starts at gamma_init = 10 (its code), a bound in
    the units of its direction; here gamma_init is the smallest power of two 2^k >= 2^-30 that is
    rejected (found by doubling, at most ``max_doublings`` tests), so gamma* < 2 gamma_init whatever
    the scale, and tau = tolerance * gamma_init. Cost: at most max_doublings + 1 + log2(2 / tolerance)
    tests (about 60 for updates of ordinary size). Returns gamma_succ, accepted, within tau of
    gamma*; 0.0 when even 2^-30 is rejected; the last accepted power when nothing is rejected."""
    start = 2.0**-30
    while accepts(start):
        if max_doublings == 0:
            return start
        start, max_doublings = 2 * start, max_doublings - 1
    if start == 2.0**-30:
        return 0.0
    gamma, step, success = start, start, 0.0
    while abs(success - gamma) > tolerance * start:
        if accepts(gamma):
            success, gamma = gamma, gamma + step / 2
        else:
            gamma = gamma - step / 2
        step /= 2
    return success


class _DistanceBudget(Attack):
    """MinMax / MinSum: m = mu + gamma p, gamma by ``halving_search`` on the family's test.

    The tests are evaluated from O(h) numbers computed once (no loop over coordinates; two
    read-backs per round, the bound and those numbers): with a_i = ||mu - x_i||^2, b_i = <p, mu - x_i>, c = ||p||^2,
    ||m - x_i||^2 = a_i + 2 gamma b_i + gamma^2 c. Cost per round: the honest rows' pairwise
    distances (O(h^2 d), once) plus O(h) per test."""

    default_adversary = True
    rule_aware = True
    adversary_stage = 1

    def __init__(self, attack_strength: float | None = None, attack_direction: str = "std") -> None:
        super().__init__(attack_strength)
        if attack_direction not in ("std", "unit", "sign"):
            raise SpecError(
                f"attack_direction must be one of std, unit, sign for attack "
                f"{self.name!r}; got {attack_direction!r}"
            )
        self.direction = attack_direction

    def gamma(self, x: Tensor, p: Tensor) -> float:
        """The largest accepted gamma for honest rows x and perturbation p."""
        raise NotImplementedError

    def craft(self, rnd: AttackRound) -> Tensor:
        x = rnd.reference(self.name)
        p = perturbation(x, self.direction)
        return rnd.repeat(x.mean(dim=0) + self.gamma(x, p) * p)


def _scalars(x: Tensor, p: Tensor) -> tuple[Tensor, Tensor, float]:
    """(a, b, c) of ``_DistanceBudget`` in float64 on the host."""
    centred = x.mean(dim=0)
    a = distances_to(x, centred).double().square()
    b = (centred - x) @ p
    return a.cpu(), b.double().cpu(), float(p.double().square().sum())


@ATTACKS.register("minmax")
class MinMax(_DistanceBudget):
    """MinMax (Shejwalkar and Houmansadr, NDSS 2021, "Manipulating the Byzantine", Sec. IV):
    every Byzantine client sends m = mu + gamma p, gamma the largest value (``halving_search``) with

        max_i ||m - x_i|| <= max_{i,j} ||x_i - x_j||,

    x_i the honest rows, mu their mean and p the perturbation ``attack_direction`` names (``std``:
    -sigma, the paper's strongest in most of its cells and the default; ``unit``: -mu/||mu||;
    ``sign``: -sign(mu)). The malicious message is no farther from any honest one than two
    honest ones are from each other. Strength is accepted and unused (gamma is searched); no
    ladder. With fewer than two honest rows the bound is 0 and m = mu."""

    def gamma(self, x: Tensor, p: Tensor) -> float:
        bound = float(pairwise_sq_distances(x).max())
        a, b, c = _scalars(x, p)
        if c == 0.0:
            return 0.0
        return halving_search(lambda g: float((a + 2 * g * b + g * g * c).max()) <= bound)


@ATTACKS.register("minsum")
class MinSum(_DistanceBudget):
    """MinSum (Shejwalkar and Houmansadr, NDSS 2021, Sec. IV): m = mu + gamma p as ``minmax``,
    gamma the largest value (``halving_search``) with

        sum_i ||m - x_i||^2 <= max_i sum_j ||x_i - x_j||^2:

    the malicious message's summed squared distance to the honest rows is no larger than the
    worst honest row's. Since sum_i b_i = 0 the left side is sum_i a_i + h gamma^2 c, so gamma
    has the closed form sqrt((T - sum_i a_i) / (h c)) (T the right side); the halving search is
    kept, as the paper runs it, and the tests check it against that form."""

    def gamma(self, x: Tensor, p: Tensor) -> float:
        bound = float(pairwise_sq_distances(x).sum(dim=1).max())
        a, b, c = _scalars(x, p)
        if c == 0.0:
            return 0.0
        total_a, total_b, h = float(a.sum()), float(b.sum()), x.shape[0]
        return halving_search(lambda g: total_a + 2 * g * total_b + h * g * g * c <= bound)


# -- line search against the deployed rule ------------------------------------------------------


def rule_error(rnd: AttackRound, honest: Tensor, message: Tensor) -> float:
    """||Agg(honest + c copies of message) - mean(honest)||, c = n_total - h (at least
    n_byzantine), Agg the deployed rule with ``rule_f`` (else f, else c): the objective of the
    optimal attacks (module docstring for what the attacker assumes of the rule's input)."""
    return rule_objective(rnd, honest)(message)


def rule_objective(rnd: AttackRound, honest: Tensor) -> Callable[[Tensor], float]:
    """``message -> rule_error(rnd, honest, message)`` for one round's line search: the rule's
    work on the honest rows, the same at every message, is done once where the rule can
    (`Aggregator.with_fixed_rows`); a non-finite error counts as +inf."""
    copies = max(rnd.n_total - honest.shape[0], rnd.n_byzantine)
    f = rnd.rule_f if rnd.rule_f is not None else (rnd.f if rnd.f is not None else copies)
    if rnd.rule is None:
        raise ValueError("a rule-aware attack needs rule=, the deployed aggregation rule")
    if isinstance(rnd.rule, Aggregator):
        aggregate = rnd.rule.with_fixed_rows(honest, f=f, seed=0)
    else:  # the rule as a round calls it (FLTrust with its reference bound in): no shortcut
        aggregate = appended_rows(rnd.rule, honest, f=f, seed=0)
    centre = honest.double().mean(dim=0)

    def objective(message: Tensor) -> float:
        error = torch.linalg.vector_norm(aggregate(message, copies).double() - centre)
        value = float(error)
        return value if math.isfinite(value) else math.inf

    return objective


def line_maximise(
    objective: Callable[[float], float],
    *,
    evaluations: int = 20,
    start: float = 0.0,
    delta: float = 10.0,
    ratio: float = 0.8,
) -> float:
    """The bounded line search of ByzFL's optimal attacks (``Optimal_ALittleIsEnough``,
    ``Optimal_InnerProductManipulation``, version 0.0.11; our own code): at most ``evaluations``
    values of ``objective``. Expansion: from x = start, try x + delta, doubling delta after
    every improvement; at the first failure delta <- ratio * delta. Contraction: with the
    evaluations left, try best + delta, keep it if better, and delta <- ratio * delta after
    every try. Returns the best x seen (the first one on ties).

    "Better" means by more than 1e-12 relative: on a plateau of the objective (the rule's output
    no longer moves: Krum keeps an honest row, ARC clips the copies to the same norm) the
    computed values differ only in their last bits, and a search that followed that noise would
    change its answer with the float kernels (``ATEN_CPU_CAPABILITY``) and disagree with ByzFL."""

    def better(value: float, best: float) -> bool:
        return value > best + 1e-12 * abs(best)

    best_x, best_y = start, objective(start)
    left = evaluations - 1
    while left > 0:
        proposal = best_x + delta
        value = objective(proposal)
        left -= 1
        if better(value, best_y):
            best_x, best_y, delta = proposal, value, 2 * delta
        else:
            delta *= ratio
            break
    while left > 0:
        proposal = best_x + delta
        value = objective(proposal)
        left -= 1
        if better(value, best_y):
            best_x, best_y = proposal, value
        delta *= ratio
    return best_x


class _LineSearched(Attack):
    """An attack vector scaled by tau, tau chosen every round by ``line_maximise`` of
    ``rule_error``. Cost per round: 20 evaluations of the deployed rule on n rows (one
    read-back each), less where the rule does its work on the honest rows once
    (`rule_objective`: SWB rotates and sorts them once, not 20 times, and merges the
    message's copies into their per-rank order). Strength is accepted and unused
    (tau is searched); no ladder."""

    needs_rule = True
    default_adversary = True
    rule_aware = True
    adversary_stage = 2

    def message(self, mu: Tensor, sigma: Tensor, tau: float) -> Tensor:
        raise NotImplementedError

    def craft(self, rnd: AttackRound) -> Tensor:
        x = rnd.reference(self.name)
        if rnd.rule is None:
            raise ValueError(f"attack {self.name!r} needs rule=, the deployed aggregation rule")
        mu, sigma = mean_std(x)
        objective = rule_objective(rnd, x)
        tau = line_maximise(lambda t: objective(self.message(mu, sigma, t)))
        return rnd.repeat(self.message(mu, sigma, tau))


@ATTACKS.register("optimal_alie")
class OptimalALIE(_LineSearched):
    """Optimal ALIE (ByzFL's ``Optimal_ALittleIsEnough``; Baruch et al., NeurIPS 2019, with the
    strength searched against the rule, as in Allouah et al., AISTATS 2023): every Byzantine
    client sends

        m = mu + tau * sigma,   tau = argmax over the line search of ||Agg(X, c x m) - mu||,

    mu, sigma the honest rows' mean and unbiased std (ByzFL's direction: + sigma)."""

    def message(self, mu: Tensor, sigma: Tensor, tau: float) -> Tensor:
        return mu + tau * sigma


@ATTACKS.register("optimal_ipm")
class OptimalIPM(_LineSearched):
    """Optimal IPM (ByzFL's ``Optimal_InnerProductManipulation``; Xie et al., UAI 2020, with the
    strength searched against the rule): every Byzantine client sends

        m = -tau * mu,   tau = argmax over the line search of ||Agg(X, c x m) - mu||."""

    def message(self, mu: Tensor, sigma: Tensor, tau: float) -> Tensor:
        return -tau * mu
