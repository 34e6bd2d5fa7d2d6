"""Write one part of a breakdown YAML: every M-th method of its `space.setting` grid, from the K-th.

    python analysis/findings/map_part.py SPACE.yaml K/M OUT.yaml

The part keeps everything else (run, the regimes, search, breakdown), so its cells are the whole
map's cells of those methods, run exactly as the whole map runs them. M parts run as M maps with
`--local` side by side, one core each (a --local map keeps every run the moment it ends, where a
Ray wave is kept only when the whole wave returns; a map interrupted at a session's end loses
nothing). To join them: start the whole map under its own --name and stop it before its first run
ends (it writes its plan.yaml), append the parts' runs.jsonl to its runs.jsonl, and `--resume` it:
a run's key is its RunSpec, so it reuses every run the parts made and runs only what they did not
(analysis/findings/claim10.md did this for the digits map). Taking every M-th method, not a block,
spreads the costly methods (SWB and SWB-DM, Bulyan, the DeMoA variants) over the parts.

A map at the horizon (`robusttune horizon`'s at_plateau.yaml) lists its cells on one joint axis
`cell`, each with its own rounds, from 25 to 400: there a part takes cells, not methods, dealt
longest first to the part with the fewest rounds so far, so the parts' rounds differ by at most
one cell's.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import yaml
from part_argument import part_of  # analysis/findings/: a script's folder is on sys.path


def cells_by_rounds(entries: list[dict], parts: int, default_rounds: int = 1) -> list[list[int]]:
    """Indices of ``entries`` dealt to ``parts`` parts, longest (most ``rounds``, else
    ``default_rounds``) first, each to the part with the fewest rounds so far (ties: the lower
    part); each part in entry order."""
    rounds = [int(entry.get("rounds", default_rounds)) for entry in entries]
    dealt: list[list[int]] = [[] for _ in range(parts)]
    totals = [0] * parts
    for index in sorted(range(len(entries)), key=lambda i: (-rounds[i], i)):
        lightest = min(range(parts), key=lambda k: (totals[k], k))
        dealt[lightest].append(index)
        totals[lightest] += rounds[index]
    return [sorted(indices) for indices in dealt]


def map_part(mapping: dict, part: int, parts: int) -> dict:
    """``mapping`` (a breakdown YAML) with only the ``setting`` grid entries i = part (mod parts),
    or, for a map at the horizon, the ``cell`` entries `cells_by_rounds` deals to ``part``; and a
    name that says which part it is."""
    space = mapping["space"]
    if "setting" in space:
        axis, entries = "setting", space["setting"]["grid"]
        kept = [entry for i, entry in enumerate(entries) if i % parts == part]
    else:
        axis, entries = "cell", space["cell"]["grid"]
        default_rounds = int((mapping.get("run") or {}).get("rounds", 1))
        kept = [entries[i] for i in cells_by_rounds(entries, parts, default_rounds)[part]]
    name = mapping.get("name", "breakdown")
    return {
        **mapping,
        "name": f"{name}_part{part}of{parts}",
        "space": {**space, axis: {**space[axis], "grid": kept}},
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("space", type=Path)
    parser.add_argument("part", type=part_of("part"))
    parser.add_argument("out", type=Path)
    args = parser.parse_args(argv)
    mapping = yaml.safe_load(args.space.read_text())
    part, parts = args.part
    header = f"# part {part}/{parts} of {args.space} (analysis/findings/map_part.py)\n"
    args.out.write_text(header + yaml.safe_dump(map_part(mapping, part, parts), sort_keys=False))
    return 0


if __name__ == "__main__":
    sys.exit(main())
