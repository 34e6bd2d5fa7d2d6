"""A sparse attack on coordinate-wise rules: the honest mean, with its largest coordinates
reversed and scaled."""

from __future__ import annotations

import math

from torch import Tensor

from robusttune.plugin import ATTACKS, Attack, AttackRound, SpecError


@ATTACKS.register("sparse_spike")
class SparseSpike(Attack):
    """Sparse spike: every Byzantine client sends the honest mean mu with the share
    ``spike_fraction`` of its coordinates of largest |mu_j| replaced by -s mu_j (s the
    strength): a large change confined to few coordinates, where a coordinate-wise rule looks
    one coordinate at a time.

    Strength ladder (1, 10, 100); ``spike_fraction`` (default 0.05) is this attack's own knob."""

    strength_ladder = (1.0, 10.0, 100.0)
    min_strength = 0.0
    why_min_strength = "s < 0 keeps the spikes' sign: no attack"

    def __init__(self, attack_strength: float | None = None, spike_fraction: float = 0.05) -> None:
        super().__init__(attack_strength)
        if not 0 < spike_fraction <= 1:
            raise SpecError(f"spike_fraction must be in (0, 1]; got {spike_fraction!r}")
        self.spike_fraction = spike_fraction

    def craft(self, rnd: AttackRound) -> Tensor:
        mu = rnd.reference(self.name).mean(dim=0)
        count = max(1, math.ceil(self.spike_fraction * mu.numel()))
        spikes = mu.abs().topk(count).indices
        message = mu.clone()
        message[spikes] = -self.strength * mu[spikes]
        return rnd.repeat(message)
