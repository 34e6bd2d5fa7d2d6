"""The rule interface, the registry and the numerical helpers the rules share (sorting, medians,
row and column blocks; distances and directions are `robusttune.methods.aggregators.geometry`).

A rule is a small callable object: parameters are given and checked once in the constructor
(``SpecError``, one line naming the key and the allowed values), the call takes the stacked
messages ``Tensor[n, d]`` and returns one ``Tensor[d]`` on the input's device and dtype.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import torch
from torch import Tensor

from robusttune.core.registries import AGGREGATORS as AGGREGATORS  # the rules register here
from robusttune.core.validation import check_value, optional_int
from robusttune.methods.aggregators.appended import appended_rows

# Column blocks of the pairwise-distance Gram product and row blocks of centred differences are
# sized so that one temporary holds about this many elements (64 MB in float32): an n x d
# temporary at n=500, d=545,098 would be 1.1 GB, and first-touching fresh pages costs about as
# much as the arithmetic on this machine.
BLOCK_ELEMENTS = 1 << 24

# Device types whose values a rule may read back to branch on (to skip a slow path that is almost
# never taken) or hand to numpy: free on the CPU, while on CUDA every read-back waits for all
# queued kernels. Elsewhere the rules take branch-free paths. tests/test_host_syncs.py empties it
# to run those paths on CPU tensors and count read-backs.
HOST_DEVICE_TYPES: frozenset[str] = frozenset({"cpu"})


def on_host(x: Tensor) -> bool:
    """Whether reading ``x``'s values back to Python costs no device synchronisation."""
    return x.device.type in HOST_DEVICE_TYPES


class Aggregator:
    """Base of every rule: ``rule(updates, f=..., weights=..., reference=..., previous=...,
    generator=...) -> Tensor[d]`` for ``updates: Tensor[n, d]``.

    Context a rule needs comes by keyword at call time: ``f`` the assumed number of corrupted
    inputs (overrides the constructor's), ``weights`` sample counts, ``reference`` the server's
    own message (FLTrust), ``previous`` the point messages move from (the current global model
    when states are aggregated, the last aggregate when momenta are), ``generator`` the run's
    torch.Generator for randomised rules (so the simulation owns every RNG and checkpoints it).
    Rules ignore the context they do not use.

    Numerics: bfloat16/float16 messages are aggregated in float32 and the result is cast back to
    the input dtype; float32 and float64 are computed in their own precision. Subclasses
    implement :meth:`aggregate` on the converted messages.
    """

    name: str = "base"
    # needs_reference: the round loop computes the server's own message for it (FLTrust)
    needs_reference: bool = False

    @classmethod
    def calibrated_trim_ratio(cls, assumed_byzantine_fraction: float) -> float | None:
        """The trim ratio the rule's paper prescribes for an assumed corruption, when a RunSpec
        gives none; None: the rule has no such law (or no trim)."""
        return None

    def __init__(self, f: int | None = None) -> None:
        self.f = check_value("f", f, optional_int(ge=0))

    def precondition(self, n: int, f: int) -> bool:
        """Whether the rule's guarantee holds for n inputs of which f may be corrupted."""
        return True

    def theoretical_breakdown(self, n: int) -> float | None:
        """The largest corrupted fraction of n inputs the rule's guarantee covers,
        max{f : precondition(n, f)} / n (Krum (n - 3) / 2n rounded down, Bulyan (n - 3) / 4n,
        median and the geometric median (n - 1) / 2n, a trimmed rule its trim), for a breakdown
        map to print beside the measured one. None: the rule has no bound in n (FLTrust), or
        states neither a precondition nor a bound (a plugin rule that defines neither gets no
        theory figure rather than a bound of (n - 1) / n it never claimed)."""
        if type(self).precondition is Aggregator.precondition:
            return None
        covered = [f for f in range(n) if self.precondition(n, f)]
        return max(covered) / n if covered else 0.0

    def _f(self, f: int | None) -> int:
        if f is None:
            return self.f or 0
        if f < 0:
            raise ValueError(f"f must be >= 0; got {f}")
        return int(f)

    def __call__(
        self,
        updates: Tensor,
        *,
        f: int | None = None,
        weights: Tensor | None = None,
        reference: Tensor | None = None,
        previous: Tensor | None = None,
        generator: torch.Generator | None = None,
    ) -> Tensor:
        if updates.dim() != 2 or updates.shape[0] < 1:
            raise ValueError(
                f"{self.name}: updates must be a Tensor[n, d] with n >= 1; got shape "
                f"{tuple(updates.shape)}"
            )
        dtype = compute_dtype(updates.dtype)
        x = updates.detach().to(dtype)
        if weights is not None:
            weights = torch.as_tensor(weights).detach().to(device=x.device, dtype=dtype).reshape(-1)
            if weights.numel() != x.shape[0]:
                raise ValueError(f"{self.name}: {weights.numel()} weights for {x.shape[0]} updates")
        if reference is not None:
            reference = reference.detach().to(device=x.device, dtype=dtype).reshape(-1)
        if previous is not None:
            previous = previous.detach().to(device=x.device, dtype=dtype).reshape(-1)
        with torch.no_grad():
            out = self.aggregate(
                x,
                f=self._f(f),
                weights=weights,
                reference=reference,
                previous=previous,
                generator=generator,
            )
        return out.to(updates.dtype) if updates.dtype.is_floating_point else out

    def with_fixed_rows(
        self, fixed: Tensor, *, f: int, seed: int = 0
    ) -> Callable[[Tensor, int], Tensor]:
        """``(message, copies) -> rule(cat[fixed, copies x message], f=f)``, unweighted, each call
        with a generator seeded ``seed``: the objective of a search that varies only the appended
        rows (the optimal attacks' line search, robusttune.methods.attacks.rule_aware). This default
        concatenates and calls the rule; a rule whose work on the fixed rows can be done once
        overrides it with the same result (SWB: their rotations)."""
        return appended_rows(self, fixed, f=f, seed=seed)

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
        """The rule on messages already in the compute dtype; returns Tensor[d]."""
        raise NotImplementedError

    def __repr__(self) -> str:
        params = ", ".join(f"{k}={v!r}" for k, v in vars(self).items() if not k.startswith("_"))
        return f"{type(self).__name__}({params})"


