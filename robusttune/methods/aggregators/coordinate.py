"""Coordinate-wise rules: mean (FedAvg), median, trimmed mean."""

from __future__ import annotations

from typing import Any

from torch import Tensor

from robusttune.core.schema import check_key
from robusttune.methods.aggregators.base import (
    AGGREGATORS,
    Aggregator,
    sort_values,
    sorted_median,
    trim_count,
)


@AGGREGATORS.register("mean")
class Mean(Aggregator):
    """FedAvg (McMahan et al., 2017): out = sum_i w_i x_i / sum_i w_i, w_i = 1 unless sample
    counts are given. No robustness: one unbounded message moves the output without bound."""

    def theoretical_breakdown(self, n: int) -> float:
        """0: a single message moves the mean anywhere."""
        return 0.0

    def aggregate(self, x: Tensor, *, weights: Tensor | None, **context: Any) -> Tensor:
        if weights is None:
            return x.mean(dim=0)
        return (weights @ x) / weights.sum()


@AGGREGATORS.register("median")
class Median(Aggregator):
    """Coordinate-wise median (Yin et al., ICML 2018): out_j = median_i x_ij.

    For even n the two middle order statistics x_(n/2) <= x_(n/2+1) are combined by
    ``median_even``: ``midpoint`` (default) returns their average; ``lower`` returns x_(n/2), the
    convention of ``torch.median`` that the SWB-DM code used, which at n = 2 returns the smaller
    message on every coordinate (the deterministic wrong answer of SWB-DM Sec. VII-B).
    Precondition: 2f < n (the median stays within the honest range).
    """

    def __init__(self, f: int | None = None, median_even: str = "midpoint") -> None:
        super().__init__(f)
        self.median_even = check_key("median_even", median_even)

    def precondition(self, n: int, f: int) -> bool:
        return 2 * f < n

    def aggregate(self, x: Tensor, **context: Any) -> Tensor:
        # clone: a row view would keep the whole sorted n x d copy alive
        return sorted_median(sort_values(x, dim=0), self.median_even == "lower").clone()


@AGGREGATORS.register("trimmed_mean")
class TrimmedMean(Aggregator):
    """Coordinate-wise trimmed mean (Yin et al., ICML 2018):
    out_j = 1/(n - 2b) * sum_{r=b}^{n-b-1} x_(r)j, the b largest and b smallest values of each
    coordinate dropped; b = floor(trim_ratio * n) when ``trim_ratio`` is given, else b = f.

    Precondition: 2b < n and b >= f (every corrupted value can be trimmed; for b = f this is
    2f < n). Unguarded with 2b >= n, b is clamped to floor((n - 1) / 2), keeping the one or two
    middle values: the rule degrades to the median instead of failing.
    """

    def __init__(self, f: int | None = None, trim_ratio: float | None = None) -> None:
        super().__init__(f)
        self.trim_ratio = check_key("trim_ratio", trim_ratio)

    def _trim(self, n: int, f: int) -> int:
        return f if self.trim_ratio is None else trim_count(self.trim_ratio, n)

    def precondition(self, n: int, f: int) -> bool:
        b = self._trim(n, f)
        return 2 * b < n and b >= f

    def aggregate(self, x: Tensor, *, f: int, **context: Any) -> Tensor:
        n = x.shape[0]
        b = min(self._trim(n, f), (n - 1) // 2)
        if b == 0:
            return x.mean(dim=0)
        # A sort, not "sum minus top-k sums": subtracting the sums of 1e6-sized outliers from the
        # total cancels away the honest values' digits in float32 (and inf - inf is NaN).
        return sort_values(x, dim=0)[b : n - b].mean(dim=0)
