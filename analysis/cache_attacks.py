"""Do the cache attacks hurt the delayed-cache methods more than ALIE does? (issue 4)

    python analysis/cache_attacks.py [--quick] [--out FILE.md] [--fractions 0.2 [0.1 0.3 ...]]
                                     [--seeds 2] [--jobs 2] [--margin 0.02] [--set KEY=VALUE ...]

On `digits` (embedded, no network; `--set dataset=fashion_mnist` for another dataset, whose
defaults then fill the keys the methods below leave unset), at the same Byzantine fraction, runs
every method below under the attacks none, alie, cache_alie and strategic_skip over a few seeds
and reports the mean final accuracy and the number of collapsed runs (final accuracy <= chance +
0.5 points, or non-finite parameters), as a markdown table, followed by one plain verdict line per method and cache attack:

    cache_alie hurts swb_dm more than alie at beta=0.2: yes (acc 0.412 vs 0.873; ...)

"yes" iff the cache attack's mean accuracy is below ALIE's by more than ``--margin`` (accuracy as a
fraction; 0.02 = 2 points); the numbers come from the runs, nothing is hard-coded.

Every run takes ``attack_scope: sample``: ALIE as both papers ran it, from the round's sampled
honest messages and its (n, f), against which a cache-aware attacker is the question (under the
default ``inputs`` scope ALIE itself reads the whole cache and equals cache_alie).

Methods (the papers' setups scaled to digits, where cnn2 at lr 0.05 learns in ~10 FedAvg rounds):
  swb_dm          state_cache + swb, N = 20, fixed participation p in {0.1, 0.5}, the dataset's
                  local training (digits: 5 local epochs, lr 0.05, batch 16; Fashion-MNIST: 2,
                  0.01, 32); max(10, ceil(3 / p)) rounds, so that
                  every cache slot is refreshed about 3 times (30 rounds at p = 0.1, 10 at 0.5)
  demoa (cclip)   demoa with its default rule (CCLIP at its default radius, relative to its
                  inputs: tau = 2 x the median distance to the centre; until issue 24 a fixed
                  tau = 10), N = 25, Bernoulli p in {0.1, 0.5}, 200 one-minibatch rounds,
                  server_lr 0.5, demoa_alpha 0.1, batch 32
  demoa (median)  the same with the coordinate-wise median (chosen when CCLIP's fixed tau = 10
                  was loose for momenta: in a clean run, p = 0.5, every client momentum had norm
                  <= 6.6 and the aggregate 0.02-0.3, so it clipped almost nothing)
  Every method takes the dataset's default model (cnn2 on digits and on Fashion-MNIST; on
  Fashion-MNIST's 28x28 images an SWB-DM run at p = 0.1 took 356 s against 26 s on digits, and
  122-130 s with `--set model=mlp`, the model of claim 11's Fashion-MNIST run).

`--quick`: one seed, max(5, ceil(1.5 / p)) swb_dm rounds, 100 demoa rounds. One strategic_skip
run per seed is not simulated but copied from the `none` run of the same seed: with fixed
participation and 2B < n the Byzantine clients can never hold half of a sample, so strategic_skip
sends exactly the honest messages and the run equals the `none` run bit for bit
(tests/test_cache_attacks.py checks that equality); the table marks such cells with `=`. Runs are
deterministic, so `--jobs` (worker processes, one torch thread each; default 2) changes the wall
time only. Default mode: 46 runs, about 8 minutes of CPU time on this 2-core machine, so about 4
minutes with the default 2 jobs when nothing else runs.
"""

from __future__ import annotations

import argparse
import math
import os
import shlex
import sys
import time
from collections import defaultdict
from collections.abc import Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field
from multiprocessing import get_context
from pathlib import Path
from typing import Any

import torch

from robusttune.core.registry import SpecError
from robusttune.core.runspec import RunSpec
from robusttune.core.yaml_input import parse_assignments
from robusttune.engine.recording import run_to_folder

ATTACKS = ("none", "alie", "cache_alie", "strategic_skip")
CACHE_ATTACKS = ("cache_alie", "strategic_skip")
DEFAULT_MARGIN = 0.02
# what the comparison itself varies per run: a --set of one of them would change the question
GRID_KEYS = (
    "participation",
    "byzantine_fraction",
    "attack",
    "seed",
    "rounds",
    "eval_every",
    "attack_scope",
)


@dataclass(frozen=True)
class Method:
    """One method of the comparison: a label, its RunSpec keys, and (p, rounds) pairs."""

    label: str
    keys: dict[str, Any]
    participations: tuple[tuple[float, int], ...]


