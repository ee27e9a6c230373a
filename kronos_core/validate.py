"""One validator for config mappings: unknown keys and value types, checked against real annotations.

Every problem is one line: where (a file or a source), the dotted key, what it
must be, what it got, and what to write instead::

    run.toml: batch_size must be an integer (got string '8'); write a whole number, e.g. batch_size = 50
    run.toml: unknown config key 'bach_size' (did you mean 'batch_size'?); ...

Annotations understood: int, float (an int is accepted and becomes a float),
bool (never an int, and an int field never takes a bool), str, X | None and
Optional[X], Literal[...], tuple[X, Y] and tuple[X, ...], list[X], dict, and
nested dataclasses (a table, checked field by field).
"""

from __future__ import annotations

import dataclasses
import difflib
import functools
import types
import typing
from collections.abc import Iterable, Mapping
from typing import Any, Literal, Union

from kronos_core.errors import KronosError

NO_EXAMPLE: Any = object()
_COUNTS = {1: "one", 2: "two", 3: "three", 4: "four"}


def given(value: Any) -> str:
    """What a value is, in the words of a TOML file: `string '8'`, `float 8.5`, `boolean True`."""
    if isinstance(value, bool):
        kind = "boolean"
    elif isinstance(value, int):
        kind = "integer"
    elif isinstance(value, float):
        kind = "float"
    elif isinstance(value, str):
        kind = "string"
    elif isinstance(value, Mapping):
        return "a table"
    elif isinstance(value, (list, tuple)):
        kind = "array"
    elif value is None:
        return "nothing"
    else:
        kind = type(value).__name__
    return f"{kind} {value!r}"


def _optional_parts(annotation: Any) -> tuple[Any, bool]:
    """(the annotation without None, whether None is allowed)."""
    if typing.get_origin(annotation) in (Union, types.UnionType):
        members = [a for a in typing.get_args(annotation) if a is not type(None)]
        allows_none = len(members) < len(typing.get_args(annotation))
        inner = members[0] if len(members) == 1 else Union[tuple(members)]  # noqa: UP007 - built at runtime
        return inner, allows_none
    return annotation, False


def describe(annotation: Any) -> str:
    """What a value of `annotation` is, for a message: 'an integer', 'a list of two numbers', ..."""
    inner, allows_none = _optional_parts(annotation)
    text = _describe(inner)
    return f"{text} or left out" if allows_none else text


def _describe(annotation: Any) -> str:
    origin, args = typing.get_origin(annotation), typing.get_args(annotation)
    if annotation is Any:
        return "any value"
    if annotation is bool:
        return "true or false"
    if annotation is int:
        return "an integer"
    if annotation is float:
        return "a number"
    if annotation is str:
        return "a string"
    if origin is Literal:
        return "one of " + ", ".join(repr(a) for a in args)
    if origin in (Union, types.UnionType):
        return " or ".join(_describe(a) for a in args)
    if origin is tuple:
        if len(args) == 2 and args[1] is Ellipsis:
            return f"a list of {_plural(args[0])}"
        if args and all(a == args[0] for a in args):
            return f"a list of {_COUNTS.get(len(args), len(args))} {_plural(args[0])}"
        return "a list of " + ", ".join(_describe(a) for a in args)
    if origin in (list, set, frozenset) or annotation in (list, tuple):
        return f"a list of {_plural(args[0])}" if args else "a list"
    if origin is dict or annotation is dict or dataclasses.is_dataclass(annotation):
        return "a table"
    return f"a {getattr(annotation, '__name__', str(annotation))}"


def _plural(annotation: Any) -> str:
    words = {int: "integers", float: "numbers", str: "strings", bool: "booleans"}
    return words.get(annotation, f"values ({_describe(annotation)})")


class _Mismatch(Exception):
    """Raised inside `_convert` when a value does not fit; carries nothing (the caller writes the message)."""


_SCALARS: dict[Any, tuple[type, ...]] = {bool: (bool,), int: (int,), float: (int, float), str: (str,)}


def _convert(value: Any, annotation: Any) -> Any:
    """`value` as `annotation` wants it (int -> float, list -> tuple), or _Mismatch."""
    origin, args = typing.get_origin(annotation), typing.get_args(annotation)
    if annotation is Any:
        return value
    if origin in (Union, types.UnionType):
        if value is None and type(None) in args:
            return None
        for member in args:
            if member is type(None):
                continue
            try:
                return _convert(value, member)
            except _Mismatch:
                continue
        raise _Mismatch
    if annotation in _SCALARS:
        # bool is an int subclass, but True is not a batch size: only a bool annotation takes a bool.
        if isinstance(value, _SCALARS[annotation]) and (annotation is bool or not isinstance(value, bool)):
            return float(value) if annotation is float else value
        raise _Mismatch
    if origin is Literal:
        if any(value == a and type(value) is type(a) for a in args):
            return value
        raise _Mismatch
    if origin is tuple or annotation is tuple:
        if not isinstance(value, (list, tuple)):
            raise _Mismatch
        if not args:
            return tuple(value)
        if len(args) == 2 and args[1] is Ellipsis:
            return tuple(_convert(v, args[0]) for v in value)
        if len(value) != len(args):
            raise _Mismatch
        return tuple(_convert(v, a) for v, a in zip(value, args))
    if origin is list or annotation is list:
        if not isinstance(value, (list, tuple)):
            raise _Mismatch
        return [_convert(v, args[0]) for v in value] if args else list(value)
    if origin is dict or annotation is dict:
        if not isinstance(value, Mapping):
            raise _Mismatch
        return dict(value)
    if dataclasses.is_dataclass(annotation):
        if not isinstance(value, (Mapping, annotation)):
            raise _Mismatch
        return value
    if isinstance(annotation, type):
        if isinstance(value, annotation):
            return value
        raise _Mismatch
    return value  # an annotation this validator does not know: accepted as is


