"""Checking settings read from plans and flags, before anything is measured.

Field validation is driven by each dataclass's own type hints, plus an optional range in the field's
metadata (``{"min": x}``, ``{"above": x}``, ``{"max": x}``; for a tuple it applies to each item), so a
field added later is checked without anyone writing a check for it. Every message names the field,
the value and what is allowed.
"""

from __future__ import annotations

import types
import typing
from dataclasses import fields
from pathlib import Path
from typing import Any, Literal


class PlanError(ValueError):
    pass


class FieldError(PlanError):
    """A field's value is not allowed: ``{field} {rule}``; ``renamed`` says it of the field as the user spelled it."""

    def __init__(self, field: str, rule: str):
        super().__init__(f"{field} {rule}")
        self.field = field
        self.rule = rule

    def renamed(self, name: str) -> FieldError:
        return FieldError(name, self.rule)


def describe(hint: Any) -> str:
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if hint is bool:
        return "true or false"
    if hint is int:
        return "a whole number"
    if hint is float:
        return "a number"
    if hint is str:
        return "a string"
    if hint is Path:
        return "a path"
    if hint is type(None):
        return "absent"
    if origin is Literal:
        return "one of " + ", ".join(repr(a) for a in args)
    if origin in (types.UnionType, typing.Union):
        return " or ".join(describe(a) for a in args if a is not type(None))
    if origin is tuple:
        plural = {int: "whole numbers", float: "numbers", str: "strings", bool: "true/false values"}
        return f"a list of {plural.get(args[0], describe(args[0]) + ' values')}"
    return f"a {getattr(hint, '__name__', hint)}"


class _Mismatch(Exception):
    pass


def _coerce(hint: Any, value: Any) -> Any:
    """``value`` as ``hint`` asks (a TOML int where a float is wanted, a list where a tuple is), or _Mismatch."""
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if hint is Any:
        return value
    if hint is bool:
        if isinstance(value, bool):
            return value
    elif hint is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
    elif hint is float:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value)
    elif hint is Path:
        if isinstance(value, (str, Path)):
            return Path(value)
    elif hint is type(None):
        if value is None:
            return None
    elif origin is Literal:
        if value in args:
            return value
    elif origin in (types.UnionType, typing.Union):
        for arg in args:
            try:
                return _coerce(arg, value)
            except _Mismatch:
                pass
    elif origin is tuple:
        if isinstance(value, (list, tuple)):  # a TOML array, or a tuple given in code
            return tuple(_coerce(args[0], v) for v in value)
    elif origin in (list, dict, set, frozenset):  # containers are checked as a whole, their items by the owner
        if isinstance(value, origin):
            return value
    elif isinstance(hint, type):
        if isinstance(value, hint):
            return value
    else:
        return value  # a type hint this checker does not know: left to the field's own code
    raise _Mismatch


def _bounds(meta: Any) -> str:
    words = {"min": "at least", "above": "above", "max": "at most"}
    return ", ".join(f"{words[k]} {meta[k]}" for k in words if k in meta)


def _out_of_range(value: Any, meta: Any) -> str | None:
    items = value if isinstance(value, tuple) else (value,)
    for item in items:
        if not isinstance(item, (int, float)) or isinstance(item, bool):
            continue
        if ("min" in meta and item < meta["min"]) or ("above" in meta and item <= meta["above"]) \
                or ("max" in meta and item > meta["max"]):
            return _bounds(meta)
    return None


def check_fields(obj: Any) -> None:
    """Check (and normalise in place) every field of a frozen dataclass against its type hint and range;
    the message names the field, the value and what is allowed."""
    hints = typing.get_type_hints(type(obj))
    for f in fields(obj):
        value = getattr(obj, f.name)
        try:
            normalised = _coerce(hints[f.name], value)
        except _Mismatch:
            bounds = _bounds(f.metadata)
            raise FieldError(f.name, f"must be {describe(hints[f.name])}{f' ({bounds})' if bounds else ''}, "
                                     f"not {value!r}") from None
        allowed = _out_of_range(normalised, f.metadata)
        if allowed is not None:
            shown = f"{value!r}" if not isinstance(value, (list, tuple)) else f"{list(value)!r}"
            each = " (each)" if isinstance(normalised, tuple) else ""
            raise FieldError(f.name, f"must be {allowed}{each}, not {shown}")
        object.__setattr__(obj, f.name, normalised)


def check_keys(where: str, given: dict[str, Any], allowed: set[str]) -> None:
    unknown = sorted(set(given) - allowed)
    if unknown:
        raise PlanError(f"{where}: unknown key(s) {', '.join(unknown)}; allowed: {', '.join(sorted(allowed))}")
