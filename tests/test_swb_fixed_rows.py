"""SWB on fixed rows plus copies of one message (robusttune.methods.aggregators.swb_fixed_rows), the
optimal attacks' objective: the merge that replaces step 3's sort, and the whole call against
the rule on the concatenated rows."""

from __future__ import annotations

import math

import pytest
import torch

from robusttune.methods.aggregators import make_aggregator
from robusttune.methods.aggregators.appended import appended_rows
from robusttune.methods.aggregators.swb_fixed_rows import (
    FixedRowsSWB,
    merged_trimmed_mean,
    padded_columns,
)

INF, NAN = math.inf, math.nan


def sorted_column_mean(
    fixed: torch.Tensor, value: torch.Tensor, copies: int, k: int
) -> torch.Tensor:
    """The trimmed mean by definition: every rank's n values sorted (torch.sort, NaN last), the
    k lowest and k highest dropped, the rest averaged in order."""
    column = torch.cat([fixed, value[:, None, :].expand(-1, copies, -1)], dim=1)
    n = column.shape[1]
    return torch.sort(column, dim=1).values[:, k : n - k].mean(dim=1)


def test_merge_on_a_hand_case():
    """F = (1, 2, 3, 4), two copies of 2.5, k = 1: t = (1, 2, 2.5, 2.5, 3, 4), b = mean(2, 2.5,
    2.5, 3) = 2.5; copies of 10: t = (1, 2, 3, 4, 10, 10), b = mean(2, 3, 4, 10) = 4.75; of
    -inf: t = (-inf, -inf, 1, 2, 3, 4), b = mean(-inf, 1, 2, 3) = -inf; of NaN (sorts last):
    mean(2, 3, 4, NaN) = NaN."""
    fixed = torch.tensor([[[1.0], [2.0], [3.0], [4.0]]])  # (nb=1, h=4, C=1)
    padded = padded_columns(fixed, 2)
    for value, expected in ((2.5, 2.5), (10.0, 4.75), (-INF, -INF)):
        assert float(merged_trimmed_mean(padded, torch.tensor([[value]]), 2, 1)) == expected
    assert math.isnan(float(merged_trimmed_mean(padded, torch.tensor([[NAN]]), 2, 1)))
    # k = 2 drops both copies of 10: mean(3, 4)
    assert float(merged_trimmed_mean(padded, torch.tensor([[10.0]]), 2, 2)) == 3.5


@pytest.mark.parametrize("copies", [1, 4, 6, 20])
@pytest.mark.parametrize("k", [1, 4, 5, 8])
def test_merge_is_the_sorted_trimmed_mean_value_for_value(copies, k):
    """At every rank the merge picks the values the sort picks, in the same order, so the mean
    is the same float: non-finite values, values equal to a fixed one, and more copies than k
    (outside the precondition) included."""
    h = 16
    gen = torch.Generator().manual_seed(copies * 100 + k)
    fixed = torch.randn(3, h, 64, generator=gen)
    fixed[2, 0, :8] = INF  # a corrupted fixed row: +inf, -inf and NaN ranks
    fixed[2, 1, 8:16] = -INF
    fixed[2, 2, 16:24] = NAN
    value = torch.randn(3, 64, generator=gen)
    value[0, :5], value[0, 5:10], value[0, 10:15] = NAN, INF, -INF
    value[1, :20] = fixed[1, 3, :20]  # ties with a fixed value
    ours = merged_trimmed_mean(padded_columns(fixed, copies), value, copies, k)
    reference = sorted_column_mean(fixed, value, copies, k)
    assert torch.equal(ours.isnan(), reference.isnan())
    assert torch.equal(torch.nan_to_num(ours), torch.nan_to_num(reference))


def rows(h: int, d: int, seed: int) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    return torch.randn(h, d, generator=gen) * 0.5 + 0.3


@pytest.mark.parametrize(
    ("rotation", "chunk", "d"),
    [("haar", 64, 1_000), ("shared", 512, 5_000), ("hadamard", 128, 3_001)],
)
def test_ties_and_corrupted_fixed_rows_give_the_rule_on_the_appended_rows(rotation, chunk, d):
    """A message equal to a fixed row (the copies tie with it for the medoid) and fixed rows
    holding infinities: the call is the rule on cat[fixed, c x message] to float32 rounding of
    the message's rotation, for c within the precondition and beyond it."""
    rule = make_aggregator("swb", trim_ratio=0.25, swb_chunk=chunk, swb_rotation=rotation)
    honest = rows(16, d, seed=11)
    corrupted = honest.clone()
    corrupted[0, : d // 3] = INF
    for fixed in (honest, corrupted):
        fast, plain = rule.with_fixed_rows(fixed, f=4), appended_rows(rule, fixed, f=4)
        for copies in (2, 4, 8):
            for message in (honest[5], honest.mean(0) - 3 * honest.std(0)):
                ours, theirs = fast(message, copies), plain(message, copies)
                assert torch.equal(ours.isfinite(), theirs.isfinite())
                torch.testing.assert_close(
                    ours[theirs.isfinite()], theirs[theirs.isfinite()], rtol=1e-5, atol=1e-5
                )


def test_rotations_are_drawn_once_when_kept_and_again_when_not(monkeypatch):
    """Kept rotations and rotations drawn again at every call give the same float (the same
    generator seed); kept ones are drawn once per n."""
    rule = make_aggregator("swb", trim_ratio=0.25, swb_chunk=64, swb_rotation="haar")
    fixed = rows(16, 700, seed=12)
    drawn = []
    plan = rule.plan
    monkeypatch.setattr(
        rule, "plan", lambda *args, **kwargs: drawn.append(args[0]) or plan(*args, **kwargs)
    )
    kept = FixedRowsSWB(rule, fixed, keep_rotations=True)
    fresh = FixedRowsSWB(rule, fixed, keep_rotations=False)
    messages = [fixed.mean(0) + tau * fixed.std(0) for tau in (0.0, 1.5, 4.0)]
    for copies in (4, 6):
        for message in messages:
            assert torch.equal(kept(message, copies), fresh(message, copies))
    # kept: one plan for n = 20 and one for n = 22; fresh: one per call
    assert drawn.count(20) == 1 + 3 and drawn.count(22) == 1 + 3


def test_the_memory_bound_decides_what_is_kept(monkeypatch):
    """Rows within the bound and rotations beyond what is left: the fixed-rows call without
    kept rotations; rows beyond it: the plain call."""
    import robusttune.methods.aggregators.swb as swb_module

    rule = make_aggregator("swb", trim_ratio=0.25, swb_chunk=64, swb_rotation="haar")
    fixed = rows(16, 700, seed=13)
    row_elements = FixedRowsSWB.kept_elements(rule, 16, 700)
    monkeypatch.setattr(swb_module, "FIXED_ROWS_ELEMENTS", row_elements + 10)
    partial = rule.with_fixed_rows(fixed, f=4)
    assert isinstance(partial, FixedRowsSWB) and not partial.keep_rotations
    monkeypatch.setattr(swb_module, "FIXED_ROWS_ELEMENTS", 10**12)
    assert rule.with_fixed_rows(fixed, f=4).keep_rotations
    monkeypatch.setattr(swb_module, "FIXED_ROWS_ELEMENTS", row_elements - 1)
    assert not isinstance(rule.with_fixed_rows(fixed, f=4), FixedRowsSWB)
