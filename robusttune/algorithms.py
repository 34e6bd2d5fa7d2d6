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

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor

from robusttune.caches import ByzantineMomenta, MomentumCache, StateCache
from robusttune.registry import Registry
from robusttune.sampling import Sample
from robusttune.schema import RUNSPEC_KEYS
from robusttune.training import client_gradients, train_clients

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
    """FedCM as DeMoA's experiments run it (Otsuka et al., arXiv 2509.02970: Sec. 3 contrasts
    its coefficient (1 - alpha p) with FedCM's (1 - alpha); the experiments' baselines): one minibatch gradient per sampled client and round,
    a client-level momentum with FedCM's coefficient (1 - alpha), no decay of unsampled momenta,
    and a robust rule over the round's sample only:

        sampled i:      m_i <- (1 - alpha) m_i + alpha g_i,   g_i one minibatch gradient at x
        not sampled:    m_i kept (the client computes nothing)
        m = Agg({m_i : i in S_t}),   x <- x - eta m.

    alpha = ``demoa_alpha``, eta = ``server_lr``. It is DeMoA's ``coefficient_swap`` ablation
    without the delayed cache, so it fails in the first Byzantine-majority round, as DeMoA
    reports. Xu et al.'s own FedCM (server momentum, K local steps) is ``fedcm_xu``."""

    methods = {"fedcm": "mean"}

    def coefficient(self, p: float) -> float:
        return 1.0 - self.spec.demoa_alpha

    def inputs(self, state: RoundState, messages: Tensor, model: Tensor) -> AggregatorInput:
        self._remember(state, messages)
        return AggregatorInput(messages,
                               self.weights(self.sample_counts.index_select(0, state.sample.clients)),
                               state.sample.byzantine_cpu.clone())


@ALGORITHMS.register("fedsgd")
class FedSGD(ServerAlgorithm):
    """FedAvg as DeMoA's experiments run it (arXiv 2509.02970, experiments: no momentum, one
    stochastic gradient per sampled client and round), i.e. McMahan et al.'s FedSGD (2017, Sec. 2) with a robust rule:

        g_i = one minibatch gradient at x for i in S_t,   x <- x - eta Agg({g_i : i in S_t}).

    Named ``fedsgd`` (McMahan et al.'s name for exactly this) because ``fedavg`` here is the
    SWB-DM grid's FedAvg, E local epochs and aggregated trained states. A client holds no state
    between rounds, so a Byzantine client has no honest state to keep apart."""

    trains_locally = False
    default_server_lr = 0.1  # a gradient step, as DeMoA's eta
    default_weights = "uniform"
    rule_overridable = True
    methods = {"fedsgd": "mean"}

    def __init__(self, spec: RunSpec, initial: Tensor, sample_counts: Tensor,
                 byzantine: Tensor) -> None:
        super().__init__(spec, initial, sample_counts, byzantine)
        self.last_aggregate = torch.zeros_like(initial)

    def begin_round(self, sample: Sample, local: Tensor, model: Tensor,
                    plan: RoundPlan | None = None) -> RoundState:
        return RoundState(sample, local)

    def inputs(self, state: RoundState, messages: Tensor, model: Tensor) -> AggregatorInput:
        return AggregatorInput(messages,
                               self.weights(self.sample_counts.index_select(0, state.sample.clients)),
                               state.sample.byzantine_cpu.clone())

    def previous(self, model: Tensor) -> Tensor:
        return self.last_aggregate  # CCLIP's centre: the last step's direction, as for DeMoA

    def step(self, model: Tensor, aggregate: Tensor, state: RoundState | None = None) -> Tensor:
        self.last_aggregate = aggregate
        return model - self.spec.server_lr * aggregate

    def state_dict(self) -> dict[str, Any]:
        return {"last_aggregate": self.last_aggregate}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.last_aggregate = state["last_aggregate"].to(self.last_aggregate.device).clone()


