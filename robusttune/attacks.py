"""Byzantine behaviours (registry). An attack is a small callable object:
``attack(honest, n_byzantine=..., n_total=..., **context) -> Tensor[n_byzantine, d]``.

Attacks are omniscient. Messages are always in update space (a trained state minus the current
global model, or a momentum), so formulas such as IPM's -eps * mu mean what their papers say
whatever the server algorithm aggregates.

Shared notation. ``honest`` is X in R^{h x d}, the honest rows the attacker computes its
statistics over, and ``n_total`` is n, the number of rows that set is drawn from (honest and
Byzantine). Which rows those are is the run's ``attack_scope``, chosen by the round loop:

- ``inputs`` (default, the stronger, omniscient view): every row the rule aggregates, so under
  ``state_cache`` and ``demoa`` the N cached rows with this round's messages in place; n = N and
  f = the Byzantine rows among them (stale malicious slots and this round's Byzantine clients).
- ``sample``: this round's sampled messages; n = the sample size, f = the Byzantine clients in it
  (the SWB-DM grid: "ALIE's perturbation magnitude is computed analytically from the round's
  (n, f) values", its attacker knowing "the benign updates in a round but not the cache state").

Without a cache both scopes are the sample. mu = (1/h) sum_i X_i and
sigma = sqrt(sum_i (X_i - mu)^2 / (h - 1)) are the coordinate-wise mean and unbiased standard
deviation (the ``torch.std`` default, as in the epfml code of Karimireddy et al. and the ALIE
code it follows; sigma is defined as 0 when fewer than two rows are available, where the unbiased
estimator is undefined). Every attack has ONE knob, ``attack_strength`` (``None``: the attack's
documented default), and returns exactly ``n_byzantine`` rows on the input's device and dtype
(``[0, d]`` when ``n_byzantine == 0``).

A round with no honest row has a defined, documented behaviour (no silent fallback to honest
training): when h == 0, attacks that need honest statistics estimate them from ``own``, the
messages the Byzantine clients would honestly have sent (they are also clients with data, and
under the momentum algorithms they keep their own honest momentum), and raise ``ValueError`` if
``own`` is not given either.

Randomness comes only from the call-time ``generator`` (the run's ``torch.Generator``). An attack
that needs random numbers and gets ``generator=None`` uses a fresh ``torch.Generator`` seeded 0 on
the input's device, so it stays reproducible but draws the same noise on every call: the round
loop should always pass its generator.

Context each attack reads (the round loop passes it by keyword):

=============== ============================================================================
none            own (required)
label_flip      own (required: the messages trained on flipped labels; ``data_side``)
sign_flip       own (used when given, else -strength * mu)
bit_flip        same as sign_flip
gaussian        own (used when given, else mu), generator
alie            n_total, f (optional; default n_byzantine); own only when h == 0
alie_swbdm      as alie
ipm, ipm_swbdm  own only when h == 0
mimic           own only when h == 0
cache_alie      cache, cache_byzantine (``needs_cache``); without them plain ALIE
strategic_skip  n_sampled (the number SAMPLED this round), own (required when honest-looking)
=============== ============================================================================

``needs_own`` says whether the attack's output depends on ``own`` when honest rows exist.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch
from scipy.stats import norm
from torch import Tensor

from robusttune.registry import Registry, SpecError
from robusttune.schema import RUNSPEC_KEYS

__all__ = ["ATTACKS", "Attack", "AttackRound", "alie_z", "make_attack"]

ATTACKS: Registry[type["Attack"]] = Registry("attack", RUNSPEC_KEYS)


@dataclass(frozen=True)
class AttackRound:
    """One round's input to an attack, checked once by ``Attack.__call__``."""

    honest: Tensor                     # [h, d] the honest rows of the attacker's scope
    n_byzantine: int                   # rows to return
    n_total: int                       # n: rows of the attacker's scope, honest and Byzantine
    n_sampled: int                     # clients sampled this round (n_total unless given)
    own: Tensor | None                 # [n_byzantine, d] what the Byzantine clients would honestly send
    f: int | None                      # the corruption count the attacker plans for (ALIE)
    cache: Tensor | None               # [N, d] the aggregator's whole input, fresh and cached
    cache_byzantine: Tensor | None     # [N] bool, True on Byzantine rows of ``cache``
    generator: torch.Generator | None

    @property
    def h(self) -> int:
        return self.honest.shape[0]

    @property
    def d(self) -> int:
        return self.honest.shape[1]

    def reference(self, attack: str) -> Tensor:
        """The honest messages the attack computes its statistics from: ``honest`` when h > 0,
        else ``own`` (the Byzantine clients' own honest messages; see the module docstring)."""
        if self.h > 0:
            return self.honest
        if self.own is None:
            raise ValueError(
                f"attack {attack!r}: no honest client was sampled this round (h == 0) and own= "
                "was not given, so there are no honest messages to estimate statistics from"
            )
        return self.own

    def require_own(self, attack: str) -> Tensor:
        if self.own is None:
            raise ValueError(f"attack {attack!r} needs own=, the Byzantine clients' honest messages")
        return self.own

    def repeat(self, row: Tensor) -> Tensor:
        """``n_byzantine`` copies of one message (separate storage, so callers may write in place)."""
        return row.unsqueeze(0).repeat(self.n_byzantine, 1)


