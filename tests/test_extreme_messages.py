"""Robust rules under extreme messages: up to f messages that are huge (float max, 1e20), +-inf or
NaN, at every position, in float32 and float64, at a small size (explicit distances) and a size
that takes the blocked Gram path of ``pairwise_sq_distances`` (n^2 d > 2^22).

What a user is promised: every rule used within its precondition returns a finite aggregate close
to the honest messages; ``mean`` may follow the bad messages (breakdown point 0: the run is then
collapsed, not crashed). Plus the precision and order-invariance cases that failed before: Krum's
float32 pick next to rows of 1e7 equals its float64 pick, and Krum's pick with an inf row present
does not depend on the client order.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from robusttune.methods.aggregators import AGGREGATORS, Aggregator, make_aggregator
from robusttune.methods.aggregators.base import argsort_last, column_centre, sort_values
from robusttune.methods.aggregators.geometry import pairwise_sq_distances
from robusttune.methods.aggregators.swb_blocks import barycenter_rows

N, F = 11, 2  # Bulyan n >= 4f + 3, Krum n > 2f + 2, SWB k = floor(0.25 * 11) = 2 >= f
SMALL_D, LARGE_D = 20, 40_000  # 11^2 * 40,000 = 4.84e6 > 2^22: the blocked Gram path
OFFSET = 3.0  # honest rows ~ N(3, 1): FLTrust's reference (their mean) has positive cosines

PARAMS = {
    "swb": {"trim_ratio": 0.25, "swb_chunk": 8},
    "bucketing": {"inner": "median", "bucket_size": 2},  # ceil(11/2) = 6 buckets: 2f < 6
    "nnm": {"inner": "median"},
    "arc": {"inner": "median"},
}
KINDS = ("max", "1e20", "+inf", "-inf", "nan", "mix")
# f bad rows: first, middle, last, spread (single bad rows are tried at every position).
PLACEMENTS_OF_F = ((0, 1), (5, 6), (9, 10), (0, 10), (2, 7))
COORDINATE_RULES = ("median", "trimmed_mean", "bulyan")  # output within the honest range


def build(name: str) -> Aggregator:
    agg = make_aggregator(name, f=F, **PARAMS.get(name, {}))
    assert name == "mean" or agg.precondition(N, F), name
    return agg


def bad_row(kind: str, which: int, d: int, dtype: torch.dtype) -> torch.Tensor:
    """One corrupted message. ``mix`` cycles +max, -max, +inf, -inf, NaN, 1e20 over the
    coordinates, starting at a different kind for each bad row."""
    big = torch.finfo(dtype).max
    values = {"max": big, "1e20": 1e20, "+inf": math.inf, "-inf": -math.inf, "nan": math.nan}
    if kind != "mix":
        return torch.full((d,), values[kind], dtype=dtype)
    cycle = torch.tensor([big, -big, math.inf, -math.inf, math.nan, 1e20], dtype=dtype)
    return cycle[(torch.arange(d) + which) % len(cycle)]


def messages(d: int, dtype: torch.dtype, seed: int = 0) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    return (OFFSET + torch.randn(N, d, generator=gen, dtype=torch.float64)).to(dtype)


def corrupt(x: torch.Tensor, positions: tuple[int, ...], kind: str) -> torch.Tensor:
    x = x.clone()
    for which, i in enumerate(positions):
        x[i] = bad_row(kind, which, x.shape[1], x.dtype)
    return x


def aggregate(agg: Aggregator, x: torch.Tensor, honest: torch.Tensor) -> torch.Tensor:
    centre = honest.mean(0)
    # FLTrust: the server's own update is the honest mean (its clean root set); CCLIP moves from
    # a point near the honest messages, as the previous aggregate is in a healthy run.
    previous = centre + 0.1 if agg.name == "cclip" else None
    return agg(x, reference=centre, previous=previous, generator=torch.Generator().manual_seed(1))


def check_close_to_honest(name: str, out: torch.Tensor, honest: torch.Tensor, label: str) -> None:
    assert torch.isfinite(out).all(), f"{label}: non-finite output"
    centre = honest.double().mean(0)
    spread = (honest.double() - centre).norm(dim=1).max().item()
    error = (out.double() - centre).norm().item()
    assert error <= 2 * spread, f"{label}: ||out - honest mean|| = {error:.3g} > 2 * {spread:.3g}"
    if name == "krum":  # Krum returns one message: an honest one
        assert any(torch.equal(out, row) for row in honest), f"{label}: not an honest message"
    if name in COORDINATE_RULES:  # Yin et al. / El Mhamdi et al.: inside the honest range
        low, high = honest.min(0).values, honest.max(0).values
        assert bool(((out >= low) & (out <= high)).all()), f"{label}: outside the honest range"


def run_placements(
    name: str, dtype: torch.dtype, kind: str, d: int, placements: list[tuple[int, ...]]
) -> None:
    agg = build(name)
    x = messages(d, dtype)
    for positions in placements:
        bad = corrupt(x, positions, kind)
        honest = x[[i for i in range(N) if i not in positions]]
        out = aggregate(agg, bad, honest)
        assert out.shape == (d,) and out.dtype == dtype
        label = f"{name} {dtype} {kind} d={d} bad rows at {positions}"
        if name == "mean":
            continue  # may follow the bad messages: finite or not, it must only not raise
        check_close_to_honest(name, out, honest, label)


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("name", AGGREGATORS.names())
def test_small_size_every_position(name, dtype, kind):
    placements = [(i,) for i in range(N)] + list(PLACEMENTS_OF_F)
    run_placements(name, dtype, kind, SMALL_D, placements)


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("name", AGGREGATORS.names())
def test_blocked_gram_size(name, dtype, kind):
    assert N * N * LARGE_D > 1 << 22
    run_placements(name, dtype, kind, LARGE_D, [(0, 7)])


def test_bucketing_around_geometric_median_also_holds():
    agg = make_aggregator("bucketing", inner="geometric_median", bucket_size=2, f=F)
    assert agg.precondition(N, F)
    x = messages(SMALL_D, torch.float32)
    for kind in KINDS:
        for positions in PLACEMENTS_OF_F:
            honest = x[[i for i in range(N) if i not in positions]]
            out = aggregate(agg, corrupt(x, positions, kind), honest)
            check_close_to_honest("bucketing", out, honest, f"bucketing(gm) {kind} {positions}")


# -- precision and order ---------------------------------------------------------------------


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_krum_next_to_rows_of_1e7_picks_in_float32_what_it_picks_in_float64(seed):
    # Centred at the mean, the honest rows sit ~1e7 f / n from the centre and their squared
    # norms (~1e17 here) swamp the honest-honest distances (~1e5) in float32.
    x = messages(LARGE_D, torch.float64, seed)
    x[[3, 8]] = 1e7
    picked64 = make_aggregator("krum", f=F)(x)
    picked32 = make_aggregator("krum", f=F)(x.float())
    assert torch.equal(picked32, picked64.float())
    # The honest-honest distances themselves keep float32 precision.
    honest = [i for i in range(N) if i not in (3, 8)]
    d32 = pairwise_sq_distances(x.float())[honest][:, honest].double()
    d64 = pairwise_sq_distances(x)[honest][:, honest]
    off = ~torch.eye(len(honest), dtype=torch.bool)
    assert ((d32 - d64).abs()[off] / d64[off]).max() < 1e-4


@pytest.mark.parametrize("bad", [{6: "+inf"}, {2: "nan", 6: "mix"}], ids=["inf", "nan+mix"])
@pytest.mark.parametrize("d", [SMALL_D, LARGE_D])
@pytest.mark.parametrize(
    "name", ["krum", "multi_krum", "bulyan", "geometric_median", "swb", "bucketing"]
)
def test_non_finite_rows_do_not_make_the_output_depend_on_client_order(name, d, bad):
    # The tie-breaking keys of rows holding inf or NaN are themselves NaN or inf, so their order
    # among themselves may follow the input; the output must not.
    x = messages(d, torch.float32, seed=4)
    for which, (i, kind) in enumerate(bad.items()):
        x[i] = bad_row(kind, which, d, x.dtype)
    agg = build(name)
    first = agg(x, generator=torch.Generator().manual_seed(0))
    assert torch.isfinite(first).all()
    gen = torch.Generator().manual_seed(5)
    for _ in range(3):
        perm = torch.randperm(N, generator=gen)
        again = agg(x[perm], generator=torch.Generator().manual_seed(0))
        torch.testing.assert_close(again, first, atol=1e-4, rtol=1e-5)


@pytest.mark.parametrize("name", ["krum", "multi_krum"])
def test_one_float32_row_of_1e20_among_50_is_never_chosen(name):
    # The issue's measurement: n = 50 on the blocked Gram path (50^2 * 2,000 > 2^22), one row of
    # 1e20 at position 0, 7 or 49; centred at the mean every squared norm overflowed, every
    # distance was NaN and Krum returned the attacker's row (multi-Krum included it).
    n, d = 50, 2_000
    assert n * n * d > 1 << 22
    x = OFFSET + torch.randn(n, d, generator=torch.Generator().manual_seed(3))
    agg = make_aggregator(name, f=1)
    for position in (0, 7, 49):
        bad = x.clone()
        bad[position] = 1e20
        honest = torch.cat([x[:position], x[position + 1 :]])
        out = agg(bad)
        assert torch.isfinite(out).all() and out.abs().max() < 100, position
        if name == "krum":
            assert any(torch.equal(out, row) for row in honest), position


@pytest.mark.parametrize("outliers", [None, 1e7], ids=["clean", "1e7 rows"])
def test_gram_path_matches_explicit_differences_in_float64(outliers):
    # Clean messages keep the mean-centred product; rows of 1e7 send it to the median-centred
    # one. Both must agree with sum_k (x_ik - x_jk)^2 computed directly: to rounding of the
    # honest scale between honest rows, and to rounding of their own squared size
    # (||x_i - c||^2 + ||x_j - c||^2, c an honest row) for the others: the Gram identity cannot
    # resolve the distance between two far rows finer than that (two equal rows of 1e7 come out
    # ~1e3 apart instead of 0, next to ~1e18 from every honest row).
    x = messages(LARGE_D, torch.float64, seed=6)
    bad = [1, 9] if outliers is not None else []
    x[bad] = outliers if outliers is not None else 0.0
    expected = torch.stack([((x - row) ** 2).sum(dim=1) for row in x])
    dist = pairwise_sq_distances(x)
    honest = [i for i in range(N) if i not in bad]
    torch.testing.assert_close(
        dist[honest][:, honest], expected[honest][:, honest], rtol=1e-9, atol=0
    )
    size = ((x - x[0]) ** 2).sum(dim=1)
    assert ((dist - expected).abs() <= 1e-12 * (size[:, None] + size[None, :])).all()


def test_pairwise_distances_to_a_non_finite_row_are_inf_and_the_diagonal_zero():
    for d in (SMALL_D, LARGE_D):
        for kind in ("+inf", "nan", "max"):
            x = corrupt(messages(d, torch.float32), (4,), kind)
            dist = pairwise_sq_distances(x)
            assert not torch.isnan(dist).any(), (d, kind)
            assert torch.equal(dist.diagonal(), torch.zeros(N)), (d, kind)
            others = [i for i in range(N) if i != 4]
            assert torch.isinf(dist[4, others]).all() and torch.isinf(dist[others, 4]).all()
            assert torch.isfinite(dist[others][:, others]).all()


# -- hand-checked cases ----------------------------------------------------------------------


def test_cclip_clips_an_overflowing_row_to_tau_along_its_direction():
    # The hand case of test_aggregators, with (3, 4) scaled by 1e30: its norm 5e30 overflows in
    # float32 (the squares do) but its direction is still (0.6, 0.8): v = 0, tau = 2 ->
    # (1.2, 1.6) and (0, 1) kept -> mean (0.6, 1.3).
    agg = make_aggregator("cclip", cclip_tau=2.0, cclip_scale="absolute")
    x = torch.tensor([[3e30, 4e30], [0.0, 1.0]])
    torch.testing.assert_close(agg(x), torch.tensor([0.6, 1.3]))
    # An inf row: the limiting direction is sign(z) on its inf coordinates, normalised:
    # (inf, -inf) -> 2 (1, -1) / sqrt(2); mean with (0, 1): (sqrt(2)/2, (1 - sqrt(2))/2).
    s = math.sqrt(2)
    out = agg(torch.tensor([[math.inf, -math.inf], [0.0, 1.0]]))
    torch.testing.assert_close(out, torch.tensor([s / 2, (1 - s) / 2]))
    # (inf, 5): only the inf coordinate has a limit direction: 2 (1, 0) -> ((2 + 0)/2, 1/2).
    torch.testing.assert_close(
        agg(torch.tensor([[math.inf, 5.0], [0.0, 1.0]])), torch.tensor([1.0, 0.5])
    )
    # A NaN row has no direction: it contributes 0, as a message at v does.
    torch.testing.assert_close(
        agg(torch.tensor([[math.nan, 0.0], [0.0, 1.0]])), torch.tensor([0.0, 0.5])
    )


def test_fltrust_enters_huge_rows_by_their_direction_and_gives_nan_rows_no_trust():
    # test_aggregators' hand case: TS = 1, 0, 3/5, 0 for (2,0), (0,3), (3,4), (-1,0) against
    # g0 = (1,0); out = (1*(1,0) + 0.6*(0.6,0.8)) / 1.6 = (0.85, 0.3). FLTrust is
    # magnitude-invariant, so (3,4) * 1e30 (its norm overflows in float32) gives the same.
    g0 = torch.tensor([1.0, 0.0])
    agg = make_aggregator("fltrust")
    g = torch.tensor([[2.0, 0], [0, 3], [3e30, 4e30], [-1, 0]])
    torch.testing.assert_close(agg(g, reference=g0), torch.tensor([0.85, 0.3]))
    # (inf, inf): direction (1,1)/sqrt(2), TS = 1/sqrt(2), rescaled to norm 1: (1,1)/sqrt(2).
    # out = (1*(1,0) + (1/sqrt 2)(1/sqrt 2)(1,1)) / (1 + 1/sqrt 2) = (1.5, 0.5) / (1 + 1/sqrt 2)
    g = torch.tensor([[2.0, 0], [0, 3], [math.inf, math.inf], [-1, 0]])
    expected = torch.tensor([1.5, 0.5]) / (1 + 1 / math.sqrt(2))
    torch.testing.assert_close(agg(g, reference=g0), expected)
    p = torch.tensor([1.0, -2.0])  # the same messages as states around p: out moves by p
    torch.testing.assert_close(agg(g + p, reference=g0 + p, previous=p), p + expected)
    # A NaN row gets trust 0: out = (1, 0) from (2, 0) alone; before, the NaN made the total
    # trust NaN and the server kept its model (0, 0) every round.
    g = torch.tensor([[2.0, 0], [0, 3], [math.nan, 1.0], [-1, 0]])
    torch.testing.assert_close(agg(g, reference=g0), torch.tensor([1.0, 0.0]))


def test_geometric_median_gives_rows_at_infinite_distance_no_weight():
    # Points 0, 1, 2 on a line and one inf row: the geometric median of the finite points is 1
    # (the middle one), and the inf row must contribute nothing (0 * inf would be NaN).
    x = torch.tensor([[0.0], [1.0], [2.0], [math.inf]], dtype=torch.float64)
    out = make_aggregator("geometric_median", gm_iters=200)(x)
    assert torch.isfinite(out).all() and abs(out.item() - 1.0) < 1e-4


def test_swb_medoid_is_never_a_nan_row():
    # Rotated rows (nb = 1, n = 4, c = 3), k = 1. Sorted rows: (1,2,3), (1,2,4), (2,3,4) and the
    # NaN row (0,0,NaN) (NaN sorts last). Per rank, drop the lowest and highest of the four:
    # rank 0: 0 1 1 2 -> 1; rank 1: 0 2 2 3 -> 2; rank 2: 3 4 4 NaN -> 4; b = (1, 2, 4).
    # Squared distances to b: 1, 0, 2 and NaN, which argmin would pick. The medoid is row 1,
    # (4, 2, 1), whose ranks place b back as z = (4, 2, 1).
    y = torch.tensor([[[1.0, 2, 3], [4, 2, 1], [2, 3, 4], [math.nan, 0, 0]]], dtype=torch.float64)
    z = barycenter_rows(y, 1)
    assert z[0].tolist() == [4.0, 2.0, 1.0]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16])
def test_column_centre_stays_inside_the_honest_values(dtype):
    # float32/float64 take numpy's partition (NaN counted largest); bfloat16 takes the
    # torch.nanmedian path that CUDA uses. With 4 of 11 rows corrupted (NaN, +inf, -inf, float
    # max) each column's centre must lie within that column's 7 honest values.
    x = messages(SMALL_D, dtype, seed=8)
    bad = {1: math.nan, 4: math.inf, 6: -math.inf, 9: torch.finfo(dtype).max}
    for i, value in bad.items():
        x[i] = value
    honest = x[[i for i in range(N) if i not in bad]]
    centre = column_centre(x)
    assert centre.dtype == dtype and torch.isfinite(centre).all()
    assert bool(((centre >= honest.min(0).values) & (centre <= honest.max(0).values)).all())


def test_torch_sort_places_nan_and_inf_where_numpy_does():
    # sort_values uses numpy on CPU float32/float64 and torch.sort elsewhere (CUDA, other
    # dtypes); the trimmed means rely on both putting NaN after +inf, so that at most k
    # corrupted values per side are dropped whichever path runs.
    a = torch.tensor([[3.0, math.nan, math.inf, -math.inf, 1.0, -2.0]] * 2)
    expected = np.sort(a.numpy(), axis=1)
    np.testing.assert_array_equal(torch.sort(a, dim=1).values.numpy(), expected)
    np.testing.assert_array_equal(sort_values(a, dim=1).numpy(), expected)
    np.testing.assert_array_equal(sort_values(a.T.contiguous(), dim=0).numpy(), expected.T)


def _awkward_float32_rows(seed: int) -> np.ndarray:
    """Rows of 512 float32 with many ties and every special value: integers in [-3, 3], zeros of
    both signs, +-inf, quiet and signalling NaNs of both signs with payloads, subnormals of both
    signs, float max, and one row of plain Gaussians."""
    rng = np.random.default_rng(seed)
    z = rng.integers(-3, 4, size=(40, 512)).astype(np.float32)
    zeros = z == 0
    z[zeros] = np.where(rng.random(int(zeros.sum())) < 0.5, np.float32(-0.0), np.float32(0.0))
    bits = z.view(np.uint32)
    for start, step, pattern in [
        (0, 7, 0x7F800000),  # +inf
        (1, 11, 0xFF800000),  # -inf
        (2, 13, 0x7FC00000),  # NaN
        (3, 17, 0xFFC00001),  # -NaN with a payload
        (4, 19, 0x7F800001),  # signalling NaN
        (5, 23, 0x00000001),  # smallest subnormal
        (6, 29, 0x80000003),  # negative subnormal
        (8, 31, 0x7F7FFFFF),  # float max
    ]:
        bits[:, start::step] = pattern
    z[-1] = rng.standard_normal(512).astype(np.float32)
    return z


@pytest.mark.parametrize("seed", [0, 1])
def test_argsort_last_is_the_stable_argsort_of_numpy_and_torch(seed):
    # SWB places its barycenter at the medoid's order with argsort_last, which on CPU float32
    # sorts integer keys built from the floats' bits instead of calling a stable float argsort:
    # the permutation must be numpy's stable argsort's and torch's stable argsort's in every
    # case, ties, signed zeros, infinities, NaNs of any sign or payload and subnormals included,
    # for any shape and for a strided view.
    z = _awkward_float32_rows(seed)
    expected = np.argsort(z, axis=-1, kind="stable")
    got = argsort_last(torch.from_numpy(z))
    assert got.dtype == torch.int64
    np.testing.assert_array_equal(got.numpy(), expected)
    np.testing.assert_array_equal(
        torch.argsort(torch.from_numpy(z), dim=-1, stable=True).numpy(), expected
    )
    columns = torch.from_numpy(z).T  # not contiguous
    np.testing.assert_array_equal(
        argsort_last(columns).numpy(), np.argsort(z.T, axis=-1, kind="stable")
    )
    stacked = z.reshape(4, 10, 512)
    np.testing.assert_array_equal(
        argsort_last(torch.from_numpy(stacked)).numpy(),
        np.argsort(stacked, axis=-1, kind="stable"),
    )
    with np.errstate(invalid="ignore"):  # a signalling NaN's cast warns; it stays a NaN
        as_double = torch.from_numpy(z.astype(np.float64))  # the float64 path: numpy's argsort
    np.testing.assert_array_equal(argsort_last(as_double).numpy(), expected)
    assert argsort_last(torch.zeros(3, 0)).shape == (3, 0)
