"""Server algorithms (registry): what the clients compute, what is aggregated, how the model moves.

`fedavg` and `state_cache` aggregate trained model states (as the SWB-DM code does: SWB is not
translation-equivariant, so states and deltas differ); `demoa` and `fedcm` aggregate client
momenta built from one minibatch gradient per round. Attacks always see messages in update space
(state - global model, or the momentum itself); `to_input` maps them back to what is aggregated.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from robusttune.caches import MomentumCache, StateCache
from robusttune.config import RunSpec
from robusttune.registry import Registry

ALGORITHMS: Registry[type["ServerAlgorithm"]] = Registry("algorithm")


@dataclass
class AggregatorInput:
    """What the rule receives this round, and which of its rows come from Byzantine clients."""

    rows: Tensor
    weights: Tensor
    byzantine_rows: Tensor  # bool[n_in]


class ServerAlgorithm:
    """Base: the per-round protocol of one server algorithm.

    ``trains_locally``: clients run E local epochs and send trained states (FedAvg style);
    otherwise they compute one minibatch gradient and send a momentum (DeMoA style).
    """

    name: str = "base"
    trains_locally: bool = True
    # Cache algorithms aggregate every slot even in a round that sampled nobody (Bernoulli).
    aggregates_cache: bool = False

    def __init__(self, spec: RunSpec, initial: Tensor, sample_counts: Tensor) -> None:
        self.spec = spec
        self.num_clients = spec.clients
        self.sample_counts = sample_counts.to(initial.device, torch.float32)

    def participation_rate(self, sampled: int) -> float:
        """p_t: the Bernoulli probability, or n/N for a fixed-size draw."""
        if self.spec.participation_mode == "bernoulli":
            return self.spec.participation
        return sampled / self.num_clients

    def fresh_messages(self, clients: Tensor, local: Tensor, model: Tensor) -> Tensor:
        """Honest messages of the sampled clients in update space, from what they computed."""
        raise NotImplementedError

    def attack_view(self, clients: Tensor, fresh: Tensor, byzantine: Tensor, model: Tensor
                    ) -> tuple[Tensor, Tensor]:
        """The aggregator's input as an omniscient attacker sees it before the Byzantine
        messages land (update space), and its Byzantine-row mask (cache attacks use it)."""
        return fresh[~byzantine], torch.zeros(int((~byzantine).sum()), dtype=torch.bool,
                                              device=fresh.device)

    def inputs(self, clients: Tensor, messages: Tensor, byzantine: Tensor, model: Tensor
               ) -> AggregatorInput:
        """Store this round's messages where the algorithm keeps them; return the rule's input."""
        raise NotImplementedError

    def previous(self, model: Tensor) -> Tensor:
        """The point the rule's inputs move from (CCLIP's centre, FLTrust's origin)."""
        return model

    def step(self, model: Tensor, aggregate: Tensor) -> Tensor:
        """The new global model from the aggregate."""
        raise NotImplementedError

    def end_round(self, clients: Tensor) -> None:
        """Bookkeeping after the round (cache decay)."""

    def state_dict(self) -> dict[str, Any]:
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        pass


class _StateAlgorithm(ServerAlgorithm):
    """Messages are trained states; w <- w + eta (Agg - w), eta = server_lr (1: replace)."""

    def fresh_messages(self, clients: Tensor, local: Tensor, model: Tensor) -> Tensor:
        return local - model

    def step(self, model: Tensor, aggregate: Tensor) -> Tensor:
        if self.spec.server_lr == 1.0:
            return aggregate
        return model + self.spec.server_lr * (aggregate - model)


@ALGORITHMS.register("fedavg")
class FedAvg(_StateAlgorithm):
    """FedAvg (McMahan et al., 2017): aggregate the sampled clients' trained states."""

    def inputs(self, clients: Tensor, messages: Tensor, byzantine: Tensor, model: Tensor
               ) -> AggregatorInput:
        return AggregatorInput(model + messages, self.sample_counts[clients], byzantine.clone())