@ALGORITHMS.register("fedcm_xu")
class FedCMXu(ServerAlgorithm):
    """FedCM as published (Xu, Wang, Wang, Yao, arXiv 2106.10874, Algorithm 1): the server
    broadcasts x_t and its momentum Delta_t (Delta_0 = 0); each sampled client runs K local SGD
    steps on a blend of its gradient and Delta_t, and the server averages the displacements:

        y_{i,0} = x_t,   y_{i,k+1} = y_{i,k} - eta_l (alpha g_{i,k} + (1 - alpha) Delta_t)
        U = Agg({y_{i,K} - x_t : i in S_t})                  (Xu et al.: the plain average)
        x_{t+1} = x_t + eta_g U,   Delta_{t+1} = -U / (eta_l K)

    i.e. Delta_{t+1} = (1 / (eta_l K |S|)) sum_i (x_t - y_{i,K}), x_{t+1} = x_t - eta_g eta_l K
    Delta_{t+1}. alpha = ``demoa_alpha``, eta_l = ``lr``, eta_g = ``server_lr`` (1: the new
    model is the clients' aggregated end point), K = a client's steps in ``local_epochs``
    epochs of ``batch_size`` (K_i = E ceil(n_i / B); with unequal data the server divides by
    the sampled clients' mean K). Local steps are plain SGD on v (``momentum`` is not used:
    Delta_t is the momentum). With alpha = 1 this is FedAvg with SGD(lr). Delta_t is server
    state broadcast to every client, so no client, honest or Byzantine, keeps state of its own.
    """

    trains_locally = True
    default_weights = "uniform"  # Xu et al. average the sampled displacements with 1/|S|
    rule_overridable = True
    methods = {"fedcm_xu": "mean"}

    def __init__(self, spec: RunSpec, initial: Tensor, sample_counts: Tensor,
                 byzantine: Tensor) -> None:
        super().__init__(spec, initial, sample_counts, byzantine)
        self.delta = torch.zeros_like(initial)
        self.last_aggregate = torch.zeros_like(initial)
        # K_i on the host (the server knows n_i): dividing by K needs no device read-back
        # K_i = E ceil(n_i / B): the number of batches train_clients runs for client i
        self.steps = [spec.local_epochs * math.ceil(int(n) / spec.batch_size)
                      for n in sample_counts.tolist()]

    def local_work(self, plan: RoundPlan, net: nn.Module, params: Tensor,
                   data: list[tuple[Tensor, Tensor]], seeds: list[int], trainer: str) -> Tensor:
        # SGD(eta_l) on alpha g + (1 - alpha) Delta = SGD(eta_l alpha) on g + drift
        alpha, spec = self.spec.demoa_alpha, self.spec
        drift = None if alpha == 1.0 else ((1.0 - alpha) / alpha) * self.delta
        return train_clients(net, params, data, epochs=spec.local_epochs,
                             batch_size=spec.batch_size, lr=spec.lr * alpha, momentum=0.0,
                             seeds=seeds, strategy=trainer, drift=drift)

    def begin_round(self, sample: Sample, local: Tensor, model: Tensor,
                    plan: RoundPlan | None = None) -> RoundState:
        return RoundState(sample, local - model)

    def inputs(self, state: RoundState, messages: Tensor, model: Tensor) -> AggregatorInput:
        return AggregatorInput(messages,
                               self.weights(self.sample_counts.index_select(0, state.sample.clients)),
                               state.sample.byzantine_cpu.clone())

    def previous(self, model: Tensor) -> Tensor:
        return self.last_aggregate

    def step(self, model: Tensor, aggregate: Tensor, state: RoundState | None = None) -> Tensor:
        self.last_aggregate = aggregate
        if state is not None:
            steps = [self.steps[c] for c in state.sample.clients_cpu.tolist()]
            mean_steps = sum(steps) / len(steps) if steps else 0.0
            if mean_steps > 0:
                self.delta = -aggregate / (self.spec.lr * mean_steps)
        return model + self.spec.server_lr * aggregate

    def state_dict(self) -> dict[str, Any]:
        return {"delta": self.delta, "last_aggregate": self.last_aggregate}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.delta = state["delta"].to(self.delta.device).clone()
        self.last_aggregate = state["last_aggregate"].to(self.last_aggregate.device).clone()