def swb_rounds(p: float, quick: bool = False) -> int:
    """SWB-DM rounds at participation p: every cache slot refreshed about 3 times (1.5 quick), at
    least 10 (5 quick). Measured on digits, no attack: at p = 0.1 swb_dm was at 0.09-0.17 after 10
    rounds (most of the 20 slots still hold the initial model) and 0.31-0.74 after 30."""
    refreshes, floor = (1.5, 5) if quick else (3.0, 10)
    return max(floor, math.ceil(refreshes / p - 1e-9))


def methods(quick: bool = False, participations: Sequence[float] = (0.1, 0.5)) -> list[Method]:
    """The three methods compared; ``quick`` shortens the runs."""
    demoa_rounds = 100 if quick else 200
    demoa = {
        "dataset": "digits",
        "method": "demoa",
        "clients": 25,
        "participation_mode": "bernoulli",
        "server_lr": 0.5,
        "demoa_alpha": 0.1,
        "batch_size": 32,
    }
    return [
        Method(
            "swb_dm",
            {"dataset": "digits", "method": "swb_dm", "clients": 20, "participation_mode": "fixed"},
            tuple((p, swb_rounds(p, quick)) for p in participations),
        ),
        Method("demoa (cclip)", dict(demoa), tuple((p, demoa_rounds) for p in participations)),
        Method(
            "demoa (median)",
            {**demoa, "aggregator": "median"},
            tuple((p, demoa_rounds) for p in participations),
        ),
    ]


@dataclass(frozen=True)
class Cell:
    """One run of the grid."""

    method: str
    beta: float
    p: float
    attack: str
    seed: int
    keys: dict[str, Any] = field(hash=False, compare=False)

    def spec(self) -> RunSpec:
        return RunSpec(**self.keys)


def grid(
    method_list: Sequence[Method],
    fractions: Sequence[float],
    seeds: Sequence[int],
    attacks: Sequence[str] = ATTACKS,
    overrides: dict[str, Any] | None = None,
) -> list[Cell]:
    """Every (method, beta, p, attack, seed) run, as cells holding their RunSpec keys;
    ``overrides`` (``--set``: a dataset, a training subset) apply to every run, and may not be
    one of the keys the grid varies (GRID_KEYS): that is one SpecError line."""
    overrides = dict(overrides or {})
    varied = sorted(set(overrides) & set(GRID_KEYS))
    if varied:
        raise SpecError(
            f"--set {varied[0]}: the comparison varies it per run; allowed: any "
            f"other RunSpec key (e.g. dataset, train_samples)"
        )
    cells = []
    for m in method_list:
        for beta in fractions:
            for p, rounds in m.participations:
                for attack in attacks:
                    for seed in seeds:
                        keys = {
                            **m.keys,
                            "attack_scope": "sample",
                            "participation": p,
                            "rounds": rounds,
                            "eval_every": rounds,
                            "byzantine_fraction": beta,
                            "attack": attack,
                            "seed": seed,
                            **overrides,
                        }
                        cells.append(Cell(m.label, beta, p, attack, seed, keys))
    return cells


def skip_equals_none(spec: RunSpec) -> bool:
    """True when strategic_skip provably never attacks: a fixed-size sample of n clients and
    2B < n Byzantine clients in the whole population, so no sample has a Byzantine half."""
    return spec.participation_mode == "fixed" and 2 * spec.n_byzantine < spec.expected_sample_size


def run_one(keys: dict[str, Any]) -> dict[str, Any]:
    """Run one RunSpec to the end; its final accuracy, collapse flag and Byzantine-majority
    rounds. One torch thread: several runs side by side are what fills a CPU."""
    torch.set_num_threads(1)
    summary = run_to_folder(RunSpec(**keys), None, tensorboard=False)
    return {
        "accuracy": summary.final_accuracy,
        "collapsed": summary.collapsed,
        "majority_rounds": summary.byzantine_majority_rounds,
        "seconds": summary.seconds,
        "copied": False,
    }


