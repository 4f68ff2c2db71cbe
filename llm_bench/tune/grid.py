"""Axes over a base preset, expanded into named candidate presets.

An axis varies one llama-server key (``spec-draft-n-max = [2, 4]``), several keys together
(``"cache-type-k+cache-type-v" = ["f16", "q8_0"]`` sets both to each value), or whole groups of
settings (``spec = [{ name = "none", spec-type = "none" }, { name = "self", spec-type = "draft-simple",
model-draft = "..." }]``; ``name`` is the value's label in preset names). The first value of every
axis makes the control (the plain preset the others are compared with), so list the plain value first.

Speculation-only keys are dropped from a candidate that does not speculate, and candidates that
end up with the same settings are kept once: a draft depth means nothing without a drafter.
"""

from __future__ import annotations

import itertools
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import PurePath
from typing import Any

from llm_bench.preset_args import settings_speculate, settings_without_speculation

Value = str | int | float | bool
Settings = dict[str, Value]

NAME_KEY = "name"


class GridError(ValueError):
    pass


@dataclass(frozen=True)
class AxisValue:
    label: str
    settings: tuple[tuple[str, Value], ...]


@dataclass(frozen=True)
class Axis:
    name: str
    values: tuple[AxisValue, ...]


@dataclass(frozen=True)
class Candidate:
    name: str
    settings: tuple[tuple[str, Value], ...]  # the full preset: base, then the axis values
    labels: tuple[str, ...]  # one per axis

    @property
    def preset(self) -> Settings:
        return dict(self.settings)


def _check_value(where: str, value: Any) -> Value:
    if isinstance(value, (bool, int, float, str)):
        text = str(value)
        if any(c in text for c in "\n\r;#"):
            raise GridError(f"{where}: {value!r} contains a line break, ';' or '#', which a presets INI cannot hold")
        return value
    raise GridError(f"{where}: {value!r} is a {type(value).__name__}; a preset value is a string, number or boolean")


def _slug(value: Value) -> str:
    text = str(value).lower() if isinstance(value, bool) else str(value)
    if "/" in text:  # a model path: its file name is enough to tell values apart
        text = PurePath(text).stem
    return re.sub(r"[^A-Za-z0-9_.]+", "-", text).strip("-") or "x"


def parse_axis(name: str, values: Any) -> Axis:
    if not isinstance(values, Sequence) or isinstance(values, str) or not values:
        raise GridError(f"axis {name!r}: give a non-empty list of values, e.g. {name} = [\"a\", \"b\"]")
    parsed = []
    for i, value in enumerate(values):
        where = f"axis {name!r}, value {i + 1}"
        if isinstance(value, Mapping):
            settings = {k: _check_value(f"{where}, key {k!r}", v) for k, v in value.items() if k != NAME_KEY}
            if not settings:
                raise GridError(f"{where}: a table of settings needs at least one llama-server key")
            label = str(value.get(NAME_KEY) or "-".join(_slug(v) for v in settings.values()))
        else:
            keys = [k.strip() for k in name.split("+") if k.strip()]
            settings = {k: _check_value(where, value) for k in keys}
            label = _slug(value)
        for key in settings:
            if not re.fullmatch(r"[a-zA-Z_][a-zA-Z0-9_.-]*", key):
                raise GridError(f"{where}: {key!r} is not a llama-server key (write it without leading dashes)")
        parsed.append(AxisValue(_slug(label), tuple(settings.items())))
    labels = [v.label for v in parsed]
    if len(set(labels)) != len(labels):
        raise GridError(f"axis {name!r}: values must have distinct labels, got {', '.join(labels)} "
                        f"(give table values a `name`)")
    return Axis(name, tuple(parsed))


def effective(settings: Settings) -> Settings:
    """What a preset really asks for: speculation-only keys dropped when it does not speculate (the
    questions are preset_args's, which knows every spelling of a speculative key)."""
    if settings_speculate(settings):
        return settings
    return settings_without_speculation(settings)


def expand(prefix: str, base: Mapping[str, Value], axes: Sequence[Axis]) -> list[Candidate]:
    """Every combination of the axes over the base, the control (first values) first, duplicates once."""
    if not axes:
        raise GridError("no axes to vary: give at least one, e.g. --axis spec-draft-n-max=2,4")
    candidates: list[Candidate] = []
    seen: dict[tuple, str] = {}
    for combo in itertools.product(*(axis.values for axis in axes)):
        settings: Settings = dict(base)
        for value in combo:
            settings.update(value.settings)
        settings = effective(settings)
        key = tuple(sorted((k, str(v)) for k, v in settings.items()))
        if key in seen:
            continue
        # An axis whose settings were all dropped (a depth without a drafter) adds nothing to the name.
        labels = tuple(v.label for v in combo if any(k in settings for k, _ in v.settings))
        name = "-".join((prefix, *labels))
        seen[key] = name
        candidates.append(Candidate(name, tuple(settings.items()), labels))
    return candidates
