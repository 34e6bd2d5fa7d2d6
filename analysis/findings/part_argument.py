"""`K/M`, part K of M, as the findings' runners take it on their command lines (map_part.py's
part, grid_in_process.py's --shard): the items i = K (mod M) of a list, so M processes side by
side split it without sharing anything."""

from __future__ import annotations

import argparse
from collections.abc import Callable


def part_of(option: str) -> Callable[[str], tuple[int, int]]:
    """An argparse ``type`` reading ``K/M`` into (K, M) with 0 <= K < M; a bad value is one line
    naming ``option``, the value and what is allowed."""

    def parse(text: str) -> tuple[int, int]:
        try:
            part, parts = (int(piece) for piece in text.split("/"))
        except ValueError:
            raise argparse.ArgumentTypeError(
                f"{option} must be K/M with integers; got {text!r}"
            ) from None
        if not 0 <= part < parts:
            raise argparse.ArgumentTypeError(f"{option} K/M needs 0 <= K < M; got {text!r}")
        return part, parts

    return parse
