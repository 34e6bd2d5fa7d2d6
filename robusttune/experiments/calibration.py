"""Calibration of a deployment against the worst case: `trim_sweep` runs a short sweep over trim
ratios through any `robusttune.engine.runners.Runner` (the Ray Tune sweep layer, or
`robusttune.engine.runners.InProcessRunner`) against the shared worst case
(`robusttune.methods.adversary`, the breakdown map's), and recommends the smallest trim ratio that
survives every attack at the deployment's Byzantine fraction and at a margin above it. The
analytic figures it is read beside (the law of a round's Byzantine share, the trim a round
exceeds) are `robusttune.problem.byzantine_law`'s.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from robusttune.core.records import survives
from robusttune.problem.byzantine_law import EPS, check_trim, lattice_byzantine

if TYPE_CHECKING:  # the runners import torch; the trim sweep needs only their protocol
    from robusttune.engine.runners import Runner
    from robusttune.methods.adversary import Adversary

__all__ = ["TrimSweep", "default_trim_grid", "no_survivor_line", "trim_sweep"]


# -- the trim sweep ---------------------------------------------------------------------------
@dataclass
class TrimSweep:
    """Outcome of `trim_sweep`. ``rows``: one per (trim ratio, Byzantine fraction) with the worst
    case's mean final accuracy over seeds (``accuracy``: the selection accuracy, validation when
    the runs hold a validation part; ``test_accuracy``: the same runs on the test part, what the
    recommendation is reported with), whether a seed collapsed, ``seeds_survived`` (of
    ``seeds``), ``survived`` (in every seed) and ``attack`` (the adversary setting behind the
    number at the seed closest to failing: the worst, or the weakest that broke the point);
    ``clean_accuracy`` and ``threshold``: each trim's clean accuracy and survival bar (means over
    seeds);
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


def trim_sweep(
    base: Mapping[str, Any],
    trims: Sequence[float],
    byzantine_fractions: Sequence[float],
    runner: Runner,
    seeds: Sequence[int] = (42,),
    adversary: Adversary | None = None,
    relative_threshold: float = 0.5,
    threshold: float | None = None,
    clean_margin: float | None = None,
) -> TrimSweep:
    """Judge ``base`` (RunSpec keys with the dataset, method and deployment; ``clients`` = N) at
    every trim ratio r against the shared worst case (``adversary``, default
    `Adversary.default()`: every default attack over its strength ladder), exactly as a breakdown
    map over ``seeds`` judges its lattice points: each (r, seed) is a replicate cell, its points
    k = 0 (clean) and k = floor(beta N) for each beta swept, through
    `robusttune.experiments.breakdown.spec_evaluator` (staged ladders, shared runs; one runner
    call per stage).

    At each seed a point survives when its worst case did not collapse and its accuracy reaches
    that seed's bar: ``threshold`` if given, else chance + ``relative_threshold`` x (that seed's
    clean accuracy - chance) (the map's `survival_bar`); a seed whose clean run did not learn
    (`learned`: within ``clean_margin`` of chance, the map's default) survives nothing. A trim
    survives at beta when it survives in every seed. Recommended: the smallest r surviving at
    every beta swept (the deployment's fraction and the margin above it) in every seed."""
    from robusttune.experiments.breakdown import Cell, Point, spec_evaluator, survival_bar
    from robusttune.experiments.breakdown.bisection import DEFAULT_CLEAN_MARGIN, learned
    from robusttune.methods.adversary import Adversary

    for r in trims:
        check_trim(r)
    if not seeds:
        raise ValueError("trim_sweep needs at least one seed")
    margin = DEFAULT_CLEAN_MARGIN if clean_margin is None else clean_margin
    clients = int(base["clients"])
    threat = adversary or Adversary.default()
    evaluate = spec_evaluator(
        {**base, "attack": base.get("attack", "none")},
        runner,
        seeds=seeds,
        adversary=threat,
        survival=(threshold, relative_threshold),
    )
    cells = {
        (float(r), int(s)): Cell.of(clients, trim_ratio=float(r), seed=int(s))
        for r in trims
        for s in seeds
    }
    # the clean points first: from then on every point's survival bar is known (staged ladders
    # stop at the first variant below it, as in a map)
    clean = dict(zip(cells, evaluate([Point(cell, 0) for cell in cells.values()])))
    counts = {beta: lattice_byzantine(beta, clients) for beta in byzantine_fractions}
    ks = sorted(k for k in set(counts.values()) if k > 0)
    attacked_keys = [(key, k) for key in cells for k in ks]
    attacked = dict(
        zip(attacked_keys, evaluate([Point(cells[key], k) for key, k in attacked_keys]))
    )
    result = TrimSweep(adversary=threat.describe(base.get("attack", "none")))

    def mean(values: Sequence[float]) -> float:
        return sum(values) / len(values)

    for r in trims:
        r = float(r)
        bars = {
            s: survival_bar(threshold, relative_threshold, clean[r, s].accuracy, clean[r, s].chance)
            for s in seeds
        }
        taught = {s: learned(clean[r, s].accuracy, clean[r, s].chance, margin) for s in seeds}
        result.clean_accuracy[r] = mean([clean[r, s].accuracy for s in seeds])
        result.threshold[r] = mean(list(bars.values()))
        for beta, k in counts.items():
            outcomes = {s: attacked.get(((r, s), k), clean[r, s]) for s in seeds}
            survived = [
                s
                for s in seeds
                if taught[s] and survives(outcomes[s].accuracy, outcomes[s].collapsed, bars[s])
            ]
            weakest = min(seeds, key=lambda s: outcomes[s].accuracy - bars[s])
            result.rows.append(
                {
                    "trim_ratio": r,
                    "byzantine_fraction": beta,
                    "byzantine_clients": k,
                    "accuracy": mean([outcomes[s].accuracy for s in seeds]),
                    "test_accuracy": mean([outcomes[s].test_accuracy for s in seeds]),
                    "collapsed": any(outcomes[s].collapsed for s in seeds),
                    "seeds": len(seeds),
                    "seeds_survived": len(survived),
                    "survived": len(survived) == len(seeds),
                    "attack": " ".join(f"{a}={b}" for a, b in outcomes[weakest].breaker),
                }
            )
    surviving = [
        r for r in trims if all(row["survived"] for row in result.rows if row["trim_ratio"] == r)
    ]
    result.recommended = min(surviving) if surviving else None
    if result.recommended is not None:
        own = byzantine_fractions[0]
        acc = {
            row["trim_ratio"]: row["accuracy"]
            for row in result.rows
            if row["byzantine_fraction"] == own
        }
        result.cost = {
            r: 100 * (acc[result.recommended] - acc[r])
            for r in sorted(acc)
            if r > result.recommended
        }
    return result


def no_survivor_line(figures: Mapping[str, Any], trims: Sequence[float]) -> str:
    """The one line `calibrate` prints when no swept trim survives: the analytic bound (the
    smallest r with P(some round exceeds the trim) <= risk, `smallest_safe_trim`)."""

    def bound(value: float | None) -> str:
        return "none below 0.5" if value is None else f"r >= {value:g}"

    return (
        f"no trim ratio in {min(trims):g}..{max(trims):g} survives every attack at "
        f"beta={figures['byzantine_fraction']:g} and the margin; the analytic bound at risk "
        f"{figures['risk']:g}: {bound(figures['analytic_safe_trim'])} over the sample, "
        f"{bound(figures['analytic_safe_trim_cache'])} over a cache"
    )
