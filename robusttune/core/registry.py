"""One small registry class shared by every concept that is chosen by name (rules, attacks,
algorithms, datasets, models), so a new entry is one class plus one ``@REGISTRY.register`` line
and its name is usable from YAML and the CLI at once."""

from __future__ import annotations

import importlib
import inspect
import threading
from typing import Any, Callable, Generic, Iterator, TypeVar

T = TypeVar("T")


class SpecError(ValueError):
    """A bad configuration value. Its message is one line that names the key and the allowed
    values; the CLI prints it and exits with status 2."""


# Keywords that are not RunSpec keys but that builders may be given by the round loop.
CONTEXT_KEYS = frozenset({"f", "n_byzantine", "n_total", "num_classes", "device"})


class Registry(Generic[T]):
    """Maps a lower-case name to a class (or factory) of one concept.

    ``passthrough``: keywords ``make`` may be handed that an entry need not take (the RunSpec
    keys, so one dict of knobs serves every rule); they are dropped for entries that do not take
    them, where any other unknown keyword is an error."""

    def __init__(self, concept: str, passthrough: frozenset[str] = frozenset(),
                 builtins: str | None = None) -> None:
        self.concept = concept
        self.passthrough = frozenset(passthrough) | CONTEXT_KEYS
        self.builtins = builtins
        self._entries: dict[str, T] = {}
        self._loaded = builtins is None
        # re-entrant: the import's own modules look names up while it registers them
        self._loading = threading.RLock()

    def _load(self) -> None:
        """Import the module that registers the built-in entries, once, at the first lookup: the
        registry lives in the foundations, its entries in the layers above, which import it.
        Another thread's lookup waits for that import to finish; a failed import is retried at
        the next lookup rather than leaving the registry half filled."""
        if self._loaded:
            return
        with self._loading:
            if not self._loaded:
                self._loaded = True
                try:
                    importlib.import_module(self.builtins)  # type: ignore[arg-type]
                except BaseException:
                    self._loaded = False
                    raise

    def register(self, name: str, **attributes: Any) -> Callable[[T], T]:
        """``@REGISTRY.register("name", key=value ...)``: the entry gets ``name`` and every
        attribute given (what is keyed by its name, e.g. a dataset's defaults, lives on it)."""

        def decorate(entry: T) -> T:
            if name in self._entries:
                raise RuntimeError(f"{self.concept} {name!r} registered twice")
            self._entries[name] = entry
            for key, value in {"name": name, **attributes}.items():
                try:
                    setattr(entry, key, value)
                except (AttributeError, TypeError):
                    pass
            return entry

        return decorate

    def __getitem__(self, name: str) -> T:
        self._load()
        try:
            return self._entries[name]
        except KeyError:
            raise SpecError(
                f"unknown {self.concept} {name!r}; allowed: {', '.join(sorted(self._entries))}"
            ) from None

    def __contains__(self, name: object) -> bool:
        self._load()
        return name in self._entries

    def __iter__(self) -> Iterator[str]:
        return iter(self.names())

    def __len__(self) -> int:
        self._load()
        return len(self._entries)

    def names(self) -> list[str]:
        self._load()
        return sorted(self._entries)

    def make(self, name: str, /, **params: Any) -> Any:
        """Build entry ``name`` from keyword parameters spelled as RunSpec keys.

        Parameters the entry's constructor does not take are dropped when they are
        ``passthrough`` keys (so the round loop can pass one dict of knobs to every rule); any
        other unknown keyword is an error, so a misspelt knob never passes silently.
        """
        entry = self[name]
        signature = inspect.signature(entry)
        accepts_any = any(p.kind is p.VAR_KEYWORD for p in signature.parameters.values())
        taken: dict[str, Any] = {}
        for key, value in params.items():
            if accepts_any or key in signature.parameters:
                taken[key] = value
            elif key not in self.passthrough:
                allowed = [k for k in signature.parameters if k != "self"]
                raise SpecError(
                    f"{self.concept} {name!r} takes no parameter {key!r}; allowed: "
                    f"{', '.join(allowed) or 'none'}"
                )
        return entry(**taken)


