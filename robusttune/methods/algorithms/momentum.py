"""The client-momentum algorithms (DeMoA; ``fedcm``, client momenta over the round's sample):
clients send a momentum built from one minibatch gradient; a Byzantine client keeps its honest
momentum apart (`ByzantineMomenta`)."""

from __future__ import annotations

from typing import Any, ClassVar

import torch
from torch import Tensor

from robusttune.core.schema import RunSchema
from robusttune.methods.algorithms.base import (
    ALGORITHMS,
    AggregatorInput,
    AttackView,
    RoundPlan,
    RoundState,
    ServerAlgorithm,
    _with_round,
)
from robusttune.methods.algorithms.caches import ByzantineMomenta, MomentumCache
from robusttune.problem.sampling import Sample


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

    def __init__(
        self, spec: RunSchema, initial: Tensor, sample_counts: Tensor, byzantine: Tensor
    ) -> None:
        super().__init__(spec, initial, sample_counts, byzantine)
        zeros = torch.zeros_like(initial)
        self.momenta = MomentumCache(spec.clients, zeros, spec.cache_dtype)
        self.byzantine_momenta = ByzantineMomenta(byzantine, zeros, spec.cache_dtype)
        self.last_aggregate = zeros.clone()

    def coefficient(self, p: float) -> float:
        raise NotImplementedError

    def unsampled_decay(self, p: float) -> float:
        return 1.0

    def begin_round(
        self, sample: Sample, local: Tensor, model: Tensor, plan: RoundPlan | None = None
    ) -> RoundState:
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
        self.byzantine_momenta.refresh(
            sample.clients.index_select(0, sample.byzantine_rows),
            state.honest.index_select(0, sample.byzantine_rows),
        )

    def previous(self, model: Tensor) -> Tensor:
        return self.last_aggregate

    def step(self, model: Tensor, aggregate: Tensor, state: RoundState | None = None) -> Tensor:
        self.last_aggregate = aggregate
        return model - self.spec.server_lr * aggregate

    def state_dict(self) -> dict[str, Any]:
        return {
            "momenta": self.momenta.state_dict(),
            "byzantine_momenta": self.byzantine_momenta.state_dict(),
            "last_aggregate": self.last_aggregate,
        }

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

    ``demoa_ablation`` names two arms built from the paper's theoretical remarks (Sec. 3), not
    from its experiments:

    - ``none``: DeMoA as above.
    - ``coefficient_swap``: (1 - alpha p) -> (1 - alpha) for a sampled client and unsampled
      momenta left as they are: the naive momentum the paper contrasts with its coefficient,
      whose variance gains alpha^2 p (1 - p) ||m_i||^2. This is exactly the update of DeMoA's
      v1 (its D-Byz-SGDM). With alpha = 1 and ``aggregator: mean`` a sampled slot becomes g_i
      and the others stay as last sent: MIFA (Gu et al., 2021).
    - ``no_decay``: the preprocessing P dropped (P = id), the coefficient kept: unsampled momenta
      are aggregated as they were last sent, a sampled one becomes (1 - alpha p) m_i + alpha g_i
      (a client nobody contacts computes nothing). The summary's remark that dropping P leaves
      MIFA with naive averaging and an infinite robustness constant describes P = id with
      alpha = 1; this arm is not MIFA, since its coefficient stays 1 - p at alpha = 1 (a sampled
      slot becomes (1 - p) m_i + g_i, not g_i).
    """

    aggregates_cache = True
    methods: ClassVar[dict[str, str]] = {"demoa": "cclip"}

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
        return AggregatorInput(
            self.momenta.read(),
            self.weights(self.sample_counts),
            self.momenta.written_by_byzantine.clone(),
        )


@ALGORITHMS.register("fedcm")
class FedCM(_MomentumAlgorithm):
    """Client momenta over the round's sample, with FedCM's coefficient (1 - alpha): one
    minibatch gradient per sampled client and round, a client-level momentum, no decay of
    unsampled momenta, and a robust rule over the round's sample only:

        sampled i:      m_i <- (1 - alpha) m_i + alpha g_i,   g_i one minibatch gradient at x
        not sampled:    m_i kept (the client computes nothing)
        m = Agg({m_i : i in S_t}),   x <- x - eta m.

    What it is: DeMoA's ``coefficient_swap`` arm (v1's update) without the delayed cache, the
    naive momentum DeMoA's Sec. 3 contrasts with its (1 - alpha p), so it meets every
    Byzantine-majority sample. What it is not: Xu et al.'s FedCM (arXiv 2106.10874), whose
    momentum is the server's, broadcast to the clients (``fedcm_xu``; with one local step that
    is server momentum, ``fedavgm``), nor a baseline DeMoA's experiments are known to have run
    (v1 compared against FedAvg and FedAvgM). The name is kept because results and search
    spaces use it. alpha = ``demoa_alpha``, eta = ``server_lr``."""

    methods: ClassVar[dict[str, str]] = {"fedcm": "mean"}

    def coefficient(self, p: float) -> float:
        return 1.0 - self.spec.demoa_alpha

    def inputs(self, state: RoundState, messages: Tensor, model: Tensor) -> AggregatorInput:
        self._remember(state, messages)
        return AggregatorInput(
            messages,
            self.weights(self.sample_counts.index_select(0, state.sample.clients)),
            state.sample.byzantine_cpu.clone(),
        )
