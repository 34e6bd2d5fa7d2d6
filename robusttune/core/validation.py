"""Checked values and the tool's one-line errors: the value types a configuration's keys use
(a number that is not a boolean, a finite float, an optional integer that may be spelt ``none``),
`Checked` (a frozen model that fails with one line) and the adapter that turns pydantic's first
error into one `SpecError` line naming the key, what is allowed and the value (``clients must be
an integer >= 1; got 0``), which the run schema (`robusttune.core.schema`), the sweep layer's
file schema and the small typed sections share."""

from __future__ import annotations

import functools
import re
from collections.abc import Mapping, Sequence
from types import UnionType
from typing import Annotated, Any, ClassVar, Union, get_args, get_origin

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, TypeAdapter, ValidationError
from pydantic.fields import FieldInfo

from robusttune.core.registry import SpecError

__all__ = [
    "Checked",
    "Finite",
    "Int",
    "KeyedError",
    "Number",
    "OptionalStr",
    "check_model",
    "check_value",
    "dotted",
    "optional_finite",
    "optional_int",
    "spec_error",
]


def _not_bool(value: Any) -> Any:
    # YAML's `yes` is True, and True is an int to Python: a number key given a boolean is a typo
    if isinstance(value, bool):
        raise ValueError("must be a number, not true/false")
    return value


def _none_word(value: Any) -> Any:
    # `--set sample_size=none` arrives as the string "none"
    if isinstance(value, str) and value.strip().lower() in ("none", "null", "~"):
        return None
    return value


Number = BeforeValidator(_not_bool)
NoneWord = BeforeValidator(_none_word)
Int = Annotated[int, Number]
Finite = Annotated[float, Number, Field(allow_inf_nan=False)]
OptionalStr = Annotated[str | None, NoneWord]


def optional_int(**bounds: Any) -> Any:
    """An integer within ``bounds`` (pydantic's ge/gt/le/lt), or None (also spelt none/null)."""
    return Annotated[Annotated[int, Number, Field(**bounds)] | None, NoneWord]


def optional_finite(**bounds: Any) -> Any:
    """A finite number within ``bounds``, or None (also spelt none/null)."""
    return Annotated[
        Annotated[float, Number, Field(allow_inf_nan=False, **bounds)] | None, NoneWord
    ]


class Checked(BaseModel):
    """A frozen pydantic model whose construction fails with one SpecError line, not a
    ValidationError: the base of the tool's small typed configurations (a deployment to
    calibrate, a breakdown plan's section)."""

    model_config = ConfigDict(frozen=True, extra="forbid")
    # the dotted prefix its keys are named under in messages (e.g. "breakdown" -> breakdown.budget)
    section: ClassVar[str] = ""

    def __init__(self, **values: Any) -> None:
        try:
            super().__init__(**values)
        except ValidationError as error:
            raise spec_error(error, model=type(self), section=self.section) from None


class KeyedError(ValueError):
    """A check inside a model that names the key at fault, relative to the model it runs in
    (``("step",)``, ``("grid", 0, "beta")``; empty: the model itself), and the value found there.
    `spec_error` prints ``KEY MESSAGE; got VALUE`` (without ``; got`` when no value is given)."""

    def __init__(self, message: str, *, key: str | tuple[str | int, ...] = (), value: Any = ...):
        super().__init__(message)
        self.key: tuple[str | int, ...] = (key,) if isinstance(key, str) else tuple(key)
        self.value = value


def dotted(loc: Sequence[str | int]) -> str:
    """A location as the user spells it: ``space.threat.grid[0].beta``."""
    text = ""
    for part in loc:
        text += f"[{part}]" if isinstance(part, int) else (f".{part}" if text else str(part))
    return text


def check_model(model: type[BaseModel], values: Any, *, where: str = "") -> Any:
    """``model.model_validate(values)``, its first error as one SpecError line."""
    try:
        return model.model_validate(values)
    except ValidationError as error:
        raise spec_error(error, where, model) from None