def make_aggregator(name: str, /, **params: Any) -> Aggregator:
    """Build rule ``name`` from keyword parameters spelled as RunSpec keys (f, trim_ratio, krum_m,
    cclip_tau, gm_iters, swb_chunk, seed ...); RunSpec keys the rule does not use are ignored."""
    return AGGREGATORS.make(name, **params)


def trim_count(ratio: float, n: int) -> int:
    """floor(ratio * n), with the same 1e-9 tolerance as RunSpec so 0.3 * 10 trims 3, not 2."""
    return math.floor(ratio * n + 1e-9)


# -- numerics ----------------------------------------------------------------------------------


def compute_dtype(dtype: torch.dtype) -> torch.dtype:
    """float32 for half precisions and integers (their sums and sorts lose too much), else the
    input dtype."""
    if dtype in (torch.float32, torch.float64):
        return dtype
    return torch.float32


def _numpy_ok(x: Tensor) -> bool:
    return on_host(x) and x.dtype in (torch.float32, torch.float64)


def sort_values(x: Tensor, dim: int) -> Tensor:
    """Sorted values along ``dim``. On CPU numpy's vectorised sort is used: measured here it
    sorts a [50, 545098] float32 matrix along the clients in 0.14 s against 1.8 s for torch.sort
    (which also builds the index tensor), and rows of 512 about 8x faster. Both paths order
    -inf < finite < +inf < NaN, which the trimmed rules rely on to drop corrupted values."""
    if _numpy_ok(x):
        return torch.from_numpy(np.sort(x.numpy(), axis=dim))
    return torch.sort(x, dim=dim).values


def argsort_last(x: Tensor) -> Tensor:
    """Stable argsort along the last dimension: the permutation that orders each row by value
    (-inf < finite < +inf < NaN, -0.0 equal to +0.0), equal values in position order, as
    ``np.argsort(kind="stable")`` and ``torch.argsort(stable=True)`` give it. On CPU float32
    it sorts one distinct 64-bit integer key per element (`_stable_argsort_float32`); float64
    takes numpy's stable argsort, other devices torch's."""
    if _numpy_ok(x):
        values = x.numpy()
        if values.dtype == np.float32 and values.shape[-1] <= 1 << 32:
            return torch.from_numpy(_stable_argsort_float32(values))
        return torch.from_numpy(np.argsort(values, axis=-1, kind="stable"))
    return torch.argsort(x, dim=-1, stable=True)


_POSITION_MASK = np.uint64(0xFFFFFFFF)


def _stable_argsort_float32(values: np.ndarray) -> np.ndarray:
    """Stable argsort of float32 rows by sorting keys key = order(v) * 2^32 + position.

    order(v) maps a float's IEEE-754 bits u to an unsigned integer in the floats' order:
    ~u for a negative float, u | 2^31 otherwise, with -0.0 read as +0.0 and every NaN as one
    quiet NaN above +inf. The keys are distinct, so any sort puts them in one order, and two
    equal values fall in position order, which is what a stable sort does: the permutation is
    numpy's stable argsort's, bit for bit on any CPU. It is faster because numpy sorts 64-bit
    integers with its vectorised sort, where its stable float argsort is a merge sort (SWB's
    medoid step, rows of 512: 3.7x, and SWB at two clients 1.46x; bench/aggregators.py). Bit
    operations only, so no floating-point mode (flushing subnormals, say) can change the order."""
    bits = np.ascontiguousarray(values).view(np.uint32)
    magnitude = bits & np.uint32(0x7FFFFFFF)
    bits = np.where(magnitude == 0, np.uint32(0), bits)
    bits = np.where(magnitude > np.uint32(0x7F800000), np.uint32(0x7FC00000), bits)
    flip = (bits.view(np.int32) >> 31).view(np.uint32) | np.uint32(0x80000000)
    keys = (bits ^ flip).astype(np.uint64)
    keys <<= np.uint64(32)
    keys |= np.arange(values.shape[-1], dtype=np.uint64)
    keys.sort(axis=-1)
    return (keys & _POSITION_MASK).astype(np.int64)


