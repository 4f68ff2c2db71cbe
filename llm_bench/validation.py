"""Checking settings read from plans and flags, before anything is measured.

Field validation is driven by each dataclass's own type hints, plus an optional range in the field's
metadata (``{"min": x}``, ``{"above": x}``, ``{"max": x}``; for a tuple it applies to each item), so a
field added later is checked without anyone writing a check for it; pydantic does the checking. Every
message names the field, the value and what is allowed.
"""

from __future__ import annotations

import functools
import types
import typing
from dataclasses import fields
from pathlib import Path
from typing import Annotated, Any, Literal

import httpx
from annotated_types import Ge, Gt, Le
from pydantic import ConfigDict, Strict, TypeAdapter, ValidationError


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


# Where a plan's value may come as TOML gives it: a list for a tuple, a string for a path. Everything
# else is strict: true is no number, 1.5 or "3" no whole number; an int is taken where a number is wanted.
_FROM_TOML = Strict(False)
_RANGES = {"min": Ge, "above": Gt, "max": Le}
_RANGE_ERRORS = {"greater_than_equal", "greater_than", "less_than_equal"}


def _leaf(hint: Any) -> bool:
    """A hint pydantic checks here: scalars, paths, literals, and unions and tuples of them. A dataclass or a
    container of other things is checked as a whole: its own __post_init__ checks its fields."""
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin in (types.UnionType, typing.Union, tuple):
        return all(_leaf(a) for a in args if a is not Ellipsis)
    return origin is Literal or hint in (bool, int, float, str, Path, type(None))


def _schema(hint: Any, meta: tuple[tuple[str, Any], ...]) -> Any:
    """The hint as pydantic validates it, its range (``meta``) on every number in it."""
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin in (types.UnionType, typing.Union):
        return typing.Union[tuple(_schema(a, meta) for a in args)]
    if origin is tuple:
        return Annotated[tuple[_schema(args[0], meta), ...], _FROM_TOML]  # type: ignore[misc]
    if hint is Path:
        return Annotated[Path, _FROM_TOML]
    if hint in (int, float) and meta:
        return Annotated[hint, *(_RANGES[k](v) for k, v in meta)]
    return hint


@functools.cache
def _adapter(hint: Any, meta: tuple[tuple[str, Any], ...]) -> TypeAdapter[Any]:
    return TypeAdapter(_schema(hint, meta), config=ConfigDict(strict=True))


def _bounds(meta: Any) -> str:
    words = {"min": "at least", "above": "above", "max": "at most"}
    return ", ".join(f"{words[k]} {meta[k]}" for k in words if k in meta)


def _checked(name: str, hint: Any, value: Any, meta: Any) -> Any:
    """``value`` as ``hint`` and the field's range allow, normalised (a list as a tuple, an int as a float)."""
    if not _leaf(hint):
        whole = typing.get_origin(hint) or hint
        if hint is Any or not isinstance(whole, type) or isinstance(value, whole):
            return value
        raise FieldError(name, f"must be {describe(hint)}, not {value!r}")
    ranges = tuple((k, meta[k]) for k in _RANGES if k in meta)
    try:
        return _adapter(hint, ranges).validate_python(value)
    except ValidationError as e:
        if any(error["type"] in _RANGE_ERRORS for error in e.errors()):
            shown = f"{list(value)!r}" if isinstance(value, (list, tuple)) else f"{value!r}"
            each = " (each)" if typing.get_origin(hint) is tuple else ""
            raise FieldError(name, f"must be {_bounds(meta)}{each}, not {shown}") from None
        bounds = _bounds(meta)
        raise FieldError(name, f"must be {describe(hint)}{f' ({bounds})' if bounds else ''}, not {value!r}") from None


def url_problem(value: str, path_ok: bool = False) -> str | None:
    """What is wrong with a server URL (None: nothing): it must parse, be http:// or https:// and name a host.
    ``path_ok``: a path on the server itself ("/metrics") will do too."""
    if path_ok and value.startswith("/"):
        return None
    try:
        url = httpx.URL(value)
    except httpx.InvalidURL as e:
        return f"it does not parse: {e}"
    if url.scheme not in ("http", "https") or not url.host:
        return "it needs http:// or https:// and a host, e.g. http://127.0.0.1:48123"
    return None


def check_url(value: str | None, name: str, path_ok: bool = False) -> None:
    """A PlanError naming ``name`` (a plan key or a flag) and the value, for a URL no request could go to."""
    problem = None if value is None else url_problem(value, path_ok)
    if problem is not None:
        raise PlanError(f"{name} is not a usable URL: {value!r} ({problem})")


def check_fields(obj: Any) -> None:
    """Check (and normalise in place) every field of a frozen dataclass against its type hint and range
    (and, with ``{"url": "server"}`` or ``{"url": "server or path"}`` in its metadata, as a server URL);
    the message names the field, the value and what is allowed."""
    hints = typing.get_type_hints(type(obj))
    for f in fields(obj):
        value = _checked(f.name, hints[f.name], getattr(obj, f.name), f.metadata)
        if "url" in f.metadata:
            check_url(value, f.name, path_ok=f.metadata["url"] == "server or path")
        object.__setattr__(obj, f.name, value)


def check_keys(where: str, given: dict[str, Any], allowed: set[str]) -> None:
    unknown = sorted(set(given) - allowed)
    if unknown:
        raise PlanError(f"{where}: unknown key(s) {', '.join(unknown)}; allowed: {', '.join(sorted(allowed))}")
