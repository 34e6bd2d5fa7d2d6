"""Evaluating lattice points with runs: `spec_evaluator` turns a base RunSpec, seeds, optional
defence knobs tuned by Optuna (ask/tell, one batch per trial across all points) and an optional
adversarial attack-strength list into an `Evaluator` for `bisect_breakdown`, on top of any
`robusttune.runners.Runner` (the Ray Tune sweep layer, or the in-process `InProcessRunner`).
Points -> RunSpecs -> one runner call per batch -> Outcomes."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable, Mapping, Sequence

from itertools import product

from robusttune.attacks import ATTACKS
from robusttune.breakdown.bisection import Evaluator, Outcome, Point
from robusttune.config import RunSpec
from robusttune.records import RunSummary
from robusttune.registry import SpecError

if TYPE_CHECKING:  # the runners import torch; evaluating needs only their protocol
    from robusttune.runners import Runner

__all__ = ["spec_evaluator", "adversary_variants"]


def _optuna_distribution(domain: Any) -> Any:
    """The Optuna distribution of a sweep-layer Domain (uniform | loguniform | int | choice)."""
    import optuna

    if domain.kind in ("choice", "grid"):
        return optuna.distributions.CategoricalDistribution(list(domain.values))
    if domain.kind == "int":
        return optuna.distributions.IntDistribution(int(domain.low), int(domain.high), step=int(domain.step or 1))
    if domain.kind == "loguniform":
        return optuna.distributions.FloatDistribution(domain.low, domain.high, log=True)
    return optuna.distributions.FloatDistribution(domain.low, domain.high, step=domain.step)


def _score(outcome: Outcome) -> float:
    """What the defence maximises and the adversary minimises: accuracy, 0 when collapsed."""
    return 0.0 if outcome.collapsed else outcome.accuracy


def adversary_variants(attack: str, adversary: Mapping[str, Sequence[Any]] | None) -> list[dict]:
    """The attacker settings a point with Byzantine clients runs (see `spec_evaluator`): the
    product of ``adversary``'s values, an attack listed without attack_strength taking its
    whole strength ladder; without ``adversary``, ``attack``'s ladder."""
    grid = [dict(zip(adversary, combo)) for combo in product(*adversary.values())] \
        if adversary else [{}]
    variants = []
    for variant in grid:
        if "attack_strength" in variant:
            variants.append(variant)
            continue
        ladder = ATTACKS[variant.get("attack", attack)].strength_ladder
        variants += [{**variant, "attack_strength": s} for s in ladder] or [variant]
    return variants


def spec_evaluator(base: Mapping[str, Any], runner: Runner, *, seeds: Sequence[int] = (42,),
                   tune: Mapping[str, Any] | None = None, budget: int = 1,
                   adversary: Mapping[str, Sequence[Any]] | None = None, sampler_seed: int = 0,
                   on_trials: Callable[[int], None] | None = None) -> Evaluator:
    """An evaluator that runs RunSpecs: point (cell, k) -> base + cell values +
    byzantine_fraction k/N, once per seed; its Outcome is the mean over seeds.

    The adversary is the worst case: without ``adversary`` every point with k > 0 runs each
    strength of its attack's ``strength_ladder`` (robusttune.attacks), and its outcome is the
    worst of them (lowest score), recorded in ``Outcome.breaker``. ``adversary`` (key -> values,
    e.g. ``{attack_strength: [1.0]}`` or ``{attack: [alie, ipm]}``) narrows or widens it: the
    worst over the product of those values, each listed attack at its whole ladder unless
    attack_strength is listed too. ``tune`` (key -> sweep-layer Domain) tunes the defence's knobs at
    every point with one Optuna study per point (TPE seeded with ``sampler_seed``), ``budget``
    trials each, driven by ask/tell so every Optuna trial of every point of the wave goes to the
    runner as one batch; the point's outcome is the best trial's. Trials per point: seeds x
    adversary values x budget."""
    if budget < 1:
        raise SpecError(f"budget must be >= 1; got {budget}")
    if not seeds:
        raise SpecError("seeds must list at least one seed")

    def specs_for(point: Point, knobs: Mapping[str, Any]) -> tuple[list[Any], list[dict]]:
        attack = point.cell.as_dict().get("attack", base.get("attack", "none"))
        variants = adversary_variants(attack, adversary) if point.byzantine > 0 else [{}]
        specs = [RunSpec.from_dict({**base, **point.cell.as_dict(), **knobs, **variant,
                                    "byzantine_fraction": point.fraction, "seed": seed})
                 for variant in variants for seed in seeds]
        return specs, variants

    def judge(point: Point, knobs: Mapping[str, Any], summaries: list[RunSummary],
              variants: list[dict]) -> Outcome:
        per_variant = [Outcome.from_summaries(summaries[i * len(seeds):(i + 1) * len(seeds)],
                                              **knobs, **variant)
                       for i, variant in enumerate(variants)]
        position = min(range(len(per_variant)), key=lambda i: _score(per_variant[i]))
        worst = per_variant[position]
        breaker = tuple(variants[position].items())
        return Outcome(worst.accuracy, worst.collapsed, sum(o.trials for o in per_variant),
                       worst.detail, breaker)

    def run_batch(requests: list[tuple[Point, dict]]) -> list[Outcome]:
        specs, spans = [], []
        for point, knobs in requests:
            these, variants = specs_for(point, knobs)
            spans.append((len(specs), len(these), variants))
            specs.extend(these)
        summaries = runner(specs)
        if on_trials is not None:
            on_trials(len(specs))
        return [judge(point, knobs, summaries[start:start + count], variants)
                for (point, knobs), (start, count, variants) in zip(requests, spans)]

    if not tune:
        return lambda points: run_batch([(p, {}) for p in points])

    def tuned(points: Sequence[Point]) -> list[Outcome]:
        import optuna

        optuna.logging.set_verbosity(optuna.logging.WARNING)
        distributions = {k: _optuna_distribution(d) for k, d in tune.items()}
        studies = [optuna.create_study(direction="maximize",
                                       sampler=optuna.samplers.TPESampler(seed=sampler_seed))
                   for _ in points]
        best: list[Outcome | None] = [None] * len(points)
        for _ in range(budget):
            asked = [study.ask(distributions) for study in studies]
            outcomes = run_batch([(p, dict(t.params)) for p, t in zip(points, asked)])
            for i, (study, trial, outcome) in enumerate(zip(studies, asked, outcomes)):
                study.tell(trial, _score(outcome))
                if best[i] is None or _score(outcome) > _score(best[i]):
                    best[i] = outcome
        # the point's trial count is the whole study's, not only the best trial's
        return [Outcome(b.accuracy, b.collapsed, b.trials * budget, b.detail, b.breaker)  # type: ignore[union-attr]
                for b in best]

    return tuned