def _fix(key: str, annotation: Any, example: Any) -> str:
    inner, allows_none = _optional_parts(annotation)
    leaf = key.rsplit(".", 1)[-1]
    if dataclasses.is_dataclass(inner) or inner is dict or typing.get_origin(inner) is dict:
        return f"write it as a [{key}] table"
    if example is NO_EXAMPLE or example is None:
        example = _example(inner)
    text = f"write it like {leaf} = {_toml(example)}"
    if inner is int:
        text = f"write a whole number, e.g. {leaf} = {_toml(example)}"
    elif inner is float:
        text = f"write it without quotes, e.g. {leaf} = {_toml(example)}"
    elif inner is bool:
        text = f"write {leaf} = true or {leaf} = false"
    elif inner is str:
        text = f"write it in quotes, e.g. {leaf} = {_toml(example)}"
    elif typing.get_origin(inner) is Literal:
        text = "use one of " + ", ".join(_toml(a) for a in typing.get_args(inner))
    return text + (" (or leave it out)" if allows_none else "")


def _example(annotation: Any) -> Any:
    origin, args = typing.get_origin(annotation), typing.get_args(annotation)
    samples = {int: 1, float: 1.0, bool: True, str: "..."}
    if annotation in samples:
        return samples[annotation]
    if origin is Literal:
        return args[0]
    if origin is tuple and args and args[-1] is not Ellipsis:
        return [_example(a) for a in args]
    if origin in (list, tuple):
        return [_example(args[0])] if args else []
    return "..."


def _toml(value: Any) -> str:
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, str):
        return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(_toml(v) for v in value) + "]"
    return repr(value)


def check_value(key: str, value: Any, annotation: Any, *, where: str, example: Any = NO_EXAMPLE,
                error: type[KronosError] = KronosError) -> Any:
    """`value` converted to `annotation` (int -> float, list -> tuple), or `error` naming the key, what it must be,
    what it got and what to write (with `example`, else a made-up one)."""
    try:
        return _convert(value, annotation)
    except _Mismatch:
        problem = f"{key} must be {describe(annotation)} (got {given(value)})"
        raise error(f"{where}: {problem}; {_fix(key, annotation, example)}") from None


def check_known_keys(keys: Iterable[str], allowed: Iterable[str], *, where: str, prefix: str = "",
                     noun: str = "key", fix: str | None = None, error: type[KronosError] = KronosError) -> None:
    """Keys not in `allowed` -> `error` naming each (with the closest allowed key, if one is close)."""
    allowed = list(allowed)
    unknown = [str(key) for key in keys if key not in allowed]
    if not unknown:
        return
    hints = []
    for key in unknown:
        close = difflib.get_close_matches(key, allowed, n=1, cutoff=0.6)
        hints.append(f"'{prefix}{key}' (did you mean '{prefix}{close[0]}'?)" if close else f"'{prefix}{key}'")
    fix = fix or f"remove {'it' if len(unknown) == 1 else 'them'} (valid keys: {', '.join(allowed)})"
    plural = "s" if len(unknown) > 1 else ""
    raise error(f"{where}: unknown {noun}{plural} {', '.join(hints)}; {fix}")


@functools.cache
def field_types(cls: type) -> dict[str, Any]:
    """A dataclass's field annotations, resolved (string annotations from `from __future__ import annotations`)."""
    hints = typing.get_type_hints(cls)
    return {spec.name: hints[spec.name] for spec in dataclasses.fields(cls)}


def check_fields(values: Mapping[str, Any], cls: type, *, where: str, prefix: str = "",
                 examples: Mapping[str, Any] | None = None, error: type[KronosError] = KronosError) -> dict[str, Any]:
    """`values` checked against the fields of dataclass `cls`: no unknown keys, each value of its field's type
    (nested dataclasses are tables, checked the same way). Returns the converted values; missing keys are not
    an error here (the dataclass's defaults, or its own checks, decide)."""
    hints = field_types(cls)
    check_known_keys(values, hints, where=where, prefix=prefix, error=error)
    out: dict[str, Any] = {}
    for key, value in values.items():
        annotation = hints[key]
        example = (examples or {}).get(key, NO_EXAMPLE)
        converted = check_value(prefix + key, value, annotation, where=where, example=example, error=error)
        inner, _ = _optional_parts(annotation)
        if dataclasses.is_dataclass(inner) and isinstance(converted, Mapping):
            converted = check_fields(converted, inner, where=where, prefix=f"{prefix}{key}.", error=error)
        out[key] = converted
    return out
