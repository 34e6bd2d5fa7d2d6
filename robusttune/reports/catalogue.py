"""What the tool can run: every registered rule, attack, method, algorithm, dataset and model,
one row each with the first line of its docstring and where it came from (built-in, or the
plugin that registered it), for ``robusttune list`` and `robusttune.api.catalogue`."""

from __future__ import annotations

import inspect
import re
from typing import Any

from robusttune.core.registries import AGGREGATORS, ALGORITHMS, ATTACKS, DATASETS, MODELS
from robusttune.core.registry import BUILT_IN, SpecError
from robusttune.core.runspec import method_presets
from robusttune.core.yaml_input import packaged_spaces

__all__ = ["CONCEPTS", "catalogue", "summary_line"]

# a full stop after these does not end a sentence ("Sec. IV", "Eq. 2", "et al. 2019")
_ABBREVIATIONS = frozenset(
    {
        "Sec",
        "Secs",
        "Eq",
        "Eqs",
        "al",
        "e.g",
        "i.e",
        "Fig",
        "Alg",
        "vs",
        "cf",
        "No",
        "Thm",
        "Prop",
        "App",
    }
)

# the concepts in the order they are listed, under the names a user filters by
CONCEPTS = ("aggregator", "attack", "method", "algorithm", "dataset", "model", "space")


def summary_line(entry: Any) -> str:
    """The first sentence of an entry's own docstring (not its base class's), or '': up to its
    first full stop, or up to the colon after a name and its paper ("Krum (Blanchard et al.,
    NeurIPS 2017): out = ...")."""
    text = (
        entry.__dict__.get("__doc__")
        if isinstance(entry, type)
        else getattr(entry, "__doc__", None)
    )
    paragraph = " ".join(inspect.cleandoc(text or "").split("\n\n", 1)[0].split())
    sentence = paragraph
    for end in re.finditer(r"(?<=\)):\s|(?<=\.)\s", paragraph):
        word = paragraph[: end.start()].rsplit(" ", 1)[-1].lstrip("(")
        if word.rstrip(".") not in _ABBREVIATIONS:
            sentence = paragraph[: end.start()]
            break
    return sentence if len(sentence) <= 120 else sentence[:119].rstrip() + "…"


def catalogue(concept: str | None = None) -> list[dict[str, str]]:
    """Rows ``{concept, name, source, summary}``: every registered entry of ``concept`` (None:
    all), every ``method:`` name with the algorithm and rule it runs (a method's source is its
    rule's: a plugin rule is a method of FedAvg's family, as every built-in rule is), and every
    search space shipped with the package (``robusttune sweep NAME`` runs it)."""
    if concept is not None and concept not in CONCEPTS:
        raise SpecError(f"concept {concept!r} is unknown; allowed: {', '.join(CONCEPTS)}")
    registries = {
        "aggregator": AGGREGATORS,
        "attack": ATTACKS,
        "algorithm": ALGORITHMS,
        "dataset": DATASETS,
        "model": MODELS,
    }
    rows: list[dict[str, str]] = []
    for name in CONCEPTS:
        if concept is not None and name != concept:
            continue
        if name == "space":
            for space, path in packaged_spaces().items():
                rows.append(
                    {
                        "concept": "space",
                        "name": space,
                        "source": BUILT_IN,
                        "summary": _first_comment(path),
                    }
                )
            continue
        if name == "method":
            for method, (algorithm, rule) in sorted(method_presets().items()):
                source = AGGREGATORS.source(rule) if rule in AGGREGATORS else BUILT_IN
                if source == BUILT_IN and algorithm in ALGORITHMS:
                    source = ALGORITHMS.source(algorithm)
                rows.append(
                    {
                        "concept": "method",
                        "name": method,
                        "source": source,
                        "summary": f"algorithm {algorithm}, rule {rule}",
                    }
                )
            continue
        registry = registries[name]
        for entry in registry.names():
            rows.append(
                {
                    "concept": name,
                    "name": entry,
                    "source": registry.source(entry),
                    "summary": summary_line(registry[entry]),
                }
            )
    return rows


def _first_comment(path: Any) -> str:
    """A space file's first comment line, without its file name ("quickstart.yaml: ...")."""
    for line in path.read_text().splitlines():
        if line.startswith("#"):
            text = line.lstrip("# ").strip()
            return (
                text.split(": ", 1)[1]
                if text.split(": ", 1)[0].endswith(".yaml") and ": " in text
                else text
            )
    return ""
