"""SWB's parts (SWB-DM paper, Section IV): the random rotations of a view's chunks (Householder,
dense, Hadamard), the blocks a view's chunks are processed in, and the per-block steps (the
trimmed barycenter of each rank, the medoid's placement). `robusttune.methods.aggregators.swb`
assembles them into the rule, `swb_fixed_rows` into its repeated calls on fixed rows."""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from typing import get_args

import torch
from torch import Tensor

from robusttune.core.schema import RunSchema
from robusttune.methods.aggregators.base import argsort_last, on_host, sort_values, tie_keys

ROTATIONS = tuple(get_args(RunSchema.model_fields["swb_rotation"].annotation))

# Chunks of one view are processed in blocks of at most this many elements of rotated messages
# (n * chunks * C), and at most MAX_BLOCK_CHUNKS chunks, so temporaries stay in the tens of MB
# and are reused across blocks (fresh pages cost ~0.6 s per GB here).
BLOCK_ELEMENTS = 1 << 23
MAX_BLOCK_CHUNKS = 128
# `SWB.with_fixed_rows` keeps the fixed rows' work (7 (h + 1) x d a view) and the plan's
# rotations up to this many float32-sized elements (512 MB); rows beyond it fall back to the
# plain call, rotations beyond what is left are drawn again at every call
FIXED_ROWS_ELEMENTS = 1 << 27


# -- rotations ---------------------------------------------------------------------------------


@dataclass
class HouseholderRotation:
    """A batch of Haar orthogonal matrices Q_b = H_0 H_1 ... H_{c-1} diag(sign_b), stored as
    LAPACK stores a QR factorisation (``torch.geqrf``): row j of ``rows`` holds the tail of the
    Householder vector v_j (v_j = e_j + rows[j, j+1:]), H_j = I - tau_j v_j v_j^T.

    Drawn by Stewart's method (SIAM J. Numer. Anal. 17(3), 1980): Householder QR of a Gaussian
    matrix G only ever reflects column j after the earlier reflections, and by the rotation
    invariance of the Gaussian that column is a fresh standard normal vector of length c - j.
    Drawing those vectors directly yields exactly the factors LAPACK would compute from G, with
    c(c+1)/2 normal numbers instead of c^2 and no factorisation; ``sign`` is the sign fix
    Q <- Q diag(sign(diag R)) (R_jj = beta_j below), without which Q is not Haar.

    This departs from the published SWB-DM code, which uses the Q of ``torch.linalg.qr`` of a
    Gaussian as it comes. That Q is not Haar: LAPACK makes R_00 = -sign(G_00) ||G_0||, so
    Q_00 = -|G_00| / ||G_0|| is never positive (measured: the largest of 2,000 draws at c = 16 is
    -2e-4). We keep the fix because Section IV describes random rotations, and a Haar draw is
    the one whose law does not depend on the coordinate system. It does not change the error:
    the published loop with and without it, n = 20, f = 4 shifted by +0.1, d = 25,600, C = 128,
    5 seeds, gives a mean L2 distance to the honest mean of 1.4893 and 1.4892.
    """

    rows: Tensor  # (nb, c, c)
    tau: Tensor  # (nb, c)
    sign: Tensor  # (nb, c)

    @staticmethod
    def draw(
        nb: int,
        c: int,
        generator: torch.Generator,
        device: torch.device,
        dtype: torch.dtype,
        workspace: dict[str, Tensor] | None = None,
    ) -> HouseholderRotation:
        """Draw ``nb`` independent Haar c x c rotations. ``workspace`` keeps the buffers between
        calls (the rotation then lives in them until the next draw)."""
        # Two chunks share one (c+1) x c Gaussian matrix M: chunk a takes the upper triangle of
        # M[:c] (row j = M[j, j:]), chunk b the lower triangle of M[1:] (row j = M[j+1:, j]);
        # the triangles are disjoint, so each chunk gets c(c+1)/2 fresh normals.
        pairs = (nb + 1) // 2
        space = {} if workspace is None else workspace
        gaussian = _buffer(space, "gaussian", (pairs, c + 1, c), generator.device, dtype)
        gaussian.normal_(generator=generator)
        if gaussian.device != device:
            gaussian = gaussian.to(device)
        rows = _buffer(space, "rows", (nb, c, c), device, dtype)
        upper = _upper_mask(c, str(device), dtype)
        # Masking by multiplication: 10x faster than torch.triu(out=) here.
        torch.mul(gaussian[:, :c, :], upper, out=rows[:pairs])
        if nb > pairs:
            torch.mul(gaussian[: nb - pairs, 1:, :].mT, upper, out=rows[pairs:])
        # dlarfg on x = (alpha, x_rest): beta = -sign(alpha) ||x||, tau = (beta - alpha) / beta,
        # v = (1, x_rest / (alpha - beta)). For j = c-1 (x_rest empty) this gives tau = 2 and
        # beta = -alpha where LAPACK takes tau = 0, beta = alpha: H_{c-1} then flips the last
        # coordinate and sign_{c-1} = -sign(alpha) flips it back, so Q diag(sign) is the same.
        norm = torch.linalg.vector_norm(rows, dim=-1)
        alpha = rows.diagonal(dim1=-2, dim2=-1).clone()
        positive = torch.where(alpha >= 0, 1.0, -1.0).to(dtype)
        beta = -positive * norm
        tau = (beta - alpha) / beta
        rows.mul_((1.0 / (alpha - beta))[..., None])  # the unit diagonal is implicit for LAPACK
        return HouseholderRotation(rows, tau, -positive)

    def forward(self, x: Tensor) -> Tensor:
        """x: (nb, n, c) -> x Q: (nb, n, c)."""
        # Q^T x^T with x^T handed over in LAPACK's column-major layout without a copy.
        y = torch.ormqr(self.rows.mT, self.tau, x.mT, left=True, transpose=True).mT
        return y.mul_(self.sign[:, None, :])

    def backward(self, z: Tensor) -> Tensor:
        """z: (nb, c) -> z Q^T: (nb, c)."""
        return torch.ormqr(
            self.rows.mT, self.tau, (z * self.sign)[..., None], left=True, transpose=False
        )[..., 0]

    def matrix(self) -> Tensor:
        nb, c, _ = self.rows.shape
        eye = torch.eye(c, device=self.rows.device, dtype=self.rows.dtype).expand(nb, c, c)
        return self.forward(eye.contiguous())


