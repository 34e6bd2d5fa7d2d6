"""`robusttune calibrate`: a deployment's Byzantine-count law and the smallest trim that survives
the worst case (`robusttune.problem.byzantine_law`, `robusttune.experiments.calibration`), from
the command line; cli.py registers it. Returns the figures (what ``--json`` prints)."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any, Literal, cast

import typer

from robusttune.core.registry import SpecError

__all__ = ["calibrate"]


def json_ready(value: Any) -> Any:
    """``value`` with non-finite floats as None and keys as text: what strict JSON takes."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {str(k): json_ready(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [json_ready(v) for v in value]
    return value


def calibrate(
    clients: int = typer.Option(..., "--clients", help="N, the population."),
    participation: float = typer.Option(
        ..., "--participation", help="p: fraction sampled per round."
    ),
    byzantine: float = typer.Option(..., "--byzantine", help="beta: assumed Byzantine fraction."),
    rounds: int = typer.Option(..., "--rounds", help="T: rounds of the deployment."),
    sample_size: int | None = typer.Option(
        None, "--sample-size", help="n (fixed mode); default round(p N)."
    ),
    mode: str = typer.Option("fixed", "--mode", help="fixed | bernoulli participation."),
    trim: list[float] = typer.Option(
        [],
        "--trim",
        help="Trim ratio r, repeatable (default for the "
        "figures: min(0.45, beta + 0.05); for the sweep: j / n_in up to beta + margin + 0.1).",
    ),
    risk: float = typer.Option(
        0.05, "--risk", help="Tolerated P(some round exceeds the trim) for the analytic trim."
    ),
    analytic_only: bool = typer.Option(False, "--analytic-only", help="Skip the sweep."),
    as_json: bool = typer.Option(False, "--json", help="Print one JSON object."),
    dataset: str = typer.Option("digits", "--dataset", help="Sweep: dataset."),
    method: str = typer.Option(
        "trimmed_mean", "--method", help="Sweep: method whose trim ratio is calibrated."
    ),
    attack: list[str] = typer.Option(
        [],
        "--attack",
        help="Sweep: narrow the worst case to these attacks "
        "(repeatable; default: every attack with default_adversary, each over its strength ladder).",
    ),
    adaptive: int = typer.Option(
        0,
        "--adaptive",
        help="Sweep: adaptive strength-search runs per attack and point, beyond the ladder.",
    ),
    margin: float = typer.Option(
        0.1, "--margin", help="Sweep: also require survival at beta + margin."
    ),
    sweep_rounds: int | None = typer.Option(
        None, "--sweep-rounds", help="Sweep: rounds per run (default min(T, 10))."
    ),
    seeds: list[int] = typer.Option(
        [42, 43, 44],
        "--seed",
        help="Sweep: seeds, repeatable; a trim must survive in every one (default: three).",
    ),
    set_: list[str] = typer.Option(
        [], "--set", help="Sweep: further RunSpec key=value, repeatable."
    ),
    out: Path | None = typer.Option(
        None, "--out", help="Sweep: results folder (default results/calibrate-...)."
    ),
    local: bool = typer.Option(
        False, "--local", help="Sweep: run trials in this process, without Ray."
    ),
    address: str | None = typer.Option(None, "--address", help="Sweep: join this Ray cluster."),
) -> Any:
    """Byzantine-count law, P(majority round) and P(count > trim) over T rounds; trim sweep.

    The per-round law of the number of Byzantine clients in a sample (hypergeometric for fixed,
    binomial for bernoulli participation), the probability of at least one Byzantine-majority
    round and of a round whose count exceeds floor(n r), over T rounds, with and without a cache;
    then (unless --analytic-only) a short sweep over trim ratios at beta and beta + margin
    against the breakdown map's worst case (every default attack over its strength ladder) that
    recommends the smallest trim surviving every attack in every seed and shows the accuracy cost
    of larger ones."""
    from robusttune.commands.trial_runner import choose_runner, ray_or_nothing
    from robusttune.core.numerics import pin
    from robusttune.core.runspec import RunSpec
    from robusttune.core.yaml_input import parse_assignments
    from robusttune.engine.runners import drive
    from robusttune.experiments.calibration import default_trim_grid, no_survivor_line, trim_sweep
    from robusttune.methods.adversary import Adversary
    from robusttune.problem.byzantine_law import Deployment, aggregator_inputs, analyze

    deployment = Deployment(
        clients=clients,
        participation=participation,
        byzantine_fraction=byzantine,
        rounds=rounds,
        sample_size=sample_size,
        # a free --mode string: Deployment checks it is fixed or bernoulli (one SpecError line)
        mode=cast(Literal["fixed", "bernoulli"], mode),
    )
    if not 0 < risk < 1:
        raise SpecError(f"--risk must be in (0, 1); got {risk}")
    figures = analyze(deployment, trim, risk)
    figures["recommended_trim_ratio"] = None
    sweep = None
    if not analytic_only:
        if byzantine >= 0.5:
            raise SpecError(
                f"--byzantine {byzantine:g} leaves no trim ratio to calibrate (a trim "
                f"ratio is below 0.5 and must exceed the Byzantine fraction); allowed: "
                f"[0, 0.5), or --analytic-only for the sampling law"
            )
        if margin < 0 or byzantine + margin >= 1:
            raise SpecError(f"--margin must be >= 0 with byzantine + margin < 1; got {margin}")
        threat = Adversary.default(attack, adaptive)
        values: dict[str, Any] = {
            "dataset": dataset,
            "method": method,
            "attack": "none",
            "clients": clients,
            "participation": participation,
            "participation_mode": mode,
            "sample_size": sample_size,
            "rounds": sweep_rounds or min(rounds, 10),
        }
        values.update(parse_assignments(set_))
        base = RunSpec.from_dict(values)  # checked once, before any run
        pin(base.numerics)
        fractions = sorted({byzantine, round(min(byzantine + margin, 0.95), 10)})
        trims = list(trim) or default_trim_grid(byzantine, margin, aggregator_inputs(base))
        label = "-".join(attack) or "worstcase"
        folder = out or Path("results") / f"calibrate-{method}-{label}-N{clients}-b{byzantine:g}"
        with ray_or_nothing(local, address):
            runner = choose_runner(folder, local, {"cpu": 1})
            sweep = drive(
                runner,
                lambda: trim_sweep(values, trims, fractions, runner, seeds=seeds, adversary=threat),
            )
        figures["recommended_trim_ratio"] = sweep.recommended
        figures["sweep"] = {
            "dataset": dataset,
            "method": method,
            "adversary": sweep.adversary,
            "byzantine_fractions": fractions,
            "clean_accuracy": {str(k): v for k, v in sweep.clean_accuracy.items()},
            "threshold": {str(k): v for k, v in sweep.threshold.items()},
            "rows": sweep.rows,
            "accuracy_cost_points": {str(k): v for k, v in sweep.cost.items()},
            "folder": str(folder),
        }
        if sweep.recommended is None:
            figures["sweep"]["no_survivor"] = no_survivor_line(figures, trims)
    if as_json:
        typer.echo(json.dumps(json_ready(figures), sort_keys=True))
        return figures
    from robusttune.reports.calibration import print_calibration

    print_calibration(figures)
    return figures
