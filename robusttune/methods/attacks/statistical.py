"""Attacks built from the honest rows' coordinate-wise statistics: ALIE, IPM, their SWB-DM
variants and Mimic."""

from __future__ import annotations

import math

import torch
from scipy.special import ndtri
from torch import Tensor

from robusttune.methods.attacks.base import ATTACKS, Attack, AttackRound, mean_std


def alie_z(n: int, f: int) -> float:
    """Baruch et al. (NeurIPS 2019, "A little is enough"), Sec. 3: with n inputs of which f are
    Byzantine, the attacker needs s = floor(n/2 + 1) - f honest "supporters", and

        z = Phi^{-1}((n - f - s) / (n - f)).

    Guard (ours): the cdf argument is clamped into [1/(2n), 1 - 1/(2n)] before Phi^{-1}. Every
    value strictly inside (0, 1) is at least 1/n from both ends (1 - cdf = s/(n - f) >= 1/n when
    s >= 1, and cdf = (ceil(n/2) - 1)/(n - f) >= 1/n when n >= 3), so the paper's z is unchanged
    wherever it is finite. The undefined cases become the most extreme quantile n samples resolve:
    a Byzantine majority (s <= 0, cdf >= 1, or n - f <= 0) gives z = Phi^{-1}(1 - 1/(2n)), and
    n <= 2 (cdf = 0) gives z = Phi^{-1}(1/(2n)). Example: z(25, 5) = Phi^{-1}(0.6) = 0.2533.
    """
    if n < 1:
        raise ValueError(f"ALIE needs n >= 1 aggregator inputs; got n={n}")
    honest = n - f
    s = math.floor(n / 2 + 1) - f
    cdf = (honest - s) / honest if honest > 0 else 1.0
    lo, hi = 1.0 / (2 * n), 1.0 - 1.0 / (2 * n)
    return float(ndtri(min(max(cdf, lo), hi)))


@ATTACKS.register("alie")
class ALIE(Attack):
    """A little is enough (Baruch, Baruch, Goldberg, NeurIPS 2019): every Byzantine client sends

        m = mu - s * z * sigma,   z = Phi^{-1}((n - f - S) / (n - f)),  S = floor(n/2 + 1) - f,

    mu, sigma the coordinate-wise mean and unbiased std of the honest messages (``torch.std``, as
    in epfml's ``ALittleIsEnoughAttack``), n = ``n_total`` (the rows of the attacker's scope: the
    aggregator's inputs by default), f = the ``f`` context if given else ``n_byzantine``; s = strength (default 1) multiplies z. Undefined
    quantiles (Byzantine majority, n <= 2) are clamped as in ``alie_z``.

    Strength ladder (1, 2, 4, 8): Baruch's z, then scaled up; at 8 the message sits 8 z standard
    deviations out, far past any robust statistic's acceptance band (the attack then trades its
    stealth for its size, which the map's worst case must include).
    """

    strength_ladder = (1.0, 2.0, 4.0, 8.0)

    def craft(self, rnd: AttackRound) -> Tensor:
        f = rnd.n_byzantine if rnd.f is None else rnd.f
        return self._message(rnd, rnd.reference(self.name), alie_z(rnd.n_total, f))

    def _message(self, rnd: AttackRound, source: Tensor, z: float) -> Tensor:
        """n_byzantine copies of mu - s * z * sigma, mu and sigma taken over the rows of source."""
        mu, sigma = mean_std(source)
        return rnd.repeat(mu - (self.strength * z) * sigma)


@ATTACKS.register("ipm")
class IPM(Attack):
    """Inner product manipulation (Xie, Koyejo, Gupta, UAI 2020, "Fall of empires"): every
    Byzantine client sends

        m = -eps * mu,   eps = strength (default 0.1, the paper's small-eps setting),

    so that <aggregate, mu> turns negative once the rule lets the Byzantine vectors dominate.

    Strength ladder (0.1, 1, 10, 1000): the paper's small eps, then eps large enough that f
    Byzantine messages reverse the mean of h honest ones (eps > h / f): at eps = 1000 any honest
    majority of up to 1000 agreeing clients per Byzantine one.
    """

    default_strength = 0.1
    min_strength = 0.0
    why_min_strength = "eps < 0 sends +|eps| mu, an honest helper"
    strength_ladder = (0.1, 1.0, 10.0, 1000.0)
    default_adversary = True  # breaks the mean at the first Byzantine client (DESIGN.md)

    def craft(self, rnd: AttackRound) -> Tensor:
        return rnd.repeat(-self.strength * rnd.reference(self.name).mean(dim=0))


def alie_z_swbdm(n: int, f: int) -> float:
    """ALIE's z as the SWB-DM study's code computes it from the round's (n, f):

        z = Phi^{-1}(clamp((n/2 - f) / max(n - f, 1), 1e-3, 1 - 1e-3)).

    It differs from Baruch's ``alie_z``: at n = 10, f = 2 it is Phi^{-1}(0.375) = -0.319 where
    Baruch's is Phi^{-1}(0.5) = 0, and a Byzantine half (f >= n/2) gives Phi^{-1}(1e-3) = -3.09,
    a large step the other way, where Baruch's clamp gives the largest positive quantile.
    """
    if n < 1:
        raise ValueError(f"ALIE needs n >= 1 aggregator inputs; got n={n}")
    argument = (n / 2 - f) / max(n - f, 1)
    return float(ndtri(min(max(argument, 1e-3), 1 - 1e-3)))


