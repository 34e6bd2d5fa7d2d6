"""Calibration of a deployment against the worst case: `trim_sweep` runs a short sweep over trim
ratios through any `robusttune.engine.runners.Runner` (the Ray Tune sweep layer, or
`robusttune.engine.runners.InProcessRunner`) against the shared worst case
(`robusttune.methods.adversary`, the breakdown map's), and recommends the smallest trim ratio that
survives every attack at the deployment's Byzantine fraction and at a margin above it. The
analytic figures it is read beside (the law of a round's Byzantine share, the trim a round
exceeds) are `robusttune.problem.byzantine_law`'s.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Mapping, Sequence

from robusttune.core.records import survives
from robusttune.problem.byzantine_law import EPS, check_trim, lattice_byzantine

if TYPE_CHECKING:  # the runners import torch; the trim sweep needs only their protocol
    from robusttune.methods.adversary import Adversary
    from robusttune.engine.runners import Runner

__all__ = ["trim_sweep", "TrimSweep", "default_trim_grid", "no_survivor_line"]


# -- the trim sweep ---------------------------------------------------------------------------
@dataclass
class TrimSweep:
    """Outcome of `trim_sweep`. ``rows``: one per (trim ratio, Byzantine fraction) with the worst
    case's mean final accuracy over seeds (``accuracy``: the selection accuracy, validation when
    the runs hold a validation part; ``test_accuracy``: the same runs on the test part, what the
    recommendation is reported with), whether a seed collapsed, ``survived``
    and ``attack`` (the adversary setting behind the number: the worst, or the weakest that broke
    the point); ``clean_accuracy`` and ``threshold``: each trim's clean accuracy and survival bar;
    ``recommended``: the smallest trim ratio that survives at every Byzantine fraction swept
    (None if none does); ``cost``: each larger trim's accuracy loss against it, in points, at the
    deployment's own fraction; ``adversary``: what the worst case ran."""

    rows: list[dict[str, Any]] = field(default_factory=list)
    recommended: float | None = None
    clean_accuracy: dict[float, float] = field(default_factory=dict)
    threshold: dict[float, float] = field(default_factory=dict)
    cost: dict[float, float] = field(default_factory=dict)
    adversary: str = ""


def default_trim_grid(byzantine_fraction: float, margin: float, n_inputs: int) -> list[float]:
    """The distinct trims: r = j / n_in for j = 0, 1, ... while r < 0.5 and r <= beta + margin +
    0.1 (which brackets the calibrated r = beta + 0.05 and over-trims a little). Only floor(n_in r)
    matters to the rule, so a finer grid would rerun identical configurations."""
    top = min(0.49, byzantine_fraction + margin + 0.1)
    return [round(j / n_inputs, 10) for j in range(n_inputs) if j / n_inputs <= top + EPS]


def trim_sweep(base: Mapping[str, Any], trims: Sequence[float], byzantine_fractions: Sequence[float],
               runner: Runner, seeds: Sequence[int] = (42,), adversary: Adversary | None = None,
               relative_threshold: float = 0.5, threshold: float | None = None) -> TrimSweep:
    """Judge ``base`` (RunSpec keys with the dataset, method and deployment; ``clients`` = N) at
    every trim ratio r against the shared worst case (``adversary``, default
    `Adversary.default()`: every default attack over its strength ladder), exactly as a breakdown
    map of the cells {trim_ratio: r} judges its lattice points: each r is a cell, its points
    k = 0 (clean) and k = floor(beta N) for each beta swept, through
    `robusttune.experiments.breakdown.spec_evaluator` (staged ladders, shared runs; one runner call per
    stage).

    A point survives when no seed collapsed and its worst case's mean accuracy reaches the bar:
    ``threshold`` if given, else ``relative_threshold`` x that trim's clean accuracy (the map's
    `survival_bar`). Recommended: the smallest r surviving at every beta swept (the deployment's
    fraction and the margin above it)."""
    from robusttune.methods.adversary import Adversary
    from robusttune.experiments.breakdown import Cell, Point, spec_evaluator, survival_bar

    for r in trims:
        check_trim(r)
    clients = int(base["clients"])
    threat = adversary or Adversary.default()
    evaluate = spec_evaluator({**base, "attack": base.get("attack", "none")}, runner, seeds=seeds,
                              adversary=threat, survival=(threshold, relative_threshold))
    cells = [Cell.of(clients, trim_ratio=float(r)) for r in trims]
    # the clean points first: from then on every point's survival bar is known (staged ladders
    # stop at the first variant below it, as in a map)
    clean = dict(zip(trims, evaluate([Point(cell, 0) for cell in cells])))
    counts = {beta: lattice_byzantine(beta, clients) for beta in byzantine_fractions}
    attacked_points = [Point(cell, k) for cell in cells for k in sorted(set(counts.values())) if k > 0]
    attacked = dict(zip(((p.cell["trim_ratio"], p.byzantine) for p in attacked_points),
                        evaluate(attacked_points)))
    result = TrimSweep(adversary=threat.describe(base.get("attack", "none")))
    for r in trims:
        result.clean_accuracy[r] = clean[r].accuracy
        result.threshold[r] = survival_bar(threshold, relative_threshold, clean[r].accuracy)
        for beta, k in counts.items():
            outcome = attacked.get((float(r), k), clean[r])
            result.rows.append({
                "trim_ratio": r, "byzantine_fraction": beta, "byzantine_clients": k,
                "accuracy": outcome.accuracy, "test_accuracy": outcome.test_accuracy,
                "collapsed": outcome.collapsed,
                "seeds": len(seeds),
                "survived": survives(outcome.accuracy, outcome.collapsed, result.threshold[r]),
                "attack": " ".join(f"{a}={b}" for a, b in outcome.breaker)})
    surviving = [r for r in trims
                 if all(row["survived"] for row in result.rows if row["trim_ratio"] == r)]
    result.recommended = min(surviving) if surviving else None
    if result.recommended is not None:
        own = byzantine_fractions[0]
        acc = {row["trim_ratio"]: row["accuracy"] for row in result.rows
               if row["byzantine_fraction"] == own}
        result.cost = {r: 100 * (acc[result.recommended] - acc[r])
                       for r in sorted(acc) if r > result.recommended}
    return result


def no_survivor_line(figures: Mapping[str, Any], trims: Sequence[float]) -> str:
    """The one line `calibrate` prints when no swept trim survives: the analytic bound (the
    smallest r with P(some round exceeds the trim) <= risk, `smallest_safe_trim`)."""
    def bound(value: float | None) -> str:
        return "none below 0.5" if value is None else f"r >= {value:g}"

    return (f"no trim ratio in {min(trims):g}..{max(trims):g} survives every attack at "
            f"beta={figures['byzantine_fraction']:g} and the margin; the analytic bound at risk "
            f"{figures['risk']:g}: {bound(figures['analytic_safe_trim'])} over the sample, "
            f"{bound(figures['analytic_safe_trim_cache'])} over a cache")
