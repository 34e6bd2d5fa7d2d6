"""Distances, directions and centred sums of the stacked messages, precise and safe against
whatever a Byzantine client sends: pairwise squared distances from a centred Gram product
(`pairwise_sq_distances`), distances to a point, unit directions of rows whose norm overflows or
is infinite (`robust_directions`), and sums over rows that skip non-finite ones exactly
(`combine_centred`). Every helper works in row or column blocks (`BLOCK_ELEMENTS`) and, off the
host, without reading values back (`on_host`). The distance-based rules and the rule-aware
attacks share them."""

from __future__ import annotations

import math
from collections.abc import Iterator

import torch
from torch import Tensor

from robusttune.methods.aggregators.base import column_blocks, column_centre, on_host, row_blocks

__all__ = [
    "GRAM_CENTRE_RATIO",
    "combine_centred",
    "direction_dots",
    "direction_sum",
    "distances_to",
    "finite_rows",
    "pairwise_sq_distances",
    "robust_directions",
]


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