@ALGORITHMS.register("state_cache")
class StateCacheAlgorithm(_StateAlgorithm):
    """SWB-DM's delayed cache (Section IV-B): c_i <- s_i for sampled i, kept otherwise;
    w <- Agg(c_1, ..., c_N)."""

    aggregates_cache = True

    def __init__(self, spec: RunSpec, initial: Tensor, sample_counts: Tensor) -> None:
        super().__init__(spec, initial, sample_counts)
        self.cache = StateCache(spec.clients, initial, spec.cache_dtype)

    def attack_view(self, clients: Tensor, fresh: Tensor, byzantine: Tensor, model: Tensor
                    ) -> tuple[Tensor, Tensor]:
        # one new [N, d] tensor; read() is the cache itself for float32, so never write into it
        view = self.cache.read() - model
        honest = clients[~byzantine]
        view[honest] = fresh[~byzantine]
        mask = self.cache.written_by_byzantine.clone()
        mask[honest] = False
        return view, mask

    def inputs(self, clients: Tensor, messages: Tensor, byzantine: Tensor, model: Tensor
               ) -> AggregatorInput:
        self.cache.refresh(clients, model + messages, byzantine)
        return AggregatorInput(self.cache.read(), self.sample_counts,
                               self.cache.written_by_byzantine.clone())

    def state_dict(self) -> dict[str, Any]:
        return {"cache": self.cache.state_dict()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.cache.load_state_dict(state["cache"])


class _MomentumAlgorithm(ServerAlgorithm):
    """Messages are client momenta; x <- x - eta * Agg(momenta)."""

    trains_locally = False

    def __init__(self, spec: RunSpec, initial: Tensor, sample_counts: Tensor) -> None:
        super().__init__(spec, initial, sample_counts)
        self.momenta = MomentumCache(spec.clients, torch.zeros_like(initial), spec.cache_dtype)
        self.last_aggregate = torch.zeros_like(initial)
        self._coefficient = 1.0

    def coefficient(self, sampled: int) -> float:
        raise NotImplementedError

    def fresh_messages(self, clients: Tensor, local: Tensor, model: Tensor) -> Tensor:
        self._coefficient = self.coefficient(len(clients))
        return self.momenta.fresh(clients, local, self._coefficient, self.spec.demoa_alpha)

    def previous(self, model: Tensor) -> Tensor:
        return self.last_aggregate

    def step(self, model: Tensor, aggregate: Tensor) -> Tensor:
        self.last_aggregate = aggregate
        return model - self.spec.server_lr * aggregate

    def state_dict(self) -> dict[str, Any]:
        return {"momenta": self.momenta.state_dict(), "last_aggregate": self.last_aggregate}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.momenta.load_state_dict(state["momenta"])
        self.last_aggregate = state["last_aggregate"].to(self.last_aggregate.device).clone()


@ALGORITHMS.register("demoa")
class DeMoA(_MomentumAlgorithm):
    """DeMoA (Otsuka, Takezawa, Yamada, ICML 2026): m_i <- (1 - alpha p) m_i + alpha g_i for
    sampled i, m_i <- (1 - alpha p) m_i otherwise (the preprocessing P), m = Agg(all N momenta),
    x <- x - eta m. Ablations: ``demoa_coefficient=alpha`` uses (1 - alpha); ``demoa_decay=False``
    leaves unsampled slots undecayed (MIFA-like, P = id)."""

    aggregates_cache = True

    def coefficient(self, sampled: int) -> float:
        alpha = self.spec.demoa_alpha
        if self.spec.demoa_coefficient == "alpha":
            return 1.0 - alpha
        return 1.0 - alpha * self.participation_rate(sampled)

    def attack_view(self, clients: Tensor, fresh: Tensor, byzantine: Tensor, model: Tensor
                    ) -> tuple[Tensor, Tensor]:
        decay = self._coefficient if self.spec.demoa_decay else 1.0
        view = self.momenta.read() * decay
        honest = clients[~byzantine]
        view[honest] = fresh[~byzantine]
        mask = self.momenta.written_by_byzantine.clone()
        mask[honest] = False
        return view, mask

    def inputs(self, clients: Tensor, messages: Tensor, byzantine: Tensor, model: Tensor
               ) -> AggregatorInput:
        self.momenta.decay(self._coefficient if self.spec.demoa_decay else 1.0)
        self.momenta.refresh(clients, messages, byzantine)
        return AggregatorInput(self.momenta.read(), self.sample_counts,
                               self.momenta.written_by_byzantine.clone())


@ALGORITHMS.register("fedcm")
class FedCM(_MomentumAlgorithm):
    """FedCM-style baseline (Xu et al., 2021, as DeMoA compares against it): sampled clients
    m_i <- (1 - alpha) m_i + alpha g_i, unsampled momenta untouched, m = Agg(sampled momenta)."""

    def coefficient(self, sampled: int) -> float:
        return 1.0 - self.spec.demoa_alpha

    def inputs(self, clients: Tensor, messages: Tensor, byzantine: Tensor, model: Tensor
               ) -> AggregatorInput:
        self.momenta.refresh(clients, messages, byzantine)
        return AggregatorInput(messages, self.sample_counts[clients], byzantine.clone())


def make_algorithm(spec: RunSpec, initial: Tensor, sample_counts: Tensor) -> ServerAlgorithm:
    """The server algorithm the spec names, holding its caches on ``initial``'s device."""
    return ALGORITHMS[spec.algorithm](spec, initial, sample_counts)
