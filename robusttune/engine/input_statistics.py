"""What a round's robust rule was given, measured against its honest inputs.

Both figures are taken over the rows the rule aggregated (the round's messages, or under a
cache algorithm the cached rows) and the honest ones among them: `aggregation_error` is the
rule's L2 error against the honest mean (SWB-DM, Eq. 1 and Figure 2), `honest_input_spread` the
honest rows' mean squared distance from that mean (the variance (delta, c)-robustness bounds the
error by; DeMoA, arXiv 2509.02970). Each returns a 0-dim tensor on the rows' device, so the
simulation reads them back with the round's other figures in one transfer.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

__all__ = ["aggregation_error", "error_from", "honest_input_spread", "honest_inputs", "spread_from"]


def honest_inputs(
    rows: Tensor, byzantine: Tensor, weights: Tensor | None
) -> tuple[Tensor, Tensor | None, Tensor] | None:
    """The rule's honest input rows (at least float32), their weights (None: unweighted) and
    their (weighted) mean xbar_H; None when no row is honest. ``byzantine`` is a host mask, so
    selecting the rows reads nothing back from the device."""
    dtype = torch.promote_types(rows.dtype, torch.float32)
    honest = (~byzantine).nonzero().flatten()
    if honest.numel() == 0:
        return None
    if honest.numel() == rows.shape[0]:
        # every row honest (a clean run, a sample without Byzantine clients): no copy of the rows
        benign, w = rows.to(dtype), None if weights is None else weights.to(dtype)
    else:
        index = honest.to(rows.device, non_blocking=True)
        benign = rows.index_select(0, index).to(dtype)
        w = None if weights is None else weights.index_select(0, index).to(dtype)
    if w is None:
        return benign, None, benign.mean(dim=0)
    return benign, w, (w @ benign) / w.sum()


def _infinite_if_nan(value: Tensor) -> Tensor:
    return torch.where(torch.isnan(value), torch.full_like(value, math.inf), value)


def aggregation_error(
    aggregate: Tensor, rows: Tensor, byzantine: Tensor, weights: Tensor | None
) -> Tensor | None:
    """The round's L2 aggregation error against the benign mean (SWB-DM, Eq. 1 and Figure 2),
    a 0-dim float64 tensor on the rows' device (no read-back here):

        E = || Agg - xbar_H ||_2,   xbar_H = sum_{i in H} w_i x_i / sum_{i in H} w_i,

    over H, the rule's input rows that no Byzantine client wrote (``byzantine``: bool[n_in] on
    the host, the AggregatorInput's mask), with the weights the rule was given (``None``: the
    plain mean 1/|H| sum_{i in H} x_i, the paper's benign mean; rules that ignore weights, such as
    median and SWB, see the same aggregate either way). The rule's inputs are what it aggregates:
    trained states under fedavg and state_cache, momenta or gradients under the others. States
    and their aggregate share one translation (the global model), so the difference is the
    update-space (delta-space) one. Under a cache algorithm H is the honest rows the rule saw:
    the honest clients' cached (possibly stale) rows, not only this round's messages.

    None when H is empty (nothing honest to compare with). A non-finite aggregate or benign mean
    gives +inf, so NaN always means "not defined this round"."""
    honest = honest_inputs(rows, byzantine, weights)
    return None if honest is None else error_from(aggregate, honest)


def error_from(aggregate: Tensor, honest: tuple[Tensor, Tensor | None, Tensor]) -> Tensor:
    """`aggregation_error` from `honest_inputs`' result (a round selects its honest rows once)."""
    centre = honest[2]
    error = torch.linalg.vector_norm(aggregate.to(centre.dtype) - centre, dtype=torch.float64)
    return _infinite_if_nan(error)


def honest_input_spread(rows: Tensor, byzantine: Tensor, weights: Tensor | None) -> Tensor | None:
    """The spread of the rule's honest inputs about their mean, a 0-dim float64 tensor on the
    rows' device (no read-back here):

        V = sum_{i in H} w_i ||x_i - xbar_H||^2 / sum_{i in H} w_i   (w_i = 1: the plain mean
        1/|H| sum_{i in H} ||x_i - xbar_H||^2),

    with H, the weights and xbar_H as in `aggregation_error`. It is the honest spread that
    (delta, c)-robustness bounds a rule's squared error by, up to c delta (the definition DeMoA,
    arXiv 2509.02970, assumes of its Agg), and the quantity DeMoA's Sec. 3 compares momentum
    recursions by: the coefficient swap (1 - alpha p) -> (1 - alpha) adds alpha^2 p (1 - p)
    ||m_i||^2 to a momentum's variance. Under a cache algorithm H is the honest clients' cached
    rows, fresh and stale, so V measures the momenta the rule aggregated. Translation-invariant:
    trained states and their updates give the same V.

    None when H is empty; +inf when a honest row is not finite."""
    honest = honest_inputs(rows, byzantine, weights)
    return None if honest is None else spread_from(honest)


def spread_from(honest: tuple[Tensor, Tensor | None, Tensor]) -> Tensor:
    """`honest_input_spread` from `honest_inputs`' result."""
    benign, w, centre = honest
    squared = torch.linalg.vector_norm(benign - centre, dim=1, dtype=torch.float64).square()
    spread = squared.mean() if w is None else (w.double() @ squared) / w.double().sum()
    return _infinite_if_nan(spread)
