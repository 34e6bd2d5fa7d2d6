"""Evaluating lattice points with runs: `spec_evaluator` turns a base RunSpec, seeds, optional
defence knobs tuned by Optuna (ask/tell, one batch per trial across all points) and an optional
adversarial attack-strength list into an `Evaluator` for `bisect_breakdown`, on top of any
`robusttune.engine.runners.Runner` (the Ray Tune sweep layer, or the in-process `InProcessRunner`).
Points -> RunSpecs -> one runner call per batch -> Outcomes."""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from robusttune.core.records import survives
from robusttune.core.registry import SpecError
from robusttune.core.runspec import RunSpec
from robusttune.experiments.breakdown.bisection import Cell, Outcome, Point, survival_bar
from robusttune.experiments.breakdown.points import learned
from robusttune.experiments.breakdown.shared_runs import SharedRuns
from robusttune.methods.adaptive import StrengthSearch
from robusttune.methods.adversary import Adversary, adversary_variants, stage_of, worst_of
from robusttune.methods.adversary import score as _score

if TYPE_CHECKING:  # the runners import torch; evaluating needs only their protocol
    from robusttune.engine.runners import Runner

__all__ = ["adversary_variants", "optuna_distribution", "spec_evaluator"]


def optuna_distribution(domain: Any) -> Any:
    """The Optuna distribution of a sweep-layer Domain (uniform | loguniform | int | choice)."""
    import optuna

    if domain.kind in ("choice", "grid"):
        return optuna.distributions.CategoricalDistribution(list(domain.values))
    if domain.kind == "int":
        return optuna.distributions.IntDistribution(
            int(domain.low), int(domain.high), step=int(domain.step or 1)
        )
    if domain.kind == "loguniform":
        return optuna.distributions.FloatDistribution(domain.low, domain.high, log=True)
    return optuna.distributions.FloatDistribution(domain.low, domain.high, step=domain.step)