class Attack:
    """Base of every attack.

    ``data_side``: the attack acts on the Byzantine clients' training data (``poison_labels``),
    and their message is what they trained. ``needs_cache``: the round loop passes ``cache``
    (the aggregator's whole input, fresh and cached, in update space) and ``cache_byzantine``
    (a bool mask of its Byzantine rows). ``needs_own``: the message is built from ``own``, so the
    Byzantine clients must train honestly even when honest clients are sampled. Context passed by
    keyword at call time: ``own`` the messages the Byzantine clients would honestly have sent
    (Tensor[n_byzantine, d]), ``f``, ``generator`` (the run's torch.Generator).

    Subclasses implement ``craft(rnd) -> Tensor[n_byzantine, d]``; ``__call__`` checks shapes
    and answers ``n_byzantine == 0`` with an empty ``[0, d]`` tensor before ``craft`` runs.
    """

    name: str = "base"
    data_side: bool = False
    needs_cache: bool = False
    needs_own: bool = False
    default_strength: float = 1.0
    min_strength: float | None = None  # smallest allowed attack_strength (None: any finite value)
    # The strengths a worst-case breakdown map tries (each attack documents why its ladder ends
    # where it does); empty: the attack has no strength to scale (none, label_flip, mimic).
    strength_ladder: tuple[float, ...] = ()

    def __init__(self, attack_strength: float | None = None) -> None:
        strength = self.default_strength if attack_strength is None else attack_strength
        try:
            strength = float(strength)
        except (TypeError, ValueError):
            raise SpecError(
                f"attack_strength must be a finite number for attack {self.name!r}; got {strength!r}"
            ) from None
        if not math.isfinite(strength):
            raise SpecError(f"attack_strength must be a finite number for attack {self.name!r}; "
                            f"got {strength}")
        if self.min_strength is not None and strength < self.min_strength:
            raise SpecError(f"attack_strength must be >= {self.min_strength:g} for attack "
                            f"{self.name!r}; got {strength}")
        self.strength = strength

    def __repr__(self) -> str:
        return f"{type(self).__name__}(attack_strength={self.strength:g})"

    def poison_labels(self, labels: Tensor, num_classes: int) -> Tensor:
        return labels

    def __call__(self, honest: Tensor, *, n_byzantine: int, n_total: int, own: Tensor | None = None,
                 f: int | None = None, cache: Tensor | None = None,
                 cache_byzantine: Tensor | None = None,
                 generator: torch.Generator | None = None, n_sampled: int | None = None) -> Tensor:
        if honest.ndim != 2:
            raise ValueError(f"attack {self.name!r}: honest must be [h, d]; got shape {tuple(honest.shape)}")
        d = honest.shape[1]
        n_byzantine, n_total = int(n_byzantine), int(n_total)
        if n_byzantine < 0 or n_total < n_byzantine:
            raise ValueError(f"attack {self.name!r}: need 0 <= n_byzantine <= n_total; got "
                             f"n_byzantine={n_byzantine}, n_total={n_total}")
        if own is not None and tuple(own.shape) != (n_byzantine, d):
            raise ValueError(f"attack {self.name!r}: own must be [n_byzantine={n_byzantine}, d={d}]; "
                             f"got shape {tuple(own.shape)}")
        if cache is not None:
            if cache.ndim != 2 or cache.shape[1] != d:
                raise ValueError(f"attack {self.name!r}: cache must be [N, d={d}]; got shape "
                                 f"{tuple(cache.shape)}")
            if cache_byzantine is None or tuple(cache_byzantine.shape) != (cache.shape[0],):
                raise ValueError(f"attack {self.name!r}: cache needs cache_byzantine, a bool mask of "
                                 f"shape [{cache.shape[0]}]")
        if n_byzantine == 0:
            return honest.new_empty((0, d))
        n_sampled = n_total if n_sampled is None else int(n_sampled)
        out = self.craft(AttackRound(honest, n_byzantine, n_total, n_sampled, own,
                                     None if f is None else int(f), cache, cache_byzantine, generator))
        return out.to(device=honest.device, dtype=honest.dtype)

    def craft(self, rnd: AttackRound) -> Tensor:
        raise NotImplementedError


