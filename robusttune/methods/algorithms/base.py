"""Server algorithms, the common part: the registry, a round's types and the base class; what the clients compute, what is aggregated, how the model moves.

`fedavg` and `state_cache` aggregate trained model states (as the SWB-DM code does: SWB is not
translation-equivariant, so states and deltas differ); `demoa` and `fedcm` aggregate client
momenta built from one minibatch gradient per round. Attacks always see messages in update space
(state - global model, or the momentum itself); `inputs` maps them back to what is aggregated.

A round has an explicit order and no state passes between calls through attributes:
``state = begin_round(sample, local, model)`` (what every sampled client would honestly send;
changes nothing),
``attack_view(state, model)`` (what an omniscient attacker sees of the aggregator's input;
changes nothing), ``inputs(state, messages, model)`` (stores the round in the caches and returns
the rule's input), ``step(model, aggregate)``.

Byzantine clients are clients too: under the momentum algorithms each keeps the momentum it would
honestly hold (`ByzantineMomenta`), apart from the server's copy of what it sent, so an attack's
``own`` is its honest momentum and not a recursion over its own past malicious messages.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar

import torch
from torch import Tensor

from robusttune.core.registries import ALGORITHMS as ALGORITHMS  # the algorithms register here
from robusttune.core.schema import RunSchema
from robusttune.problem.sampling import Sample
from robusttune.problem.training import client_gradients, train_clients

if TYPE_CHECKING:  # annotations only; the spec type is the schema, below the resolver
    from torch import nn


@dataclass(frozen=True)
class RoundPlan:
    """Who works this round and what kind of round it is, chosen by the algorithm from the
    participation draw before anyone computes (Byz-VR-MARINA-PP's coin: a full round asks
    every client for its full local gradient)."""

    clients: Tensor  # long[k] on the host, sorted
    full: bool = False  # a full-participation round (every client, full local gradients)


@dataclass(frozen=True)
class RoundState:
    """One round as the algorithm opened it (rows aligned with ``sample.clients``)."""

    sample: Sample
    honest: Tensor  # [k, d] what each sampled client would honestly send, in update space
    decay: float = 1.0  # factor applied to every unsampled momentum this round (DeMoA's P)
    full: bool = False  # RoundPlan.full: Byz-VR-MARINA-PP's full-gradient round


@dataclass(frozen=True)
class AttackView:
    """The aggregator's input as it will be once this round's messages land, in update space, as
    an omniscient attacker sees it beforehand: the rows of the sampled Byzantine clients hold their
    honest messages as placeholders and are marked Byzantine with every row a Byzantine client
    wrote earlier and that stays in the input."""

    rows: Tensor  # [n_in, d], a tensor of its own (never the live cache)
    byzantine: Tensor  # bool[n_in], on the host


@dataclass(frozen=True)
class AggregatorInput:
    """What the rule receives this round, and which of its rows come from Byzantine clients."""

    rows: Tensor
    weights: Tensor | None  # None: unweighted (``aggregate_weights: uniform``)
    byzantine_rows: Tensor  # bool[n_in], on the host
    previous: Tensor | None = None  # the rule's centre when the round sets it (else previous())


class ServerAlgorithm:
    """Base: the per-round protocol of one server algorithm.

    ``trains_locally``: clients run E local epochs and send trained states (FedAvg style);
    otherwise they compute one minibatch gradient and send a momentum (DeMoA style).
    ``aggregates_cache``: the rule runs over all N cached rows, so it runs even in a round that
    sampled nobody (Bernoulli), and the attacker's ``inputs`` scope differs from the sample.

    What the resolver reads by the algorithm's name: ``default_server_lr`` (eta when server_lr
    is not given), ``methods`` (the ``method:`` presets that run this algorithm, each with its
    rule), ``rule_methods`` (every rule's name is also a method of this algorithm: FedAvg) and
    ``rule_overridable`` (its methods take another rule, labelled ALGORITHM+RULE) and
    ``default_weights`` (what ``aggregate_weights: auto`` resolves to: ``samples`` weighs the
    rule's inputs by the clients' sample counts, ``uniform`` gives each client one vote).
    """

    name: str = "base"
    trains_locally: bool = True
    aggregates_cache: bool = False
    default_server_lr: float = 1.0
    # FedAvg (McMahan et al., 2017) weighs client k by n_k / n; SWB-DM's code does the same
    default_weights: str = "samples"
    methods: ClassVar[dict[str, str]] = {}
    rule_methods: bool = False
    rule_overridable: bool = False

    def __init__(
        self, spec: RunSchema, initial: Tensor, sample_counts: Tensor, byzantine: Tensor
    ) -> None:
        self.spec = spec
        self.num_clients = spec.clients
        self.sample_counts = sample_counts.to(initial.device, torch.float32)

    @classmethod
    def variant(cls, spec: RunSchema) -> type[ServerAlgorithm]:
        """The class that runs ``spec`` under this entry's name: itself, unless a named option of
        the algorithm selects another form of it (``marina_variant``). The resolver reads the
        registry entry's attributes whichever class runs."""
        return cls

    def weights(self, counts: Tensor) -> Tensor | None:
        """The rule's weights for inputs from clients with sample ``counts``: the counts, or None
        (unweighted) under ``aggregate_weights: uniform``."""
        return counts if self.spec.aggregate_weights == "samples" else None

    def plan(self, drawn: Tensor, generator: torch.Generator) -> RoundPlan:
        """Who works this round, from the participation draw ``drawn`` (host long[k]). Most
        algorithms take the draw as it is; ``generator`` is the run's sampling stream (a coin an
        algorithm draws there is checkpointed with it)."""
        return RoundPlan(drawn)

    def local_work(
        self,
        plan: RoundPlan,
        net: nn.Module,
        params: Tensor,
        data: list[tuple[Tensor, Tensor]],
        seeds: list[int],
        trainer: str,
    ) -> Tensor:
        """What each of ``data``'s owners computes at the global model ``params``: trained
        states (E local epochs of SGD(lr, momentum)) or one minibatch gradient, rows aligned
        with ``data``."""
        spec = self.spec
        if self.trains_locally:
            return train_clients(
                net,
                params,
                data,
                epochs=spec.local_epochs,
                batch_size=spec.batch_size,
                lr=spec.lr,
                momentum=spec.momentum,
                seeds=seeds,
                strategy=trainer,
            )
        return client_gradients(
            net, params, data, batch_size=spec.batch_size, seeds=seeds, strategy=trainer
        )

    def participation_rate(self, sampled: int) -> float:
        """p_t: the Bernoulli probability, or n/N for a fixed-size draw."""
        if self.spec.participation_mode == "bernoulli":
            return self.spec.participation
        return sampled / self.num_clients

    def begin_round(
        self, sample: Sample, local: Tensor, model: Tensor, plan: RoundPlan | None = None
    ) -> RoundState:
        """The honest messages of the sampled clients (update space) from what they computed
        (``local``: trained states or minibatch gradients, rows aligned with the sample)."""
        raise NotImplementedError

    def attack_view(self, state: RoundState, model: Tensor) -> AttackView:
        """Without a cache the aggregator's input is the round's sample."""
        return AttackView(state.honest, state.sample.byzantine_cpu)

    def inputs(self, state: RoundState, messages: Tensor, model: Tensor) -> AggregatorInput:
        """Store this round's ``messages`` (what was sent, rows aligned with the sample) where
        the algorithm keeps them; return the rule's input."""
        raise NotImplementedError

    def previous(self, model: Tensor) -> Tensor:
        """The point the rule's inputs move from (CCLIP's centre, FLTrust's origin)."""
        return model

    def step(self, model: Tensor, aggregate: Tensor, state: RoundState | None = None) -> Tensor:
        """The new global model from the aggregate (``state``: the round, for algorithms whose
        step depends on its kind)."""
        raise NotImplementedError

    def state_dict(self) -> dict[str, Any]:
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        pass


def _with_round(rows: Tensor, written_by_byzantine: Tensor, state: RoundState) -> AttackView:
    """A cache's rows (a tensor of the view's own) with this round's honest messages in the
    sampled slots; Byzantine: what Byzantine clients wrote earlier and this round's."""
    rows.index_copy_(0, state.sample.clients, state.honest)
    byzantine = written_by_byzantine.clone()
    byzantine[state.sample.clients_cpu] = state.sample.byzantine_cpu
    return AttackView(rows, byzantine)


def make_algorithm(
    spec: RunSchema, initial: Tensor, sample_counts: Tensor, byzantine: Tensor | None = None
) -> ServerAlgorithm:
    """The server algorithm the spec names, holding its caches on ``initial``'s device.
    ``byzantine``: bool[N], which clients are Byzantine (None: nobody)."""
    if byzantine is None:
        byzantine = torch.zeros(spec.clients, dtype=torch.bool)
    built = ALGORITHMS[spec.algorithm].variant(spec)
    own = spec.params_for(ALGORITHMS, spec.algorithm) if hasattr(spec, "params_for") else {}
    return built(spec, initial, sample_counts, byzantine.to(initial.device), **own)