def spec_error(
    error: ValidationError, where: str = "", model: type[BaseModel] | None = None, section: str = ""
) -> SpecError:
    """One line from pydantic's first error: the key (dotted path, under ``section`` when the
    model is one section of a file), what is allowed, the value. ``where`` (a file name)
    prefixes the line; ``model`` (the one validated) names the allowed keys of an unknown one
    and tells an integer key from a real one, also in nested models."""
    first = error.errors(include_url=False)[0]
    loc = tuple(first["loc"])
    head: tuple[str, ...] = (section,) if section else ()

    def shown(parts: tuple[Any, ...]) -> str:
        return dotted(head + tuple(parts))

    prefix = f"{where}: " if where else ""
    if first["type"] == "extra_forbidden":
        owner = _model_at(model, loc[:-1])
        fields = _keys_of(owner) if owner is not None else []
        listed = f"; allowed keys: {', '.join(sorted(fields))}" if fields else ""
        return SpecError(f"{prefix}unknown key {shown(loc)!r}{listed}")
    if first["type"] == "value_error":
        cause = first.get("ctx", {}).get("error")
        message = str(cause if cause is not None else first["msg"]).removeprefix("Value error, ")
        value = first.get("input")
        if isinstance(cause, KeyedError):
            loc += cause.key
            if cause.value is ...:
                return SpecError(f"{prefix}{shown(loc)} {message}")
            value = cause.value
        if not loc:  # a check across keys words its own line
            return SpecError(prefix + message)
        return SpecError(f"{prefix}{shown(loc)} {message}; got {value!r}")
    if first["type"] == "invalid_key" or loc[-1:] == ("[key]",):  # a mapping's key, not a value
        parent = loc[:-1] if first["type"] == "invalid_key" else loc[:-2]
        what = f"{shown(parent)} key" if parent else "key"
        return SpecError(f"{prefix}{what} {first.get('input')!r} must be text")
    field = _field_at(model, loc)
    return SpecError(
        f"{prefix}{shown(loc) or 'value'} must be {_allowed(first, field)}; "
        f"got {first.get('input')!r}"
    )


def _walk(model: type[BaseModel] | None, loc: Sequence[str | int]) -> tuple[Any, Any]:
    """(annotation, field) found at ``loc`` below ``model``: through nested models (by field
    name or alias), the values of dicts and the items of lists and tuples. Inside a container
    the field is the item's (its bounds), built from the item's annotation."""
    annotation: Any = model
    field: Any = None
    for part in loc:
        annotation = _unwrap(annotation)
        if isinstance(annotation, type) and issubclass(annotation, BaseModel):
            field = next(
                (f for name, f in annotation.model_fields.items() if part in (name, f.alias)), None
            )
            if field is None:
                return None, None
            annotation = field.annotation
            continue
        origin, arguments = get_origin(annotation), get_args(annotation)
        if origin is dict and len(arguments) == 2:
            annotation = arguments[1]
        elif origin in (list, tuple, set, frozenset) and arguments:
            fixed = origin is tuple and Ellipsis not in arguments
            if fixed and isinstance(part, int) and part < len(arguments):
                annotation = arguments[part]
            else:
                annotation = arguments[0]
        else:
            return None, None
        field = FieldInfo.from_annotation(annotation)
        annotation = field.annotation
    return annotation, field


def _unwrap(annotation: Any) -> Any:
    """The type inside Annotated[...] and Optional[...]."""
    while True:
        if get_origin(annotation) is Annotated:
            annotation = get_args(annotation)[0]
            continue
        arguments = [a for a in get_args(annotation) if a is not type(None)]
        if get_origin(annotation) in (Union, UnionType) and len(arguments) == 1:
            annotation = arguments[0]
            continue
        return annotation


def _model_at(model: type[BaseModel] | None, loc: Sequence[str | int]) -> type[BaseModel] | None:
    annotation = _unwrap(_walk(model, loc)[0])
    return (
        annotation if isinstance(annotation, type) and issubclass(annotation, BaseModel) else None
    )