def _buffer(
    space: dict[str, Tensor],
    name: str,
    shape: tuple[int, ...],
    device: torch.device,
    dtype: torch.dtype,
) -> Tensor:
    """An uninitialised tensor of ``shape`` kept in ``space`` and reused while big enough: fresh
    pages cost ~0.6 s per GB here, as much as the arithmetic done on them."""
    count = math.prod(shape)
    held = space.get(name)
    device = torch.device(device)
    same_device = (
        held is not None
        and held.device.type == device.type
        and (device.index is None or held.device.index == device.index)
    )
    if held is None or not same_device or held.numel() < count or held.dtype != dtype:
        held = space[name] = torch.empty(count, device=device, dtype=dtype)
    return held[:count].view(shape)


@functools.lru_cache(maxsize=4)
def _upper_mask(c: int, device: str, dtype: torch.dtype) -> Tensor:
    return torch.ones(c, c, device=device, dtype=dtype).triu_()


@dataclass
class DenseRotation:
    """One explicit c x c rotation applied to every chunk of a block (``shared``)."""

    q: Tensor  # (c, c)

    def forward(self, x: Tensor) -> Tensor:
        return x @ self.q

    def backward(self, z: Tensor) -> Tensor:
        return z @ self.q.T

    def matrix(self) -> Tensor:
        return self.q[None]


@functools.lru_cache(maxsize=4)
def _hadamard(size: int, device: str, dtype: torch.dtype) -> Tensor:
    h = torch.ones(1, 1, dtype=torch.float64)
    while h.shape[0] < size:
        h = torch.cat([torch.cat([h, h], 1), torch.cat([h, -h], 1)], 0)
    return (h / math.sqrt(size)).to(device=device, dtype=dtype)


@dataclass
class HadamardRotation:
    """Randomized Hadamard rotation x -> [x, 0] D H / sqrt(C) per chunk: D a random +-1 diagonal
    per chunk, H the Sylvester-Hadamard matrix of order C (a power of two). A chunk shorter than
    C (the last one) is zero-padded to C before rotating and cut back to its length after the
    inverse rotation. Orthogonal, but not Haar: it is one of only 2^C matrices, all sharing H's
    structure, where a Haar draw is spread over the whole orthogonal group."""

    signs: Tensor  # (nb, C)
    length: int  # c <= C, the chunk length

    def forward(self, x: Tensor) -> Tensor:
        size = self.signs.shape[1]
        if self.length < size:
            x = torch.nn.functional.pad(x, (0, size - self.length))
        return (x * self.signs[:, None, :]) @ _hadamard(size, str(x.device), x.dtype)

    def backward(self, z: Tensor) -> Tensor:
        size = self.signs.shape[1]
        out = (z @ _hadamard(size, str(z.device), z.dtype)) * self.signs
        return out[:, : self.length]

    def matrix(self) -> Tensor:
        size = self.signs.shape[1]
        h = _hadamard(size, str(self.signs.device), self.signs.dtype)
        return (self.signs[:, :, None] * h)[:, : self.length, :]


@dataclass
class Block:
    """Chunks [first, first + count) of length ``length`` of one view, and their rotation."""

    view: int
    first: int
    count: int
    length: int
    rotation: HouseholderRotation | DenseRotation | HadamardRotation


