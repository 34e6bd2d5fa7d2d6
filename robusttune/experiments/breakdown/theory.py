"""Theory beside measurement: for each cell of a breakdown map, the rule's theoretical breakdown
fraction over the inputs it aggregates and the chance that sampling alone hands the Byzantine
clients a majority, so a reader sees whether a collapse is the rule's or the sampling's."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from robusttune.core.runspec import RunSpec
from robusttune.experiments.breakdown.cell_search import CellResult
from robusttune.methods.aggregators import make_rule
from robusttune.problem.byzantine_law import (
    Deployment,
    aggregator_inputs,
    p_any_round,
    p_majority_round,
)

__all__ = ["theory_columns", "told_bound"]


def theory_columns(base: Mapping[str, Any], result: CellResult) -> dict[str, Any]:
    """For one cell: ``inputs`` (n_in, the rows its rule aggregates: the sample, or all N cached
    rows), ``theory_fraction`` (the rule's bound as a fraction of n_in, from its precondition;
    None where the rule has none) and, at the first lattice point above the measured breakdown
    (beta = (b + 1) / N, the point that failed), ``p_majority_round`` (one round's sample is
    Byzantine-majority) and ``p_majority_run`` (some of the run's T rounds is)."""
    values = {**base, **result.cell.as_dict(), "byzantine_fraction": 0.0}
    spec = RunSpec.from_dict(values)
    n_inputs = aggregator_inputs(spec)
    theory = told_bound(values, n_inputs)
    columns: dict[str, Any] = {
        "inputs": n_inputs,
        "theory_fraction": theory,
        "p_majority_round": math.nan,
        "p_majority_run": math.nan,
    }
    if result.breakdown is not None and result.breakdown < result.k_max:
        deployment = Deployment(
            clients=spec.clients,
            participation=spec.participation,
            byzantine_fraction=(result.breakdown + 1) / spec.clients,
            rounds=spec.rounds,
            sample_size=spec.sample_size if spec.participation_mode == "fixed" else None,
            mode=spec.participation_mode,
        )
        q = p_majority_round(deployment, cache=spec.aggregates_cache)
        columns.update(p_majority_round=q, p_majority_run=p_any_round(q, spec.rounds))
    return columns


def told_bound(values: Mapping[str, Any], n: int) -> float | None:
    """The rule's theoretical breakdown over n inputs as the map runs it: the largest f / n that
    the rule's own bound covers when the rule is built as a run expecting f corrupted inputs of
    n builds it (assumed beta = f / n, so a trim tied to the assumed corruption follows it:
    SWB's r = min(0.45, beta + 0.05)),

        max { f / n : f <= n x theoretical_breakdown_{rule(beta = f / n)}(n) },  0 if none.

    For a rule whose parameters do not follow beta it is `theoretical_breakdown(n)`; None where
    the rule has no bound in n (FLTrust)."""

    def bound(f: int) -> float | None:
        spec = RunSpec.from_dict({**values, "assumed_byzantine_fraction": f / n})
        return make_rule(spec.aggregator, **spec.aggregator_params()).theoretical_breakdown(n)

    if bound(0) is None:
        return None

    def covers(f: int) -> bool:
        b = bound(f)
        # whether a rule has a bound in n depends on the rule, not its assumed beta (bound(0) had)
        assert b is not None
        return f <= n * b + 1e-9

    covered = [f for f in range(n) if covers(f)]
    return max(covered) / n if covered else 0.0
