"""The state algorithms (FedAvg, SWB-DM's delayed state cache): clients train E local epochs
from the global model and send trained states."""

from __future__ import annotations

from typing import Any, ClassVar

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
from robusttune.methods.algorithms.caches import StateCache
from robusttune.problem.sampling import Sample


class _StateAlgorithm(ServerAlgorithm):
    """Messages are trained states; w <- w + eta (Agg - w), eta = server_lr (1: replace). Clients
    start every round from the global model, so they hold no state of their own."""

    def begin_round(
        self, sample: Sample, local: Tensor, model: Tensor, plan: RoundPlan | None = None
    ) -> RoundState:
        return RoundState(sample, local - model)

    def step(self, model: Tensor, aggregate: Tensor, state: RoundState | None = None) -> Tensor:
        if self.spec.server_lr == 1.0:
            return aggregate
        return model + self.spec.server_lr * (aggregate - model)


@ALGORITHMS.register("fedavg")
class FedAvg(_StateAlgorithm):
    """FedAvg (McMahan et al., 2017): aggregate the sampled clients' trained states. Every rule's
    name is a method of it (``method: krum`` is FedAvg with Krum), as in the SWB-DM study."""

    methods: ClassVar[dict[str, str]] = {"fedavg": "mean"}
    rule_methods = True

    def inputs(self, state: RoundState, messages: Tensor, model: Tensor) -> AggregatorInput:
        return AggregatorInput(
            model + messages,
            self.weights(self.sample_counts.index_select(0, state.sample.clients)),
            state.sample.byzantine_cpu.clone(),
        )


@ALGORITHMS.register("state_cache")
class StateCacheAlgorithm(_StateAlgorithm):
    """SWB-DM's delayed cache (Section IV-B): c_i <- s_i for sampled i, kept otherwise;
    w <- Agg(c_1, ..., c_N)."""

    aggregates_cache = True
    methods: ClassVar[dict[str, str]] = {"swb_dm": "swb", "delayed_momentum": "median"}

    def __init__(
        self, spec: RunSchema, initial: Tensor, sample_counts: Tensor, byzantine: Tensor
    ) -> None:
        super().__init__(spec, initial, sample_counts, byzantine)
        self.cache = StateCache(spec.clients, initial, spec.cache_dtype)

    def attack_view(self, state: RoundState, model: Tensor) -> AttackView:
        # read() is the cache itself for float32: the subtraction makes the view's own tensor
        rows = self.cache.read() - model
        return _with_round(rows, self.cache.written_by_byzantine, state)

    def inputs(self, state: RoundState, messages: Tensor, model: Tensor) -> AggregatorInput:
        self.cache.refresh(state.sample, model + messages)
        return AggregatorInput(
            self.cache.read(),
            self.weights(self.sample_counts),
            self.cache.written_by_byzantine.clone(),
        )

    def state_dict(self) -> dict[str, Any]:
        return {"cache": self.cache.state_dict()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.cache.load_state_dict(state["cache"])
