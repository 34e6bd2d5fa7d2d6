"""The round loop of one federated run: a plain generator of RoundRecords.

It knows nothing of Ray or of result files: the `run` command and the Tune trainable are thin
adapters around `Simulation`. Every RNG is seeded from the RunSpec and lives in the Simulation's
state, so a run repeated on the CPU is identical and a run restored from `state_dict()` continues
bit for bit.
"""

from __future__ import annotations

import functools
import math
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from robusttune.core.numerics import float_path, pin
from robusttune.core.records import RoundRecord, RunSummary, is_collapsed, selection_accuracy
from robusttune.core.registries import ATTACKS, MODELS
from robusttune.core.registry import SpecError
from robusttune.core.runspec import RunSpec
from robusttune.engine.byzantine_messages import byzantine_messages
from robusttune.engine.input_statistics import error_from, honest_inputs, spread_from
from robusttune.methods.aggregators import Aggregator, make_rule
from robusttune.methods.algorithms import RoundPlan, make_algorithm
from robusttune.methods.attacks import make_attack
from robusttune.problem.data import load_federated
from robusttune.problem.evaluation import evaluate
from robusttune.problem.models import flat_params, make_model
from robusttune.problem.sampling import (
    Sample,
    byzantine_clients,
    draw_sample,
    is_byzantine_majority,
    sampling_generator,
)
from robusttune.problem.training import resolve_trainer

# RoundRecord figures whose run mean summary.json keeps as mean_<name>
ROUND_MEANS = ("aggregation_error", "honest_input_spread")


@dataclass
class RunningMean:
    """The mean of a round figure over the rounds where it was defined: a NaN round (not
    defined: no aggregate, no honest input) is skipped, an infinite one makes the mean +inf."""

    total: float = 0.0
    count: int = 0

    def add(self, value: float) -> None:
        if not math.isnan(value):
            self.total += value
            self.count += 1

    @property
    def mean(self) -> float:
        """NaN when no round had the figure."""
        return self.total / self.count if self.count else math.nan


def resolve_device(name: str) -> torch.device:
    """``auto`` is CUDA when this process can see a GPU; the sweep layer passes an explicit device
    chosen from the trial's resources instead. A CUDA device this process cannot see is a
    SpecError (one line), not a CUDA traceback from deep inside the first allocation."""
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    device = torch.device(name)
    if device.type == "cuda":
        count = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if count == 0:
            raise SpecError(
                f"device {name!r} needs a CUDA GPU and this process sees none; allowed: cpu, auto"
            )
        if device.index is not None and device.index >= count:
            raise SpecError(
                f"device {name!r} is not a GPU this process sees; allowed: cpu, auto, "
                f"cuda, cuda:0 .. cuda:{count - 1}"
            )
    return device


def client_seed(seed: int, round_index: int, client: int) -> int:
    """A per-(run, round, client) seed for batch order: no RNG state to carry between rounds, and
    both training strategies draw identical batches. ``client=-1`` is the server (FLTrust)."""
    return (seed * 1_000_003 + round_index * 10_007 + client + 1) % (2**63 - 1)


