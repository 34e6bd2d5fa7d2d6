"""Byzantine behaviours (registry). An attack is a small callable object:
``attack(honest, n_byzantine=..., n_total=..., **context: Any) -> Tensor[n_byzantine, d]``.

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
minmax, minsum  own only when h == 0 (``attack_direction``: std, unit or sign)
fang_trmean     generator; own only when h == 0
fang_krum       rule_f (``needs_rule``); own only when h == 0
optimal_alie    rule, rule_f (``needs_rule``: the deployed rule, evaluated 20 times a round)
optimal_ipm     as optimal_alie
=============== ============================================================================

Rule-aware attacks (``rule_aware``, ``fang``) choose their message against the deployed rule
every round; their strength is searched, not scaled, so they have no ladder.
``default_adversary``: whether the attack belongs to a cell's default worst case (sign flip,
IPM and the rule-aware attacks).

``needs_own`` says whether the attack's output depends on ``own`` when honest rows exist.
"""

from __future__ import annotations

from typing import Any

# importing the families registers their attacks
from robusttune.methods.attacks import cache, fang, rule_aware, simple, statistical  # noqa: F401
from robusttune.methods.attacks.base import ATTACKS, Attack, AttackRound
from robusttune.methods.attacks.statistical import alie_z, alie_z_swbdm

__all__ = ["ATTACKS", "Attack", "AttackRound", "alie_z", "alie_z_swbdm", "make_attack"]


def make_attack(name: str, /, **params: Any) -> Attack:
    """Build attack ``name``; its one knob is ``attack_strength`` (None: the attack's default).
    An unknown name or a parameter that is neither the knob nor a RunSpec key is a ``SpecError``."""
    return ATTACKS.make(name, **params)
