"""The attack contract: the registry, one round's input (``AttackRound``), the ``Attack`` base
class and the statistics the attack families share (notation: the package docstring)."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
from torch import Tensor

from robusttune.core.numerics import sqrt
from robusttune.core.registries import ATTACKS as ATTACKS  # the attacks register here
from robusttune.core.registry import SpecError

if TYPE_CHECKING:
    from robusttune.methods.aggregators import Aggregator


@dataclass(frozen=True)
class AttackRound:
    """One round's input to an attack, checked once by ``Attack.__call__``."""

    honest: Tensor  # [h, d] the honest rows of the attacker's scope
    n_byzantine: int  # rows to return
    n_total: int  # n: rows of the attacker's scope, honest and Byzantine
    n_sampled: int  # clients sampled this round (n_total unless given)
    own: Tensor | None  # [n_byzantine, d] what the Byzantine clients would honestly send
    f: int | None  # the corruption count the attacker plans for (ALIE)
    cache: Tensor | None  # [N, d] the aggregator's whole input, fresh and cached
    cache_byzantine: Tensor | None  # [N] bool, True on Byzantine rows of ``cache``
    generator: torch.Generator | None
    # the deployed rule (``needs_rule`` attacks), or the rule as the round calls it (FLTrust's
    # with its reference bound in)
    rule: Aggregator | Callable[..., Tensor] | None = None
    rule_f: int | None = None  # the f that rule is told this round

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
            raise ValueError(
                f"attack {attack!r} needs own=, the Byzantine clients' honest messages"
            )
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
    needs_rule: bool = False
    default_strength: float = 1.0
    min_strength: float | None = None  # smallest allowed attack_strength (None: any finite value)
    # what a strength below min_strength would do, for the error line (IPM's eps < 0 sends +mu)
    why_min_strength: str = ""
    # The strengths a worst-case breakdown map tries (each attack documents why its ladder ends
    # where it does); empty: the attack has no strength to scale (none, label_flip, mimic).
    strength_ladder: tuple[float, ...] = ()
    # Whether the shared worst case (robusttune.methods.adversary.default_attacks: calibrate's and robust
    # tuning's adversary when none is named) runs this attack over its ladder.
    default_adversary: bool = False
    # Whether the attack chooses its message against the deployed rule every round (MinMax,
    # MinSum, Fang et al.'s, the optimal ALIE / IPM): its family in a map's report, beside the
    # strength ladders that scale one fixed direction.
    rule_aware: bool = False
    # Where a staged adversary tries it (robusttune.methods.adversary: cheapest stage first, and a point
    # stops at its first break): 0 a closed-form message per round (the ladders), 1 a
    # rule-aware message at no more than one pairwise-distance product of the honest rows per
    # round (O(h^2 d): MinMax, MinSum, Fang's), 2 evaluations of the deployed rule every round
    # (the optimal attacks' 20-point line search: 20 rule calls).
    adversary_stage: int = 0

    def __init__(self, attack_strength: float | None = None) -> None:
        strength = self.default_strength if attack_strength is None else attack_strength
        try:
            strength = float(strength)
        except (TypeError, ValueError):
            raise SpecError(
                f"attack_strength must be a finite number for attack {self.name!r}; got {strength!r}"
            ) from None
        if not math.isfinite(strength):
            raise SpecError(
                f"attack_strength must be a finite number for attack {self.name!r}; got {strength}"
            )
        if self.min_strength is not None and strength < self.min_strength:
            why = f" ({self.why_min_strength})" if self.why_min_strength else ""
            raise SpecError(
                f"attack_strength must be >= {self.min_strength:g} for attack "
                f"{self.name!r}; got {strength:g}{why}"
            )
        self.strength = strength

    def __repr__(self) -> str:
        return f"{type(self).__name__}(attack_strength={self.strength:g})"

    def poison_labels(self, labels: Tensor, num_classes: int) -> Tensor:
        return labels

    def __call__(
        self,
        honest: Tensor,
        *,
        n_byzantine: int,
        n_total: int,
        own: Tensor | None = None,
        f: int | None = None,
        cache: Tensor | None = None,
        cache_byzantine: Tensor | None = None,
        generator: torch.Generator | None = None,
        n_sampled: int | None = None,
        rule: Aggregator | Callable[..., Tensor] | None = None,
        rule_f: int | None = None,
    ) -> Tensor:
        if honest.ndim != 2:
            raise ValueError(
                f"attack {self.name!r}: honest must be [h, d]; got shape {tuple(honest.shape)}"
            )
        d = honest.shape[1]
        n_byzantine, n_total = int(n_byzantine), int(n_total)
        if n_byzantine < 0 or n_total < n_byzantine:
            raise ValueError(
                f"attack {self.name!r}: need 0 <= n_byzantine <= n_total; got "
                f"n_byzantine={n_byzantine}, n_total={n_total}"
            )
        if own is not None and tuple(own.shape) != (n_byzantine, d):
            raise ValueError(
                f"attack {self.name!r}: own must be [n_byzantine={n_byzantine}, d={d}]; "
                f"got shape {tuple(own.shape)}"
            )
        if cache is not None:
            if cache.ndim != 2 or cache.shape[1] != d:
                raise ValueError(
                    f"attack {self.name!r}: cache must be [N, d={d}]; got shape "
                    f"{tuple(cache.shape)}"
                )
            if cache_byzantine is None or tuple(cache_byzantine.shape) != (cache.shape[0],):
                raise ValueError(
                    f"attack {self.name!r}: cache needs cache_byzantine, a bool mask of "
                    f"shape [{cache.shape[0]}]"
                )
        if n_byzantine == 0:
            return honest.new_empty((0, d))
        n_sampled = n_total if n_sampled is None else int(n_sampled)
        out = self.craft(
            AttackRound(
                honest,
                n_byzantine,
                n_total,
                n_sampled,
                own,
                None if f is None else int(f),
                cache,
                cache_byzantine,
                generator,
                rule,
                None if rule_f is None else int(rule_f),
            )
        )
        return out.to(device=honest.device, dtype=honest.dtype)

    def craft(self, rnd: AttackRound) -> Tensor:
        raise NotImplementedError


def mean_std(x: Tensor, correction: int = 1) -> tuple[Tensor, Tensor]:
    """Coordinate-wise mean and std of the rows of x, sigma = sqrt(sum_i (x_i - mu)^2 / (h - c))
    (c = ``correction``: 1 unbiased, as ``torch.std``; 0 the population std); std is 0 where
    h - c < 1. Two passes written out: ``torch.std`` over dim 0 ran 12x slower on a CPU thread
    ([22, 53002]: 13.8 ms against 1.1 ms), and ALIE over N cached rows calls it every round."""
    h = x.shape[0]
    mu = x.mean(dim=0)
    if h - correction < 1:
        return mu, torch.zeros_like(mu)
    # the root correctly rounded (numerics.sqrt): MKL's would give sigma CPU-dependent last bits
    return mu, sqrt((x - mu).square_().sum(dim=0).div_(h - correction))


def standard_normal(
    shape: tuple[int, ...], like: Tensor, generator: torch.Generator | None
) -> Tensor:
    """N(0, 1) draws shaped ``shape`` on ``like``'s device and dtype, from ``generator`` (drawn on
    the generator's own device, then moved); None -> a fresh generator seeded 0 (module docstring)."""
    if generator is None:
        generator = torch.Generator(device=like.device).manual_seed(0)
    draws = torch.randn(shape, generator=generator, device=generator.device, dtype=like.dtype)
    return draws.to(like.device)


# ---------------------------------------------------------------------------------------------