class Simulation:
    """One federated run. Iterate it (or call `step`) to get one RoundRecord per round."""

    def __init__(self, spec: RunSpec) -> None:
        pin(spec.numerics)  # before this run's first computation (robusttune.core.numerics)
        self.spec = spec
        self.device = resolve_device(spec.device)
        self.trainer = resolve_trainer(spec.trainer, self.device)
        self.data = load_federated(spec, self.device)
        self.num_classes = self.data.num_classes

        self.model = make_model(
            spec.model,
            self.data.input_shape,
            self.data.num_classes,
            seed=spec.seed,
            **spec.params_for(MODELS, spec.model),
        ).to(self.device)
        self.params = flat_params(self.model).detach().clone()

        self.sampling_rng = sampling_generator(spec)
        self.noise_rng = torch.Generator(device=self.device).manual_seed(spec.seed + 1)
        self.byzantine = byzantine_clients(spec)

        self.attack = make_attack(
            spec.attack,
            attack_strength=spec.attack_strength,
            attack_direction=spec.attack_direction,
            **spec.params_for(ATTACKS, spec.attack),
        )
        self.client_x = self.data.client_x
        self.client_y = (
            [
                self.attack.poison_labels(y, self.num_classes) if bool(self.byzantine[i]) else y
                for i, y in enumerate(self.data.client_y)
            ]
            if self.attack.data_side
            else self.data.client_y
        )
        counts = torch.tensor([len(y) for y in self.client_y], dtype=torch.float32)

        self.aggregator = make_rule(spec.aggregator, **spec.aggregator_params())
        self.algorithm = make_algorithm(spec, self.params, counts, self.byzantine)

        self.rounds_done = 0
        self.last_accuracy = math.nan
        self.last_loss = math.nan
        self.last_validation_accuracy = math.nan
        self.byzantine_majority_rounds = 0
        self.collapsed = False
        # the run's means of the round figures on the rule's inputs (summary.json's mean_<name>)
        self.round_means = {name: RunningMean() for name in ROUND_MEANS}

    # -- one round ---------------------------------------------------------------------------
    def _sample(self) -> Tensor:
        return draw_sample(self.spec, self.sampling_rng)

    def _client_work(
        self, plan: RoundPlan, data: list[tuple[Tensor, Tensor]], seeds: list[int]
    ) -> Tensor:
        """What each of ``data``'s owners computes at the global model, as the algorithm asks
        (trained states, one minibatch gradient, full gradients ...). Returns [len(data), d]."""
        return self.algorithm.local_work(plan, self.model, self.params, data, seeds, self.trainer)

    def _local_work(self, plan: RoundPlan, round_index: int) -> Tensor:
        clients = plan.clients.tolist()
        if not clients:
            return self.params.new_zeros((0, self.params.numel()))
        data = [(self.client_x[c], self.client_y[c]) for c in clients]
        return self._client_work(
            plan, data, [client_seed(self.spec.seed, round_index, c) for c in clients]
        )

    def _server_reference(self, plan: RoundPlan, round_index: int) -> Tensor | None:
        """FLTrust's server message: the server does the clients' work on its clean root set."""
        if not self.aggregator.needs_reference:
            return None
        root = [(self.data.root_x, self.data.root_y)]
        return self._client_work(plan, root, [client_seed(self.spec.seed, round_index, -1)])[0]

    def step(self) -> RoundRecord:
        """Run the next round and return its record. Never raises on divergence: non-finite
        parameters end the run as collapsed with the record kept."""
        spec = self.spec
        round_index = self.rounds_done + 1
        plan = self.algorithm.plan(self._sample(), self.sampling_rng)
        sampled_cpu = plan.clients
        sample = Sample.of(sampled_cpu, self.byzantine[sampled_cpu], self.device)
        n_sampled, n_byzantine = sample.size, sample.n_byzantine

        started = time.perf_counter()
        local = self._local_work(plan, round_index)
        reference = self._server_reference(plan, round_index)
        train_seconds = time.perf_counter() - started

        started = time.perf_counter()
        state = self.algorithm.begin_round(sample, local, self.params, plan)
        messages = state.honest
        if n_byzantine and not self.attack.data_side and self.attack.name != "none":
            # the rule's input is the round's sample, or all N rows under a cache
            n_inputs = spec.clients if self.algorithm.aggregates_cache else n_sampled
            rule: Aggregator | Callable[..., Tensor] = self.aggregator
            if self.aggregator.needs_reference:
                # the rule as this round calls it: FLTrust scores every row against the server's
                # own update (its message minus the current model), which it cannot do without
                rule = functools.partial(
                    rule, reference=reference, previous=self.algorithm.previous(self.params)
                )
            messages = byzantine_messages(
                self.attack,
                self.algorithm,
                state,
                self.params,
                scope=spec.attack_scope,
                generator=self.noise_rng,
                rule=rule,
                rule_f=spec.assumed_f(n_inputs),
            )
        # read back with the record's other figures, not here in the middle of the round
        bad_messages = (~torch.isfinite(messages)).any(dim=1).sum()

        aggregated = False
        aggregate = inputs = None
        if n_sampled or self.algorithm.aggregates_cache:
            inputs = self.algorithm.inputs(state, messages, self.params)
            n_inputs = inputs.rows.shape[0]
            f_assumed = spec.assumed_f(n_inputs)
            byzantine_rows = int(inputs.byzantine_rows.sum())
            held_assumed = self.aggregator.precondition(n_inputs, f_assumed)
            held_actual = self.aggregator.precondition(n_inputs, byzantine_rows)
            if held_assumed or not spec.guarded:
                previous = (
                    inputs.previous
                    if inputs.previous is not None
                    else self.algorithm.previous(self.params)
                )
                aggregate = self.aggregator(
                    inputs.rows,
                    f=f_assumed,
                    weights=inputs.weights,
                    reference=reference,
                    previous=previous,
                    generator=self.noise_rng,
                )
                self.params = self.algorithm.step(self.params, aggregate, state)
                aggregated = True
            share = byzantine_rows / n_inputs
        else:
            f_assumed, held_assumed, held_actual, share = 0, False, False, 0.0
        aggregate_seconds = time.perf_counter() - started
        # measured after the timing: aggregate_seconds stays the rule's (and the caches') cost
        # one selection of the honest rows for both; the spread is defined in a refused round
        # too: it describes the inputs, not the rule's answer
        honest = (
            None
            if inputs is None
            else honest_inputs(inputs.rows, inputs.byzantine_rows, inputs.weights)
        )
        error = None if aggregate is None or honest is None else error_from(aggregate, honest)
        spread = None if honest is None else spread_from(honest)

        # the round's one read-back (beside evaluation): counts, norm, error and spread together.
        # The norm accumulates in float64: a diverging run's finite float32 parameters pass 1.8e19
        # long before they overflow, and a float32 norm would record inf beside 0 non-finite
        # parameters (seed 42's claim-2 mlp run on an AVX-512 Xeon under ATen's default kernels).
        undefined = torch.full((), math.nan, dtype=torch.float64, device=self.params.device)
        figures = torch.stack(
            [
                bad_messages.double(),
                (~torch.isfinite(self.params)).sum().double(),
                torch.linalg.vector_norm(self.params, dtype=torch.float64),
                undefined if error is None else error,
                undefined if spread is None else spread,
            ]
        ).tolist()
        nonfinite_messages, nonfinite, param_norm = int(figures[0]), int(figures[1]), figures[2]
        round_error, round_spread = figures[3], figures[4]
        self.round_means["aggregation_error"].add(round_error)
        self.round_means["honest_input_spread"].add(round_spread)
        majority = is_byzantine_majority(n_byzantine, n_sampled)
        self.byzantine_majority_rounds += int(majority)
        accuracy = loss = max_share = validation_accuracy = math.nan
        last = round_index == spec.rounds
        if nonfinite or last or round_index % spec.eval_every == 0:
            evaluation = evaluate(self.model, self.params, self.data.test_x, self.data.test_y)
            accuracy, loss, max_share = (
                evaluation.accuracy,
                evaluation.loss,
                evaluation.max_class_share,
            )
            # NaN for an empty validation part
            if self.data.validation_x is not None and self.data.validation_y is not None:
                validation_accuracy = evaluate(
                    self.model, self.params, self.data.validation_x, self.data.validation_y
                ).accuracy
            self.last_accuracy, self.last_loss = accuracy, loss
            self.last_validation_accuracy = validation_accuracy
        self.collapsed = nonfinite > 0 or (
            last and is_collapsed(self.selection_accuracy(), self.num_classes, False)
        )
        self.rounds_done = round_index
        return RoundRecord(
            round=round_index,
            accuracy=accuracy,
            loss=loss,
            param_norm=param_norm,
            nonfinite_params=nonfinite,
            max_class_share=max_share,
            sampled=n_sampled,
            byzantine_sampled=n_byzantine,
            nonfinite_messages=nonfinite_messages,
            byzantine_input_share=share,
            byzantine_majority=majority,
            f_assumed=f_assumed,
            precondition_held_assumed=bool(held_assumed),
            precondition_held_actual=bool(held_actual),
            aggregated=aggregated,
            collapsed=self.collapsed,
            train_seconds=train_seconds,
            aggregate_seconds=aggregate_seconds,
            aggregation_error=round_error,
            honest_input_spread=round_spread,
            validation_accuracy=validation_accuracy,
        )

    @property
    def finished(self) -> bool:
        return self.rounds_done >= self.spec.rounds or (self.collapsed and self.nonfinite)

    @property
    def nonfinite(self) -> bool:
        return not bool(torch.isfinite(self.params).all())

    def __iter__(self) -> Iterator[RoundRecord]:
        while not self.finished:
            yield self.step()

    # -- checkpoints -------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        """Everything needed to continue bit for bit: model, caches, RNG states, counters."""
        return {
            "spec": self.spec.to_dict(),
            "rounds_done": self.rounds_done,
            "params": self.params.detach().cpu().clone(),
            "algorithm": _to_cpu(self.algorithm.state_dict()),
            "sampling_rng": self.sampling_rng.get_state(),
            "noise_rng": self.noise_rng.get_state(),
            "last_accuracy": self.last_accuracy,
            "last_loss": self.last_loss,
            "last_validation_accuracy": self.last_validation_accuracy,
            "byzantine_majority_rounds": self.byzantine_majority_rounds,
            "collapsed": self.collapsed,
            **{
                f"{name}_{part}": value
                for name, mean in self.round_means.items()
                for part, value in (("sum", mean.total), ("rounds", mean.count))
            },
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if state["spec"] != self.spec.to_dict():
            raise ValueError("checkpoint belongs to a different RunSpec")
        self.rounds_done = state["rounds_done"]
        self.params = state["params"].to(self.device).clone()
        self.algorithm.load_state_dict(_to_device(state["algorithm"], self.device))
        self.sampling_rng.set_state(state["sampling_rng"])
        self.noise_rng.set_state(state["noise_rng"])
        self.last_accuracy = state["last_accuracy"]
        self.last_loss = state["last_loss"]
        # a checkpoint written before the validation split has none
        self.last_validation_accuracy = state.get("last_validation_accuracy", math.nan)
        self.byzantine_majority_rounds = state["byzantine_majority_rounds"]
        self.collapsed = state["collapsed"]
        # a checkpoint written before a figure was recorded starts its mean afresh
        self.round_means = {
            name: RunningMean(state.get(f"{name}_sum", 0.0), state.get(f"{name}_rounds", 0))
            for name in ROUND_MEANS
        }

    def selection_accuracy(self) -> float:
        """The accuracy a collapse is judged on, as `RunSummary.selection_accuracy`: validation
        where the run has a validation part, test where it has none (``validation_fraction:
        0``). Collapse decides survival in every selection (map, calibrate, tuning), and
        selections read no test data (issue 23)."""
        return selection_accuracy(
            self.last_accuracy, self.last_validation_accuracy, self.spec.validation_fraction > 0
        )

    def summary(self, seconds: float) -> RunSummary:
        """The run's final figures and its resolved RunSpec (summary.json)."""
        return RunSummary(
            final_accuracy=self.last_accuracy,
            final_loss=self.last_loss,
            final_validation_accuracy=self.last_validation_accuracy,
            collapsed=is_collapsed(self.selection_accuracy(), self.num_classes, self.nonfinite),
            rounds_run=self.rounds_done,
            byzantine_majority_rounds=self.byzantine_majority_rounds,
            seconds=seconds,
            num_classes=self.num_classes,
            spec=self.spec.to_dict(),
            float_path=float_path().label(),
            mean_aggregation_error=self.round_means["aggregation_error"].mean,
            mean_honest_input_spread=self.round_means["honest_input_spread"].mean,
        )


def load_checkpoint(path: str | Path) -> dict[str, Any]:
    """A ``Simulation.state_dict()`` saved with ``torch.save``, read with ``weights_only=True``:
    checkpoints come back from shared storage, so nothing in them may run code when loaded. They
    hold only tensors (RNG states are uint8 tensors), numbers, strings, None and dicts, all of
    which the safe unpickler accepts as they are."""
    return torch.load(path, map_location="cpu", weights_only=True)


def _to_cpu(tree: Any) -> Any:
    if isinstance(tree, Tensor):
        return tree.detach().cpu().clone()
    if isinstance(tree, dict):
        return {k: _to_cpu(v) for k, v in tree.items()}
    return tree


def _to_device(tree: Any, device: torch.device) -> Any:
    if isinstance(tree, Tensor):
        return tree.to(device)
    if isinstance(tree, dict):
        return {k: _to_device(v, device) for k, v in tree.items()}
    return tree


def simulate(spec: RunSpec) -> Iterator[RoundRecord]:
    """Run ``spec`` round by round, yielding one RoundRecord per round."""
    yield from Simulation(spec)
