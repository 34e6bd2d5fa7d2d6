"""What `--help` shows beyond the options: each command's docstring with every paragraph on one
line (the terminal wraps it) and one or two examples of a first use."""

from __future__ import annotations

import inspect

__all__ = ["EXAMPLES", "readable_help"]

# Shown at the end of each command's --help: what a first use looks like.
EXAMPLES: dict[str, tuple[str, ...]] = {
    "run": (
        "robusttune run --set method=median --set attack=ipm --set byzantine_fraction=0.2",
        "robusttune run my_run.yaml --out results/runs/mine",
    ),
    "sweep": (
        "robusttune sweep search_spaces/quickstart.yaml",
        "robusttune sweep search_spaces/paper_grid.yaml --dry-run",
    ),
    "calibrate": (
        "robusttune calibrate --clients 100 --participation 0.1 --byzantine 0.1 "
        "--rounds 200 --analytic-only",
        "robusttune calibrate --clients 20 --participation 0.5 --byzantine 0.2 "
        "--rounds 50 --method trimmed_mean",
    ),
    "breakdown": (
        "robusttune breakdown search_spaces/breakdown.yaml --dry-run",
        "robusttune breakdown examples/meamed_map.yaml --local",
    ),
    "report": ("robusttune report results/quickstart",),
    "tune": ("robusttune tune search_spaces/tune_defence.yaml --num-samples 8",),
    "horizon": ("robusttune horizon search_spaces/breakdown.yaml --local",),
    "list": ("robusttune list aggregator", "robusttune list --plugin examples/my_defence/"),
}


def readable_help(doc: str, examples: tuple[str, ...] = ()) -> str:
    """A command's help from its docstring: each paragraph one line (the terminal wraps it,
    where the docstring's own line breaks would cut sentences), then its examples, one per
    line."""
    paragraphs = [" ".join(part.split()) for part in inspect.cleandoc(doc).split("\n\n")]
    if examples:
        paragraphs.append("Examples:\n" + "\n".join(f"  $ {line}" for line in examples))
    return "\n\n".join(p for p in paragraphs if p)
