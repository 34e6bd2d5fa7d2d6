"""Who takes part in a round: the draw (fixed-size as in SWB-DM, or Bernoulli as in DeMoA) and the
`Sample` the round carries, held on the host for bookkeeping and on the run's device for
indexing rows, so that no step of a round has to read a device value back."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import torch
from torch import Tensor

from robusttune.core.schema import RunSchema

__all__ = [
    "Sample",
    "byzantine_clients",
    "byzantine_ever_sampled",
    "byzantine_majority_rounds",
    "draw_clients",
    "draw_sample",
    "is_byzantine_majority",
    "sampling_generator",
]


def draw_clients(
    mode: str, clients: int, participation: float, sample_size: int, generator: torch.Generator
) -> Tensor:
    """The sampled clients, sorted, as a CPU long tensor. ``fixed``: ``sample_size`` clients
    without replacement (a random permutation's head); ``bernoulli``: each client independently
    with probability ``participation`` (possibly nobody)."""
    if mode == "bernoulli":
        chosen = torch.rand(clients, generator=generator) < participation
        return chosen.nonzero().flatten()
    order = torch.randperm(clients, generator=generator)
    return order[:sample_size].sort().values


def is_byzantine_majority(n_byzantine: int, n_sampled: int) -> bool:
    """A Byzantine-majority round (DeMoA, arXiv 2509.02970): the Byzantine clients hold at least
    half of the sampled set, 2 b_t >= |S_t|, with b_t >= 1 (an empty sample is not one)."""
    return n_byzantine > 0 and 2 * n_byzantine >= n_sampled


@dataclass(frozen=True)
class Sample:
    """This round's sampled clients and which of them are Byzantine."""

    clients_cpu: Tensor  # long[k]
    byzantine_cpu: Tensor  # bool[k]
    clients: Tensor  # long[k] on the run's device
    byzantine_rows: Tensor  # long[b] positions of the Byzantine clients in the sample, device
    honest_rows: Tensor  # long[k - b] positions of the honest ones, device

    @classmethod
    def of(cls, clients: Tensor, byzantine: Tensor, device: torch.device | str) -> Sample:
        """From the clients and their Byzantine flags (any device); copies to ``device`` are
        non-blocking, so building a Sample never waits for queued GPU work."""
        clients_cpu = clients.detach().cpu().long()
        byzantine_cpu = byzantine.detach().cpu().bool()
        positions = torch.arange(len(clients_cpu))

        def move(t: Tensor) -> Tensor:
            return t.to(device, non_blocking=True)

        return cls(
            clients_cpu,
            byzantine_cpu,
            move(clients_cpu),
            move(positions[byzantine_cpu]),
            move(positions[~byzantine_cpu]),
        )

    @property
    def size(self) -> int:
        return len(self.clients_cpu)

    @property
    def n_byzantine(self) -> int:
        return int(self.byzantine_cpu.sum())


# -- a run's own draws, from its RunSpec ---------------------------------------------------------
def byzantine_clients(spec: RunSchema) -> Tensor:
    """Which clients are Byzantine (bool[N]): the first floor(beta N) of a permutation seeded
    with seed + 2, its own stream (a generator seeded like the sampling one would draw round 1's
    permutation, putting every Byzantine client into the first fixed-size sample)."""
    order = torch.randperm(spec.clients, generator=torch.Generator().manual_seed(spec.seed + 2))
    mask = torch.zeros(spec.clients, dtype=torch.bool)
    mask[order[: spec.n_byzantine]] = True
    return mask


def sampling_generator(spec: RunSchema) -> torch.Generator:
    """The run's sampling stream: it draws the rounds' samples and nothing else."""
    return torch.Generator().manual_seed(spec.seed)


def draw_sample(spec: RunSchema, generator: torch.Generator) -> Tensor:
    """One round's sampled clients (sorted CPU long tensor) from the sampling stream."""
    return draw_clients(
        spec.participation_mode,
        spec.clients,
        spec.participation,
        spec.expected_sample_size,
        generator,
    )


def byzantine_ever_sampled(spec: RunSchema) -> bool:
    """Whether some round of the run samples a Byzantine client. The samples depend on the seed,
    N, p, the sampling mode and the sample size alone (not on the model, the rule or the attack),
    so this replays the run's sampling stream for all ``rounds`` without training."""
    if spec.n_byzantine == 0:
        return False
    return any(n_byzantine > 0 for n_byzantine, _ in _replayed_samples(spec))


def byzantine_majority_rounds(spec: RunSchema) -> list[int]:
    """The rounds (1-based) whose drawn sample S_t is Byzantine-majority, 2 b_t >= |S_t| with
    b_t >= 1 (the RoundRecord's ``byzantine_majority``), replayed from the sampling stream alone
    as `byzantine_ever_sampled` does: the same for every model, rule and attack, so a study can
    choose seeds by when the first such round comes (DeMoA, arXiv 2509.02970: FedAvg and FedCM
    fall right after it) without training. A method whose plan overrides the draw (Algorithm 1
    MARINA's full rounds) aggregates another set in those rounds."""
    return [
        round_index
        for round_index, (n_byzantine, n_sampled) in enumerate(_replayed_samples(spec), start=1)
        if is_byzantine_majority(n_byzantine, n_sampled)
    ]


def _replayed_samples(spec: RunSchema) -> Iterator[tuple[int, int]]:
    """(Byzantine clients sampled, clients sampled) for each of the run's rounds, in order, from
    its sampling stream alone."""
    byzantine, generator = byzantine_clients(spec), sampling_generator(spec)
    for _ in range(spec.rounds):
        sample = draw_sample(spec, generator)
        yield int(byzantine[sample].sum()), len(sample)