# ---------------------------------------------------------------------------------------------
# helpers


def mean_std(x: Tensor, correction: int = 1) -> tuple[Tensor, Tensor]:
    """Coordinate-wise mean and std of the rows of x, sigma = sqrt(sum_i (x_i - mu)^2 / (h - c))
    (c = ``correction``: 1 unbiased, as ``torch.std``; 0 the population std); std is 0 where
    h - c < 1. Two passes written out: ``torch.std`` over dim 0 ran 12x slower on a CPU thread
    ([22, 53002]: 13.8 ms against 1.1 ms), and ALIE over N cached rows calls it every round."""
    h = x.shape[0]
    mu = x.mean(dim=0)
    if h - correction < 1:
        return mu, torch.zeros_like(mu)
    return mu, (x - mu).square_().sum(dim=0).div_(h - correction).sqrt_()


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
    return float(norm.ppf(min(max(cdf, lo), hi)))


def _standard_normal(shape: tuple[int, ...], like: Tensor, generator: torch.Generator | None) -> Tensor:
    """N(0, 1) draws shaped ``shape`` on ``like``'s device and dtype, from ``generator`` (drawn on
    the generator's own device, then moved); None -> a fresh generator seeded 0 (module docstring)."""
    if generator is None:
        generator = torch.Generator(device=like.device).manual_seed(0)
    draws = torch.randn(shape, generator=generator, device=generator.device, dtype=like.dtype)
    return draws.to(like.device)


# ---------------------------------------------------------------------------------------------
# attacks


@ATTACKS.register("none")
class NoAttack(Attack):
    """No attack: Byzantine clients send what they honestly trained (``own``). It breaks nothing,
    so a breakdown map refuses a cell with it."""

    needs_own = True

    def craft(self, rnd: AttackRound) -> Tensor:
        return rnd.require_own(self.name)


@ATTACKS.register("label_flip")
class LabelFlip(Attack):
    """Label flipping (data side): Byzantine clients train on y -> K - 1 - y and send the result
    (``own``, which the round loop trains on ``poison_labels``). Strength is unused."""

    data_side = True
    needs_own = True

    def poison_labels(self, labels: Tensor, num_classes: int) -> Tensor:
        return num_classes - 1 - labels

    def craft(self, rnd: AttackRound) -> Tensor:
        return rnd.require_own(self.name)


