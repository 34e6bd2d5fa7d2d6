"""Who takes part in a round: the draw (fixed-size as in SWB-DM, or Bernoulli as in DeMoA) and the
`Sample` the round carries, held on the host for bookkeeping and on the run's device for
indexing rows, so that no step of a round has to read a device value back."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

__all__ = ["Sample", "draw_clients", "is_byzantine_majority"]


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