def run_grid(cells: Sequence[Cell], jobs: int = 1, log=None) -> dict[Cell, dict[str, Any]]:
    """Run every cell (strategic_skip cells that provably equal `none` are copied from it)."""
    todo = [c for c in cells if not (c.attack == "strategic_skip" and skip_equals_none(c.spec()))]
    copied = [c for c in cells if c not in todo]
    by_key = {(c.method, c.beta, c.p, c.attack, c.seed): c for c in cells}
    for c in copied:  # the `none` run each copy comes from must be simulated
        none = by_key.get((c.method, c.beta, c.p, "none", c.seed))
        if none is None:
            todo.append(Cell(c.method, c.beta, c.p, "none", c.seed, {**c.keys, "attack": "none"}))
    results: dict[Cell, dict[str, Any]] = {}
    if jobs <= 1:
        for i, cell in enumerate(todo, 1):
            results[cell] = run_one(cell.keys)
            _log(log, i, len(todo), cell, results[cell])
    else:
        with ProcessPoolExecutor(max_workers=jobs, mp_context=get_context("spawn")) as pool:
            futures = {pool.submit(run_one, cell.keys): cell for cell in todo}
            for i, (future, cell) in enumerate(futures.items(), 1):
                results[cell] = future.result()
                _log(log, i, len(todo), cell, results[cell])
    for c in copied:
        source = next(
            r
            for k, r in results.items()
            if (k.method, k.beta, k.p, k.attack, k.seed) == (c.method, c.beta, c.p, "none", c.seed)
        )
        results[c] = {**source, "seconds": 0.0, "copied": True}
    return {c: results[c] for c in cells}


def _log(log, i: int, total: int, cell: Cell, result: dict[str, Any]) -> None:
    if log is not None:
        print(
            f"[{i}/{total}] {cell.method} beta={cell.beta:g} p={cell.p:g} {cell.attack} "
            f"seed={cell.seed}: acc {result['accuracy']:.3f}"
            f"{' collapsed' if result['collapsed'] else ''} ({result['seconds']:.1f} s)",
            file=log,
            flush=True,
        )


@dataclass(frozen=True)
class Summary:
    """Seeds pooled: mean final accuracy and collapsed runs of one (method, beta, p, attack)."""

    accuracy: float
    collapsed: int
    runs: int
    majority_rounds: float
    copied: bool
    rounds: int
    by_seed: tuple[tuple[int, float], ...] = ()  # (seed, final accuracy), seed order


def summarize(results: dict[Cell, dict[str, Any]]) -> dict[tuple[str, float, float, str], Summary]:
    """(method, beta, p, attack) -> Summary over seeds."""
    groups: dict[tuple[str, float, float, str], list[dict[str, Any]]] = defaultdict(list)
    rounds: dict[tuple[str, float, float, str], int] = {}
    seeds: dict[tuple[str, float, float, str], list[tuple[int, float]]] = defaultdict(list)
    for cell, result in results.items():
        key = (cell.method, cell.beta, cell.p, cell.attack)
        groups[key].append(result)
        rounds[key] = int(cell.keys["rounds"])
        seeds[key].append((cell.seed, result["accuracy"]))
    return {
        key: Summary(
            accuracy=sum(r["accuracy"] for r in rs) / len(rs),
            collapsed=sum(r["collapsed"] for r in rs),
            runs=len(rs),
            majority_rounds=sum(r["majority_rounds"] for r in rs) / len(rs),
            copied=all(r["copied"] for r in rs),
            rounds=rounds[key],
            by_seed=tuple(sorted(seeds[key])),
        )
        for key, rs in groups.items()
    }


def hurts_more(cache_accuracy: float, alie_accuracy: float, margin: float = DEFAULT_MARGIN) -> bool:
    """The cache attack hurts more than ALIE iff its accuracy is lower by more than ``margin``:
    cache_accuracy < alie_accuracy - margin. A non-finite cache accuracy (diverged run) hurts more
    unless ALIE's diverged too."""
    if not math.isfinite(cache_accuracy):
        return math.isfinite(alie_accuracy)
    if not math.isfinite(alie_accuracy):
        return False
    return cache_accuracy < alie_accuracy - margin


@dataclass(frozen=True)
class Verdict:
    """One method, beta and cache attack against ALIE, pooled over p and seeds."""

    method: str
    beta: float
    attack: str
    cache_accuracy: float
    alie_accuracy: float
    cache_collapsed: int
    alie_collapsed: int
    runs: int
    per_p: tuple[tuple[float, float, float, bool, float], ...]  # (p, cache, alie, more, none acc)
    more: bool
    paired_lower: int = 0  # (p, seed) pairs where the cache attack is below ALIE by the margin
    pairs: int = 0

    def line(self) -> str:
        detail = "; ".join(
            f"p={p:g}: {c:.3f} vs {a:.3f} {'yes' if m else 'no'} (none {n:.3f})"
            for p, c, a, m, n in self.per_p
        )
        return (
            f"{self.attack} hurts {self.method} more than alie at beta={self.beta:g}: "
            f"{'yes' if self.more else 'no'} (acc {self.cache_accuracy:.3f} vs "
            f"{self.alie_accuracy:.3f}, collapsed {self.cache_collapsed} vs "
            f"{self.alie_collapsed} of {self.runs}; lower by the margin in "
            f"{self.paired_lower} of {self.pairs} same-seed pairs; {detail})"
        )