@ATTACKS.register("alie_swbdm")
class ALIESWBDM(ALIE):
    """ALIE as the SWB-DM study ran it (the ``attacks.py`` file of the repository its paper names):

        m = mu - s * z * sigma_pop,   z = ``alie_z_swbdm(n, f)``,
        sigma_pop = sqrt(sum_i (X_i - mu)^2 / h)   (the population std, 0 for one row),

    n = ``n_total``, f = ``f`` if given else ``n_byzantine``, s = strength (default 1). The
    paper grid (``search_spaces/paper_grid.yaml``) uses it with ``attack_scope: sample``;
    ``alie`` (Baruch's z, unbiased std) stays the default ALIE, DeMoA's setting. Strength ladder
    as ``alie``'s.
    """

    def craft(self, rnd: AttackRound) -> Tensor:
        f = rnd.n_byzantine if rnd.f is None else rnd.f
        source = rnd.reference(self.name)
        mu, sigma = mean_std(source, correction=0)
        return rnd.repeat(mu - (self.strength * alie_z_swbdm(rnd.n_total, f)) * sigma)


@ATTACKS.register("ipm_swbdm")
class IPMSWBDM(Attack):
    """IPM as the SWB-DM study ran it ("negates the honest gradient direction and norm-matches"):
    every Byzantine client sends

        m = -s * eps_t * mu,   eps_t = ((1/h) sum_i ||X_i||) / ||mu||,

    so ||m|| = s * the mean honest message norm, recomputed every round (s = strength, default 1).
    Honest messages that cancel (mu = 0) have no direction to negate: m = 0. ``ipm`` with its
    fixed eps = 0.1 stays the default IPM, DeMoA's setting. eps_t >= 1 always (the triangle
    inequality bounds ||mu|| by the mean norm), and it grows as the honest messages disagree.

    Strength ladder (1, 10, 100, 1000): the study's norm-matched message, then scaled up as
    ``ipm``'s is.
    """

    min_strength = 0.0
    why_min_strength = "s < 0 sends the norm-matched +mu, an honest helper"
    strength_ladder = (1.0, 10.0, 100.0, 1000.0)

    def craft(self, rnd: AttackRound) -> Tensor:
        source = rnd.reference(self.name)
        mu = source.mean(dim=0)
        mu_norm = torch.linalg.vector_norm(mu)
        mean_norm = torch.linalg.vector_norm(source, dim=1).mean()
        eps = torch.where(
            mu_norm > 0, mean_norm / mu_norm.clamp_min(torch.finfo(mu.dtype).tiny), 0.0
        )
        return rnd.repeat(-(self.strength * eps) * mu)


@ATTACKS.register("mimic")
class Mimic(Attack):
    """Mimic (Karimireddy, He, Jaggi, ICLR 2022, "Byzantine-robust learning on heterogeneous
    datasets via bucketing"; epfml's ``MimicVariantAttacker``): every Byzantine client sends an
    exact copy of one honest client's message, over-weighting that client's data distribution.

    Target choice here, recomputed every round from this round's honest messages X (h x d):
    centre them, Xc = X - mu; estimate the top principal direction v of Xc by ``power_iterations``
    (10) steps v <- Xc^T (Xc v) / ||Xc^T (Xc v)||, started from the centred row of largest norm
    (deterministic, no random numbers); send X_t with t = argmax_i |<Xc_i, v>| (first index on
    ties), the honest client farthest from the mean along the direction of largest variance.

    No strength ladder: a scaled copy is no longer a mimic (see below).

    Difference from epfml: there, z starts from a seed-0 Gaussian vector, is refined once per round
    by one power step over a running mean during a warm-up window, then the argmax of <g_i, z>
    (uncentred, signed) fixes the target rank, which is reused for the rest of training. Ours is
    stateless (a partially participating target may not be sampled again), uses several power
    steps in the round itself and the absolute centred projection (the sign of a power-iteration
    direction is arbitrary). Strength is accepted and unused: a scaled copy is no longer a mimic,
    so a sweep over ``attack_strength`` sees identical runs. When h == 0 a Byzantine client's
    ``own`` message is copied.
    """

    power_iterations: int = 10

    def craft(self, rnd: AttackRound) -> Tensor:
        x = rnd.reference(self.name)
        return rnd.repeat(x.index_select(0, self.target(x).view(1))[0])

    def target(self, x: Tensor) -> Tensor:
        """Index (a 0-d tensor on x's device, never read back) of the row every Byzantine client
        copies. A zero direction (all rows identical, or a power step orthogonal to every row)
        gives equal projections, and the first row: any copy is then as good."""
        xc = x - x.mean(dim=0)
        v = xc.index_select(0, xc.norm(dim=1).argmax().view(1))[0]
        tiny = torch.finfo(xc.dtype).tiny
        for _ in range(self.power_iterations):
            w = (xc @ v) @ xc
            v = w / w.norm().clamp_min(tiny)
        return (xc @ v).abs().argmax()