def _field_at(model: type[BaseModel] | None, loc: Sequence[str | int]) -> Any:
    return _walk(model, loc)[1] if loc else None


def _keys_of(model: type[BaseModel]) -> list[str]:
    """The keys a model takes, as the user writes them (aliases where set)."""
    return [f.alias or name for name, f in model.model_fields.items()]


def _constraints(field: Any) -> tuple[str, dict[str, float]]:
    """(number kind, bounds) of a field, looking inside Optional[Annotated[...]]."""
    bounds: dict[str, float] = {}
    kind = "number"

    def visit(annotation: Any, metadata: list[Any]) -> None:
        nonlocal kind
        for item in metadata:
            for name in ("ge", "gt", "le", "lt"):
                if getattr(item, name, None) is not None:
                    bounds[name] = getattr(item, name)
            if hasattr(item, "metadata") and isinstance(item.metadata, list):
                visit(None, item.metadata)
        if annotation is int:
            kind = "integer"
        for argument in get_args(annotation):
            if get_origin(argument) is Annotated:
                inner, *extra = get_args(argument)
                visit(inner, extra)
            elif argument is int:
                kind = "integer"

    if field is not None:
        visit(field.annotation, list(field.metadata))
    return kind, bounds


def _allowed(first: Mapping[str, Any], field: Any) -> str:
    kind, ctx = first["type"], first.get("ctx", {})
    if kind in ("greater_than_equal", "greater_than", "less_than_equal", "less_than"):
        number, bounds = _constraints(field)
        low = (
            f"[{bounds['ge']:g}"
            if "ge" in bounds
            else f"({bounds['gt']:g}"
            if "gt" in bounds
            else None
        )
        high = (
            f"{bounds['le']:g}]"
            if "le" in bounds
            else f"{bounds['lt']:g})"
            if "lt" in bounds
            else None
        )
        if low and high:
            return f"{'an integer' if number == 'integer' else 'a number'} in {low}, {high}"
        sign = {
            "greater_than_equal": ">=",
            "greater_than": ">",
            "less_than_equal": "<=",
            "less_than": "<",
        }[kind]
        limit = next(iter(ctx.values()))
        return f"{'an integer' if number == 'integer' else 'a number'} {sign} {limit:g}"
    if kind == "literal_error":
        return "one of " + ", ".join(re.findall(r"'([^']*)'", ctx.get("expected", "")))
    if kind.startswith("int"):
        return "an integer"
    if kind.startswith("float") or kind == "finite_number":
        return "a finite number"
    if kind.startswith("bool"):
        return "true or false"
    if kind.startswith("string"):
        return "text"
    if kind == "missing":
        return "set"
    if kind in ("dict_type", "model_type", "model_attributes_type"):
        return "a mapping"
    if kind in ("list_type", "tuple_type"):
        return "a list"
    if kind in ("too_short", "too_long"):
        count = ctx.get("min_length" if kind == "too_short" else "max_length", 0)
        what = ("a mapping", "key") if ctx.get("field_type") == "Dictionary" else ("a list", "item")
        return (
            f"{what[0]} of at {'least' if kind == 'too_short' else 'most'} {count} "
            f"{what[1]}{'' if count == 1 else 's'}"
        )
    return first["msg"].lower()


@functools.cache
def _adapter(annotation: Any) -> TypeAdapter[Any]:
    return TypeAdapter(annotation)


def check_value(key: str, value: Any, annotation: Any) -> Any:
    """``value`` validated (and coerced) as ``annotation`` (a type with pydantic metadata), or
    one SpecError line naming ``key``: for the parameters of a rule built on its own."""
    try:
        return _adapter(annotation).validate_python(value)
    except ValidationError as error:
        first = error.errors(include_url=False)[0]
        if first["type"] == "value_error":
            message = str(first.get("ctx", {}).get("error", first["msg"])).removeprefix(
                "Value error, "
            )
            raise SpecError(f"{key} {message}; got {value!r}") from None
        field = FieldInfo.from_annotation(annotation)
        raise SpecError(f"{key} must be {_allowed(first, field)}; got {value!r}") from None
