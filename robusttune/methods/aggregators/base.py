"""The rule interface, the registry and the numerical helpers the rules share.

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
    """Stable argsort along the last dimension (numpy on CPU, for the same reason)."""
    if _numpy_ok(x):
        return torch.from_numpy(np.argsort(x.numpy(), axis=-1, kind="stable"))
    return torch.argsort(x, dim=-1, stable=True)


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


# The mean-centred Gram product is kept when the messages' median squared distance to the mean
# is at most this many times their median pairwise squared distance: float32 distances then
# lose at most ~4 bits (the error of ||a||^2 + ||b||^2 - 2 a.b is ~eps (||a||^2 + ||b||^2)).
# Measured: 0.45 for N(3, 1) messages (n = 11, d = 40,000), 2.5 for bench/aggregators.py's
# 10-of-50 shifted messages, 1.6e4 with two of the 11 at 1e7 (the true ratio is ~1e12, but the
# computed distances are rounding noise of size ~eps ||a||^2, which caps it near 1/eps: the
# test is sound because once precision is lost the noise itself pushes the ratio far past 16).
GRAM_CENTRE_RATIO = 16.0


def _centred_gram_distances(x: Tensor, median_centre: bool) -> tuple[Tensor, Tensor]:
    """(||a||^2 + ||b||^2 - 2 a.b for every pair, the Gram matrix) of the messages centred at their
    mean or, with ``median_centre``, at their :func:`column_centre` computed block by block."""
    n, d = x.shape
    mean = None if median_centre else x.mean(dim=0)
    gram = torch.zeros(n, n, device=x.device, dtype=x.dtype)
    for cols in column_blocks(d, n):
        block = x[:, cols]
        block = block - (column_centre(block) if mean is None else mean[cols])
        gram.addmm_(block, block.T)
    sq = gram.diagonal()
    dist = (sq[:, None] + sq[None, :] - 2 * gram).clamp_min_(0)
    return 0.5 * (dist + dist.T), gram  # exact symmetry, so i->j and j->i agree bit for bit


def _mean_centre_is_precise(dist: Tensor, gram: Tensor) -> bool:
    """Whether the mean-centred distances kept their precision (see GRAM_CENTRE_RATIO)."""
    if not bool(torch.isfinite(gram).all()):
        return False
    n = dist.shape[0]
    pairs = dist[~torch.eye(n, dtype=torch.bool, device=dist.device)]
    return bool(gram.diagonal().median() <= GRAM_CENTRE_RATIO * pairs.median())


def pairwise_sq_distances(x: Tensor) -> Tensor:
    """D[i, j] = ||x_i - x_j||^2, with D[i, i] = 0 and +inf wherever the distance is not a finite
    number (it overflows, or a row holds inf or NaN: inf - inf and NaN would otherwise make the
    distance NaN, and NaN compares neither smaller nor larger, so Krum could pick such a row).

    Small problems (n^2 d <= 2^22) use explicit differences, exact for the small integers of
    hand-checked examples. Larger ones use the Gram identity ||a||^2 + ||b||^2 - 2 a.b on centred
    messages, by column blocks so the centred copy stays small: distances do not change under
    translation, and centring keeps the cancellation at the scale of the spread between messages
    instead of the scale of the model (states have norm ~30 while two clients differ by ~0.1,
    which would lose about 1e-3 relative in float32).

    The centre is the mean, unless the result shows it was not a centre of the messages (a
    non-finite entry, or the typical squared norm after centring more than GRAM_CENTRE_RATIO
    times the typical squared distance): the mean follows corrupted rows (one float32 row of
    1e20 overflowed every centred squared norm, making every distance NaN, and two rows of 1e7
    among 11 put the honest rows ~2e6 from the centre, making their float32 distances noise).
    The product is then recomputed centred at the coordinate-wise :func:`column_centre`, which
    stays among the honest values while they are a majority, so the honest-honest entries only
    ever see honest values. Ordinary rounds thus pay no median; such rounds pay two passes.

    Off the host (:func:`on_host`) the product is always centred at :func:`column_centre`:
    choosing between the two centres reads the test's outcome back, which would stall the device
    once per call. The median costs a sort per column block there, more than the Gram product
    itself; it is the price of a Krum call that never waits for the device."""
    n, d = x.shape
    if n * n * d <= 1 << 22:
        dist = (x[:, None, :] - x[None, :, :]).square_().sum(dim=-1)
    elif on_host(x):
        dist, gram = _centred_gram_distances(x, median_centre=False)
        if not _mean_centre_is_precise(dist, gram):
            dist, _ = _centred_gram_distances(x, median_centre=True)
    else:
        dist, _ = _centred_gram_distances(x, median_centre=True)
    dist = dist.masked_fill_(torch.isnan(dist), math.inf)
    dist.fill_diagonal_(0)
    return dist


def robust_directions(rows: Tensor, centre: Tensor | None) -> Tensor:
    """u_i = z_i / ||z_i|| for z_i = rows_i - centre (centre 0 if None), for the few rows whose
    norm ||z_i|| is not a finite number, computed without overflow:

    - finite z_i whose squares overflow: divided by max_j |z_ij| first (exact direction);
    - z_i with infinite coordinates: the limit direction sign(z_ij) on those coordinates, 0 on
      the others, normalised (the limit of z / ||z|| as those coordinates grow);
    - z_i with a NaN coordinate has no direction: u_i = 0.

    z is formed as rows / 2 - centre / 2 (the same direction), which cannot overflow for finite
    inputs where rows - centre can (float max minus a negative number)."""
    half = 0.5 * rows if centre is None else 0.5 * rows - 0.5 * centre
    infinite = torch.isinf(half)
    direction = torch.where(infinite.any(dim=1, keepdim=True), torch.sign(half) * infinite, half)
    direction = torch.where(torch.isnan(half).any(dim=1, keepdim=True), 0.0, direction)
    peak = direction.abs().amax(dim=1, keepdim=True)
    direction = direction / torch.where(peak > 0, peak, 1.0)
    norm = torch.linalg.vector_norm(direction, dim=1, keepdim=True)
    return direction / torch.where(norm > 0, norm, 1.0)


def distances_to(x: Tensor, point: Tensor) -> Tensor:
    """||x_i - point|| for every row, from explicit differences (no cancellation), in row blocks."""
    out = torch.empty(x.shape[0], device=x.device, dtype=x.dtype)
    for rows in row_blocks(*x.shape):
        out[rows] = torch.linalg.vector_norm(x[rows] - point, dim=1)
    return out


def finite_rows(x: Tensor) -> Tensor:
    """Tensor[n] of bool: whether row i holds only finite values, in row blocks (no n x d mask)."""
    out = torch.empty(x.shape[0], dtype=torch.bool, device=x.device)
    for rows in row_blocks(*x.shape):
        out[rows] = torch.isfinite(x[rows]).all(dim=1)
    return out


def _masked_rows(x: Tensor, mask: Tensor) -> Iterator[tuple[Tensor, Tensor | slice]]:
    """(rows of x, their indices) covering every row where ``mask`` is True. On the host only the
    masked rows, gathered (usually none: nothing to compute); elsewhere every row in row blocks,
    since gathering needs their count on the host. Callers weight the rows by the mask."""
    if on_host(x):
        which = mask.nonzero().squeeze(1)
        if which.numel():
            yield x[which], which
        return
    for rows in row_blocks(*x.shape):
        yield x[rows], rows


def direction_sum(x: Tensor, coefficients: Tensor, centre: Tensor | None, mask: Tensor) -> Tensor:
    """sum_{i : mask_i} c_i u_i with u_i the :func:`robust_directions` of x_i - centre: the
    contribution of the rows whose norm is not finite, without gathering them off the host."""
    out = torch.zeros(x.shape[1], device=x.device, dtype=x.dtype)
    for part, rows in _masked_rows(x, mask):
        # Finite unit (or zero) directions: a zero weight on an unmasked row adds exactly 0.
        out += torch.where(mask[rows], coefficients[rows], 0.0) @ robust_directions(part, centre)
    return out


def direction_dots(x: Tensor, vector: Tensor, centre: Tensor | None, mask: Tensor) -> Tensor:
    """Tensor[n]: u_i . vector for the rows where ``mask`` is True (u_i as in
    :func:`direction_sum`), 0 elsewhere."""
    out = torch.zeros(x.shape[0], device=x.device, dtype=x.dtype)
    for part, rows in _masked_rows(x, mask):
        out[rows] = torch.where(mask[rows], robust_directions(part, centre) @ vector, 0.0)
    return out


def combine_centred(
    x: Tensor, coefficients: Tensor, centre: Tensor | None, skip: Tensor | None = None
) -> Tensor:
    """sum_i c_i (x_i - centre) from explicit differences, in row blocks. Rows where the boolean
    mask ``skip`` is True contribute exactly nothing whatever their values (a coefficient 0 on a
    row of inf or NaN would give 0 * inf = NaN): their rows of the block are zeroed first.

    On the host only the row blocks holding a skipped row pay for that (a branch on the mask);
    elsewhere every block is masked (one more elementwise pass), since the branch would read the
    mask back once per block."""
    if centre is None and skip is None:
        return coefficients @ x
    host = on_host(x)
    out = torch.zeros(x.shape[1], device=x.device, dtype=x.dtype)
    for rows in row_blocks(*x.shape):
        part = x[rows] if centre is None else x[rows] - centre
        if skip is not None and (not host or bool(skip[rows].any())):
            part = torch.where(skip[rows, None], 0.0, part)
            out += coefficients[rows].masked_fill(skip[rows], 0.0) @ part
            continue
        out += coefficients[rows] @ part
    return out


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
