"""Server-side delayed caches: one slot per client, refreshed when the client is sampled.

`StateCache` is SWB-DM's cache of trained model states (Section IV-B: c_i <- s_i for sampled i,
c_i kept otherwise, slots start as the initial global model). `MomentumCache` is DeMoA's cache of
client momenta with the decay of unsampled slots, which equals the preprocessing
P(m_i) = prod_{s = t - tau + 1}^{t} (1 - alpha_s p_s) m_i applied lazily round by round.
Slots may be stored in bfloat16 (`cache_dtype`) so large populations fit; reads are float32.
"""

from __future__ import annotations

import torch
from torch import Tensor

from robusttune.problem.sampling import Sample

_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}


class ClientCache:
    """N slots of d values plus who wrote each slot last (for the Byzantine share of the input).
    The slots live on the run's device; who wrote them is bookkeeping and stays on the host, so
    reading it never waits for the GPU."""

    def __init__(self, num_clients: int, initial: Tensor, dtype: str = "float32") -> None:
        self.dtype = _DTYPES[dtype]
        self.slots = initial.detach().to(self.dtype).expand(num_clients, -1).clone()
        # True where a Byzantine client's own submission sits in its slot (slots start benign).
        self.written_by_byzantine = torch.zeros(num_clients, dtype=torch.bool)

    def refresh(self, sample: Sample, values: Tensor) -> None:
        """Overwrite the slots of the sampled clients with ``values`` (rows aligned)."""
        self.slots.index_copy_(0, sample.clients, values.to(self.dtype))
        self.written_by_byzantine[sample.clients_cpu] = sample.byzantine_cpu

    def read(self) -> Tensor:
        return self.slots.float()

    def state_dict(self) -> dict[str, Tensor]:
        return {"slots": self.slots, "written_by_byzantine": self.written_by_byzantine}

    def load_state_dict(self, state: dict[str, Tensor]) -> None:
        self.slots = state["slots"].to(self.slots.device, self.dtype).clone()
        self.written_by_byzantine = state["written_by_byzantine"].cpu().clone()


class StateCache(ClientCache):
    """SWB-DM's cache of each client's last submitted trained state."""


class MomentumCache(ClientCache):
    """DeMoA's server copy of every client's momentum (Otsuka et al., 2025).

    Sampled i:     m_i <- (1 - alpha p) m_i + alpha g_i
    Not sampled:   m_i <- (1 - alpha p) m_i   (the server applies the decay to its copy, so after
                   tau unsampled rounds the slot equals P(m_i) = prod (1 - alpha_s p_s) m_i)
    A slot holds what its client last sent, so a Byzantine client's slot holds its malicious
    message; its honest momentum lives in `ByzantineMomenta`.
    """

    def decay(self, coefficient: float) -> None:
        """m_i <- coefficient * m_i for every slot (one fused op, no loop over clients)."""
        if coefficient != 1.0:
            self.slots.mul_(coefficient)


class ByzantineMomenta:
    """The momentum each Byzantine client would honestly hold, one row per Byzantine client (B rows,
    not N), kept in the cache's dtype so that under ``attack: none`` it equals the server's copy
    bit for bit. It follows the honest recursion (decay when unsampled, c m_i + alpha g_i when
    sampled) whatever the client sends, and is what attacks get as ``own``."""

    def __init__(self, byzantine: Tensor, initial: Tensor, dtype: str = "float32") -> None:
        self.dtype = _DTYPES[dtype]
        members = byzantine.nonzero().flatten()
        self.row_of = torch.full((byzantine.numel(),), -1, dtype=torch.long, device=initial.device)
        self.row_of[members] = torch.arange(len(members), device=initial.device)
        self.slots = initial.detach().to(self.dtype).expand(len(members), -1).clone()

    def read(self, clients: Tensor) -> Tensor:
        """float32 rows of the given Byzantine ``clients``."""
        return self.slots.index_select(0, self.row_of[clients]).float()

    def decay(self, coefficient: float) -> None:
        if coefficient != 1.0:
            self.slots.mul_(coefficient)

    def refresh(self, clients: Tensor, values: Tensor) -> None:
        """Set the rows of the Byzantine ``clients`` to ``values`` (rows aligned)."""
        self.slots.index_copy_(0, self.row_of[clients], values.to(self.dtype))

    def state_dict(self) -> dict[str, Tensor]:
        return {"slots": self.slots}

    def load_state_dict(self, state: dict[str, Tensor]) -> None:
        self.slots = state["slots"].to(self.slots.device, self.dtype).clone()
