"""The worst case, defined once: the adversary that `breakdown`, `calibrate` and robust tuning
judge a defence against.

An `Adversary` turns a point with Byzantine clients into the attacker settings it runs (its
*variants*, each a mapping of RunSpec keys):

    variants(a) = for each combination c of ``settings``' values (key -> values):
                      c, if c sets attack_strength,
                      else {c, attack_strength: s} for s in ladder(attack(c)), or c alone when the
                      attack has no ladder (none, label_flip, mimic);
    attack(c)   = c's attack if it names one, else a (the cell's own attack).

Without ``settings`` a point runs its cell's attack over that attack's `strength_ladder`
(robusttune.methods.attacks). `Adversary.default()` is the worst case when nobody names an attack:
every attack whose class attribute ``default_adversary`` is True (`default_attacks`), each over
its ladder. ``adaptive`` > 0 adds, per group of variants that share everything but the strength
and whose ladder spans a range, that many strengths proposed by a seeded Optuna study minimising
the point's score (`robusttune.methods.adaptive.StrengthSearch`).

Staged order. The attacks a setting lists run cheapest first: stably sorted by their class
attribute ``adversary_stage`` (0 the strength ladders, 1 rule-aware messages at one
pairwise-distance product a round, 2 the optimal attacks' 20 rule calls a round), so a staged
evaluator (`robusttune.experiments.breakdown.spec_evaluator`, which runs a point's variants in this order and
stops at the first that breaks it) reaches the expensive attacks only at points every cheaper
one survived. The order changes no verdict: a point survives iff it survives every variant.
With the ladders first, the attack that broke a cell's first failing point is of the family
`family_of` names "rule-aware" exactly when every ladder survived that point.

The point's outcome is the worst variant: the lowest `score` (accuracy, 0 when collapsed), the
first in variant order among equals (`worst_of`). Attack strength is never a knob a defence is
tuned over: the defence maximises this minimum.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from itertools import product
from typing import Any

from robusttune.core.registry import SpecError

__all__ = [
    "STRENGTH",
    "Adversary",
    "adversary_variants",
    "default_attacks",
    "family_of",
    "score",
    "stage_of",
    "staged_order",
    "worst_of",
]

STRENGTH = "attack_strength"


def default_attacks() -> tuple[str, ...]:
    """The attacks the default worst case runs: those whose class sets ``default_adversary``
    (sign_flip and ipm, and the rule-aware attacks), in `staged_order`."""
    from robusttune.methods.attacks import ATTACKS

    return staged_order(
        [name for name in ATTACKS.names() if getattr(ATTACKS[name], "default_adversary", False)]
    )


def staged_order(attacks: Sequence[str]) -> tuple[str, ...]:
    """``attacks`` stably sorted by ``adversary_stage``, cheapest first (module docstring);
    an unknown name is a SpecError."""
    from robusttune.methods.attacks import ATTACKS

    for attack in attacks:
        _ladder(attack)
    return tuple(sorted(attacks, key=lambda name: ATTACKS[name].adversary_stage))


def stage_of(attack: str) -> int:
    """``attack``'s ``adversary_stage`` (module docstring: 0 the ladders, 1 and 2 the
    rule-aware attacks, dearer per run)."""
    from robusttune.methods.attacks import ATTACKS

    _ladder(attack)
    return int(ATTACKS[attack].adversary_stage)


def family_of(attack: str) -> str:
    """The family a report names for ``attack``: "rule-aware" (it chooses its message against
    the deployed rule every round, ``rule_aware``) or "ladder" (one fixed direction scaled by
    a strength, or no strength at all)."""
    from robusttune.methods.attacks import ATTACKS

    _ladder(attack)
    return "rule-aware" if ATTACKS[attack].rule_aware else "ladder"


def score(outcome: Any) -> float:
    """What a defence maximises and the adversary minimises: an outcome's accuracy, 0 when it
    collapsed (an object with ``accuracy`` and ``collapsed``)."""
    return 0.0 if outcome.collapsed else outcome.accuracy


def worst_of(outcomes: Sequence[Any]) -> int:
    """The position of the worst outcome: the first with the lowest `score`."""
    return min(range(len(outcomes)), key=lambda i: score(outcomes[i]))


def _ladder(attack: str) -> tuple[float, ...]:
    from robusttune.methods.attacks import ATTACKS

    if attack not in ATTACKS:
        raise SpecError(
            f"adversary attack must be one of {', '.join(ATTACKS.names())}; got {attack!r}"
        )
    return ATTACKS[attack].strength_ladder


@dataclass(frozen=True)
class Adversary:
    """The worst case a point with Byzantine clients is judged by (module docstring):
    ``settings`` (RunSpec key -> values tried, in order, the attacks in `staged_order`; empty:
    the cell's attack) and
    ``adaptive`` (strength-search runs per searchable group, 0: the ladders only)."""

    settings: tuple[tuple[str, tuple[Any, ...]], ...] = ()
    adaptive: int = 0

    @classmethod
    def of(
        cls, settings: Mapping[str, Sequence[Any]] | None = None, adaptive: int = 0
    ) -> Adversary:
        """Validated: values listed, adaptive >= 0, no adaptive search over strengths given;
        the attacks listed in `staged_order`."""
        settings = dict(settings or {})
        for key, values in settings.items():
            if isinstance(values, (str, bytes)) or not isinstance(values, Sequence) or not values:
                raise SpecError(f"adversary.{key} must list at least one value; got {values!r}")
        if adaptive < 0:
            raise SpecError(f"adaptive must be >= 0 runs; got {adaptive}")
        if adaptive and STRENGTH in settings:
            raise SpecError(
                "the adaptive adversary searches each attack's own strength range; "
                "allowed with it: no adversary.attack_strength"
            )
        if "attack" in settings:
            settings["attack"] = list(staged_order(settings["attack"]))
        return cls(tuple((k, tuple(v)) for k, v in settings.items()), int(adaptive))

    @classmethod
    def default(cls, attacks: Sequence[str] = (), adaptive: int = 0) -> Adversary:
        """Every attack in ``attacks`` (default: `default_attacks`) over its ladder."""
        return cls.of({"attack": list(attacks) or list(default_attacks())}, adaptive)

    @property
    def mapping(self) -> dict[str, list[Any]]:
        return {k: list(v) for k, v in self.settings}

    @property
    def attacks(self) -> tuple[str, ...] | None:
        """The attacks named (None: the cell's own)."""
        return dict(self.settings).get("attack")

    def variants(self, attack: str) -> list[dict[str, Any]]:
        """The attacker settings a point of a cell attacked by ``attack`` runs, in order."""
        keys = [k for k, _ in self.settings]
        grid = [dict(zip(keys, combo)) for combo in product(*(v for _, v in self.settings))]
        out: list[dict[str, Any]] = []
        for variant in grid or [{}]:
            if STRENGTH in variant:
                out.append(variant)
                continue
            ladder = _ladder(variant.get("attack", attack))
            out += [{**variant, STRENGTH: s} for s in ladder] or [variant]
        return out

    def searches(self, attack: str) -> list[tuple[dict[str, Any], tuple[float, ...]]]:
        """The adaptive searches a point of ``attack``'s cell runs: (the group's settings without
        the strength, its ladder) for every group whose ladder spans a range; none without
        ``adaptive``."""
        from robusttune.methods.adaptive import spans_a_range

        if not self.adaptive:
            return []
        groups: list[tuple[dict[str, Any], tuple[float, ...]]] = []
        for variant in self.variants(attack):
            group = {k: v for k, v in variant.items() if k != STRENGTH}
            ladder = _ladder(group.get("attack", attack))
            if spans_a_range(ladder) and all(g != group for g, _ in groups):
                groups.append((group, ladder))
        return groups

    def runs_per_point(self, attack: str) -> int:
        """Variants plus adaptive runs a point with Byzantine clients costs in full."""
        return len(self.variants(attack)) + self.adaptive * len(self.searches(attack))

    def describe(self, attack: str | None = None) -> str:
        """One phrase for output: ``sign_flip x4, ipm x4 (+ adaptive 4)``."""
        counts: dict[str, int] = {}
        for variant in self.variants(attack or "none"):
            name = variant.get("attack", attack or "none")
            counts[name] = counts.get(name, 0) + 1
        text = ", ".join(f"{name} x{n}" for name, n in counts.items())
        return text + (f" (+ adaptive {self.adaptive} per attack)" if self.adaptive else "")


def adversary_variants(
    attack: str, adversary: Mapping[str, Sequence[Any]] | None
) -> list[dict[str, Any]]:
    """`Adversary.variants` of the mapping ``adversary`` (None: ``attack``'s own ladder)."""
    return Adversary.of(adversary).variants(attack)
