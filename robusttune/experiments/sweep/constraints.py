"""What a search space's ``constraints`` section excludes (`constraint_violation`): the rule
that an attack goes with Byzantine clients and the clean run without them, and the ``drop``
combinations. The grid's expansion drops what it names; under Optuna a reachable one is an
error (`robusttune.experiments.sweep.space`)."""

from __future__ import annotations

from robusttune.core.runspec import RunSpec
from robusttune.experiments.sweep.domains import describe_values
from robusttune.experiments.sweep.space_file import ConstraintSpec

__all__ = ["constraint_violation"]


def constraint_violation(spec: RunSpec, constraints: ConstraintSpec) -> str | None:
    """Why ``spec`` is excluded by ``constraints``, or None.

    attack_matches_byzantine: the clean attack ``none`` only without Byzantine clients, and any
    other attack only with at least one (an attack with no attacker repeats the clean run)."""
    if constraints.attack_matches_byzantine:
        if spec.attack == "none" and spec.n_byzantine > 0:
            return "attack none with Byzantine clients (attack_matches_byzantine)"
        if spec.attack != "none" and spec.n_byzantine == 0:
            return "an attack without Byzantine clients (attack_matches_byzantine)"
    for rule in constraints.drop:
        if all(getattr(spec, key) in allowed for key, allowed in rule.items()):
            return f"constraints.drop {describe_values({k: v[0] if len(v) == 1 else list(v) for k, v in rule.items()})}"
    return None
