"""SWB on h fixed rows plus c copies of one message, called again and again with a new message:
the objective of the optimal attacks' line search (robusttune.methods.attacks.rule_aware, 20 calls a
round on the same honest rows). What depends only on the fixed rows is done once per n = h + c:
the rotations are drawn once (the call's generator is reseeded to ``seed`` every time, so every
call draws the same ones), the fixed rows are rotated and argsorted once (steps 1 and 2, and
the order step 4 places b in when a fixed row is the medoid), and their sorted values are
sorted across the rows at every rank once. A call then rotates and argsorts the one message and
merges its c copies into each rank's sorted column, which gives step 3's trimmed mean without
sorting n values per rank; the medoid is the rule's own (`swb_blocks.medoid_rows`).

The result is the plain call's (`Aggregator.with_fixed_rows`: the rule on
cat[fixed, c x message] with a generator seeded ``seed``) to the rounding of the message's
rotation: rotated alone, a GEMM may round its row differently from the same row in the batch.
The merge picks the values the sort picks, in the same order, so with k >= 1 step 3 gives the
same float (tests/test_swb_fixed_rows.py); with k = 0 it averages the sorted column where the
rule averages the rows as given, which may differ in the last bit.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Protocol

import torch
from torch import Tensor

from robusttune.methods.aggregators.base import (
    argsort_last,
    compute_dtype,
    sort_values,
    trim_count,
)
from robusttune.methods.aggregators.swb_blocks import Block, chunks_of, medoid_rows


class SlicedRule(Protocol):
    """What the fixed-rows plan reads of its SWB rule (robusttune.methods.aggregators.swb, which
    imports this module: the plan names the rule by what it uses, not by its class)."""

    trim_ratio: float
    swb_chunk: int
    swb_views: int
    swb_rotation: str

    def plan(
        self,
        n: int,
        d: int,
        generator: torch.Generator,
        device: torch.device,
        dtype: torch.dtype,
        reuse: bool = True,
    ) -> Iterator[Block]: ...

    def combine(
        self,
        d: int,
        blocks: Iterable[Block],
        like: Tensor,
        barycenter: Callable[[int, Block, int, int], Tensor],
    ) -> Tensor: ...


__all__ = ["FixedRowsSWB", "merged_trimmed_mean", "padded_columns"]


def merged_trimmed_mean(padded: Tensor, value: Tensor, copies: int, k: int) -> Tensor:
    """Step 3 of SWB at every rank r when the n = h + c values of rank r are h fixed values,
    sorted (F_0 <= ... <= F_{h-1} in the rules' order -inf < finite < +inf < NaN), and c copies
    of ``value``: (nb, C):

        b_r = mean of t_k, ..., t_{n-k-1},   t the merged sorted column,

    t_j = F_j for j < p, value for p <= j < p + c, F_{j-c} beyond, p = #{i : F_i < value} (h for
    a NaN value, which sorts last). ``padded``: (nb, h + 2c, C), F in rows [c, c + h) and
    anything around it (`padded_columns`), so that t's two runs of F are slices: no sort and no
    index tensor, O(h) work per rank. Picks the values the sort of the n values picks, in the
    same order (`swb.trimmed_rank_mean`). Returns (nb, C)."""
    h = padded.shape[1] - 2 * copies
    n = h + copies
    columns = padded[:, copies : copies + h]
    position = (columns < value[:, None, :]).sum(dim=1, keepdim=True)  # (nb, 1, C)
    position.masked_fill_(torch.isnan(value)[:, None, :], h)
    merged = torch.arange(k, n - k, device=padded.device).reshape(1, -1, 1)
    below, beyond = padded[:, copies + k : copies + n - k], padded[:, k : n - k]  # F_j, F_{j-c}
    picked = torch.where(merged < position + copies, value[:, None, :], beyond)
    return torch.where(merged < position, below, picked).mean(dim=1)


def padded_columns(ranked: Tensor, copies: int) -> Tensor:
    """The sorted rows' values sorted across the rows at every rank (F of
    `merged_trimmed_mean`), with c rows of zeros on each side: (nb, h, C) -> (nb, h + 2c, C)."""
    return torch.nn.functional.pad(sort_values(ranked, dim=1), (0, 0, copies, copies))


@dataclass
class _FixedBlock:
    """One block of the plan with its fixed rows' work: ``rotated``, ``order`` and ``ranked``
    hold the h fixed rows' Y, argsort(Y) and sort(Y) in rows [0, h) and the message's in row h
    (overwritten by every call); ``padded`` their sorted Y sorted across the rows at every rank
    (`padded_columns`)."""

    rotated: Tensor  # (nb, h + 1, C)
    order: Tensor  # (nb, h + 1, C), int64
    ranked: Tensor  # (nb, h + 1, C)
    padded: Tensor  # (nb, h + 2c, C)


class FixedRowsSWB:
    """``(message, copies) -> SWB(cat[fixed, copies x message], generator seeded seed)``, the
    fixed rows' work done once per n (module docstring). With ``keep_rotations`` the plan's
    rotations are kept too (`rotation_elements`: ``haar`` d x C numbers a view, ``shared``
    C x C, ``hadamard`` d signs), else drawn again at every call (`SWB.with_fixed_rows` decides
    by its memory bound)."""

    def __init__(
        self, rule: SlicedRule, fixed: Tensor, *, seed: int = 0, keep_rotations: bool = True
    ) -> None:
        self.rule, self.seed, self.keep_rotations = rule, seed, keep_rotations
        self.dtype = fixed.dtype
        self.fixed = fixed.detach().to(compute_dtype(fixed.dtype))
        self.blocks: dict[int, list[Block]] = {}
        self.work: dict[int, list[_FixedBlock]] = {}

    @staticmethod
    def kept_elements(rule: SlicedRule, h: int, d: int) -> int:
        """Float32-sized elements kept for the fixed rows and the message, a view: Y and sort(Y),
        (h + 1) x d each; argsort(Y), (h + 1) x d int64 (two each); the per-rank sorted
        columns with their padding, (h + 2c) x d, at most 3h x d since c < h within the rule's
        precondition (2f < n): 7 (h + 1) x d in all."""
        return 7 * (h + 1) * d * rule.swb_views

    @staticmethod
    def rotation_elements(rule: SlicedRule, d: int) -> int:
        """Elements of one plan's rotations for d coordinates (an upper bound: the last chunk
        counted at full size; ``shared`` draws one matrix for the full chunks and one for the
        last)."""
        size = rule.swb_chunk
        chunks = -(-d // size)
        per_view = {
            "haar": chunks * size * (size + 2),
            "shared": 2 * size * (size + 2),
            "hadamard": chunks * size,
        }[rule.swb_rotation]
        return per_view * rule.swb_views

    def plan(self, n: int) -> Iterable[Block]:
        """The blocks of the plan for n rows, drawn from a generator seeded ``seed``: kept from
        the first call with ``keep_rotations``, else drawn again."""
        if n in self.blocks:
            return self.blocks[n]
        generator = torch.Generator(device=self.fixed.device).manual_seed(self.seed)
        blocks = self.rule.plan(
            n,
            self.fixed.shape[1],
            generator,
            self.fixed.device,
            self.fixed.dtype,
            reuse=not self.keep_rotations,
        )
        if self.keep_rotations:
            kept = self.blocks[n] = list(blocks)
            return kept
        return blocks

    def __call__(self, message: Tensor, copies: int) -> Tensor:
        h, d = self.fixed.shape
        n = h + copies
        k = trim_count(self.rule.trim_ratio, n)
        work = self.work.setdefault(n, [])
        one = message.detach().to(self.fixed.dtype).reshape(1, d)

        def barycenter(index: int, block: Block, start: int, stop: int) -> Tensor:
            if index == len(work):
                work.append(self._fixed_block(block, start, stop, copies))
            kept = work[index]
            rotated = block.rotation.forward(chunks_of(one, block, start, stop))  # (nb, 1, C)
            kept.rotated[:, h:] = rotated
            kept.order[:, h:] = argsort_last(rotated).to(rotated.device)
            kept.ranked[:, h:] = rotated.gather(-1, kept.order[:, h:])
            b = merged_trimmed_mean(kept.padded, kept.ranked[:, h], copies, k)
            # the c copies are one row for the medoid: equal rows are interchangeable there
            medoid = medoid_rows(kept.rotated, kept.ranked, b)
            rank_to_coordinate = kept.order[torch.arange(len(medoid), device=b.device), medoid]
            return torch.empty_like(b).scatter_(1, rank_to_coordinate, b)

        with torch.no_grad():
            out = self.rule.combine(d, self.plan(n), self.fixed, barycenter)
        return out.to(self.dtype)

    def _fixed_block(self, block: Block, start: int, stop: int, copies: int) -> _FixedBlock:
        h = self.fixed.shape[0]
        rotated = block.rotation.forward(chunks_of(self.fixed, block, start, stop))
        nb, _, size = rotated.shape
        order = argsort_last(rotated).to(rotated.device)
        ranked = rotated.gather(-1, order)

        def with_message_row(rows: Tensor) -> Tensor:
            out = rows.new_empty(nb, h + 1, size)
            out[:, :h] = rows
            return out

        return _FixedBlock(
            with_message_row(rotated),
            with_message_row(order),
            with_message_row(ranked),
            padded_columns(ranked, copies),
        )
