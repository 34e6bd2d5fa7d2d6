"""Aggregation rules: shared properties of every registry entry, one hand-checked case per rule,
robustness to huge outliers, precondition boundaries, and SWB against the published per-chunk
loop given the same rotations."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy import optimize, stats

from robusttune.core.registry import SpecError
from robusttune.methods.aggregators import AGGREGATORS, Aggregator, make_aggregator
from robusttune.methods.aggregators.base import tie_keys
from robusttune.methods.aggregators.swb_blocks import (
    HouseholderRotation,
    barycenter_rows,
    published_chunk_step,
)

# Small SWB chunks keep the tests fast; 37 = 4 full chunks of 8 + a last chunk of 5.
PARAMS = {
    "swb": {"swb_chunk": 8, "trim_ratio": 0.2},
    "bucketing": {"inner": "median", "bucket_size": 2},
    "nnm": {"inner": "median"},
    "arc": {"inner": "median"},
}


def build(name: str, **extra) -> Aggregator:
    return make_aggregator(name, **{**PARAMS.get(name, {}), **extra})


def call(agg: Aggregator, x: torch.Tensor, seed: int = 0, **context) -> torch.Tensor:
    if agg.name == "fltrust" and "reference" not in context:
        context["reference"] = x.float().mean(0).to(x.dtype) + 0.1
    return agg(x, generator=torch.Generator(device=x.device).manual_seed(seed), **context)


def t(rows) -> torch.Tensor:
    return torch.tensor(rows, dtype=torch.float64)


DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])


# -- shared properties of every registry entry -----------------------------------------------


@pytest.mark.parametrize("name", AGGREGATORS.names())
@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16])
def test_shape_dtype_device_and_order_invariance(name, device, dtype):
    gen = torch.Generator().manual_seed(1)
    x = (torch.randn(9, 37, generator=gen, dtype=torch.float64) + 3).to(device=device, dtype=dtype)
    agg = build(name, f=2)
    out = call(agg, x, f=2)
    assert out.shape == (37,) and out.dtype == dtype and out.device.type == device
    assert torch.isfinite(out).all()
    # Same generator state, clients in another order: the same output (up to rounding).
    perm = torch.randperm(9, generator=gen).to(device)
    shuffled = call(agg, x[perm], f=2)
    tol = 2e-2 if dtype == torch.bfloat16 else 1e-5
    torch.testing.assert_close(shuffled.double(), out.double(), atol=tol, rtol=tol)


def test_registry_has_every_design_name():
    assert set(AGGREGATORS.names()) == {
        "mean",
        "median",
        "trimmed_mean",
        "krum",
        "multi_krum",
        "bulyan",
        "geometric_median",
        "cclip",
        "fltrust",
        "swb",
        "bucketing",
        "nnm",
        "arc",
    }


@given(
    n=st.integers(1, 9),
    d=st.integers(1, 20),
    f=st.integers(0, 9),
    name=st.sampled_from(AGGREGATORS.names()),
    rotation=st.sampled_from(["haar", "shared", "hadamard"]),
    seed=st.integers(0, 2**16),
)
@settings(max_examples=80, deadline=None)
def test_any_shape_gives_one_finite_vector(n, d, f, name, rotation, seed):
    # Unguarded: every rule runs even where its precondition fails (the papers' failure modes).
    # SWB with 4-coordinate chunks: d < 4 is one short chunk, d = 4q + r a short last chunk.
    x = torch.randn(n, d, generator=torch.Generator().manual_seed(seed))
    agg = build(name, swb_chunk=4, swb_rotation=rotation) if name == "swb" else build(name)
    out = call(agg, x, f=f)
    assert out.shape == (d,) and torch.isfinite(out).all()


def test_bad_parameters_are_one_line_spec_errors():
    cases = [
        ("median", {"median_even": "upper"}, "median_even"),
        ("trimmed_mean", {"trim_ratio": 0.5}, "trim_ratio"),
        ("multi_krum", {"krum_m": 0}, "krum_m"),
        ("geometric_median", {"gm_iters": 0}, "gm_iters"),
        ("cclip", {"cclip_tau": 0}, "cclip_tau"),
        ("swb", {"swb_rotation": "givens"}, "swb_rotation"),
        ("swb", {"swb_rotation": "hadamard", "swb_chunk": 500}, "swb_chunk"),
        ("swb", {"swb_views": 0}, "swb_views"),
        ("bucketing", {"inner": "nope"}, "nope"),
        ("krum", {"f": -1}, "f"),
        ("krum", {"bogus": 1}, "bogus"),
    ]
    for name, params, key in cases:
        with pytest.raises(SpecError) as err:
            make_aggregator(name, **params)
        assert key in str(err.value) and "\n" not in str(err.value)


def test_runspec_keys_a_rule_does_not_take_are_dropped():
    agg = make_aggregator("krum", f=2, trim_ratio=0.1, swb_chunk=64, seed=3, gm_iters=5)
    assert isinstance(agg, Aggregator) and agg.f == 2


def test_call_time_f_overrides_the_constructor():
    x = t([[0.0], [1], [2], [3], [100]])
    agg = make_aggregator("trimmed_mean", f=0)
    assert agg(x).item() == pytest.approx(21.2)
    assert agg(x, f=1).item() == pytest.approx(2.0)


# -- one hand-computed case per rule ----------------------------------------------------------


def test_mean_weighted_by_sample_counts():
    x = t([[1.0, 0], [3, 4]])
    assert make_aggregator("mean")(x).tolist() == [2.0, 2.0]
    # (1*1 + 3*3) / 4 = 2.5 ; (0*1 + 4*3) / 4 = 3
    assert make_aggregator("mean")(x, weights=torch.tensor([1.0, 3.0])).tolist() == [2.5, 3.0]


def test_median_even_midpoint_and_lower():
    x = t([[1.0, 10], [2, 0], [4, 5], [8, -1]])
    # column 0 sorted 1 2 4 8 -> (2+4)/2 = 3 or lower 2; column 1 sorted -1 0 5 10 -> 2.5 or 0
    assert make_aggregator("median")(x).tolist() == [3.0, 2.5]
    assert make_aggregator("median", median_even="lower")(x).tolist() == [2.0, 0.0]
    assert make_aggregator("median")(x[:3]).tolist() == [2.0, 5.0]  # odd: the middle value
    # n = 2 with "lower": the smaller message on every coordinate (SWB-DM Sec. VII-B).
    assert make_aggregator("median", median_even="lower")(t([[1.0, 5], [3, -5]])).tolist() == [
        1.0,
        -5.0,
    ]


def test_trimmed_mean_drops_b_each_side():
    x = t([[1.0, -7], [2, 0], [3, 1], [4, 2], [100, 3]])
    # f = 1: drop 1 and 100 -> (2+3+4)/3 = 3 ; drop -7 and 3 -> (0+1+2)/3 = 1
    assert make_aggregator("trimmed_mean", f=1)(x).tolist() == [3.0, 1.0]
    # trim_ratio 0.4: b = floor(0.4 * 5) = 2 -> the middle value only
    assert make_aggregator("trimmed_mean", trim_ratio=0.4)(x).tolist() == [3.0, 1.0]
    assert make_aggregator("trimmed_mean", trim_ratio=0.0)(x).tolist() == [22.0, -0.2]


def test_krum_and_multi_krum_on_five_points():
    # a=(0,0) b=(1,0) c=(0,3) d=(3,0) e=(10,10), f = 1 -> n - f - 2 = 2 nearest neighbours.
    # Squared distances: ab=1 ac=9 ad=9 ae=200 bc=10 bd=4 be=181 cd=18 ce=149 de=149
    # scores: a = 1+9 = 10, b = 1+4 = 5, c = 9+10 = 19, d = 4+9 = 13, e = 149+149 = 298
    x = t([[0.0, 0], [1, 0], [0, 3], [3, 0], [10, 10]])
    assert make_aggregator("krum", f=1)(x).tolist() == [1.0, 0.0]  # b
    # multi-Krum, m = n - f = 4 best: b, a, d, c -> ((0+1+0+3)/4, (0+0+3+0)/4)
    assert make_aggregator("multi_krum", f=1)(x).tolist() == [1.0, 0.75]
    assert make_aggregator("multi_krum", f=1, krum_m=2)(x).tolist() == [0.5, 0.0]  # b, a


def test_bulyan_step_by_step():
    # n = 7, f = 1: theta = n - 2f = 5 picks by iterated Krum, then beta = theta - 2f = 3.
    # x1 = x2 = (-1,-1), x3 = (3,3), x4 = (0,-2), x5 = (2,-3), x6 = (-3,2), x7 = (9,-9).
    # Squared distances: d12=0 d13=32 d14=2 d15=13 d16=13 d17=164 d34=34 d35=37 d36=37
    #   d37=180 d45=5 d46=25 d47=130 d56=50 d57=85 d67=265; d2j = d1j.
    # |R|=7, k=4: x1=x2=0+2+13+13=28, x3=135, x4=2+2+5+25=34, x5=68, x6=88, x7=543 -> x1
    #   (x2 ties but is the same vector).
    # |R|=6, k=3: x2=2+13+13=28, x4=2+5+25=32, x3=103, x5=55, x6=75, x7=379 -> x2
    # |R|=5, k=2: x3=34+37=71, x4=5+25=30, x5=5+37=42, x6=25+37=62, x7=85+130=215 -> x4
    # |R|=4, k=1: x3=x5=x6=37 (each one's nearest is at 37), x7=85: the last two picks are two
    #   of x3, x5, x6, whichever the tie-break takes; every choice gives the same output:
    #   {x3,x5}: coord 1 = -1 -1 0 2 3, median 0, 3 closest -1 -1 0 -> -2/3;
    #            coord 2 = -3 -2 -1 -1 3, median -1, 3 closest -2 -1 -1 -> -4/3
    #   {x3,x6}: coord 1 = -3 -1 -1 0 3 (median -1: -1 -1 0); coord 2 = -2 -1 -1 2 3 (-2 -1 -1)
    #   {x5,x6}: coord 1 = -3 -1 -1 0 2 (median -1: -1 -1 0); coord 2 = -3 -2 -1 -1 2 (-2 -1 -1)
    x = t([[-1.0, -1], [-1, -1], [3, 3], [0, -2], [2, -3], [-3, 2], [9, -9]])
    out = make_aggregator("bulyan", f=1)(x)
    torch.testing.assert_close(out, t([-2 / 3, -4 / 3]))


@pytest.mark.parametrize(("n", "f"), [(11, 2), (12, 2), (15, 3), (8, 1)])
def test_bulyan_matches_a_direct_numpy_reference(n, f):
    # Independent implementation: iterated Krum by explicit distance sums, then per coordinate
    # the beta values with the smallest |v - median|. Continuous data, so the only exact ties are
    # the two ends of the closest pair once Krum scores with one neighbour; they are broken by
    # the documented fixed projection (tie_keys), as the rule does.
    x = np.random.default_rng(n * 10 + f).standard_normal((n, 6))
    keys = tie_keys(torch.from_numpy(x)).numpy()
    remaining, chosen = list(range(n)), []
    for _ in range(n - 2 * f):
        k = max(len(remaining) - f - 2, 1)
        scores = [
            np.sort([((x[i] - x[j]) ** 2).sum() for j in remaining if j != i])[:k].sum()
            for i in remaining
        ]
        best = np.lexsort((keys[remaining], scores))[0]
        chosen.append(remaining.pop(int(best)))
    sel = x[chosen]
    beta = len(chosen) - 2 * f
    med = np.median(sel, axis=0)
    closest = np.argsort(np.abs(sel - med), axis=0, kind="stable")[:beta]
    expected = np.take_along_axis(sel, closest, axis=0).mean(axis=0)
    out = make_aggregator("bulyan", f=f)(torch.from_numpy(x))
    np.testing.assert_allclose(out.numpy(), expected, rtol=1e-12, atol=1e-12)


def test_geometric_median_matches_an_independent_solver():
    rng = np.random.default_rng(0)
    pts = np.vstack([rng.normal(size=(6, 3)), [[8.0, -5, 3]]])
    best = optimize.minimize(
        lambda v: np.linalg.norm(pts - v, axis=1).sum(),
        pts.mean(0),
        method="Nelder-Mead",
        options={"xatol": 1e-10, "fatol": 1e-12, "maxiter": 20000},
    )
    out = make_aggregator("geometric_median", gm_iters=500)(torch.from_numpy(pts))
    np.testing.assert_allclose(out.numpy(), best.x, atol=1e-5)
    # weights: a sample count of 5 on one point acts like 5 copies of it
    counts = torch.tensor([5.0, 1, 1, 1, 1, 1, 1])
    copies = torch.from_numpy(np.vstack([pts[:1]] * 4 + [pts]))
    torch.testing.assert_close(
        make_aggregator("geometric_median", gm_iters=500)(torch.from_numpy(pts), weights=counts),
        make_aggregator("geometric_median", gm_iters=500)(copies),
        atol=1e-6,
        rtol=0,
    )


def test_geometric_median_first_step_starts_at_the_coordinate_wise_median():
    # Start v_0 = coordinate-wise median: column 0 sorted 0 0 2 3 50 -> 2, column 1 the same ->
    # v_0 = (2, 2). One Weiszfeld step: b_i = 1 / ||v_0 - x_i|| (uniform a_i cancel), with
    # distances sqrt(8), 2, 2, sqrt(2), 48 sqrt(2); v_1 = sum b_i x_i / sum b_i.
    pts = np.array([[0.0, 0], [2, 0], [0, 2], [3, 3], [50, 50]])
    b = 1 / np.array([math.sqrt(8), 2, 2, math.sqrt(2), 48 * math.sqrt(2)])
    expected = (b[:, None] * pts).sum(0) / b.sum()
    out = make_aggregator("geometric_median", gm_iters=1)(torch.from_numpy(pts))
    np.testing.assert_allclose(out.numpy(), expected, rtol=1e-12)


def test_cclip_one_iteration_by_formula():
    x = t([[3.0, 4], [0, 1]])
    # v = 0, tau = 2: (3,4) has norm 5 -> (1.2, 1.6); (0,1) is kept; mean -> (0.6, 1.3)
    fixed = make_aggregator("cclip", cclip_tau=2.0, cclip_scale="absolute")
    torch.testing.assert_close(fixed(x), t([0.6, 1.3]))
    # v = (1,1): x - v = (2,3), norm sqrt(13) -> (2,3) * 2/sqrt(13); (-1,0) kept
    s = 2 / math.sqrt(13)
    expected = t([1 + (2 * s - 1) / 2, 1 + (3 * s + 0) / 2])
    torch.testing.assert_close(fixed(x, previous=t([1.0, 1])), expected)
    # a message at v contributes nothing (0 / 0 is not NaN)
    assert make_aggregator("cclip")(t([[1.0, 1]]), previous=t([1.0, 1])).tolist() == [1.0, 1.0]


def test_cclip_median_distance_radius_by_formula():
    # v = 0, distances 5, 1, 2, 100, 0 -> lower median 2 (sorted 0 1 2 5 100), tau = 1: r = 2.
    # (3,4) -> (1.2, 1.6); (0,1), (0,2) kept; (100,0) -> (2, 0); (0,0) adds 0.
    # mean of five: ((1.2 + 2) / 5, (1.6 + 1 + 2) / 5) = (0.64, 0.92)
    x = t([[3.0, 4], [0, 1], [0, 2], [100, 0], [0, 0]])
    torch.testing.assert_close(make_aggregator("cclip", cclip_tau=1.0)(x), t([0.64, 0.92]))
    # tau = 0.5: r = 1: (0.6, 0.8), (0, 1), (0, 1), (1, 0), 0 -> (1.6 / 5, 2.8 / 5)
    torch.testing.assert_close(make_aggregator("cclip", cclip_tau=0.5)(x), t([0.32, 0.56]))
    # the radius follows the scale: the same inputs times 1e-3 give the same answer times 1e-3
    torch.testing.assert_close(
        make_aggregator("cclip", cclip_tau=1.0)(x * 1e-3), t([0.64e-3, 0.92e-3])
    )
    # the default tau = 2: r = 4: (3,4) -> (2.4, 3.2); (0,1), (0,2) kept; (100,0) -> (4, 0):
    # ((2.4 + 4) / 5, (3.2 + 1 + 2) / 5) = (1.28, 1.24)
    torch.testing.assert_close(make_aggregator("cclip")(x), t([1.28, 1.24]))
    assert make_aggregator("cclip").radius(t([5.0, 1, 2, 100, 0])).item() == 4.0
    # a fixed tau = 10 is the plain mean of inputs of scale 1e-3 (all inside the radius)
    small = x * 1e-3
    loose = make_aggregator("cclip", cclip_tau=10.0, cclip_scale="absolute")
    torch.testing.assert_close(loose(small), small.mean(0))
    # two iterations: v_1 = (0.64, 0.92); distances to v_1 recomputed, median of them again
    v1 = t([0.64, 0.92])
    d = torch.linalg.vector_norm(x - v1, dim=1)
    r = d.sort().values[2]
    expected = v1 + (torch.clamp(r / d, max=1.0)[:, None] * (x - v1)).sum(0) / 5
    torch.testing.assert_close(make_aggregator("cclip", cclip_tau=1.0, cclip_iters=2)(x), expected)


def test_cclip_median_radius_holds_while_byzantine_rows_are_a_minority():
    # 3 honest rows near (1, 0), 2 huge ones, v = 0: distances 1, 1.1, 0.9, 1e6, 1e6, median
    # 1.1 (an honest one): tau = 1: the honest rows are kept, each huge row is cut to length
    # 1.1: ((1 + 1.1 + 0.9 - 1.1, 1.1) / 5) = (0.38, 0.22); the default tau = 2 cuts them to 2.2:
    # ((3 - 2.2) / 5, 2.2 / 5) = (0.16, 0.44); under a fixed tau = 10 they pull 10 each
    honest = t([[1.0, 0], [1.1, 0], [0.9, 0]])
    x = torch.cat([honest, t([[-1e6, 0], [0, 1e6]])])
    torch.testing.assert_close(make_aggregator("cclip", cclip_tau=1.0)(x), t([0.38, 0.22]))
    torch.testing.assert_close(make_aggregator("cclip")(x), t([0.16, 0.44]))
    # the same rows sent as inf and NaN: the median (1.1) is still an honest row's, the inf row
    # is cut to 2.2 along its direction, the NaN row adds nothing: ((3 - 2.2) / 5, 0)
    torch.testing.assert_close(
        make_aggregator("cclip")(torch.cat([honest, t([[-math.inf, 0], [math.nan, 1]])])),
        t([0.16, 0.0]),
    )
    torch.testing.assert_close(
        make_aggregator("cclip", cclip_tau=10.0, cclip_scale="absolute")(x),
        t([(3.0 - 10) / 5, 10 / 5]),
    )
    # more than half the rows at v (DeMoA's zero momenta early on): r = 0, v does not move
    zeros = torch.cat([torch.zeros(3, 2), t([[5.0, 5], [1e6, 0]])])
    assert make_aggregator("cclip")(zeros).tolist() == [0.0, 0.0]
    # more than half the rows non-finite: no finite median, r = 0, v stays where it was
    broken = t([[math.inf, 0], [math.nan, 0], [math.inf, 1], [1.0, 1], [0, 1]])
    assert make_aggregator("cclip")(broken, previous=t([0.5, 0.5])).tolist() == [0.5, 0.5]


def test_fltrust_by_formula():
    g = t([[2.0, 0], [0, 3], [3, 4], [-1, 0]])
    g0 = t([1.0, 0])
    # TS = relu(cos) = 1, 0, 3/5, 0; rescaled to ||g0|| = 1: (1,0), -, (0.6,0.8), -
    # out = (1*(1,0) + 0.6*(0.6,0.8)) / 1.6 = (0.85, 0.3)
    agg = make_aggregator("fltrust")
    torch.testing.assert_close(agg(g, reference=g0), t([0.85, 0.3]))
    p = t([1.0, 1])  # the same messages as states around p
    torch.testing.assert_close(agg(g + p, reference=g0 + p, previous=p), t([1.85, 1.3]))
    # every message points away from the server's: the server keeps its model
    assert agg(-g.abs() - 1, reference=t([1.0, 1]) + p, previous=p).tolist() == [1.0, 1.0]
    with pytest.raises(ValueError, match="reference"):
        agg(g)


def test_swb_with_one_coordinate_chunks_is_the_trimmed_mean():
    # C = 1: Q = +-1, sorting one value is nothing, the medoid permutation is trivial, so
    # SWB is the coordinate-wise trimmed mean with k = floor(n r): here floor(5 * 0.2) = 1.
    x = t([[1.0, -7], [2, 0], [3, 1], [4, 2], [100, 3]])
    for rotation in ("haar", "shared", "hadamard"):
        agg = make_aggregator("swb", swb_chunk=1, trim_ratio=0.2, swb_rotation=rotation)
        torch.testing.assert_close(agg(x), t([3.0, 1.0]))


def test_bucketing_buckets_then_inner_rule():
    x = t([[1.0], [1], [5], [5]])
    # buckets of 2 are {1,1},{5,5} -> means 1, 5 or {1,5},{1,5} -> 3, 3: the median is 3 either way
    for seed in range(5):
        agg = make_aggregator("bucketing", inner="median", bucket_size=2, seed=seed)
        assert agg(x).tolist() == [3.0]
    # one bucket of everything: the inner rule sees the mean only
    assert make_aggregator("bucketing", inner="krum", bucket_size=4, f=1)(x).tolist() == [3.0]
    # 5 messages, buckets of 2: ceil(5/2) = 3 bucket means; weights become bucket totals
    agg = make_aggregator("bucketing", inner="mean", bucket_size=2)
    w = torch.tensor([1.0, 2, 3, 4, 5])
    y = t([[1.0], [2], [3], [4], [5]])
    torch.testing.assert_close(agg(y, weights=w), make_aggregator("mean")(y, weights=w))


@pytest.mark.parametrize(("n", "s"), [(10, 2), (11, 3), (2, 5), (7, 1)])
@pytest.mark.parametrize("weighted", [False, True])
def test_bucket_sums_by_formula_in_blocks(monkeypatch, n, s, weighted):
    # sums_k = sum over shuffled positions p in [ks, (k+1)s) of w_order[p] x_order[p], by a
    # Python loop; the rule's blocks forced down to one bucket each so the block seams are used.
    from robusttune.methods.aggregators import base
    from robusttune.methods.aggregators.wrappers import bucket_sums

    gen = torch.Generator().manual_seed(n * 10 + s)
    x = torch.randn(n, 6, generator=gen, dtype=torch.float64)
    w = torch.rand(n, generator=gen, dtype=torch.float64) + 0.5 if weighted else None
    order = torch.randperm(n, generator=gen)
    monkeypatch.setattr(base, "BLOCK_ELEMENTS", s * 6)
    sums, totals = bucket_sums(x, order, s, w)
    buckets = math.ceil(n / s)
    assert sums.shape == (buckets, 6) and totals.shape == (buckets,)
    for k in range(buckets):
        members = order[k * s : (k + 1) * s].tolist()
        weight = [1.0 if w is None else float(w[i]) for i in members]
        torch.testing.assert_close(sums[k], sum(c * x[i] for c, i in zip(weight, members)))
        assert totals[k].item() == pytest.approx(sum(weight))


# -- robustness, preconditions ---------------------------------------------------------------


def test_f_huge_outliers_leave_robust_rules_bounded_while_mean_follows():
    gen = torch.Generator().manual_seed(3)
    n, f, d = 11, 2, 40
    x = torch.randn(n, d, generator=gen)
    x[:f] = 1e6
    reference = x[f:].mean(0)
    assert make_aggregator("mean")(x).abs().max() > 1e5
    robust = {
        "median": {},
        "trimmed_mean": {},
        "krum": {},
        "multi_krum": {},
        "bulyan": {},
        "geometric_median": {},
        "cclip": {},
        "fltrust": {},
        "swb": {"swb_chunk": 8},
        "bucketing": {"inner": "median", "bucket_size": 2},
    }
    for name, params in robust.items():
        out = make_aggregator(name, f=f, **params)(x, reference=reference, generator=gen)
        assert out.abs().max() < 10, name


def test_precondition_boundaries():
    bulyan, krum, multi = (make_aggregator(name) for name in ("bulyan", "krum", "multi_krum"))
    assert bulyan.precondition(11, 2) and not bulyan.precondition(11, 3)  # n >= 4f + 3
    assert krum.precondition(7, 2) and not krum.precondition(6, 2)  # n > 2f + 2
    assert multi.precondition(5, 1) and not multi.precondition(4, 1)
    for name in ("median", "trimmed_mean", "geometric_median", "cclip"):
        agg = make_aggregator(name)
        assert agg.precondition(5, 2) and not agg.precondition(4, 2), name  # 2f < n
    assert not make_aggregator("trimmed_mean", trim_ratio=0.1).precondition(10, 2)  # trims 1 < f
    assert make_aggregator("swb", trim_ratio=0.25).precondition(10, 2)  # k = 2 >= f
    assert not make_aggregator("swb", trim_ratio=0.15).precondition(10, 2)  # k = 1 < f
    assert make_aggregator("fltrust").precondition(2, 5)
    # bucketing: the inner rule's precondition on ceil(n / s) bucket means
    wrapped = make_aggregator("bucketing", inner="bulyan", bucket_size=2)
    assert wrapped.precondition(22, 2) and not wrapped.precondition(20, 2)


def test_unguarded_rules_run_where_their_precondition_fails():
    x = t([[0.0, 1], [5, 5]])
    assert make_aggregator("krum", f=1)(x).shape == (2,)  # n = 2: one neighbour
    out = make_aggregator("bulyan", f=2)(t([[0.0], [1], [2], [3], [50]]))  # theta = 1
    assert out.shape == (1,) and torch.isfinite(out).all()
    assert (
        make_aggregator("trimmed_mean", f=3)(t([[0.0], [1], [9]])).item() == 1.0
    )  # b clamped to 1


# -- SWB -------------------------------------------------------------------------------------


@pytest.mark.parametrize("rotation", ["haar", "shared", "hadamard"])
def test_swb_of_identical_messages_is_that_message(rotation):
    v = torch.randn(1000, generator=torch.Generator().manual_seed(0))
    agg = make_aggregator("swb", swb_chunk=64, swb_rotation=rotation, trim_ratio=0.25)
    out = agg(v.repeat(7, 1), generator=torch.Generator().manual_seed(1))
    torch.testing.assert_close(out, v, atol=1e-5, rtol=0)


def published_swb(x: torch.Tensor, rotations: list[list[torch.Tensor]], chunk: int, k: int):
    """The SWB-DM code's loop: per view, per chunk, Q from torch.linalg.qr, then rotate, sort,
    trim, medoid, place back, rotate back. Here each Q is re-derived by QR of G = Q_given R
    (R upper triangular, positive diagonal), whose sign-fixed Q factor is Q_given. The sign fix
    is ours, not the published code's: that code uses torch.linalg.qr's Q as it comes, which is
    not Haar (its first diagonal entry is never positive); see HouseholderRotation. The fix is
    needed here to recover Q_given from the QR, and the rule applies it too."""
    d = x.shape[1]
    out = torch.zeros(d, dtype=x.dtype)
    gen = torch.Generator().manual_seed(99)
    for qs in rotations:
        for c, start in enumerate(range(0, d, chunk)):
            q_given = qs[c]
            size = q_given.shape[0]
            r = torch.randn(size, size, generator=gen, dtype=x.dtype).triu(1) + torch.diag(
                torch.rand(size, generator=gen, dtype=x.dtype) + 0.5
            )
            q, rr = torch.linalg.qr(q_given @ r)
            q = q * torch.sign(torch.diagonal(rr))  # our sign fix (not in the published code)
            out[start : start + size] += published_chunk_step(x[:, start : start + size], q, k)
    return out / len(rotations)


@pytest.mark.parametrize("rotation", ["haar", "shared"])
def test_swb_equals_the_published_per_chunk_loop_given_the_same_rotations(rotation):
    n, d, chunk = 10, 45, 8  # 5 full chunks + a last chunk of 5
    x = torch.randn(n, d, generator=torch.Generator().manual_seed(5), dtype=torch.float64)
    agg = make_aggregator(
        "swb", swb_chunk=chunk, swb_views=2, swb_rotation=rotation, trim_ratio=0.2
    )
    plan = agg.plan(n, d, torch.Generator().manual_seed(7), x.device, x.dtype, reuse=False)
    rotations: list[list[torch.Tensor]] = [[], []]
    for block in plan:
        matrices = block.rotation.matrix().expand(block.count, -1, -1)
        rotations[block.view].extend(matrices.unbind(0))
    if rotation == "shared":  # one Q for every full chunk of a view, another per view
        assert all(torch.equal(q, rotations[0][0]) for q in rotations[0][:5])
        assert not torch.allclose(rotations[0][0], rotations[1][0])
    expected = published_swb(x, rotations, chunk, k=2)
    out = agg(x, generator=torch.Generator().manual_seed(7))
    torch.testing.assert_close(out, expected, atol=1e-10, rtol=0)


def test_swb_medoid_ties_do_not_depend_on_client_order():
    # Clients 0 and 1 have the same sorted values (coordinate permutations of each other), so
    # they tie exactly as medoid; the pick must not be "whichever comes first".
    y = t([[[1.0, 2, 3], [3, 2, 1], [10, 20, 30]]])
    a = barycenter_rows(y, 0)
    b = barycenter_rows(y[:, [1, 0, 2]], 0)
    assert torch.equal(a, b)
    assert sorted(a[0].tolist()) == [4.0, 8.0, 12.0]  # b = per-rank mean of 1 2 3, 1 2 3, 10 20 30


def haar_statistics(q: torch.Tensor) -> dict[str, float]:
    c = q.shape[-1]
    trace = q.diagonal(dim1=-2, dim2=-1).sum(-1)
    beta = stats.beta((c - 1) / 2, (c - 1) / 2)  # (Q_ij + 1) / 2 for a uniform unit column
    return {
        "q00_mean": q[:, 0, 0].mean().item(),
        "q00_sq": (q[:, 0, 0] ** 2).mean().item(),
        "trace": trace.mean().item(),
        "trace_sq": (trace**2).mean().item(),
        "det_positive": (torch.linalg.det(q) > 0).double().mean().item(),
        "ks_first": stats.kstest(((q[:, 0, 0] + 1) / 2).numpy(), beta.cdf).pvalue,
        "ks_last": stats.kstest(((q[:, -1, -1] + 1) / 2).numpy(), beta.cdf).pvalue,
    }


def is_haar(s: dict[str, float], c: int, draws: int) -> bool:
    se = 1 / math.sqrt(draws)
    # Haar moments: E q00 = 0, E q00^2 = 1/c, E q00^4 = 3/(c(c+2)); E tr = 0, E tr^2 = 1,
    # E tr^4 = 3 (c >= 4); det = +1 or -1 with probability 1/2.
    sd_q00_sq = math.sqrt(3 / (c * (c + 2)) - 1 / c**2)
    return (
        abs(s["q00_mean"]) < 5 * se / math.sqrt(c)
        and abs(s["q00_sq"] - 1 / c) < 5 * sd_q00_sq * se
        and abs(s["trace"]) < 5 * se
        and abs(s["trace_sq"] - 1) < 5 * math.sqrt(2) * se
        and abs(s["det_positive"] - 0.5) < 5 * 0.5 * se
        and s["ks_first"] > 1e-4
        and s["ks_last"] > 1e-4
    )


def test_stewart_householder_rotations_are_haar():
    c, draws = 4, 6000
    gen = torch.Generator().manual_seed(11)
    q = HouseholderRotation.draw(draws, c, gen, torch.device("cpu"), torch.float64).matrix()
    assert is_haar(haar_statistics(q), c, draws)
    # Negative control: QR of a Gaussian without the sign fix fails the same check.
    g = torch.randn(draws, c, c, generator=gen, dtype=torch.float64)
    assert not is_haar(haar_statistics(torch.linalg.qr(g).Q), c, draws)
    # Orthogonal to float32 precision at the production size's order of magnitude.
    big = HouseholderRotation.draw(3, 128, gen, torch.device("cpu"), torch.float32).matrix()
    assert (big.mT @ big - torch.eye(128)).abs().max() < 1e-5


def test_hadamard_rotation_is_orthogonal_and_pads_the_last_chunk():
    agg = make_aggregator("swb", swb_chunk=8, swb_rotation="hadamard")
    blocks = list(
        agg.plan(
            3, 21, torch.Generator().manual_seed(0), torch.device("cpu"), torch.float64, reuse=False
        )
    )
    full = blocks[0].rotation.matrix()
    torch.testing.assert_close(full @ full.mT, torch.eye(8).expand_as(full).double())
    last = blocks[-1].rotation.matrix()  # 5 coordinates padded to 8: orthonormal rows
    assert last.shape == (1, 5, 8)
    torch.testing.assert_close(last @ last.mT, torch.eye(5)[None].double())


def test_swb_own_generator_is_reproducible_and_advances():
    x = torch.randn(6, 30, generator=torch.Generator().manual_seed(0))
    a, b = make_aggregator("swb", swb_chunk=8, seed=4), make_aggregator("swb", swb_chunk=8, seed=4)
    first = a(x)
    assert torch.equal(first, b(x))
    assert not torch.equal(first, a(x))


def test_tie_keys_separate_distinct_rows_and_follow_the_rows():
    x = torch.randn(5, 16, generator=torch.Generator().manual_seed(0))
    keys = tie_keys(x)
    assert len(set(keys.tolist())) == 5
    torch.testing.assert_close(tie_keys(x[[3, 1, 4, 0, 2]]), keys[[3, 1, 4, 0, 2]])