def verdicts(
    summary: dict[tuple[str, float, float, str], Summary], margin: float = DEFAULT_MARGIN
) -> list[Verdict]:
    """For every (method, beta) and cache attack: mean accuracy over p and seeds against ALIE's,
    decided by ``hurts_more``; the same decision per p for the detail, and per same-seed pair
    (same Byzantine clients and samples) as a consistency count: a yes from one lucky seed shows
    as 1 of 4."""
    out = []
    settings = sorted(
        {(m, b) for m, b, _, _ in summary}, key=lambda mb: (_order(summary, mb[0]), mb[1])
    )
    for method, beta in settings:
        ps = sorted({p for m, b, p, _ in summary if (m, b) == (method, beta)})
        for attack in CACHE_ATTACKS:
            pairs = [
                (summary.get((method, beta, p, attack)), summary.get((method, beta, p, "alie")))
                for p in ps
            ]
            if any(c is None or a is None for c, a in pairs):
                continue
            cache_acc = sum(c.accuracy * c.runs for c, _ in pairs) / sum(c.runs for c, _ in pairs)
            alie_acc = sum(a.accuracy * a.runs for _, a in pairs) / sum(a.runs for _, a in pairs)
            none = [summary.get((method, beta, p, "none")) for p in ps]
            per_p = tuple(
                (
                    p,
                    c.accuracy,
                    a.accuracy,
                    hurts_more(c.accuracy, a.accuracy, margin),
                    math.nan if n is None else n.accuracy,
                )
                for p, (c, a), n in zip(ps, pairs, none)
            )
            paired = [
                hurts_more(ca, aa, margin)
                for c, a in pairs
                for (sc, ca), (sa, aa) in zip(c.by_seed, a.by_seed)
                if sc == sa
            ]
            out.append(
                Verdict(
                    method,
                    beta,
                    attack,
                    cache_acc,
                    alie_acc,
                    sum(c.collapsed for c, _ in pairs),
                    sum(a.collapsed for _, a in pairs),
                    sum(c.runs for c, _ in pairs),
                    per_p,
                    hurts_more(cache_acc, alie_acc, margin),
                    sum(paired),
                    len(paired),
                )
            )
    return out


def _order(summary, method: str) -> int:
    return list(dict.fromkeys(m for m, _, _, _ in summary)).index(method)


def noise_notes(
    summary: dict[tuple[str, float, float, str], Summary], margin: float = DEFAULT_MARGIN
) -> list[str]:
    """Settings where the clean run ends more than ``margin`` below an attacked one: there the
    spread between runs exceeds the margin, so a verdict that rests on them is weak."""
    notes = []
    for (method, beta, p, attack), none in summary.items():
        if attack != "none":
            continue
        attacked = {
            a: summary[(method, beta, p, a)] for a in ATTACKS[1:] if (method, beta, p, a) in summary
        }
        best = max(attacked, key=lambda a: attacked[a].accuracy, default=None)
        if best is not None and none.accuracy < attacked[best].accuracy - margin:
            seeds = ", ".join(f"{acc:.3f}" for _, acc in none.by_seed)
            notes.append(
                f"Note: {method} at beta={beta:g}, p={p:g}: the clean run "
                f"({none.accuracy:.3f}; seeds {seeds}) ends below {best} "
                f"({attacked[best].accuracy:.3f}), so run-to-run noise there exceeds the "
                f"{margin * 100:g}-point margin."
            )
    return notes


def answer(found: Sequence[Verdict], margin: float = DEFAULT_MARGIN) -> str:
    """The issue's question in one line: which cache attacks hurt which method more than ALIE."""
    hits = [v for v in found if v.more]
    if not hits:
        return (
            f"Answer: no. Neither cache attack lowers the accuracy of swb_dm or demoa below "
            f"ALIE's by more than {margin * 100:g} points at any Byzantine fraction tested."
        )
    names = ", ".join(
        f"{v.attack} on {v.method} at beta={v.beta:g} ({v.cache_accuracy:.3f} vs "
        f"{v.alie_accuracy:.3f}, lower in {v.paired_lower} of {v.pairs} same-seed pairs)"
        for v in hits
    )
    return (
        f"Answer: yes. The cache attacks hurt more than ALIE in {len(hits)} of {len(found)} "
        f"comparisons: {names}."
    )