def spec_evaluator(
    base: Mapping[str, Any],
    runner: Runner,
    *,
    seeds: Sequence[int] = (42,),
    tune: Mapping[str, Any] | None = None,
    budget: int = 1,
    adversary: Adversary | Mapping[str, Sequence[Any]] | None = None,
    sampler_seed: int = 0,
    on_trials: Callable[[int], None] | None = None,
    share: bool = True,
    staged: bool = True,
    survival: tuple[float | None, float] | None = None,
    adaptive: int = 0,
    prioritise: bool = True,
    clean_margin: float | None = None,
) -> Callable[[Sequence[Point]], list[Outcome]]:
    """An evaluator that runs RunSpecs: point (cell, k) -> base + cell values +
    byzantine_fraction k/N, once per seed; its Outcome is the mean over seeds. A cell that sets
    ``seed`` itself (a replicate, `robusttune.experiments.breakdown.replicates`) runs at that seed
    alone: a map's seeds are replicates, each bisected as a one-seed map.

    The adversary is the worst case: without ``adversary`` every point with k > 0 runs each
    strength of its attack's ``strength_ladder`` (robusttune.methods.attacks), and its outcome is the
    worst of them (lowest score, the first in ladder order among equals), recorded in
    ``Outcome.breaker``. ``adversary`` (key -> values, e.g. ``{attack_strength: [1.0]}`` or
    ``{attack: [alie, ipm]}``) narrows or widens it: the worst over the product of those values,
    each listed attack at its whole ladder unless attack_strength is listed too. ``tune`` (key ->
    sweep-layer Domain) tunes the defence's knobs at every point with one Optuna study per point
    (TPE seeded with ``sampler_seed``), ``budget`` trials each, driven by ask/tell so every
    Optuna trial of every point of the wave goes to the runner as one batch; the point's outcome
    is the best trial's. Trials per point at most: seeds x adversary values x budget.

    Two savings that never change an outcome (tests/test_breakdown.py compares the maps with and
    without each):

    - ``share``: a run equal to one made before, once the knobs it ignores are removed
      (`canonical_spec`: an attack without Byzantine clients), is not made again; every cell's
      clean point then costs one run per seed however many attacks the map lists.
    - ``staged``: a point's adversary variants run in ladder order, one variant per runner call
      (every point of the batch together), and a point stops at the first variant that scores 0
      (collapsed, or accuracy 0). The worst case is the first variant with the lowest score and
      no run scores below 0, so the variants after it cannot change the outcome, its accuracy,
      its collapse flag or its breaker. A point whose variants all score above 0 runs them all.
      The cost is more runner calls per wave (at most the ladder's length).

    ``survival`` = (threshold, relative_threshold), the bar `bisect_breakdown` judges points by
    (`survival_bar`: the absolute threshold, else chance + relative x the cell's clean margin
    above chance), stops a
    staged ladder earlier still: at the first variant that fails that bar (collapsed, or below
    it). Bisection reads only whether a point survived, and a point survives the worst variant
    iff it survives every variant, so no verdict changes; what changes is what a failed point
    records: the first variant run that broke it (its accuracy and ``breaker``; in ladder
    order, the weakest, unless ``prioritise`` put another first) instead of the worst, and
    fewer runs. The clean accuracy is the cell's k = 0 point, which
    bisection asks for in the cell's first wave, run in the wave's first stage (its only
    variant), so from the second stage on the bar is known. With ``tune`` it is ignored: a
    trial's score is what Optuna is told, and the worst one must be told for the study to go
    on as without it.

    ``clean_margin`` (with ``survival``) stops a point's ladder at its first variant once its
    cell's clean run is known not to have learned (`learned`: accuracy - chance < clean_margin;
    give the map's own margin): such a cell has no breakdown point (`clean_at_chance`), so no
    verdict of its points is ever read, and a point asked in the cell's first wave, beside the
    clean point, would otherwise run every setting it survives. The point keeps the accuracy
    and setting of the variants it ran.

    ``prioritise`` (with ``staged``) runs first, at a point with Byzantine clients and within
    each adversary stage (the ladders before the rule-aware attacks, `staged_order`), the
    settings that broke the same cell's failed points before (at any seed; the nearest k
    first, then ladder order): a cell's failures near its boundary tend to fall to the same
    setting, so a failed point mostly costs one run of its stage instead of the ladder up to
    that setting (a later seed's search, which asks mostly for failures, gains most). The
    settings a point ran are put back in ladder order before it is judged, so a survivor
    (every setting run) gets the outcome and breaker it gets without this, and no verdict
    changes; a failed point records the first setting in that order that broke it (of the
    first stage that broke it, so a rule-aware breaker still means every ladder survived),
    not necessarily the weakest of its ladder.

    ``adaptive`` > 0 (the adaptive adversary, `robusttune.methods.adaptive`): a point with
    Byzantine clients whose ladder did not settle it (see above) runs up to ``adaptive`` more
    strengths per attack whose ladder spans a range, each proposed by a seeded Optuna study that
    knows that attack's ladder scores and minimises the score within the ladder's range; the
    outcome is the worst over the ladders and those runs. ``adversary`` may be a
    `robusttune.methods.adversary.Adversary` (which carries its own adaptive budget), the one worst
    case `calibrate` and robust tuning use too."""
    if budget < 1:
        raise SpecError(f"budget must be >= 1; got {budget}")
    if not isinstance(adversary, Adversary):
        adversary = Adversary.of(adversary, adaptive)
    elif adaptive:
        raise SpecError("give the adaptive budget inside the Adversary, not beside it")
    threat = adversary
    if not seeds:
        raise SpecError("seeds must list at least one seed")
    shared = SharedRuns(runner, share, on_trials)
    stop_bar = survival if staged and not tune else None
    clean_outcome: dict[Cell, Outcome] = {}  # each cell's k = 0 outcome, once run
    # (k, setting) of every failed point, per cell over its seeds (``prioritise``)
    breakers: dict[tuple[Any, ...], list[tuple[int, dict[str, Any]]]] = {}
    breakers_lock = threading.Lock()

    def seedless(cell: Cell) -> tuple[Any, ...]:
        return (cell.clients, *((k, v) for k, v in cell.values if k != "seed"))

    def settled(point: Point, outcome: Outcome) -> bool:
        """Whether no later variant can change what the map reads of the point (see ``staged``,
        ``survival``, ``clean_margin``)."""
        return broken(point, outcome) or unread(point)

    def unread(point: Point) -> bool:
        """The point's cell is known to have no breakdown point (``clean_margin``)."""
        clean = clean_outcome.get(point.cell)
        return (
            stop_bar is not None
            and point.byzantine > 0
            and clean is not None
            and clean_margin is not None
            and not learned(clean.accuracy, clean.chance, clean_margin)
        )

    def broken(point: Point, outcome: Outcome) -> bool:
        """Whether the point failed, whatever its later variants give."""
        if _score(outcome) <= 0:
            return True
        if stop_bar is None or point.byzantine == 0:
            return False
        threshold, relative = stop_bar
        clean = clean_outcome.get(point.cell)
        if threshold is None and clean is None:
            return False
        bar = survival_bar(
            threshold,
            relative,
            clean.accuracy if clean else float("nan"),
            clean.chance if clean else 0.0,
        )
        return not survives(outcome.accuracy, outcome.collapsed, bar)

    def attack_of(point: Point) -> str:
        return point.cell.as_dict().get("attack", base.get("attack", "none"))

    def variants_for(point: Point) -> list[dict[str, Any]]:
        return threat.variants(attack_of(point)) if point.byzantine > 0 else [{}]

    def run_order(point: Point, variants: list[dict[str, Any]]) -> list[int]:
        """The positions of ``variants`` in the order they run (``prioritise``)."""
        with breakers_lock:
            known = list(breakers.get(seedless(point.cell), ()))
        if not (prioritise and staged and known):
            return list(range(len(variants)))

        def rank(position: int) -> tuple[int, float, int]:
            variant = variants[position]
            distance = min(
                (abs(k - point.byzantine) for k, v in known if v == variant),
                default=float("inf"),
            )
            return stage_of(variant.get("attack", attack_of(point))), distance, position

        return sorted(range(len(variants)), key=rank)

    def seeds_of(point: Point) -> Sequence[int]:
        """A replicate's cell carries its own seed (`robusttune.experiments.breakdown.replicates`):
        its points run at that seed alone; any other cell's points run at every seed."""
        values = point.cell.as_dict()
        return [values["seed"]] if "seed" in values else seeds

    def specs_for(
        point: Point, knobs: Mapping[str, Any], variant: Mapping[str, Any]
    ) -> list[RunSpec]:
        return [
            RunSpec.from_dict(
                {
                    **base,
                    **point.cell.as_dict(),
                    **knobs,
                    **variant,
                    "byzantine_fraction": point.fraction,
                    "seed": seed,
                }
            )
            for seed in seeds_of(point)
        ]

    def judge(
        point: Point,
        per_variant: list[Outcome],
        variants: list[dict[str, Any]],
        trials: int,
        full: int,
    ) -> Outcome:
        """The worst variant run (the first with the lowest score); ``runs`` counts every
        variant, run or not (``full`` of them): what the point costs in full."""
        position = worst_of(per_variant)
        worst = per_variant[position]
        return Outcome(
            worst.accuracy,
            worst.collapsed,
            trials,
            worst.detail,
            tuple(variants[position].items()),
            runs=full * len(seeds_of(point)),
            test_accuracy=worst.test_accuracy,
            chance=worst.chance,
        )

    def searches_of(point: Point) -> list[tuple[dict[str, Any], tuple[float, ...]]]:
        """The adaptive searches of ``point``: (group settings, ladder); none at k = 0."""
        return threat.searches(attack_of(point)) if point.byzantine > 0 else []

    def run_variants(
        todo: list[tuple[int, dict[str, Any]]],
        requests: list[tuple[Point, dict[str, Any]]],
        judged: list[list[Outcome]],
        trials: list[int],
    ) -> None:
        """Run variant ``todo[n][1]`` of point ``todo[n][0]``, all in one runner call."""
        specs = [
            spec
            for i, variant in todo
            for spec in specs_for(requests[i][0], requests[i][1], variant)
        ]
        summaries, new = shared(specs)
        start = 0
        for i, variant in todo:
            size = len(seeds_of(requests[i][0]))
            span = slice(start, start + size)
            start += size
            judged[i].append(Outcome.from_summaries(summaries[span], **requests[i][1], **variant))
            trials[i] += sum(new[span])
            if requests[i][0].byzantine == 0:
                clean_outcome[requests[i][0].cell] = judged[i][-1]

    def search(
        requests: list[tuple[Point, dict[str, Any]]],
        variants: list[list[dict[str, Any]]],
        judged: list[list[Outcome]],
        trials: list[int],
    ) -> None:
        """The adaptive adversary's runs after the ladder (see ``adaptive``)."""
        searches: dict[tuple[int, int], tuple[dict[str, Any], StrengthSearch]] = {}
        for i, (point, _) in enumerate(requests):
            if settled(point, judged[i][worst_of(judged[i])]):
                continue
            for g, (group, ladder) in enumerate(searches_of(point)):
                # the group's ladder runs, told first: the ladder is the search's floor
                tried = [
                    (v["attack_strength"], _score(o))
                    for v, o in zip(variants[i], judged[i])
                    if {k: x for k, x in v.items() if k != "attack_strength"} == group
                ]
                searches[i, g] = (group, StrengthSearch(ladder, tried, sampler_seed))
        for _ in range(threat.adaptive):
            open_searches = [
                key
                for key in searches
                if not settled(requests[key[0]][0], judged[key[0]][worst_of(judged[key[0]])])
            ]
            if not open_searches:
                break
            todo = [(key, {**searches[key][0], **searches[key][1].ask()}) for key in open_searches]
            run_variants([(key[0], variant) for key, variant in todo], requests, judged, trials)
            for n, (key, variant) in enumerate(todo):
                variants[key[0]].append(variant)
                # run_variants appended each point's outcomes in todo order
                position = (
                    len(judged[key[0]]) - sum(1 for k, _ in todo[n + 1 :] if k[0] == key[0]) - 1
                )
                searches[key][1].tell(_score(judged[key[0]][position]))

    def run_batch(requests: list[tuple[Point, dict[str, Any]]]) -> list[Outcome]:
        ladders = [variants_for(point) for point, _ in requests]
        orders = [run_order(point, ladder) for (point, _), ladder in zip(requests, ladders)]
        variants = [[ladder[j] for j in order] for ladder, order in zip(ladders, orders)]
        judged: list[list[Outcome]] = [[] for _ in requests]
        trials = [0] * len(requests)
        stage, depth = 0, max(len(v) for v in variants) if variants else 0
        while stage < depth:
            # staged: variant `stage` of every point not yet settled; else every variant at once
            todo = [
                (i, j)
                for i, v in enumerate(variants)
                for j in (range(stage, stage + 1) if staged else range(len(v)))
                if j < len(v)
                and not (staged and judged[i] and settled(requests[i][0], judged[i][-1]))
            ]
            stage = stage + 1 if staged else depth
            if not todo:
                break
            run_variants([(i, variants[i][j]) for i, j in todo], requests, judged, trials)
        full = [
            len(v) + threat.adaptive * len(searches_of(p)) for v, (p, _) in zip(variants, requests)
        ]
        for i, order in enumerate(orders):
            # what ran, back in ladder order: the search and the worst case read it so
            ran = sorted(range(len(judged[i])), key=order.__getitem__)
            variants[i] = [variants[i][n] for n in ran]
            judged[i] = [judged[i][n] for n in ran]
        if threat.adaptive:
            search(requests, variants, judged, trials)
        outcomes = [
            judge(requests[i][0], judged[i], variants[i], trials[i], full[i])
            for i in range(len(requests))
        ]
        failed = [
            (point, outcome)
            for (point, _), outcome in zip(requests, outcomes)
            if point.byzantine > 0 and broken(point, outcome)
        ]
        with breakers_lock:
            for point, outcome in failed:
                breakers.setdefault(seedless(point.cell), []).append(
                    (point.byzantine, dict(outcome.breaker))
                )
        return outcomes

    if not tune:
        return lambda points: run_batch([(p, {}) for p in points])

    def tuned(points: Sequence[Point]) -> list[Outcome]:
        import optuna

        optuna.logging.set_verbosity(optuna.logging.WARNING)
        distributions = {k: optuna_distribution(d) for k, d in tune.items()}
        studies = [
            optuna.create_study(
                direction="maximize", sampler=optuna.samplers.TPESampler(seed=sampler_seed)
            )
            for _ in points
        ]
        best: list[Outcome | None] = [None] * len(points)
        trials = [0] * len(points)
        for _ in range(budget):
            asked = [study.ask(distributions) for study in studies]
            outcomes = run_batch([(p, dict(t.params)) for p, t in zip(points, asked)])
            for i, (study, trial, outcome) in enumerate(zip(studies, asked, outcomes)):
                study.tell(trial, _score(outcome))
                trials[i] += outcome.trials
                if best[i] is None or _score(outcome) > _score(best[i]):
                    best[i] = outcome
        # the point's trial count is the whole study's runs, not only the best trial's
        results = []
        for b, t in zip(best, trials):
            # budget >= 1: every point's study was told at least one trial; `judge` always
            # sets ``runs``
            assert b is not None and b.runs is not None
            results.append(
                Outcome(
                    b.accuracy,
                    b.collapsed,
                    t,
                    b.detail,
                    b.breaker,
                    runs=b.runs * budget,
                    test_accuracy=b.test_accuracy,
                    chance=b.chance,
                )
            )
        return results

    return tuned