@ATTACKS.register("sign_flip")
class SignFlip(Attack):
    """Sign flipping: each Byzantine client i sends the negation of the update it would honestly
    have sent, scaled by the strength s (default 1):

        m_i = -s * own_i          (own given)
        m_i = -s * mu             (own not given: every Byzantine client sends the same vector)

    The SWB-DM study's "sign-flip" attack. With s = 1 and ``own`` this is exactly ``bit_flip``.

    Strength ladder (1, 3, 10, 100): the flip itself, then scaled up; at s = 100 one Byzantine
    client among up to 100 honest ones reverses the mean of their agreeing updates.
    """

    needs_own = True
    strength_ladder = (1.0, 3.0, 10.0, 100.0)

    def craft(self, rnd: AttackRound) -> Tensor:
        if rnd.own is not None:
            return -self.strength * rnd.own
        mu = rnd.reference(self.name).mean(dim=0)
        return rnd.repeat(-self.strength * mu)


@ATTACKS.register("bit_flip")
class BitFlip(SignFlip):
    """Bit flipping (Allen-Zhu et al., ICLR 2021; Karimireddy, He, Jaggi, ICML 2021 / ICLR 2022,
    the attack in DeMoA's experiments): a Byzantine worker sends -g instead of its own g (epfml's
    ``BitFlippingWorker.get_gradient`` returns ``-super().get_gradient()``).

        m_i = -s * own_i          (own given; s = 1 default)
        m_i = -s * mu             (own not given)

    Equivalent to ``sign_flip`` in this package: the same formula and knob, kept as a separate
    name so that the DeMoA experiments (where messages are momenta, so the Byzantine client sends
    its negated honest momentum) and the SWB-DM ones keep their papers' names. The name "bit
    flipping" refers to flipping the sign bit of every float, not to random bit errors.
    """


@ATTACKS.register("gaussian")
class GaussianNoise(Attack):
    """Additive Gaussian noise: each Byzantine client i sends its honest message plus independent
    noise,

        m_i = b_i + s * rms * xi_i,   xi_i ~ N(0, I_d) drawn from ``generator``,
        rms = sqrt((1/d) sum_j mu_j^2) = ||mu||_2 / sqrt(d),

    where b_i = own_i when ``own`` is given (else b_i = mu) and mu is the honest mean message (the
    mean of ``own`` when h == 0). Default s = 1: the noise has the per-coordinate scale of the
    honest mean update, so its norm ~= ||mu|| (a noise-to-signal ratio of one; the attack stays in
    proportion as updates shrink during training). s >= 0; s = 0 returns the honest message.
    Noise is drawn on the generator's device and moved; generator=None -> seed-0 fallback.

    Strength ladder (1, 10, 100, 1000): noise of growing scale, up to 1000 times the honest
    signal, where the noise alone outweighs the sum of 1000 honest messages.
    """

    needs_own = True
    min_strength = 0.0
    strength_ladder = (1.0, 10.0, 100.0, 1000.0)

    def craft(self, rnd: AttackRound) -> Tensor:
        mu = rnd.reference(self.name).mean(dim=0)
        base = rnd.own if rnd.own is not None else rnd.repeat(mu)
        rms = mu.square().mean().sqrt()
        noise = _standard_normal((rnd.n_byzantine, rnd.d), base, rnd.generator)
        return base + (self.strength * rms) * noise


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
    strength_ladder = (0.1, 1.0, 10.0, 1000.0)

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
    return float(norm.ppf(min(max(argument, 1e-3), 1 - 1e-3)))