def chunks_of(x: Tensor, block: Block, start: int, stop: int) -> Tensor:
    """Rows x (r, d) cut to the block's chunks: (count, r, length), one contiguous r x length
    matrix per chunk."""
    return (
        x[:, start:stop].reshape(x.shape[0], block.count, block.length).transpose(0, 1).contiguous()
    )


def barycenter_rows(y: Tensor, k: int) -> Tensor:
    """Steps 2-4 of SWB for a batch of rotated chunks y: (nb, n, c) -> z: (nb, c)."""
    ranked = sort_values(y, dim=-1)  # s_i = sort(Y_i)
    return placed_at_medoid(y, ranked, trimmed_rank_mean(ranked, k))


def trimmed_rank_mean(ranked: Tensor, k: int) -> Tensor:
    """Step 3: b_r = mean over clients of s_ir without the k lowest and k highest, for rows
    sorted ``ranked``: (nb, n, c) -> (nb, c)."""
    n = ranked.shape[1]
    if not k:
        return ranked.mean(dim=1)
    # Per rank, drop k values on each side across clients: a sort along the clients (numpy's
    # vectorised sort, ~0.1 s per view at n=50; a masked top-k in torch took ~1 s), never a
    # "total minus top-k sums" difference, which cancels the honest digits next to 1e6
    # outliers and turns inf into NaN. Both sort paths (numpy on CPU float32/64, torch.sort
    # elsewhere) put -inf first and NaN after +inf (pinned by
    # tests/test_extreme_messages.py), so at each rank the at most f <= k values of corrupted
    # rows (a rotated inf or float-max row is +-inf or NaN) sit at the ends and are dropped.
    return sort_values(ranked, dim=1)[:, k : n - k].mean(dim=1)


def placed_at_medoid(y: Tensor, ranked: Tensor, b: Tensor) -> Tensor:
    """Step 4: b placed back in the order of the medoid m (`medoid_rows`), z[argsort(Y_m)] = b:
    (nb, c)."""
    medoid = medoid_rows(y, ranked, b)
    rank_to_coordinate = argsort_last(y[torch.arange(y.shape[0], device=y.device), medoid])
    return torch.empty_like(b).scatter_(1, rank_to_coordinate.to(y.device), b)


def medoid_rows(y: Tensor, ranked: Tensor, b: Tensor) -> Tensor:
    """The medoid of step 4 in every chunk, m = argmin_i ||s_i - b||_2 over the rows (y:
    (nb, r, c) rotated, ``ranked`` their sorted rows; equal rows may be given once): (nb,)."""
    dist = (ranked - b[:, None, :]).square_().sum(dim=-1)  # (nb, r)
    # A corrupted row's distance can be NaN (a NaN message, or inf - inf once a rotation mixes
    # +-inf or float-max coordinates), and argmin returns a NaN's index: count it as +inf so the
    # medoid is the nearest row with a defined distance. (A NaN medoid gave a finite but wrong z:
    # b placed back in the order of the NaN row's argsort.)
    dist.masked_fill_(torch.isnan(dist), math.inf)
    # Different rows can tie exactly (their sorted values agree, e.g. coordinate permutations of
    # each other): among the rows at the lowest distance, pick by a fixed projection of Y_i, not
    # by client index. Off the host the keys are computed for every chunk and selected with
    # where, since testing for a tie first reads the device back once per block; on the host the
    # test is free and skips the keys' matrix-vector product over y (~8% of this function at
    # n = 50, C = 512), as ties are rare.
    lowest = dist.min(dim=1, keepdim=True).values
    at_lowest = dist == lowest
    tied = at_lowest.sum(dim=1) > 1
    medoid = dist.argmin(dim=1)
    if not on_host(y) or bool(tied.any()):
        keys = torch.where(at_lowest, tie_keys(y), torch.inf)
        medoid = torch.where(tied, keys.argmin(dim=1), medoid)
    return medoid


def published_chunk_step(chunk: Tensor, q: Tensor, k: int) -> Tensor:
    """One chunk of SWB exactly as the SWB-DM code loops over them (Section IV), kept as the
    independent reference that tests and ``bench/aggregators.py`` hold the fast path against:
    Y = X Q, S_i = sort(Y_i), b = per-rank mean of S without its k lowest and k highest,
    m = argmin_i ||S_i - b||, z[argsort(Y_m)] = b, return z Q^T. ``chunk``: (n, c)."""
    n = chunk.shape[0]
    y = chunk @ q
    ranked = torch.sort(y, dim=1).values
    b = torch.sort(ranked, dim=0).values[k : n - k].mean(0)
    medoid = torch.argmin(((ranked - b) ** 2).sum(1))
    z = torch.empty_like(b)
    z[torch.argsort(y[medoid])] = b
    return z @ q.T
