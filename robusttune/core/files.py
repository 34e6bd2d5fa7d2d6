"""Atomic local file writes: a reader (``--resume``, a restored trial, the report) never sees half
a file. The text goes to ``NAME.tmp`` beside the target and is renamed over it (``os.replace`` is
atomic within one filesystem). Used for summary.json, the cut rounds.csv of a restored run, and
the sweep's sweep.yaml and trials.csv when they are stored locally."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

__all__ = ["write_json_atomic", "write_text_atomic"]


def write_text_atomic(path: str | Path, text: str) -> None:
    """Write ``text`` to a temporary file beside ``path`` and rename it over ``path``. Line
    endings are written as given (a csv module's ``\\r\\n`` rows stay as they are)."""
    path = Path(path)
    temporary = path.with_name(path.name + ".tmp")
    with temporary.open("w", newline="") as handle:
        handle.write(text)
    os.replace(temporary, path)


def write_json_atomic(path: Path, payload: Any) -> None:
    """Write JSON to a temporary file and rename it, so a reader never sees half a file."""
    write_text_atomic(path, json.dumps(payload, indent=2, sort_keys=True, default=_jsonable))


def _jsonable(value: Any) -> Any:
    if isinstance(value, (set, frozenset, tuple)):
        return list(value)
    return str(value)
