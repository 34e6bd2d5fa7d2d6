"""Wrappers around another rule: bucketing."""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import Tensor

from robusttune.aggregators.base import (
    AGGREGATORS, Aggregator, check_int, generator_for, make_aggregator, tie_keys,
)
from robusttune.registry import SpecError


@AGGREGATORS.register("bucketing")
class Bucketing(Aggregator):
    """Bucketing (Karimireddy, He and Jaggi, ICLR 2022, Algorithm 1) around any rule:
    shuffle the n messages with the generator, average consecutive buckets of s = ``bucket_size``
    (the last bucket holds the n mod s left over, if any), and apply the ``inner`` rule to the
    ceil(n/s) bucket means with the same f:
        y_k = mean{x_pi(i) : i in bucket k},   out = Inner(y_1 .. y_ceil(n/s); f).
    Built as ``make_aggregator("bucketing", inner="krum", bucket_size=2, **inner_params)``; the
    inner rule takes the remaining parameters. s in {0, 1} means no bucketing. With sample
    counts, bucket means are weighted and the inner rule gets the bucket totals as weights.

    The messages are first put in a canonical order (by a fixed projection) and then shuffled,
    so the output depends on the set of messages and the generator state, not on their order.
    Randomness: the call-time generator, else an own generator seeded from ``seed``.
    Precondition: the inner rule's on (ceil(n/s), f) — the actual n, not the expected one.
    """

    def __init__(self, inner: str | Aggregator = "mean", bucket_size: int = 2, seed: int = 0,
                 f: int | None = None, **inner_params: Any) -> None:
        super().__init__(f)
        self.bucket_size = max(check_int("bucket_size", bucket_size, 0), 1)
        self.seed = check_int("seed", seed, 0)
        if isinstance(inner, Aggregator):
            self.inner = inner
        elif isinstance(inner, str):
            if inner == "bucketing":
                raise SpecError("inner 'bucketing' is not allowed; allowed: any other aggregator")
            self.inner = make_aggregator(inner, f=f, seed=seed, **inner_params)
        else:
            raise SpecError(f"inner must be an aggregator name; got {inner!r}")
        self._generators: dict[str, torch.Generator] = {}

    @property
    def needs_reference(self) -> bool:  # type: ignore[override]
        return self.inner.needs_reference

    def n_buckets(self, n: int) -> int:
        return math.ceil(n / self.bucket_size)

    def precondition(self, n: int, f: int) -> bool:
        return self.inner.precondition(self.n_buckets(n), f)

    def aggregate(self, x: Tensor, *, f: int, weights: Tensor | None, reference: Tensor | None,
                  previous: Tensor | None, generator: torch.Generator | None) -> Tensor:
        n, d = x.shape
        gen = generator_for(generator, self._generators, self.seed, x.device)
        canonical = torch.argsort(tie_keys(x), stable=True)
        shuffle = torch.randperm(n, generator=gen, device=gen.device).to(x.device)
        s = self.bucket_size
        # Message canonical[shuffle[p]] sits at shuffled position p, in bucket p // s; summing
        # with index_add_ never copies the n x d messages (1.1 GB at n = 500).
        bucket = torch.empty(n, dtype=torch.long, device=x.device)
        bucket[canonical[shuffle]] = torch.arange(n, device=x.device) // s
        w = torch.ones(n, device=x.device, dtype=x.dtype) if weights is None else weights
        buckets = math.ceil(n / s)
        totals = torch.zeros(buckets, device=x.device, dtype=x.dtype).index_add_(0, bucket, w)
        sums = torch.zeros(buckets, d, device=x.device, dtype=x.dtype)
        sums.index_add_(0, bucket, x if weights is None else x * w[:, None])
        means = sums / totals[:, None]
        return self.inner(means, f=f, weights=None if weights is None else totals,
                          reference=reference, previous=previous, generator=gen)
