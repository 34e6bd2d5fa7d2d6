"""Pre-aggregations in front of any rule: nearest-neighbour mixing (NNM) and adaptive robust
clipping (ARC). Each maps the n messages to n new ones and hands them to its ``inner`` rule with
the same f, as ``bucketing`` does (``make_rule``: ``pre_aggregator`` of a RunSpec)."""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from robusttune.core.registry import SpecError
from robusttune.core.schema import check_key
from robusttune.methods.aggregators.base import AGGREGATORS, Aggregator, make_aggregator, tie_keys
from robusttune.methods.aggregators.geometry import (
    _masked_rows,
    distances_to,
    pairwise_sq_distances,
    robust_directions,
)


class PreAggregation(Aggregator):
    """A map of the messages followed by the ``inner`` rule (built from the remaining RunSpec
    keys, or given), with the same f and context. The guarantee is the inner rule's where the
    pre-aggregation's own holds: ``precondition`` is 2f < n (both papers' f < n/2) and the
    inner rule's; ``theoretical_breakdown`` the smaller of the two fractions (None where the
    inner rule has no bound in n, FLTrust)."""

    def __init__(
        self,
        inner: str | Aggregator = "mean",
        f: int | None = None,
        seed: int = 0,
        **inner_params: Any,
    ) -> None:
        super().__init__(f)
        self.seed = check_key("seed", seed)
        if isinstance(inner, Aggregator):
            self.inner = inner
        elif isinstance(inner, str):
            if inner in ("nnm", "arc"):
                raise SpecError(
                    f"inner {inner!r} is not allowed; allowed: any rule but nnm, arc "
                    "(name the pre-aggregation with pre_aggregator)"
                )
            self.inner = make_aggregator(inner, f=f, seed=seed, **inner_params)
        else:
            raise SpecError(f"inner must be an aggregator name; got {inner!r}")

    @property
    def needs_reference(self) -> bool:  # type: ignore[override]
        return self.inner.needs_reference

    def precondition(self, n: int, f: int) -> bool:
        return 2 * f < n and self.inner.precondition(n, f)

    def theoretical_breakdown(self, n: int) -> float | None:
        inner, outer = self.inner.theoretical_breakdown(n), super().theoretical_breakdown(n)
        return None if inner is None or outer is None else min(inner, outer)

    def premap(self, x: Tensor, f: int, previous: Tensor | None) -> Tensor:
        """The n messages the inner rule aggregates."""
        raise NotImplementedError

    def aggregate(
        self,
        x: Tensor,
        *,
        f: int,
        weights: Tensor | None,
        reference: Tensor | None,
        previous: Tensor | None,
        generator: torch.Generator | None,
    ) -> Tensor:
        return self.inner(
            self.premap(x, f, previous),
            f=f,
            weights=weights,
            reference=reference,
            previous=previous,
            generator=generator,
        )


@AGGREGATORS.register("nnm")
class NearestNeighbourMixing(PreAggregation):
    """Nearest-neighbour mixing (Allouah et al., AISTATS 2023, "Fixing by mixing", Algorithm 1):
    every message is replaced by the mean of its n - f nearest messages, itself included,

        y_i = 1/(n - f) sum_{j in N_i} x_j,   N_i = the n - f rows nearest x_i in ||.||_2,

    and ``inner`` aggregates y_1 .. y_n with the same f (n - f clamped to [1, n]). Exact distance
    ties are broken by a fixed projection of the messages (``tie_keys``), so the output does not
    depend on the client order. Cost: the pairwise distances (O(n^2 d)) and n - f gathers of the
    n rows (a loop over neighbour slots, never over coordinates; no n x (n - f) x d copy).
    Extreme messages: a row holding inf or NaN, or whose distances overflow, is at distance +inf
    from every other, so while at most f rows are such, an honest row's n - f nearest are honest
    and its mix finite; the corrupted rows' own mixes go to the inner rule as corrupted rows."""

    def premap(self, x: Tensor, f: int, previous: Tensor | None) -> Tensor:
        n = x.shape[0]
        k = min(max(n - f, 1), n)
        dist = pairwise_sq_distances(x)
        by_key = torch.argsort(tie_keys(x), stable=True)
        # row i's columns in key order, then stably by distance: (distance, key) lexicographic
        nearest = by_key[torch.argsort(dist[:, by_key], dim=1, stable=True)[:, :k]]
        mixed = x.index_select(0, nearest[:, 0])
        for slot in range(1, k):
            mixed += x.index_select(0, nearest[:, slot])
        return mixed / k


@AGGREGATORS.register("arc")
class AdaptiveRobustClipping(PreAggregation):
    """Adaptive robust clipping (Allouah et al., ICLR 2025, "Adaptive gradient clipping for
    robust federated learning", Algorithm 1): with k = floor(2 (f / n) (n - f)), the k messages of
    largest norm are clipped to the norm of the (k+1)-th largest,

        y_i = c + (x_i - c) min(1, tau / ||x_i - c||),   tau = the (k+1)-th largest ||x_j - c||,

    the others kept (k clamped to [0, n - 1]; k = 0 keeps every message), and ``inner``
    aggregates y with the same f. Norms are taken from c = ``previous``, the point the messages
    move from: the global model when states are aggregated (so these are the update norms the
    paper clips), the last aggregate under the momentum algorithms (their momenta's change, as
    CCLIP centres); c = 0 when none is given. Rows tied with tau are unchanged by the clip, so
    ties in norm need no rule.
    Extreme messages: a norm that is not finite (overflow, inf) clips the row to tau along its
    overflow-free direction (``robust_directions``); a NaN row has none and becomes c."""

    def premap(self, x: Tensor, f: int, previous: Tensor | None) -> Tensor:
        n = x.shape[0]
        k = min(max(2 * f * (n - f) // n, 0), n - 1)  # floor(2 (f / n) (n - f)), exactly
        if k == 0:
            return x
        centre = (
            torch.zeros(x.shape[1], device=x.device, dtype=x.dtype)
            if previous is None
            else previous
        )
        norms = distances_to(x, centre)
        norms = norms.masked_fill_(torch.isnan(norms), float("inf"))
        tau = torch.topk(norms, k + 1).values[k:]  # the (k+1)-th largest, a 1-element tensor
        clipped = norms > tau
        scale = torch.where(clipped, tau / norms, 1.0)
        far = clipped & ~torch.isfinite(norms)
        out = torch.where(far[:, None], 0.0, x - centre) * scale[:, None]
        for part, rows in _masked_rows(x, far):
            out[rows] = torch.where(
                far[rows, None], tau * robust_directions(part, centre), out[rows]
            )
        return out.add_(centre)
