"""Server algorithms (registry): what the clients compute, what is aggregated, how the model moves.

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
from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor

from robusttune.caches import ByzantineMomenta, MomentumCache, StateCache
from robusttune.registry import Registry
from robusttune.sampling import Sample
from robusttune.schema import RUNSPEC_KEYS
from robusttune.training import batch_orders, client_gradients, train_clients

if TYPE_CHECKING:  # the resolver (config) sits above this registry and reads its entries
    from torch import nn

    from robusttune.config import RunSpec

ALGORITHMS: Registry[type["ServerAlgorithm"]] = Registry("algorithm", RUNSPEC_KEYS)


@dataclass(frozen=True)
class RoundPlan:
    """Who works this round and what kind of round it is, chosen by the algorithm from the
    participation draw before anyone computes (Byz-VR-MARINA-PP's coin: a full round asks
    every client for its full local gradient)."""

    clients: Tensor     # long[k] on the host, sorted
    full: bool = False  # a full-participation round (every client, full local gradients)


@dataclass(frozen=True)
class RoundState:
    """One round as the algorithm opened it (rows aligned with ``sample.clients``)."""

    sample: Sample
    honest: Tensor      # [k, d] what each sampled client would honestly send, in update space
    decay: float = 1.0  # factor applied to every unsampled momentum this round (DeMoA's P)
    full: bool = False  # RoundPlan.full: Byz-VR-MARINA-PP's full-gradient round


@dataclass(frozen=True)
class AttackView:
    """The aggregator's input as it will be once this round's messages land, in update space, as
    an omniscient attacker sees it beforehand: the rows of the sampled Byzantine clients hold their
    honest messages as placeholders and are marked Byzantine with every row a Byzantine client
    wrote earlier and that stays in the input."""

    rows: Tensor        # [n_in, d], a tensor of its own (never the live cache)
    byzantine: Tensor   # bool[n_in], on the host


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
    methods: dict[str, str] = {}
    rule_methods: bool = False
    rule_overridable: bool = False

    def __init__(self, spec: RunSpec, initial: Tensor, sample_counts: Tensor,
                 byzantine: Tensor) -> None:
        self.spec = spec
        self.num_clients = spec.clients
        self.sample_counts = sample_counts.to(initial.device, torch.float32)

    def weights(self, counts: Tensor) -> Tensor | None:
        """The rule's weights for inputs from clients with sample ``counts``: the counts, or None
        (unweighted) under ``aggregate_weights: uniform``."""
        return counts if self.spec.aggregate_weights == "samples" else None

    def plan(self, drawn: Tensor, generator: torch.Generator) -> RoundPlan:
        """Who works this round, from the participation draw ``drawn`` (host long[k]). Most
        algorithms take the draw as it is; ``generator`` is the run's sampling stream (a coin an
        algorithm draws there is checkpointed with it)."""
        return RoundPlan(drawn)

    def local_work(self, plan: RoundPlan, net: nn.Module, params: Tensor,
                   data: list[tuple[Tensor, Tensor]], seeds: list[int], trainer: str) -> Tensor:
        """What each of ``data``'s owners computes at the global model ``params``: trained
        states (E local epochs of SGD(lr, momentum)) or one minibatch gradient, rows aligned
        with ``data``."""
        spec = self.spec
        if self.trains_locally:
            return train_clients(net, params, data, epochs=spec.local_epochs,
                                 batch_size=spec.batch_size, lr=spec.lr, momentum=spec.momentum,
                                 seeds=seeds, strategy=trainer)
        return client_gradients(net, params, data, batch_size=spec.batch_size, seeds=seeds,
                                strategy=trainer)

    def participation_rate(self, sampled: int) -> float:
        """p_t: the Bernoulli probability, or n/N for a fixed-size draw."""
        if self.spec.participation_mode == "bernoulli":
            return self.spec.participation
        return sampled / self.num_clients

    def begin_round(self, sample: Sample, local: Tensor, model: Tensor,
                    plan: RoundPlan | None = None) -> RoundState:
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


class _StateAlgorithm(ServerAlgorithm):
    """Messages are trained states; w <- w + eta (Agg - w), eta = server_lr (1: replace). Clients
    start every round from the global model, so they hold no state of their own."""

    def begin_round(self, sample: Sample, local: Tensor, model: Tensor,
                    plan: RoundPlan | None = None) -> RoundState:
        return RoundState(sample, local - model)

    def step(self, model: Tensor, aggregate: Tensor, state: RoundState | None = None) -> Tensor:
        if self.spec.server_lr == 1.0:
            return aggregate
        return model + self.spec.server_lr * (aggregate - model)


@ALGORITHMS.register("fedavg")
class FedAvg(_StateAlgorithm):
    """FedAvg (McMahan et al., 2017): aggregate the sampled clients' trained states. Every rule's
    name is a method of it (``method: krum`` is FedAvg with Krum), as in the SWB-DM study."""

    methods = {"fedavg": "mean"}
    rule_methods = True

    def inputs(self, state: RoundState, messages: Tensor, model: Tensor) -> AggregatorInput:
        return AggregatorInput(model + messages,
                               self.weights(self.sample_counts.index_select(0, state.sample.clients)),
                               state.sample.byzantine_cpu.clone())


@ALGORITHMS.register("state_cache")
class StateCacheAlgorithm(_StateAlgorithm):
    """SWB-DM's delayed cache (Section IV-B): c_i <- s_i for sampled i, kept otherwise;
    w <- Agg(c_1, ..., c_N)."""

    aggregates_cache = True
    methods = {"swb_dm": "swb", "delayed_momentum": "median"}

    def __init__(self, spec: RunSpec, initial: Tensor, sample_counts: Tensor,
                 byzantine: Tensor) -> None:
        super().__init__(spec, initial, sample_counts, byzantine)
        self.cache = StateCache(spec.clients, initial, spec.cache_dtype)

    def attack_view(self, state: RoundState, model: Tensor) -> AttackView:
        # read() is the cache itself for float32: the subtraction makes the view's own tensor
        rows = self.cache.read() - model
        return _with_round(rows, self.cache.written_by_byzantine, state)

    def inputs(self, state: RoundState, messages: Tensor, model: Tensor) -> AggregatorInput:
        self.cache.refresh(state.sample, model + messages)
        return AggregatorInput(self.cache.read(), self.weights(self.sample_counts),
                               self.cache.written_by_byzantine.clone())

    def state_dict(self) -> dict[str, Any]:
        return {"cache": self.cache.state_dict()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.cache.load_state_dict(state["cache"])


class _MomentumAlgorithm(ServerAlgorithm):
    """Messages are client momenta; x <- x - eta * Agg(momenta).

    Per round with sampling rate p: a sampled client computes
    m_i <- c(p) m_i + alpha g_i and sends it; every other momentum (the client's own and the
    server's copy alike) becomes P(p) m_i. ``coefficient`` is c(p), ``unsampled_decay`` P(p).
    An honest client's momentum is the server's copy of it; a Byzantine client's honest momentum
    follows the same recursion in ``byzantine_momenta`` while the server's copy holds what it sent.
    """

    trains_locally = False
    # DeMoA's server step x <- x - eta m is a gradient step, so eta is a learning rate (FedAvg-style
    # algorithms replace the model by the aggregate: eta = 1)
    default_server_lr = 0.1
    rule_overridable = True  # DeMoA's experiments run it with CM, Krum, RFA and CCLIP
    # DeMoA (Sec. 3) aggregates the n clients' momenta with a (delta, c)-robust rule, one vote each
    default_weights = "uniform"

    def __init__(self, spec: RunSpec, initial: Tensor, sample_counts: Tensor,
                 byzantine: Tensor) -> None:
        super().__init__(spec, initial, sample_counts, byzantine)
        zeros = torch.zeros_like(initial)
        self.momenta = MomentumCache(spec.clients, zeros, spec.cache_dtype)
        self.byzantine_momenta = ByzantineMomenta(byzantine, zeros, spec.cache_dtype)
        self.last_aggregate = zeros.clone()

    def coefficient(self, p: float) -> float:
        raise NotImplementedError

    def unsampled_decay(self, p: float) -> float:
        return 1.0

    def begin_round(self, sample: Sample, local: Tensor, model: Tensor,
                    plan: RoundPlan | None = None) -> RoundState:
        p = self.participation_rate(sample.size)
        held = self.momenta.slots.index_select(0, sample.clients).float()
        byzantine = sample.clients.index_select(0, sample.byzantine_rows)
        held.index_copy_(0, sample.byzantine_rows, self.byzantine_momenta.read(byzantine))
        honest = self.coefficient(p) * held + self.spec.demoa_alpha * local
        return RoundState(sample, honest, self.unsampled_decay(p))

    def _remember(self, state: RoundState, messages: Tensor) -> None:
        """Every momentum moves one round: unsampled ones decay, sampled ones take what was sent
        (server copy) and what the Byzantine clients honestly computed (their own)."""
        sample = state.sample
        self.momenta.decay(state.decay)
        self.momenta.refresh(sample, messages)
        self.byzantine_momenta.decay(state.decay)
        self.byzantine_momenta.refresh(sample.clients.index_select(0, sample.byzantine_rows),
                                       state.honest.index_select(0, sample.byzantine_rows))

    def previous(self, model: Tensor) -> Tensor:
        return self.last_aggregate

    def step(self, model: Tensor, aggregate: Tensor, state: RoundState | None = None) -> Tensor:
        self.last_aggregate = aggregate
        return model - self.spec.server_lr * aggregate

    def state_dict(self) -> dict[str, Any]:
        return {"momenta": self.momenta.state_dict(),
                "byzantine_momenta": self.byzantine_momenta.state_dict(),
                "last_aggregate": self.last_aggregate}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.momenta.load_state_dict(state["momenta"])
        self.byzantine_momenta.load_state_dict(state["byzantine_momenta"])
        self.last_aggregate = state["last_aggregate"].to(self.last_aggregate.device).clone()


@ALGORITHMS.register("demoa")
class DeMoA(_MomentumAlgorithm):
    """DeMoA (Otsuka, Takezawa, Yamada, ICML 2026, Sec. 3): with p = p_t,

        sampled i:      m_i <- (1 - alpha p) m_i + alpha g_i,   g_i one minibatch gradient at x
        not sampled:    m_i <- (1 - alpha p) m_i                (the server decays its copy: after
                        tau unsampled rounds the slot is P(m_i) = prod_s (1 - alpha_s p_s) m_i)
        m = Agg(all N momenta, fresh and decayed),   x <- x - eta m.

    ``demoa_ablation`` names the paper's ablations (Sec. 3, "ablations"):

    - ``none``: DeMoA as above.
    - ``coefficient_swap``: (1 - alpha p) -> (1 - alpha) for a sampled client and unsampled
      momenta left as they are: the naive momentum the paper contrasts with its coefficient,
      whose variance gains alpha^2 p (1 - p) ||m_i||^2.
    - ``no_decay``: the preprocessing P dropped (P = id): unsampled momenta are aggregated as
      they were last sent, and a client's momentum changes only in rounds it is sampled (a client
      nobody contacts computes nothing). With alpha = 1 and ``aggregator: mean`` this is MIFA,
      for which the paper's robustness constant is infinite.
    """

    aggregates_cache = True
    methods = {"demoa": "cclip"}

    def coefficient(self, p: float) -> float:
        alpha = self.spec.demoa_alpha
        if self.spec.demoa_ablation == "coefficient_swap":
            return 1.0 - alpha
        return 1.0 - alpha * p

    def unsampled_decay(self, p: float) -> float:
        if self.spec.demoa_ablation == "none":
            return 1.0 - self.spec.demoa_alpha * p
        return 1.0

    def attack_view(self, state: RoundState, model: Tensor) -> AttackView:
        rows = self.momenta.read() * state.decay  # a new tensor even when decay is 1
        return _with_round(rows, self.momenta.written_by_byzantine, state)

    def inputs(self, state: RoundState, messages: Tensor, model: Tensor) -> AggregatorInput:
        self._remember(state, messages)
        return AggregatorInput(self.momenta.read(), self.weights(self.sample_counts),
                               self.momenta.written_by_byzantine.clone())


@ALGORITHMS.register("fedcm")
class FedCM(_MomentumAlgorithm):
    """FedCM-style baseline (Xu et al., 2021, as DeMoA compares against it): a sampled client
    computes m_i <- (1 - alpha) m_i + alpha g_i, unsampled momenta stay as they are, and
    m = Agg(the sampled momenta), x <- x - eta m."""

    methods = {"fedcm": "mean"}

    def coefficient(self, p: float) -> float:
        return 1.0 - self.spec.demoa_alpha

    def inputs(self, state: RoundState, messages: Tensor, model: Tensor) -> AggregatorInput:
        self._remember(state, messages)
        return AggregatorInput(messages,
                               self.weights(self.sample_counts.index_select(0, state.sample.clients)),
                               state.sample.byzantine_cpu.clone())


def _with_round(rows: Tensor, written_by_byzantine: Tensor, state: RoundState) -> AttackView:
    """A cache's rows (a tensor of the view's own) with this round's honest messages in the
    sampled slots; Byzantine: what Byzantine clients wrote earlier and this round's."""
    rows.index_copy_(0, state.sample.clients, state.honest)
    byzantine = written_by_byzantine.clone()
    byzantine[state.sample.clients_cpu] = state.sample.byzantine_cpu
    return AttackView(rows, byzantine)


def make_algorithm(spec: RunSpec, initial: Tensor, sample_counts: Tensor,
                   byzantine: Tensor | None = None) -> ServerAlgorithm:
    """The server algorithm the spec names, holding its caches on ``initial``'s device.
    ``byzantine``: bool[N], which clients are Byzantine (None: nobody)."""
    if byzantine is None:
        byzantine = torch.zeros(spec.clients, dtype=torch.bool)
    return ALGORITHMS[spec.algorithm](spec, initial, sample_counts, byzantine.to(initial.device))
