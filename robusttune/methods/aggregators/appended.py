"""A rule on fixed rows plus copies of one appended message: the objective of a search that
varies only the appended rows (robusttune.methods.attacks.rule_aware's line search), for any callable
rule; `Aggregator.with_fixed_rows` starts from it and a rule may do its fixed-row work once."""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor

__all__ = ["appended_rows"]


def appended_rows(
    rule: Callable[..., Tensor], fixed: Tensor, *, f: int, seed: int = 0
) -> Callable[[Tensor, int], Tensor]:
    """``(message, copies) -> rule(cat[fixed, copies x message], f=f, generator=seeded(seed))``
    for any callable rule (`Aggregator.with_fixed_rows` without a shortcut)."""

    def evaluate(message: Tensor, copies: int) -> Tensor:
        rows = torch.cat([fixed, message.unsqueeze(0).expand(copies, -1)])
        return rule(rows, f=f, generator=torch.Generator(device=fixed.device).manual_seed(seed))

    return evaluate
