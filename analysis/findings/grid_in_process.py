"""Run a grid search space's trials in this process, a shard at a time, skipping finished ones.

    python analysis/findings/grid_in_process.py SPACE.yaml FOLDER [--from I] [--to J] [--shard K/M]

The in-process counterpart of `robusttune sweep SPACE.yaml` for a grid: the same trials in the same
order (robusttune.experiments.sweep.space.SweepSpec.expand), each written by robusttune.engine.recording.run_to_folder
to ``FOLDER/trials/IIIII-<method>-<attack>-b<fraction>-p<participation>-s<seed>`` where IIIII is
the trial's index in the grid. A trial whose folder holds summary.json is skipped, and a folder
without one (a killed run) is started over, so the same command continues an interrupted job, in
this session or, once FOLDER is brought back, in another. ``--shard K/M`` keeps the trials whose
index is K modulo M: M such processes side by side (one torch thread each, as a Tune trial with
one CPU) split the grid without sharing anything but FOLDER. ``--from``/``--to`` cut the index
range first (half-open), e.g. one split of claim6_mnist_convnet.yaml.

Why not Ray: on a 2-core machine the findings' long grids ran as two such processes; an
interrupted Ray Tune experiment resumes only from its own experiment state, which a session that
loses its working folders does not keep, while these run folders can be kept (or archived) as
they are. Every run trains in the numerics its RunSpec names (portable by default).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch
from part_argument import part_of  # analysis/findings/: a script's folder is on sys.path

from robusttune.core.runspec import RunSpec
from robusttune.engine.recording import run_to_folder
from robusttune.experiments.sweep.space import load_sweep


def trial_folder(out: Path, index: int, spec: RunSpec) -> Path:
    """FOLDER/trials/IIIII-... for grid index ``index`` (robusttune.engine.runners.InProcessRunner's
    naming, with the grid index in place of its counter)."""
    name = (
        f"{index:05d}-{spec.method}-{spec.attack}-b{spec.byzantine_fraction:.4g}"
        f"-p{spec.participation:g}-s{spec.seed}"
    )
    return out / "trials" / name


def shard_indices(total: int, start: int, end: int | None, shard: int, shards: int) -> list[int]:
    """Indices i in [start, end) of a grid of ``total`` trials with i = shard (mod shards)."""
    stop = total if end is None else min(end, total)
    return [i for i in range(start, stop) if i % shards == shard]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("space", type=Path)
    parser.add_argument("folder", type=Path)
    parser.add_argument("--from", dest="start", type=int, default=0)
    parser.add_argument("--to", dest="end", type=int, default=None)
    parser.add_argument("--shard", type=part_of("--shard"), default=(0, 1))
    args = parser.parse_args(argv)

    sweep = load_sweep(args.space)
    points = sweep.expand().points
    indices = shard_indices(len(points), args.start, args.end, *args.shard)
    torch.set_num_threads(1)
    for index in indices:
        spec = sweep.run_spec(points[index])
        folder = trial_folder(args.folder, index, spec)
        if (folder / "summary.json").is_file():
            print(f"{index}: kept {folder.name}", file=sys.stderr, flush=True)
            continue
        started = time.perf_counter()
        summary = run_to_folder(spec, folder, tensorboard=False)
        print(
            f"{index}: {folder.name} {time.perf_counter() - started:.0f} s "
            f"final {summary.final_accuracy:.4f} collapsed {summary.collapsed}",
            file=sys.stderr,
            flush=True,
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
