"""One small registry class shared by every concept that is chosen by name (rules, attacks,
algorithms, datasets, models), so a new entry is one class plus one ``@REGISTRY.register`` line
and its name is usable from YAML and the CLI at once. A plugin registers the same way
(`robusttune.core.plugins`); the registry remembers where each entry came from."""

from __future__ import annotations

import contextlib
import importlib
import inspect
import threading
from collections.abc import Callable, Iterator
from typing import Any, Generic, TypeVar

T = TypeVar("T", bound=Callable[..., Any])  # an entry: a class or a function that builds one

BUILT_IN = "built-in"


class SpecError(ValueError):
    """A bad configuration value. Its message is one line that names the key and the allowed
    values; the CLI prints it and exits with status 2."""


# Keywords that are not RunSpec keys but that builders may be given by the round loop.
CONTEXT_KEYS = frozenset({"f", "n_byzantine", "n_total", "num_classes", "device"})

# The tool's registries (robusttune.core.registries fills it), so the knobs of plugin entries
# can be gathered across concepts.
_REGISTRIES: list[Registry[Any]] = []
# The plugin whose import is registering entries now (set by robusttune.core.plugins).
_source = threading.local()
# Bumped by every registration: what is derived from all entries is cached per version.
_version = 0
_derived: dict[str, tuple[int, Any]] = {}


@contextlib.contextmanager
def registering_from(source: str) -> Iterator[None]:
    """Entries registered inside the block are recorded as coming from ``source`` (a plugin's
    name as the user wrote it)."""
    previous = getattr(_source, "name", None)
    _source.name = source
    try:
        yield
    finally:
        _source.name = previous


def _source_of(entry: Any) -> str:
    module = getattr(entry, "__module__", "") or ""
    if module == "robusttune" or module.startswith("robusttune."):
        return BUILT_IN  # even when a plugin's import is what brought the built-ins in
    name = getattr(_source, "name", None)
    return module if name is None else name