def clip_rows(rows: Tensor, level: Tensor | float) -> Tensor:
    """clip_lambda(v) = min(1, lambda / ||v||) v for every row (Byz-VR-MARINA-PP's clipping).
    A row with a non-finite entry has no finite norm to clip to; it becomes 0 (it carries no
    usable difference), so every output row has norm <= lambda."""
    finite = torch.isfinite(rows).all(dim=1, keepdim=True)
    rows = torch.where(finite, rows, torch.zeros((), dtype=rows.dtype, device=rows.device))
    norms = torch.linalg.vector_norm(rows, dim=1, keepdim=True)
    level = torch.as_tensor(level, dtype=rows.dtype, device=rows.device)
    # norm 0 or inf: the factor is 1 on a zero row and 0 on an overflowing one, never NaN
    factor = (level / norms.clamp_min(torch.finfo(rows.dtype).tiny)).clamp(max=1.0)
    return rows * factor


def rand_k(rows: Tensor, ratio: float, generator: torch.Generator) -> Tensor:
    """The unbiased Rand-K sparsifier (Byz-VR-MARINA's compressor example): keep k =
    max(1, round(ratio d)) coordinates drawn uniformly per row, scaled by d / k, so E[Q(v)] = v."""
    n, d = rows.shape
    k = max(1, int(round(ratio * d)))
    if k >= d:
        return rows
    keep = torch.rand((n, d), generator=generator).argsort(dim=1)[:, :k].to(rows.device)
    out = torch.zeros_like(rows)
    out.scatter_(1, keep, rows.gather(1, keep) * (d / k))
    return out


