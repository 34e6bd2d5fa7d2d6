"""Fang et al.'s full-knowledge local model poisoning attacks (USENIX Security 2020, "Local model
poisoning attacks to Byzantine-robust federated learning", Sec. 4): against the coordinate-wise
median and trimmed mean, and against Krum.

Both are stated for local models around the current global model w; here, as for every attack of
the package, they act on updates (w's role is played by 0), and the change direction is
s = sign(mu), mu the mean honest update: the direction the global model moves in without attack.
"""

from __future__ import annotations

import torch
from torch import Tensor

from robusttune.core.numerics import sqrt
from robusttune.methods.aggregators.distance import krum_scores
from robusttune.methods.aggregators.geometry import pairwise_sq_distances
from robusttune.methods.attacks.base import ATTACKS, Attack, AttackRound


def uniform(shape: tuple[int, ...], like: Tensor, generator: torch.Generator | None) -> Tensor:
    """U[0, 1) draws on ``like``'s device and dtype from ``generator`` (drawn on the generator's
    device, then moved); None -> a fresh generator seeded 0, as ``standard_normal``."""
    if generator is None:
        generator = torch.Generator(device=like.device).manual_seed(0)
    draws = torch.rand(shape, generator=generator, device=generator.device, dtype=like.dtype)
    return draws.to(like.device)


@ATTACKS.register("fang_trmean")
class FangTrimmedMean(Attack):
    """Fang et al.'s full-knowledge attack on the trimmed mean (which they also run against the
    median, Sec. 4.2), per coordinate j, with s_j = sign(mu_j) (1 where mu_j = 0),
    w_max,j / w_min,j the largest / smallest honest value and b = strength (default 2, the
    paper's; b >= 1): every Byzantine client i draws, independently,

        s_j = -1:  m_ij ~ U[w_max,j, b w_max,j]   (w_max,j > 0)   or U[w_max,j, w_max,j / b]  (<= 0)
        s_j = +1:  m_ij ~ U[w_min,j / b, w_min,j] (w_min,j > 0)   or U[b w_min,j, w_min,j]    (<= 0)

    just beyond the honest extreme opposite the change direction, so every order statistic the
    rule keeps moves against it. Randomness: the run's generator. One pass over the h x d
    honest rows per round (their extremes), no search. No ladder: b sets how far past the
    extremes, and the paper's 2 is the attack."""

    default_adversary = True
    rule_aware = True
    adversary_stage = 1
    default_strength = 2.0
    min_strength = 1.0
    why_min_strength = "b < 1 draws inside the honest range instead of beyond its extremes"

    def craft(self, rnd: AttackRound) -> Tensor:
        x = rnd.reference(self.name)
        b = self.strength
        upward = x.mean(dim=0) < 0  # s_j = -1: push the coordinate up, past the largest value
        top, bottom = x.amax(dim=0), x.amin(dim=0)
        # the extreme the message starts from, and the far end of the interval it is drawn in
        edge = torch.where(upward, top, bottom)
        grows = torch.where(upward, top > 0, bottom <= 0)  # the interval's far end is b * edge
        far = torch.where(grows, b * edge, edge / b)
        u = uniform((rnd.n_byzantine, rnd.d), x, rnd.generator)
        return edge + u * (far - edge)


@ATTACKS.register("fang_krum")
class FangKrum(Attack):
    """Fang et al.'s full-knowledge attack on Krum (Sec. 4.1): every Byzantine client sends

        m = -lambda s,   s = sign(mu),

    lambda the largest value found for which Krum, told f = ``rule_f`` (the deployed rule's f;
    else the Byzantine rows c), selects m among the h honest rows and the c copies. The search
    starts at the paper's bound (D the Euclidean distance, Gamma_i the n - c - 2 honest rows
    nearest x_i, at least one),

        lambda_0 = 1 / ((n - 2c - 1) sqrt(d)) min_i sum_{l in Gamma_i} D(x_l, x_i)
                   + 1 / sqrt(d) max_i ||x_i||       (the first term dropped when n <= 2c + 1),

    halves lambda until Krum selects m (the paper's loop; at most 40 halvings), then bisects
    between the selected lambda and the rejected 2 lambda 10 more times, keeping the largest
    selected. If no lambda is selected it sends the last, smallest one. Krum's choice is computed
    from the h x h honest distances (one O(h^2 d) product per round) and the closed form
    ||m - x_i||^2 = ||x_i||^2 + 2 lambda <s, x_i> + lambda^2 ||s||^2: O(n^2) per test, with a
    strict win over every honest score (so a tie is never counted as selected). Strength is
    accepted and unused; no ladder."""

    needs_rule = True
    default_adversary = True
    rule_aware = True
    adversary_stage = 1
    halvings, refinements = 40, 10

    def craft(self, rnd: AttackRound) -> Tensor:
        x = rnd.reference(self.name)
        h, d = x.shape
        c = max(rnd.n_total - h, rnd.n_byzantine)
        n = h + c
        f = rnd.rule_f if rnd.rule_f is not None else c
        s = torch.sign(x.mean(dim=0))
        honest_sq = pairwise_sq_distances(x).double().cpu()
        norms_sq = x.double().square().sum(dim=1).cpu()
        dots = (x @ s).double().cpu()
        s_sq = float(s.double().square().sum())
        if s_sq == 0.0:  # no change direction: nothing to push against
            return rnd.repeat(torch.zeros_like(s))

        def selected(lam: float) -> bool:
            to_crafted = norms_sq + 2 * lam * dots + lam * lam * s_sq  # ||-lam s - x_i||^2
            dist = torch.zeros(n, n, dtype=torch.float64)
            dist[:h, :h] = honest_sq
            dist[:h, h:] = to_crafted[:, None]
            dist[h:, :h] = to_crafted[None, :]
            scores = krum_scores(dist, f)
            return bool(scores[h] < scores[:h].min()) if h else True

        lam = self.bound(honest_sq, norms_sq, n, c, d)
        for _ in range(self.halvings):
            if selected(lam):
                break
            lam /= 2
        else:
            return rnd.repeat(-lam * s)
        low, high = lam, 2 * lam
        for _ in range(self.refinements):
            middle = (low + high) / 2
            low, high = (middle, high) if selected(middle) else (low, middle)
        return rnd.repeat(-low * s)

    @staticmethod
    def bound(honest_sq: Tensor, norms_sq: Tensor, n: int, c: int, d: int) -> float:
        """Fang et al.'s upper bound lambda_0 on lambda (class docstring)."""
        h = honest_sq.shape[0]
        far = float(sqrt(norms_sq).max()) / d**0.5
        if n - 2 * c - 1 <= 0 or h < 2:
            return far if far > 0 else 1.0
        k = min(max(n - c - 2, 1), h - 1)
        others = sqrt(honest_sq) + torch.diag(torch.full((h,), float("inf"), dtype=torch.float64))
        nearest = torch.topk(others, k, dim=1, largest=False).values.sum(dim=1)
        value = float(nearest.min()) / ((n - 2 * c - 1) * d**0.5) + far
        return value if value > 0 else 1.0
