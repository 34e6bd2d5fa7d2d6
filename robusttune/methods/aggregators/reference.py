"""Rules that score messages against the server's own message: FLTrust."""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from robusttune.methods.aggregators.base import AGGREGATORS, Aggregator, row_blocks
from robusttune.methods.aggregators.geometry import combine_centred, direction_dots, direction_sum


@AGGREGATORS.register("fltrust")
class FLTrust(Aggregator):
    """FLTrust (Cao, Fang, Liu and Gong, NDSS 2021, Eq. 5-7). With p = ``previous`` (0 if None,
    i.e. the messages already are updates), g_i = x_i - p and g_0 = ``reference`` - p the update
    the server computed on its clean root set:
        TS_i = relu(cos(g_i, g_0)),
        out  = p + sum_i TS_i (||g_0|| / ||g_i||) g_i / sum_i TS_i,
    every trusted update rescaled to the server update's norm. A zero g_i has no direction and
    gets TS_i = 0. If every TS_i is 0 (all messages point away from the server's), the server
    keeps its model: out = p. Needs ``reference`` at call time; does not depend on n or f.

    The rule only uses each g_i's direction, so a g_i whose norm or dot product with g_0 is not
    finite (its squares overflow, or it holds inf) enters through its direction computed without
    overflow (:func:`~robusttune.methods.aggregators.geometry.robust_directions`; for inf coordinates the
    limit direction sign(g) on them), and a g_i holding NaN has no direction: TS_i = 0. (Before,
    one NaN message made the total trust NaN and the server silently kept its model every round.)
    """

    needs_reference = True

    def theoretical_breakdown(self, n: int) -> None:
        """None: FLTrust trusts the server's root data, not a majority of the n inputs, so no
        fraction of n bounds it (its guarantee is on the root set's representativeness)."""
        return None

    def aggregate(
        self, x: Tensor, *, reference: Tensor | None, previous: Tensor | None, **context: Any
    ) -> Tensor:
        if reference is None:
            raise ValueError("fltrust needs the server's own message: call it with reference=...")
        n, d = x.shape
        tiny = torch.finfo(x.dtype).tiny
        g0 = reference if previous is None else reference - previous
        norm0 = torch.linalg.vector_norm(g0)
        norms = torch.empty(n, device=x.device, dtype=x.dtype)
        dots = torch.empty(n, device=x.device, dtype=x.dtype)
        for rows in row_blocks(n, d):
            g = x[rows] if previous is None else x[rows] - previous
            norms[rows] = torch.linalg.vector_norm(g, dim=1)
            dots[rows] = g @ g0
        far = ~(torch.isfinite(norms) & torch.isfinite(dots))
        usable = (norms > 0) & (norm0 > 0) & ~far
        # Divided one factor at a time: norms * norm0 can overflow where each is finite.
        cos = torch.where(usable, dots / norms.clamp_min(tiny) / norm0.clamp_min(tiny), 0.0)
        # Rows at non-finite norm or dot enter by their direction u_i: cos_i = u_i . g_0 / ||g_0||.
        # Selections by torch.where, not branches, so nothing is read back off the host.
        unit0 = g0 / norm0.clamp_min(tiny)
        cos = torch.where(far & (norm0 > 0), direction_dots(x, unit0, previous, far), cos)
        trust = torch.relu(cos)
        total = trust.sum()
        base = torch.zeros(d, device=x.device, dtype=x.dtype) if previous is None else previous
        coefficients = torch.where(usable, trust * norm0 / norms.clamp_min(tiny), 0.0)
        out = combine_centred(x, coefficients / total, previous, skip=far)
        out += direction_sum(x, trust * norm0 / total, previous, far)  # rescaled: norm0 * u_i
        # Every TS_i = 0 (total 0, out NaN): the server keeps its model.
        return torch.where(total > 0, base + out, base)