@ALGORITHMS.register("byz_vr_marina_pp")
class ByzVRMarinaPP(ServerAlgorithm):
    """Byz-VR-MARINA-PP (Malinovsky, Richtarik, Horvath, Gorbunov, arXiv 2311.14127 / NeurIPS
    2024, Algorithm 1): Byz-VR-MARINA's recursive variance reduction with client sampling, the
    harm of a round bounded by clipping the gradient differences at the server.

    The server holds an estimate g^k of the gradient at x^k and steps x^{k+1} = x^k - gamma g^k.
    Then, with c_k ~ Bernoulli(p):

        c_k = 1 (full participation):  every client sends its full local gradient at x^{k+1},
            g^{k+1} = ARAgg(grad f_1(x^{k+1}), ..., grad f_N(x^{k+1}))
        c_k = 0 (partial):  C sampled clients send Q(Delta_i), Delta_i = grad f_i(x^{k+1}; xi_i)
            - grad f_i(x^k; xi_i) on one minibatch xi_i (the same at both points), and
            g^{k+1} = g^k + ARAgg({clip_lambda(Q(Delta_i)) : i in S_k}),
            lambda_{k+1} = alpha_lambda ||x^{k+1} - x^k||.

    Clipping is done by the server, so a Byzantine message is clipped too: in a round whose
    sample is all Byzantine, every input has norm <= lambda, and a rule whose output lies in the
    inputs' convex hull (mean, geometric_median, krum, multi_krum, cclip from the centre 0) moves
    g by at most lambda and the next step by at most gamma lambda; coordinate-wise rules stay in
    the inputs' bounding box (<= sqrt(min(C, d)) lambda). This is the paper's claim ("bound the
    potential harm ... even during iterations when all sampled clients are Byzantine").

    Keys: p = ``marina_p`` (resolved to C/N when not given), alpha_lambda =
    ``marina_clip_multiplier``, Q = ``marina_compressor`` (``none`` by default, ``rand_k`` with
    ``marina_compress_ratio``), gamma = ``server_lr``, minibatch = ``batch_size``, C = the
    participation draw (``participation``/``sample_size``; the paper samples C clients without
    replacement, ``participation_mode: fixed``). Full local gradients use all of a client's
    data: digits clients hold tens of samples, so that is one batch. The first round is a full
    round (g^0 = ARAgg of full gradients at x^0). The coin is drawn every round from the run's
    sampling stream. Rounds map as: this round's model is x^{k+1}, ``anchor`` is x^k; a round
    that aggregates nothing (empty Bernoulli draw, or ``guarded`` refusal) changes neither, so
    the next round computes the same differences again. Clients keep no state of their own
    (the server holds g and x^k), so a Byzantine client's honest message needs no cache.
    """

    trains_locally = False
    default_server_lr = 0.1
    default_weights = "uniform"  # ARAgg over the n (or C) clients, one vote each
    rule_overridable = True
    # DeMoA's main comparison runs every method with CCLIP (its experiments); any rule may be given
    methods = {"byz_vr_marina_pp": "cclip"}

    def __init__(self, spec: RunSpec, initial: Tensor, sample_counts: Tensor,
                 byzantine: Tensor) -> None:
        super().__init__(spec, initial, sample_counts, byzantine)
        self.estimate: Tensor | None = None  # g^k; None until the first (full) round
        self.anchor = initial.detach().clone()  # x^k, the point g^k estimates the gradient at

    def plan(self, drawn: Tensor, generator: torch.Generator) -> RoundPlan:
        # drawn every round, so the sampling stream does not depend on the estimate's state
        coin = bool(torch.rand((), generator=generator) < self.spec.marina_p)
        if coin or self.estimate is None:
            return RoundPlan(torch.arange(self.num_clients), full=True)
        return RoundPlan(drawn)

    def local_work(self, plan: RoundPlan, net: nn.Module, params: Tensor,
                   data: list[tuple[Tensor, Tensor]], seeds: list[int], trainer: str) -> Tensor:
        if plan.full or self.estimate is None:
            # one "minibatch" holding all of a client's data is its full local gradient
            everything = max([1] + [len(y) for _, y in data])
            return client_gradients(net, params, data, batch_size=everything, seeds=seeds,
                                    strategy=trainer)
        batch = self.spec.batch_size
        # the same seeds draw the same minibatch xi_i at x^{k+1} and at x^k
        now = client_gradients(net, params, data, batch_size=batch, seeds=seeds, strategy=trainer)
        before = client_gradients(net, self.anchor, data, batch_size=batch, seeds=seeds,
                                  strategy=trainer)
        difference = now - before
        if self.spec.marina_compressor == "rand_k" and len(seeds):
            generator = torch.Generator().manual_seed((seeds[0] * 31 + 17) % (2**63 - 1))
            difference = rand_k(difference, self.spec.marina_compress_ratio, generator)
        return difference

    def begin_round(self, sample: Sample, local: Tensor, model: Tensor,
                    plan: RoundPlan | None = None) -> RoundState:
        full = self.estimate is None or (plan is not None and plan.full)
        return RoundState(sample, local, full=full)

    def clip_level(self, model: Tensor) -> Tensor:
        """lambda_{k+1} = alpha_lambda ||x^{k+1} - x^k|| (a device scalar: no read-back)."""
        return self.spec.marina_clip_multiplier * torch.linalg.vector_norm(model - self.anchor)

    def inputs(self, state: RoundState, messages: Tensor, model: Tensor) -> AggregatorInput:
        weights = self.weights(self.sample_counts.index_select(0, state.sample.clients))
        byzantine = state.sample.byzantine_cpu.clone()
        if state.full:
            centre = self.estimate if self.estimate is not None else torch.zeros_like(model)
            return AggregatorInput(messages, weights, byzantine, previous=centre)
        return AggregatorInput(clip_rows(messages, self.clip_level(model)), weights, byzantine,
                               previous=torch.zeros_like(model))

    def step(self, model: Tensor, aggregate: Tensor, state: RoundState | None = None) -> Tensor:
        full = self.estimate is None or (state is not None and state.full)
        self.estimate = aggregate if full else self.estimate + aggregate
        self.anchor = model.detach().clone()
        return model - self.spec.server_lr * self.estimate

    def state_dict(self) -> dict[str, Any]:
        return {"estimate": self.estimate, "anchor": self.anchor}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        device = self.anchor.device
        self.estimate = None if state["estimate"] is None else state["estimate"].to(device).clone()
        self.anchor = state["anchor"].to(device).clone()


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
