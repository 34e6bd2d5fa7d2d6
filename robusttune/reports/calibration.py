"""What `robusttune calibrate` prints: its figures (`robusttune.problem.byzantine_law.analyze` and the
trim sweep's rows, as the command assembles them) as rich tables."""

from __future__ import annotations

from typing import Any


def print_calibration(f: dict[str, Any]) -> None:
    """Print `calibrate`'s figures (the analytic tables, then the trim sweep against the worst
    case and its recommendation, or the one line naming the analytic bound)."""
    from rich.console import Console

    from robusttune.display.terminal import print_table

    console = Console()
    cache = "over a cache (N slots)"
    head = [
        {
            "figure": "P(Byzantine-majority round)",
            "sampled set": f"{f['p_majority_round']:.4g}",
            cache: f"{f['p_majority_round_cache']:.4g}",
        },
        {
            "figure": f"P(any in {f['rounds']} rounds)",
            "sampled set": f"{f['p_majority_round_any']:.4g}",
            cache: f"{f['p_majority_round_any_cache']:.4g}",
        },
    ]
    for t in f["trims"]:
        head.append(
            {
                "figure": f"P(K > floor(n r)), r={t['trim_ratio']:g}, any round",
                "sampled set": f"{t['p_exceeds_trim_any']:.4g}",
                cache: f"{t['p_exceeds_trim_any_cache']:.4g}",
            }
        )
    head.append(
        {
            "figure": f"smallest r with P(any exceeds) <= {f['risk']:g}",
            "sampled set": str(f["analytic_safe_trim"]),
            cache: str(f["analytic_safe_trim_cache"]),
        }
    )
    print_table(
        head,
        console=console,
        title=(
            f"N={f['clients']}, p={f['participation']:g} ({f['mode']}), "
            f"beta={f['byzantine_fraction']:g} (B={f['n_byzantine']}), T={f['rounds']}"
        ),
    )
    console.print(
        f"law of K, the Byzantine clients in a round's sample: {f['law']}, "
        f"E[K] = {f['expected_byzantine']:.3g}"
    )
    print_table(
        [{"k": str(k), "P(K = k)": f"{p:.4g}"} for k, p in f["byzantine_pmf"].items()],
        console=console,
    )
    sweep = f.get("sweep")
    if sweep:
        rows = [
            {
                "trim_ratio": f"{row['trim_ratio']:g}",
                "beta (k)": f"{row['byzantine_fraction']:g} ({row['byzantine_clients']})",
                "clean": f"{sweep['clean_accuracy'][str(row['trim_ratio'])]:.3f}",
                "bar": f"{sweep['threshold'][str(row['trim_ratio'])]:.3f}",
                "worst validation (mean)": f"{row['accuracy']:.3f}",
                "its test": f"{row['test_accuracy']:.3f}",
                "collapsed": str(row["collapsed"]),
                "survived (seeds)": f"{row['survived']} ({row.get('seeds_survived', '?')}/"
                f"{row.get('seeds', '?')})",
                "worst attack": row["attack"] or "-",
            }
            for row in sorted(
                sweep["rows"], key=lambda r: (r["trim_ratio"], r["byzantine_fraction"])
            )
        ]
        print_table(
            rows,
            console=console,
            title=(
                f"trim sweep: {sweep['method']} on {sweep['dataset']} against the worst "
                f"case of {sweep['adversary']}"
            ),
        )
        if f["recommended_trim_ratio"] is None:
            console.print(sweep["no_survivor"], markup=False, highlight=False, soft_wrap=True)
        else:
            chosen = [
                row for row in sweep["rows"] if row["trim_ratio"] == f["recommended_trim_ratio"]
            ]
            tests = ", ".join(
                f"{row['test_accuracy']:.3f} at beta={row['byzantine_fraction']:g}"
                for row in chosen
            )
            console.print(
                f"recommended trim ratio: {f['recommended_trim_ratio']:g} (the smallest "
                f"surviving every attack at beta and beta + margin in every seed, on "
                f"validation accuracy); its worst-case test accuracy: {tests}"
            )
        for r, cost in sweep["accuracy_cost_points"].items():
            console.print(f"  r={float(r):g} costs {cost:+.2f} accuracy points against it")
        console.print(f"runs: {sweep['folder']}")