def midpoint(low: Tensor, high: Tensor) -> Tensor:
    """(low + high) / 2 without overflow for values near the dtype's maximum."""
    return 0.5 * low + 0.5 * high


def sorted_median(ordered: Tensor, lower: bool = False) -> Tensor:
    """Median along dim 0 of values already sorted along dim 0. Odd n: the middle row; even n:
    the midpoint of the two middle rows, or the lower one with ``lower`` (torch.median's choice)."""
    n = ordered.shape[0]
    if n % 2 == 1:
        return ordered[n // 2]
    if lower:
        return ordered[n // 2 - 1]
    return midpoint(ordered[n // 2 - 1], ordered[n // 2])


@functools.lru_cache(maxsize=8)
def _direction(length: int, device: str, dtype: torch.dtype) -> Tensor:
    generator = torch.Generator().manual_seed(0x5EED)
    return torch.randn(length, generator=generator, dtype=torch.float64).to(
        device=device, dtype=dtype
    )


def tie_keys(rows: Tensor) -> Tensor:
    """One number per row (its projection on a fixed pseudo-random direction) used to break exact
    ties between different rows without looking at their positions, so a choice never depends on
    the order in which the messages arrive. Different rows tie in key with probability zero; equal
    rows are interchangeable."""
    return rows @ _direction(rows.shape[-1], str(rows.device), rows.dtype)


def rank_ascending(
    scores: Tensor, rows: Tensor | None = None, keys: Tensor | None = None
) -> Tensor:
    """Indices that sort ``scores`` ascending; exact ties are broken by :func:`tie_keys` of
    ``rows`` (row i belongs to score i), or by precomputed ``keys``, so the ranking is a function
    of the set of messages, not of their order: the lexicographic order of (score_i, key_i),
    from a stable argsort by key followed by a stable argsort by score.

    Ties are broken unconditionally: two stable argsorts of n values cost nothing next to the
    scores, where testing for a tie first read a device value back on every call.

    A row holding inf or NaN has a NaN or infinite key, and rows with NaN keys keep their input
    order among themselves (argsort puts NaN last, stably). That never reaches a result: such a
    row is at distance +inf from every other (:func:`pairwise_sq_distances`), so its Krum score
    is +inf and it ranks after every row with a finite score, whose keys are finite."""
    if keys is None:
        assert rows is not None, "ties need rows or keys"
        keys = tie_keys(rows)
    by_key = torch.argsort(keys, stable=True)
    return by_key[torch.argsort(scores[by_key], stable=True)]


def column_blocks(d: int, rows: int) -> Iterator[slice]:
    width = max(1024, BLOCK_ELEMENTS // max(rows, 1))
    for start in range(0, d, width):
        yield slice(start, min(d, start + width))


def row_blocks(n: int, d: int) -> Iterator[slice]:
    height = max(1, BLOCK_ELEMENTS // max(d, 1))
    for start in range(0, n, height):
        yield slice(start, min(n, start + height))


def column_centre(x: Tensor) -> Tensor:
    """A coordinate-wise centre of the rows. On CPU float32/float64: per column the order
    statistic of rank floor(n/2) (the median for odd n, the upper median for even n) by numpy's
    partition (linear time), NaN counted as the largest value as in numpy's sort. Elsewhere
    (CUDA, other dtypes): torch.nanmedian, the lower median of the values that are not NaN.

    Either way, unlike the mean, it stays inside the honest values of each column while fewer
    than half of the rows are corrupted, whatever their size (+-inf, NaN, 1e20), which is all its
    users need. A column whose centre is still not finite (half of its values or more are) is
    centred at 0, so the other columns keep a finite centre."""
    n = x.shape[0]
    if _numpy_ok(x):
        centre = torch.from_numpy(np.partition(x.numpy(), n // 2, axis=0)[n // 2])
    else:
        centre = torch.nanmedian(x, dim=0).values
    return torch.where(torch.isfinite(centre), centre, 0.0)


def generator_for(
    generator: torch.Generator | None,
    own: dict[str, torch.Generator],
    seed: int,
    device: torch.device,
) -> torch.Generator:
    """The call-time generator if given, else the rule's own generator for ``device``, created on
    first use from ``seed`` and advancing from call to call."""
    if generator is not None:
        return generator
    key = str(device)
    if key not in own:
        own[key] = torch.Generator(device=device).manual_seed(seed)
    return own[key]