@ATTACKS.register("alie_swbdm")
class ALIESWBDM(ALIE):
    """ALIE as the SWB-DM study ran it (the ``attacks.py`` of the repository its paper names):

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

    strength_ladder = (1.0, 10.0, 100.0, 1000.0)

    def craft(self, rnd: AttackRound) -> Tensor:
        source = rnd.reference(self.name)
        mu = source.mean(dim=0)
        mu_norm = torch.linalg.vector_norm(mu)
        mean_norm = torch.linalg.vector_norm(source, dim=1).mean()
        eps = torch.where(mu_norm > 0, mean_norm / mu_norm.clamp_min(torch.finfo(mu.dtype).tiny), 0.0)
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


@ATTACKS.register("cache_alie")
class CacheALIE(ALIE):
    """Cache-aware ALIE (adaptive; neither SWB-DM nor DeMoA evaluated it): ALIE computed over the
    aggregator's whole input, fresh and cached, which is what a delayed-cache rule actually sees:

        m = mu_c - s * z(N, B) * sigma_c,

    mu_c, sigma_c the coordinate-wise mean and unbiased std of the honest cache rows
    ``cache[~cache_byzantine]``, N = number of cache rows, B = number of Byzantine rows
    (``cache_byzantine.sum()``: the round loop marks the slots this round's Byzantine clients are
    about to overwrite as Byzantine too), z as in ``alie_z``, s = strength (default 1). Every
    Byzantine client sends the same vector. It reads the cache whatever ``attack_scope`` says, so
    under the default ``inputs`` scope it equals ``alie``; with ``attack_scope: sample`` it is the
    cache-aware attacker beside a sample-scope ALIE.

    Without ``cache`` this is plain ``alie`` with n = ``n_total`` and f = ``f`` or
    ``n_byzantine``. A cache with no honest row takes mu, sigma from ``honest`` (``own`` when
    h == 0), keeping z(N, B).
    """

    needs_cache = True

    def craft(self, rnd: AttackRound) -> Tensor:
        if rnd.cache is None:
            return super().craft(rnd)
        # the mask is bookkeeping on the host: its counts never wait for the device
        mask = rnd.cache_byzantine.detach().cpu().bool()
        rows = (~mask).nonzero().flatten().to(rnd.cache.device, non_blocking=True)
        honest_rows = rnd.cache.index_select(0, rows)
        source = honest_rows if len(rows) > 0 else rnd.reference(self.name)
        z = alie_z(rnd.cache.shape[0], int(mask.sum()))
        return self._message(rnd, source.to(rnd.honest.dtype), z)


@ATTACKS.register("strategic_skip")
class StrategicSkip(Attack):
    """Strategic skipping (adaptive; the threat the SWB-DM paper names in its introduction): the
    Byzantine clients behave honestly (send ``own``) unless they hold at least half of the sampled
    set,

        2 * n_byzantine >= n_sampled,   n_sampled = the number of clients SAMPLED this round

    (the round loop passes it even when the aggregator runs over a cache of N rows; without it,
    ``n_total``). In such a round every Byzantine client sends

        m = -s * mu,   s = strength (default 10), mu over the attacker's scope,

    the same vector from all of them, so that an order statistic (median, trimmed mean, Krum's
    neighbourhood) lands on it, and a large step against the honest direction (10x the honest mean,
    reversed) drives the model away in a single round. Data poisoning is off (``data_side`` False):
    the honest-looking rounds are genuinely honest, so the run is clean until the sample turns.

    Strength ladder (1, 10, 100, 1000): from a plain reversed mean to one that outweighs up to
    1000 honest messages in the round it strikes.
    """

    needs_own = True
    default_strength = 10.0
    strength_ladder = (1.0, 10.0, 100.0, 1000.0)

    def craft(self, rnd: AttackRound) -> Tensor:
        if 2 * rnd.n_byzantine < rnd.n_sampled:
            return rnd.require_own(self.name)
        return rnd.repeat(-self.strength * rnd.reference(self.name).mean(dim=0))


def make_attack(name: str, /, **params: Any) -> Attack:
    """Build attack ``name``; its one knob is ``attack_strength`` (None: the attack's default).
    An unknown name or a parameter that is neither the knob nor a RunSpec key is a ``SpecError``."""
    return ATTACKS.make(name, **params)
