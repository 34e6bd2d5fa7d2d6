"""DeMoA's comparison baselines: FedSGD (FedAvg as DeMoA runs it), FedAvgM (server momentum over
it) and Xu et al.'s FedCM. Byz-VR-MARINA-PP, the third, has its own module (`marina`)."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any, ClassVar

import torch
from torch import Tensor

from robusttune.core.schema import RunSchema
from robusttune.methods.algorithms.base import (
    ALGORITHMS,
    AggregatorInput,
    RoundPlan,
    RoundState,
    ServerAlgorithm,
)
from robusttune.problem.sampling import Sample
from robusttune.problem.training import train_clients

if TYPE_CHECKING:
    from torch import nn


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
    methods: ClassVar[dict[str, str]] = {"fedsgd": "mean"}

    def __init__(
        self, spec: RunSchema, initial: Tensor, sample_counts: Tensor, byzantine: Tensor
    ) -> None:
        super().__init__(spec, initial, sample_counts, byzantine)
        self.last_aggregate = torch.zeros_like(initial)

    def begin_round(
        self, sample: Sample, local: Tensor, model: Tensor, plan: RoundPlan | None = None
    ) -> RoundState:
        return RoundState(sample, local)

    def inputs(self, state: RoundState, messages: Tensor, model: Tensor) -> AggregatorInput:
        return AggregatorInput(
            messages,
            self.weights(self.sample_counts.index_select(0, state.sample.clients)),
            state.sample.byzantine_cpu.clone(),
        )

    def previous(self, model: Tensor) -> Tensor:
        return self.last_aggregate  # CCLIP's centre: the last step's direction, as for DeMoA

    def step(self, model: Tensor, aggregate: Tensor, state: RoundState | None = None) -> Tensor:
        self.last_aggregate = aggregate
        return model - self.spec.server_lr * aggregate

    def state_dict(self) -> dict[str, Any]:
        return {"last_aggregate": self.last_aggregate}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.last_aggregate = state["last_aggregate"].to(self.last_aggregate.device).clone()


@ALGORITHMS.register("fedavgm")
class FedAvgM(FedSGD):
    """FedAvgM, server momentum over FedAvg (Hsu, Qi, Brown, arXiv 1909.06335, Algorithm 1;
    DeMoA v1's second baseline beside FedAvg), with DeMoA's clients (one minibatch gradient per
    sampled client and round, as ``fedsgd``) and a robust rule:

        m <- (1 - alpha) m + alpha Agg({g_i : i in S_t}),   x <- x - eta m,   m_0 = 0.

    Hsu et al. write v <- beta v + Delta, x <- x - v with Delta the clients' averaged update;
    with one local gradient step Delta = eta_l Agg(g), and theirs is this recursion with
    beta = 1 - alpha and eta_l = alpha eta. The momentum is the server's (one vector, broadcast
    nowhere), so no client keeps state and the rule sees only the round's sample: a round whose
    sample has a Byzantine majority reaches m. alpha = ``demoa_alpha``, eta = ``server_lr``; an
    empty (Bernoulli) round leaves m and x as they were."""

    methods: ClassVar[dict[str, str]] = {"fedavgm": "mean"}

    def __init__(
        self, spec: RunSchema, initial: Tensor, sample_counts: Tensor, byzantine: Tensor
    ) -> None:
        super().__init__(spec, initial, sample_counts, byzantine)
        self.server_momentum = torch.zeros_like(initial)

    def step(self, model: Tensor, aggregate: Tensor, state: RoundState | None = None) -> Tensor:
        self.last_aggregate = aggregate
        alpha = self.spec.demoa_alpha
        self.server_momentum = (1.0 - alpha) * self.server_momentum + alpha * aggregate
        return model - self.spec.server_lr * self.server_momentum

    def state_dict(self) -> dict[str, Any]:
        return {**super().state_dict(), "server_momentum": self.server_momentum}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        super().load_state_dict(state)
        self.server_momentum = state["server_momentum"].to(self.server_momentum.device).clone()


@ALGORITHMS.register("fedcm_xu")
class FedCMXu(ServerAlgorithm):
    """FedCM as published (Xu, Wang, Wang, Yao, arXiv 2106.10874, Algorithm 1): the server
    broadcasts x_t and its momentum Delta_t (Delta_0 = 0); each sampled client runs K local SGD
    steps on a blend of its gradient and Delta_t, and the server averages the displacements:

        y_{i,0} = x_t,   y_{i,k+1} = y_{i,k} - eta_l (alpha g_{i,k} + (1 - alpha) Delta_t)
        U = Agg({y_{i,K} - x_t : i in S_t})                  (Xu et al.: the plain average)
        x_{t+1} = x_t + eta_g U,   Delta_{t+1} = -U / (eta_l K)

    i.e. Delta_{t+1} = (1 / (eta_l K |S|)) sum_i (x_t - y_{i,K}), x_{t+1} = x_t - eta_g eta_l K
    Delta_{t+1}. A server step written in gradient scale, x_{t+1} = x_t - eta'_g Delta_{t+1} (one
    public implementation does so; the paper's text was not reachable to settle it), is this
    update with eta'_g = eta_g eta_l K: the same family, a different meaning of server_lr.
    alpha = ``demoa_alpha``, eta_l = ``lr``, eta_g = ``server_lr`` (1: the new
    model is the clients' aggregated end point), K = a client's steps in ``local_epochs``
    epochs of ``batch_size`` (K_i = E ceil(n_i / B); with unequal data the server divides by
    the sampled clients' mean K). Local steps are plain SGD on v (``momentum`` is not used:
    Delta_t is the momentum). With alpha = 1 this is FedAvg with SGD(lr). Delta_t is server
    state broadcast to every client, so no client, honest or Byzantine, keeps state of its own.
    """

    trains_locally = True
    default_weights = "uniform"  # Xu et al. average the sampled displacements with 1/|S|
    rule_overridable = True
    methods: ClassVar[dict[str, str]] = {"fedcm_xu": "mean"}

    def __init__(
        self, spec: RunSchema, initial: Tensor, sample_counts: Tensor, byzantine: Tensor
    ) -> None:
        super().__init__(spec, initial, sample_counts, byzantine)
        self.delta = torch.zeros_like(initial)
        self.last_aggregate = torch.zeros_like(initial)
        # K_i on the host (the server knows n_i): dividing by K needs no device read-back
        # K_i = E ceil(n_i / B): the number of batches train_clients runs for client i
        self.steps = [
            spec.local_epochs * math.ceil(int(n) / spec.batch_size) for n in sample_counts.tolist()
        ]

    def local_work(
        self,
        plan: RoundPlan,
        net: nn.Module,
        params: Tensor,
        data: list[tuple[Tensor, Tensor]],
        seeds: list[int],
        trainer: str,
    ) -> Tensor:
        # SGD(eta_l) on alpha g + (1 - alpha) Delta = SGD(eta_l alpha) on g + drift
        alpha, spec = self.spec.demoa_alpha, self.spec
        drift = None if alpha == 1.0 else ((1.0 - alpha) / alpha) * self.delta
        return train_clients(
            net,
            params,
            data,
            epochs=spec.local_epochs,
            batch_size=spec.batch_size,
            lr=spec.lr * alpha,
            momentum=0.0,
            seeds=seeds,
            strategy=trainer,
            drift=drift,
        )

    def begin_round(
        self, sample: Sample, local: Tensor, model: Tensor, plan: RoundPlan | None = None
    ) -> RoundState:
        return RoundState(sample, local - model)

    def inputs(self, state: RoundState, messages: Tensor, model: Tensor) -> AggregatorInput:
        return AggregatorInput(
            messages,
            self.weights(self.sample_counts.index_select(0, state.sample.clients)),
            state.sample.byzantine_cpu.clone(),
        )

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
