"""What the sampled Byzantine clients send in one round: their rows of the round's messages
replaced by the attack's, with the statistics the run's ``attack_scope`` shows the attacker
(the round loop, `robusttune.engine.simulation`, calls it once a round)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor

from robusttune.methods.aggregators import Aggregator
from robusttune.methods.algorithms import RoundState, ServerAlgorithm
from robusttune.methods.attacks import Attack

__all__ = ["byzantine_messages"]


def byzantine_messages(
    attack: Attack,
    algorithm: ServerAlgorithm,
    state: RoundState,
    model: Tensor,
    *,
    scope: str,
    generator: torch.Generator | None,
    rule: Aggregator | Callable[..., Tensor] | None = None,
    rule_f: int | None = None,
) -> Tensor:
    """The round's messages: ``state.honest`` with the sampled Byzantine clients' rows replaced
    by what ``attack`` crafts (a new tensor; ``state.honest`` stays what they honestly computed).

    The attacker's statistics come from ``scope`` (RunSpec ``attack_scope``): ``inputs`` takes
    the honest rows of the aggregator's input as it will be after this round (all N cached rows
    under a cache algorithm), n = its row count and f = its Byzantine rows; ``sample`` takes the
    round's honest messages, n = the sample size and f = the Byzantine clients sampled;
    ``population`` takes the rows of ``inputs`` with n = N clients and f = B Byzantine clients
    (the run's, ``spec.clients`` and ``spec.n_byzantine``), so ALIE's z is the same under every
    algorithm (DeMoA's comparison, like the epfml code its attacks follow, uses the global n and
    f). Each Byzantine client's ``own`` is its honest message, built from its own honest state.
    A ``needs_rule`` attack is handed ``rule`` (the deployed rule) and ``rule_f`` (its f)."""
    sample, honest = state.sample, state.honest
    over_inputs = scope in ("inputs", "population")
    view = None
    if attack.needs_cache or (over_inputs and algorithm.aggregates_cache):
        view = algorithm.attack_view(state, model)
    if over_inputs and view is not None:
        rows = (~view.byzantine).nonzero().flatten().to(view.rows.device, non_blocking=True)
        reference = view.rows.index_select(0, rows)
        n_total, f = view.rows.shape[0], int(view.byzantine.sum())
    else:
        reference = honest.index_select(0, sample.honest_rows)
        n_total, f = sample.size, sample.n_byzantine
    if scope == "population":
        n_total, f = algorithm.spec.clients, algorithm.spec.n_byzantine
    context: dict[str, Any] = {}
    if attack.needs_cache:
        assert view is not None  # read above for every cache attack
        context = {"cache": view.rows, "cache_byzantine": view.byzantine}
    if attack.needs_rule:
        context.update(rule=rule, rule_f=rule_f)
    malicious = attack(
        reference,
        n_byzantine=sample.n_byzantine,
        n_total=n_total,
        f=f,
        n_sampled=sample.size,
        own=honest.index_select(0, sample.byzantine_rows),
        generator=generator,
        **context,
    )
    return honest.index_copy(0, sample.byzantine_rows, malicious.to(honest.dtype))
