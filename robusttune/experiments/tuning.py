"""Robust tuning: the defence's knobs chosen against the worst case, on validation accuracy.

A tuning space (``search_spaces/tune_defence.yaml``) is a sweep-layer search space whose
``space:`` axes are the defence's knobs (trim ratio, DeMoA's alpha and eta, p, a rule's own
parameters) and whose ``tuning:`` section says how to search them. Optuna (ask/tell, seeded)
proposes knobs x; each proposal is scored by the shared adversary (`robusttune.methods.adversary`):

    clean(x) = accuracy of x at beta = 0 (the mean over the seeds),
    worst(x) = min over the seeds s and the adversary's variants v of score(x, v, s) at
               k = floor(beta N) (score: validation accuracy, 0 when collapsed; the breakdown
               map's worst case, with each seed a replicate, as in a map),

each run one federated run (one Ray Tune trial through `robusttune.experiments.sweep.stream.TuneStreamRunner`,
or in process with ``--local``). The study maximises (clean, worst) with NSGA-II (Deb et al.,
2002), or worst alone with TPE (``objectives: worst``). Attack strength is never a knob: the
adversary minimises over it, the defence maximises the minimum (a space naming attack,
attack_strength or attack_scope is refused).

The result is the Pareto front of (clean, worst) over the proposals and the recommended knobs:
the front's point of highest worst-case accuracy (then highest clean accuracy), reported with
the test accuracy of the same runs. Every finished run is kept in runs.jsonl
(`robusttune.experiments.breakdown.store`); proposals are a deterministic function of the seed and the told
scores (``batch`` proposals asked per wave), so ``--resume`` replays the study and runs only the
missing runs, as a breakdown map does.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any, ClassVar, Literal

from pydantic import Field

from robusttune.core.plugins import declare_plugins
from robusttune.core.registry import SpecError
from robusttune.core.validation import Checked, Number
from robusttune.core.yaml_input import parse_assignments, read_yaml
from robusttune.methods.adversary import Adversary, score, worst_of

__all__ = [
    "NOT_KNOBS",
    "Proposal",
    "TuningPlan",
    "TuningResult",
    "load_tuning",
    "pareto_front",
    "parse_tuning",
    "run_study",
    "study_cost",
]

# The adversary's keys and the lattice's: never a knob a defence is tuned over.
NOT_KNOBS = ("attack", "attack_strength", "attack_scope", "byzantine_fraction", "seed")


class TuningSection(Checked):
    """The ``tuning:`` section of a tuning space."""

    section: ClassVar[str] = "tuning"

    objectives: Literal["clean_and_worst", "worst"] = "clean_and_worst"
    num_samples: Annotated[int, Number, Field(ge=1)] = 20
    batch: Annotated[int, Number, Field(ge=1)] = 2
    population: Annotated[int, Number, Field(ge=2)] = 8
    seed: Annotated[int, Number, Field(ge=0)] = 0
    seeds: Annotated[list[Annotated[int, Number, Field(ge=0)]], Field(min_length=1)] = [42]  # noqa: RUF012 - pydantic copies a default per model
    # default: every default_adversary attack over its ladder; a mapping narrows or widens it;
    # adaptive: the default attacks plus adaptive_budget strength-search runs per attack
    adversary: (
        Literal["default", "adaptive"] | dict[str, Annotated[list[Any], Field(min_length=1)]]
    ) = "default"
    adaptive_budget: Annotated[int, Number, Field(ge=1)] = 4


@dataclass
class TuningPlan:
    """A parsed tuning space: the base run (``byzantine_fraction`` = beta), the knobs (name ->
    sweep-layer Domain) and the ``tuning:`` settings. ``raw`` is the mapping as run (plan.yaml)."""

    name: str
    base: dict[str, Any]
    knobs: dict[str, Any]
    byzantine_fraction: float
    clients: int
    threat: Adversary
    objectives: str = "clean_and_worst"
    num_samples: int = 20
    batch: int = 2
    population: int = 8
    sampler_seed: int = 0
    seeds: list[int] = field(default_factory=lambda: [42])
    resources: dict[str, float | str] = field(default_factory=dict)
    max_concurrent: int = 0
    raw: dict[str, Any] = field(default_factory=dict)

    @property
    def byzantine(self) -> int:
        """k = floor(beta N), the lattice point the worst case is measured at."""
        return math.floor(self.byzantine_fraction * self.clients + 1e-9)

    def identity(self) -> dict[str, Any]:
        """What a resumed study must match (`identity_of` its mapping)."""
        return self.identity_of(self.raw)

    @staticmethod
    def identity_of(mapping: Mapping[str, Any]) -> dict[str, Any]:
        """A study's mapping without what may change on a resume: its name, resources,
        max_concurrent and tuning.num_samples. A resume with more (or fewer) proposals replays
        the seeded study from its first proposal and reuses every run runs.jsonl has, so it
        ends as a fresh study of that size ends."""
        kept = {
            k: v
            for k, v in mapping.items()
            if k not in ("name", "resources", "max_concurrent", "plugins")
        }
        if isinstance(kept.get("tuning"), dict):
            kept["tuning"] = {k: v for k, v in kept["tuning"].items() if k != "num_samples"}
        return kept


def load_tuning(
    path: str | Path,
    run: Mapping[str, Any] | None = None,
    num_samples: int | None = None,
    cpu: float | None = None,
    gpu: float | str | None = None,
    max_concurrent: int | None = None,
    assignments: Sequence[str] = (),
) -> TuningPlan:
    """Read a tuning YAML (see `parse_tuning`); ``run`` (``--set``, or ``assignments`` as typed,
    read once the file's plugins are loaded: their knobs are keys), ``num_samples`` and the
    per-trial ``cpu``/``gpu`` and ``max_concurrent`` (None: the file's) are written into the
    mapping first, so they are validated as the file's values are."""
    path = Path(path)
    raw = read_yaml(path, "tuning space")
    if isinstance(raw, dict) and assignments:
        declare_plugins(copy.deepcopy(raw), path.name)
        run = {**(run or {}), **parse_assignments(assignments)}
    if isinstance(raw, dict):
        if run:
            raw["run"] = {**(raw.get("run") or {}), **run}
        if num_samples is not None:
            raw["tuning"] = {**(raw.get("tuning") or {}), "num_samples": num_samples}
        for key, value in (("cpu", cpu), ("gpu", gpu)):
            if value is not None:
                raw["resources"] = {**(raw.get("resources") or {}), key: value}
        if max_concurrent is not None:
            raw["max_concurrent"] = max_concurrent
    return parse_tuning(raw, source=path.name, default_name=path.stem)


def parse_tuning(mapping: Any, *, source: str, default_name: str) -> TuningPlan:
    """Validate a tuning mapping: ``run`` (with byzantine_fraction > 0 and no attack), ``space``
    (the knobs, no key of NOT_KNOBS), ``tuning`` (`TuningSection`), ``resources``,
    ``max_concurrent``. Errors are one SpecError line naming the file and the key."""
    from robusttune.core.runspec import RunSpec
    from robusttune.experiments.sweep.space import check_sections, parse_sweep

    if not isinstance(mapping, dict):
        raise SpecError(f"{source}: a tuning space is a mapping (run, space, tuning ...)")
    check_sections(mapping, source)
    kept = copy.deepcopy(mapping)
    declare_plugins(kept, source)  # first: the names a plugin registers are checked below
    raw = copy.deepcopy(kept)
    section_values = raw.pop("tuning", None) or {}
    if not isinstance(section_values, dict):
        raise SpecError(
            f"{source}: tuning must be a mapping with keys {', '.join(TuningSection.model_fields)}"
        )
    try:
        section = TuningSection(**section_values)
    except SpecError as error:
        raise SpecError(f"{source}: {error}") from None
    if "search" in raw:
        raise SpecError(
            f"{source}: search is a sweep's; a tuning space's study is its tuning: "
            f"section (objectives, num_samples, seed ...)"
        )
    space = raw.get("space") or {}
    run = raw.get("run") or {}
    for key in NOT_KNOBS:
        if key in space:
            raise SpecError(
                f"{source}: space.{key} is the adversary's or the run's, never a knob "
                f"a defence is tuned over; allowed in space: the defence's knobs "
                f"(trim_ratio, demoa_alpha, server_lr, participation, ...)"
            )
    if run.get("attack", "none") != "none":
        raise SpecError(
            f"{source}: run.attack {run['attack']!r}: the attacks are tuning.adversary's "
            f"(default: every default_adversary attack over its ladder); remove it from run"
        )
    if not space:
        raise SpecError(f"{source}: space lists no knob to tune")
    raw["constraints"] = {**(raw.get("constraints") or {}), "attack_matches_byzantine": False}
    raw["search"] = {"algorithm": "grid"}
    sweep = parse_sweep(raw, name=default_name, source=source)
    if any(axis.groups is not None for axis in sweep.axes):
        raise SpecError(f"{source}: a joint axis cannot be tuned; list each knob as its own axis")
    knobs = {axis.name: axis.domain for axis in sweep.axes}
    base = dict(sweep.run)
    spec = RunSpec.from_dict({**base, "attack": "none"})
    beta = float(base.get("byzantine_fraction", 0.0))
    if spec.n_byzantine < 1:
        raise SpecError(
            f"{source}: run.byzantine_fraction {beta:g} gives no Byzantine client of "
            f"clients={spec.clients}; robust tuning needs an attacked setting"
        )
    adversary = section.adversary
    if adversary == "default":
        threat = Adversary.default()
    elif adversary == "adaptive":
        threat = Adversary.default(adaptive=section.adaptive_budget)
    else:
        threat = Adversary.of(adversary)
    base = {k: v for k, v in base.items() if k != "byzantine_fraction"}
    return TuningPlan(
        name=sweep.name,
        base={**base, "attack": "none"},
        knobs=knobs,
        byzantine_fraction=beta,
        clients=spec.clients,
        threat=threat,
        objectives=section.objectives,
        num_samples=section.num_samples,
        batch=section.batch,
        population=section.population,
        sampler_seed=section.seed,
        seeds=list(section.seeds),
        resources={"cpu": sweep.resources.cpu, "gpu": sweep.resources.gpu},
        max_concurrent=sweep.max_concurrent,
        raw=kept,
    )


def study_cost(plan: TuningPlan) -> str:
    """The dry run's lines: the knobs, the adversary and the runs the study costs at most,

        runs <= num_samples x seeds x (1 clean + the adversary's runs per attacked point),

    fewer where a proposal's ladder stops at a zero score or two proposals share a run."""
    from robusttune.experiments.sweep.domains import format_value

    attacked = plan.threat.runs_per_point("none")
    per_proposal = len(plan.seeds) * (1 + attacked)
    knobs = ", ".join(f"{name} {domain.describe()}" for name, domain in plan.knobs.items())
    search = (
        "TPE on the worst case"
        if plan.objectives == "worst"
        else f"NSGA-II on clean and worst-case accuracy, population {plan.population}"
    )
    return "\n".join(
        [
            f"{plan.name}: {plan.num_samples} proposals ({search}, seed {plan.sampler_seed}), "
            f"{plan.batch} per wave; knobs: {knobs}",
            f"each proposal: 1 clean run and {attacked} attacked at k = {plan.byzantine} of "
            f"{plan.clients} ({plan.threat.describe()}), per seed of {plan.seeds}: {per_proposal} runs",
            f"runs: at most {plan.num_samples * per_proposal} (fewer where a ladder stops at a zero "
            f"score); per trial {plan.resources.get('cpu', 1):g} CPU, {format_value(plan.resources.get('gpu', 0))} GPU, at most {plan.max_concurrent or 'as resources allow'} "
            f"at once on Ray",
        ]
    )


@dataclass(frozen=True)
class Proposal:
    """One proposal's knobs and its two outcomes (`robusttune.experiments.breakdown.Outcome`): ``clean`` at
    beta = 0 (the mean over seeds) and ``worst`` at k = floor(beta N), the worst of the
    adversary's variants at the seed where it is worst (``worst_seed``)."""

    number: int
    knobs: dict[str, Any]
    clean: Any
    worst: Any
    worst_seed: int | None = None

    @property
    def values(self) -> tuple[float, float]:
        """(clean, worst) scores: validation accuracy, 0 when collapsed."""
        return score(self.clean), score(self.worst)

    def row(self) -> dict[str, Any]:
        return {
            "proposal": self.number,
            **self.knobs,
            "clean_validation": self.values[0],
            "worst_validation": self.values[1],
            "worst_attack": " ".join(f"{a}={b}" for a, b in self.worst.breaker),
            "worst_seed": self.worst_seed,
            "clean_test": self.clean.test_accuracy,
            "worst_test": self.worst.test_accuracy,
            "worst_collapsed": self.worst.collapsed,
        }


def pareto_front(points: list[tuple[float, float]]) -> list[bool]:
    """Whether each (a, b) is non-dominated (no other point >= in both and > in one)."""
    return [not any(o[0] >= p[0] and o[1] >= p[1] and o != p for o in points) for p in points]


@dataclass
class TuningResult:
    """Every proposal, the front and the recommendation (the front's highest worst case, then
    highest clean accuracy, then the earliest)."""

    proposals: list[Proposal]

    @property
    def front(self) -> list[bool]:
        return pareto_front([p.values for p in self.proposals])

    @property
    def recommended(self) -> Proposal:
        return max(self.proposals, key=lambda p: (p.values[1], p.values[0], -p.number))

    def frame(self) -> Any:
        import pandas as pd

        table = pd.DataFrame([p.row() for p in self.proposals])
        table.insert(1, "pareto", self.front)
        table.insert(2, "recommended", [p is self.recommended for p in self.proposals])
        return table


def seed_mean(outcomes: Sequence[Any]) -> Any:
    """One seed-averaged `Outcome` of one point's replicates: mean selection and test accuracy
    (a non-finite one counts as 0), collapsed when any seed collapsed, their trials summed."""
    from robusttune.core.records import mean_accuracy
    from robusttune.experiments.breakdown import Outcome

    first = outcomes[0]
    return Outcome(
        mean_accuracy(o.accuracy for o in outcomes),
        any(o.collapsed for o in outcomes),
        sum(o.trials for o in outcomes),
        tuple(d for o in outcomes for d in o.detail),
        first.breaker,
        test_accuracy=mean_accuracy(o.test_accuracy for o in outcomes),
        chance=first.chance,
    )


def run_study(
    plan: TuningPlan,
    runner: Any,
    on_wave: Callable[[list[Proposal]], None] | None = None,
    staged: bool = True,
) -> TuningResult:
    """Run the study of ``plan`` through ``runner`` (module docstring): waves of ``batch``
    proposals, each wave's clean and attacked points handed to one `spec_evaluator`, with
    shared runs. ``staged``: one runner call per adversary variant for every point of the wave,
    a point stopping at its first zero score; off, every variant of the wave in one runner call,
    so a runner with many slots (Ray Tune) runs them side by side instead of one stage after
    another, each stage waiting for its slowest run. Either way a proposal's worst case is the first variant of lowest score, and no
    score is below 0, so the outcomes, the told values and the proposals are the same
    (`spec_evaluator`'s ``staged``); unstaged only runs the variants after a zero score too."""
    import optuna

    from robusttune.experiments.breakdown import Cell, Point, spec_evaluator
    from robusttune.experiments.breakdown.evaluate import optuna_distribution

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    distributions = {k: optuna_distribution(d) for k, d in plan.knobs.items()}
    if plan.objectives == "worst":
        study = optuna.create_study(
            direction="maximize", sampler=optuna.samplers.TPESampler(seed=plan.sampler_seed)
        )
    else:
        study = optuna.create_study(
            directions=["maximize", "maximize"],
            sampler=optuna.samplers.NSGAIISampler(
                seed=plan.sampler_seed, population_size=plan.population
            ),
        )
    evaluate = spec_evaluator(
        plan.base,
        runner,
        seeds=plan.seeds,
        adversary=plan.threat,
        sampler_seed=plan.sampler_seed,
        staged=staged,
    )
    proposals: list[Proposal] = []
    while len(proposals) < plan.num_samples:
        asked = [
            study.ask(distributions)
            for _ in range(min(plan.batch, plan.num_samples - len(proposals)))
        ]
        # one replicate per seed: the worst case is each seed's worst variant, then the worst seed
        cells = [
            Cell.of(plan.clients, **trial.params, seed=seed)
            for trial in asked
            for seed in plan.seeds
        ]
        outcomes = evaluate(
            [Point(c, 0) for c in cells] + [Point(c, plan.byzantine) for c in cells]
        )
        S = len(plan.seeds)
        wave = []
        for i, trial in enumerate(asked):
            clean = outcomes[i * S : (i + 1) * S]
            attacked = outcomes[len(cells) + i * S : len(cells) + (i + 1) * S]
            worst = worst_of(attacked)
            proposal = Proposal(
                trial.number,
                dict(trial.params),
                seed_mean(clean),
                attacked[worst],
                plan.seeds[worst],
            )
            study.tell(
                trial, proposal.values[1] if plan.objectives == "worst" else list(proposal.values)
            )
            wave.append(proposal)
        proposals += wave
        if on_wave is not None:
            on_wave(wave)
    return TuningResult(proposals)
