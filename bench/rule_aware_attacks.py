"""Cost of one round of each rule-aware attack, against ALIE (a closed-form attack) and against one
call of the deployed rule, measured in the same run (issue 22: the searches' cost per round).

Honest rows are N(0.3, 0.5^2) updates of the map's MLP size, h = 16 honest and c = 4 Byzantine
rows (the map's N = 20 at beta = 0.2). For each rule the script prints, per attack, seconds per
round and the ratios attack / ALIE and attack / one rule call. By construction optimal ALIE and
IPM cost about 20 rule calls (their line search) and MinMax / MinSum / Fang one pairwise-distance
product, whatever the rule; against SWB the line search does the honest rows' work once
(`SWB.with_fixed_rows`: rotations drawn once, the honest rows rotated and sorted once, the
message's copies merged into their per-rank order), so there it costs fewer: a closing line
compares it with the same search through the plain rule (`aggregators.base.appended_rows`), in
the same run. Ends with one line ``swb_fixed_rows_speedup_optimal_alie: <plain / fixed rows>``
(that comparison's ratio).

    python bench/rule_aware_attacks.py            # d = 55,210, 3 repeats
    python bench/rule_aware_attacks.py --quick    # d = 5,000, 1 repeat: seconds, the smoke run
"""

from __future__ import annotations

import argparse
import time

import torch

from robusttune.methods.aggregators import make_rule
from robusttune.methods.attacks import make_attack

ATTACKS = ("alie", "minmax", "minsum", "fang_trmean", "fang_krum", "optimal_alie", "optimal_ipm")
RULES = (
    {"aggregator": "median"},
    {"aggregator": "krum"},
    {"aggregator": "cclip"},
    {"aggregator": "median", "pre_aggregator": "nnm"},
    {"aggregator": "swb", "swb_rotation": "shared", "trim_ratio": 0.25},
)


def seconds(call, repeats: int) -> float:
    call()  # warm-up
    started = time.perf_counter()
    for _ in range(repeats):
        call()
    return (time.perf_counter() - started) / repeats


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    d, repeats = (5_000, 1) if args.quick else (55_210, 3)
    h, c = 16, 4
    gen = torch.Generator().manual_seed(0)
    honest = torch.randn(h, d, generator=gen) * 0.5 + 0.3
    speedup = float("nan")
    for params in RULES:
        rule = make_rule(**params)
        f = c
        label = "+".join(str(v) for k, v in params.items() if k in ("pre_aggregator", "aggregator"))
        rows = torch.cat([honest, honest[:c]])
        one_call = seconds(
            lambda: rule(rows, f=f, generator=torch.Generator().manual_seed(0)), repeats
        )
        times = {}
        for name in ATTACKS:
            attack = make_attack(name)
            times[name] = seconds(
                lambda: attack(
                    honest,
                    n_byzantine=c,
                    n_total=h + c,
                    f=c,
                    rule=rule,
                    rule_f=f,
                    generator=torch.Generator().manual_seed(1),
                ),
                repeats,
            )
        print(f"{label}: one rule call {one_call:.4f} s")
        for name, value in times.items():
            print(
                f"  {name:13s} {value:.4f} s/round  x{value / times['alie']:.1f} of alie  "
                f"x{value / one_call:.1f} of one rule call"
            )
        if params["aggregator"] == "swb":
            plain = make_attack("optimal_alie")
            through_plain = seconds(
                lambda: plain(
                    honest,
                    n_byzantine=c,
                    n_total=h + c,
                    f=c,
                    # a plain function: the attack cannot see the rule, so takes no shortcut
                    rule=lambda rows, **context: rule(rows, **context),  # noqa: PLW0108
                    rule_f=f,
                    generator=torch.Generator().manual_seed(1),
                ),
                repeats,
            )
            speedup = through_plain / times["optimal_alie"]
            print(
                f"  optimal_alie through the plain rule {through_plain:.4f} s/round: the honest "
                f"rows' work done once is x{speedup:.2f} faster"
            )
    print(f"swb_fixed_rows_speedup_optimal_alie: {speedup:.2f}")


if __name__ == "__main__":
    main()
