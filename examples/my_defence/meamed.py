"""Mean around the median (MeaMed; Xie, Koyejo and Gupta, 2018, "Generalized Byzantine-tolerant
SGD", arXiv:1802.10116, Definition 5): per coordinate, the mean of the k values nearest the
coordinate's median, k = n - f by default."""

from __future__ import annotations

import math

import torch
from torch import Tensor

from robusttune.plugin import AGGREGATORS, Aggregator, SpecError


@AGGREGATORS.register("meamed")
class MeanAroundMedian(Aggregator):
    """Mean around the median (Xie, Koyejo and Gupta, 2018): out_j = mean of the k values x_ij
    nearest med_i x_ij, k = ceil(keep_fraction * n), or n - f when keep_fraction is None.

    ``keep_fraction`` is this rule's own knob: set it in a run (``keep_fraction: 0.6``, ``--set
    keep_fraction=0.6``) or search it (``space: {keep_fraction: {uniform: [0.3, 1.0]}}``)."""

    def __init__(self, keep_fraction: float | None = None, f: int | None = None) -> None:
        super().__init__(f)
        if keep_fraction is not None and not 0 < keep_fraction <= 1:
            raise SpecError(f"keep_fraction must be in (0, 1] or none; got {keep_fraction!r}")
        self.keep_fraction = keep_fraction

    def precondition(self, n: int, f: int) -> bool:
        """The median the values are gathered around stays among honest values while 2f < n."""
        return 2 * f < n

    def aggregate(self, x: Tensor, *, f: int, **context) -> Tensor:
        n = x.shape[0]
        if self.keep_fraction is None:
            k = max(1, n - f)
        else:
            k = max(1, min(n, math.ceil(self.keep_fraction * n)))
        median = x.median(dim=0).values
        # the k rows nearest the median in each coordinate, chosen together (one topk, no loop)
        nearest = (x - median).abs().topk(k, dim=0, largest=False).indices
        return torch.gather(x, 0, nearest).mean(dim=0)