class Registry(Generic[T]):
    """Maps a lower-case name to a class (or factory) of one concept.

    ``passthrough``: keywords ``make`` may be handed that an entry need not take (the RunSpec
    keys, so one dict of knobs serves every rule); they are dropped for entries that do not take
    them, where any other unknown keyword is an error. ``builtins``: the module whose import
    registers the built-in entries (at the first lookup). ``base``: ``"module:Class"`` every
    entry from outside the package must subclass (None: any callable). ``standard``: the
    parameters the tool itself passes to an entry (a model's input_shape), which are therefore
    not knobs of the entry's own."""

    # called once after the first registry has its built-ins (robusttune.core.registries loads
    # every registry's built-ins, then the installed packages' plugins)
    after_builtins: Callable[[], None] | None = None

    def __init__(
        self,
        concept: str,
        passthrough: frozenset[str] = frozenset(),
        builtins: str | None = None,
        base: str | None = None,
        standard: frozenset[str] = frozenset(),
    ) -> None:
        self.concept = concept
        self.passthrough = frozenset(passthrough) | CONTEXT_KEYS
        self.builtins = builtins
        self.base = base
        self.standard = frozenset(standard)
        self._entries: dict[str, T] = {}
        self._sources: dict[str, str] = {}
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
        if Registry.after_builtins is not None:
            Registry.after_builtins()

    def register(self, name: str, **attributes: Any) -> Callable[[T], T]:
        """``@REGISTRY.register("name", key=value ...)``: the entry gets ``name`` and every
        attribute given (what is keyed by its name, e.g. a dataset's defaults, lives on it).

        A name taken by another entry is a `SpecError` naming both origins; the same class
        registered again under its name (a notebook cell run twice) replaces itself. An entry
        from outside the package must be a subclass of the registry's ``base``."""

        def decorate(entry: T) -> T:
            source = _source_of(entry)
            known = self._entries.get(name)
            if known is not None and not _same_definition(known, entry):
                raise SpecError(
                    f"{self.concept} {name!r} from {source} clashes with the "
                    f"{self._sources[name]} {self.concept} of that name; allowed: "
                    f"a name not in use ({', '.join(sorted(self._entries))})"
                )
            if source != BUILT_IN:
                self._check_kind(name, entry, source)
            global _version  # noqa: PLW0603 - counts registrations process-wide (caches key on it)
            self._entries[name] = entry
            self._sources[name] = source
            _version += 1
            for key, value in {"name": name, **attributes}.items():
                with contextlib.suppress(AttributeError, TypeError):
                    setattr(entry, key, value)
            return entry

        return decorate

    def _check_kind(self, name: str, entry: Any, source: str) -> None:
        if self.base is None:
            if not callable(entry):
                raise SpecError(
                    f"{self.concept} {name!r} from {source} is a "
                    f"{type(entry).__name__}, not a callable"
                )
            return
        module, _, attribute = self.base.partition(":")
        base = getattr(importlib.import_module(module), attribute)
        if not (isinstance(entry, type) and issubclass(entry, base)):
            what = entry.__name__ if isinstance(entry, type) else type(entry).__name__
            # named where plugins import it from, not where it lives (which may move)
            raise SpecError(
                f"{self.concept} {name!r} from {source}: {what} is not a subclass "
                f"of {attribute}; allowed: a subclass of it (from robusttune.plugin "
                f"import {attribute})"
            )

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

    def source(self, name: str) -> str:
        """Where entry ``name`` came from: ``built-in`` or the plugin that registered it."""
        self[name]
        return self._sources[name]

    def own_parameters(self, name: str) -> dict[str, inspect.Parameter]:
        """The knobs of entry ``name`` that are its own: the parameters of its constructor (or
        factory) that are neither RunSpec keys, nor context the round loop passes, nor what the
        tool passes every entry of the concept (``standard``). Empty for built-in entries,
        whose knobs are all RunSpec keys."""
        entry = self[name]
        if self._sources[name] == BUILT_IN:
            return {}
        try:
            parameters = inspect.signature(entry, eval_str=True).parameters
        except (NameError, SyntaxError, AttributeError):
            # an annotation that names what the module cannot resolve: taken as any value
            parameters = inspect.signature(entry).parameters
        except (TypeError, ValueError):
            return {}
        return {
            key: parameter
            for key, parameter in parameters.items()
            if key not in self.passthrough
            and key not in self.standard
            and key != "self"
            and parameter.kind not in (parameter.VAR_POSITIONAL, parameter.VAR_KEYWORD)
        }

    def takes(self, name: str, key: str) -> bool:
        """Whether entry ``name``'s constructor takes keyword ``key``."""
        try:
            parameters = inspect.signature(self[name]).parameters
        except (TypeError, ValueError):
            return False
        return key in parameters or any(p.kind is p.VAR_KEYWORD for p in parameters.values())

    def make(self, name: str, /, **params: Any) -> Any:
        """Build entry ``name`` from keyword parameters spelled as RunSpec keys.

        Parameters the entry's constructor does not take are dropped when they are
        ``passthrough`` keys or a plugin entry's own knob (so the round loop can pass one dict
        of knobs to every rule); any other unknown keyword is an error, so a misspelt knob never
        passes silently.
        """
        entry = self[name]
        signature = inspect.signature(entry)
        accepts_any = any(p.kind is p.VAR_KEYWORD for p in signature.parameters.values())
        taken: dict[str, Any] = {}
        for key, value in params.items():
            if accepts_any or key in signature.parameters:
                taken[key] = value
            elif key not in self.passthrough and key not in plugin_keys():
                allowed = [k for k in signature.parameters if k != "self"]
                raise SpecError(
                    f"{self.concept} {name!r} takes no parameter {key!r}; allowed: "
                    f"{', '.join(allowed) or 'none'}"
                )
        return entry(**taken)


def _same_definition(known: Any, entry: Any) -> bool:
    """The same class or function defined again (a re-run notebook cell, a re-imported file)."""
    return known is entry or (
        getattr(known, "__module__", None) == getattr(entry, "__module__", None)
        and getattr(known, "__qualname__", None) == getattr(entry, "__qualname__", None)
    )


def plugin_parameters() -> dict[str, list[tuple[Registry[Any], str, inspect.Parameter]]]:
    """Every plugin entry's own knob: key -> [(registry, entry name, parameter) ...]."""
    for registry in _REGISTRIES:
        registry._load()
    cached = _derived.get("parameters")
    if cached is not None and cached[0] == _version:
        return cached[1]
    found: dict[str, list[tuple[Registry[Any], str, inspect.Parameter]]] = {}
    for registry in _REGISTRIES:
        for name in registry.names():
            for key, parameter in registry.own_parameters(name).items():
                found.setdefault(key, []).append((registry, name, parameter))
    _derived["parameters"] = (_version, found)
    return found


def plugin_keys() -> frozenset[str]:
    """The names of every plugin entry's own knobs (valid run keys beside the RunSpec's)."""
    return frozenset(plugin_parameters())