def markdown(summary: dict[tuple[str, float, float, str], Summary]) -> str:
    """One row per (method, beta, p): mean final accuracy and collapsed runs per attack."""
    head = "| method | beta | p | rounds | majority rounds | " + " | ".join(ATTACKS) + " |"
    lines = [head, "|" + "---|" * (5 + len(ATTACKS))]
    rows = sorted(
        {(m, b, p) for m, b, p, _ in summary}, key=lambda r: (_order(summary, r[0]), r[1], r[2])
    )
    for method, beta, p in rows:
        cells = []
        for attack in ATTACKS:
            s = summary.get((method, beta, p, attack))
            cells.append(
                ""
                if s is None
                else f"{'=' if s.copied else ''}{s.accuracy:.3f} ({s.collapsed}/{s.runs})"
            )
        row = [s for k, s in summary.items() if k[:3] == (method, beta, p)]
        # the sample draw depends on the seed only, so every attack sees the same majority rounds
        lines.append(
            f"| {method} | {beta:g} | {p:g} | {row[0].rounds} | "
            f"{row[0].majority_rounds:g} | " + " | ".join(cells) + " |"
        )
    return "\n".join(lines)


def report(
    summary,
    found: Sequence[Verdict],
    margin: float,
    command: str,
    seconds: float,
    dataset: str = "digits",
) -> str:
    """The markdown report: how it was made, the table, the verdicts, noise notes, the answer."""
    return "\n".join(
        [
            f"# Cache attacks against the delayed-cache methods ({dataset})",
            "",
            f"Produced by `{command}` in {seconds:.0f} s. Cells: mean final test accuracy over seeds "
            "(collapsed runs / runs); majority rounds: rounds per run in which the Byzantine clients "
            "held at least half of the sample (where strategic_skip attacks); `=`: strategic_skip "
            "cannot attack there (fixed sample, 2B < n), so the cell is the `none` run. Verdict: yes "
            "iff the cache attack's mean accuracy (over p and seeds) is below ALIE's by more than "
            f"{margin * 100:g} points.",
            "",
            markdown(summary),
            "",
            *[v.line() for v in found],
            "",
            *[note + "\n" for note in noise_notes(summary, margin)],
            answer(found, margin),
            "",
        ]
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--quick", action="store_true", help="one seed, 5 swb_dm / 100 demoa rounds"
    )
    parser.add_argument(
        "--out", type=Path, default=None, help="also write the report (markdown) here"
    )
    parser.add_argument(
        "--fractions",
        type=float,
        nargs="+",
        default=[0.2],
        help="Byzantine fractions (default 0.2)",
    )
    parser.add_argument(
        "--seeds", type=int, default=None, help="seeds 0..k-1 (default 2; 1 with --quick)"
    )
    parser.add_argument(
        "--jobs",
        type=int,
        default=min(2, os.cpu_count() or 1),
        help="runs side by side, one torch thread each (results do not change; "
        "default min(2, CPUs))",
    )
    parser.add_argument(
        "--margin",
        type=float,
        default=DEFAULT_MARGIN,
        help="accuracy gap (fraction) needed for a yes (default 0.02)",
    )
    parser.add_argument(
        "--set",
        dest="assignments",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="a RunSpec key for every run, repeatable "
        "(e.g. dataset=fashion_mnist, train_samples=12000)",
    )
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    seeds = range(args.seeds if args.seeds is not None else (1 if args.quick else 2))
    started = time.perf_counter()
    try:
        cells = grid(
            methods(args.quick),
            args.fractions,
            list(seeds),
            overrides=parse_assignments(args.assignments),
        )
        for cell in cells:  # every spec checked before the first run starts
            cell.spec()
    except SpecError as error:
        print(f"cache_attacks.py: {error}", file=sys.stderr)
        return 2
    results = run_grid(cells, jobs=args.jobs, log=sys.stderr)
    summary = summarize(results)
    found = verdicts(summary, args.margin)
    command = "python analysis/cache_attacks.py " + " ".join(
        shlex.quote(a) for a in (sys.argv[1:] if argv is None else argv)
    )
    text = report(
        summary,
        found,
        args.margin,
        command.strip(),
        time.perf_counter() - started,
        dataset=cells[0].spec().dataset,
    )
    print(text)
    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
