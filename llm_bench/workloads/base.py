"""What a workload is: one registered object per workload module (the registry is ``__init__.py``).

A ``Workload`` names itself; declares its own settings, a frozen dataclass that plans give as the
``[protocol.<name>]`` table (``legacy``: the flat ``[protocol]`` keys plans and results used before,
still read); runs against a model the runner has loaded; names the ``workload`` of the records it
writes; sets its settings from the command line (``flags``); and says what it adds to the report:
its own tables, a column of the main table, marks beside the chart's bars, lines of the summary, a chart of
its own; and the part of a record only it writes (``part``), which it owns as a type of its own.
"""

from __future__ import annotations

import typing
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Generic, TypeVar

from llm_bench.engines import Engine
from llm_bench.results import AliasRecord
from llm_bench.tables import Cell, Row, Section, Table
from llm_bench.validation import FieldError

S = TypeVar("S")
Log = Callable[[str], None]


class RunParameters(typing.Protocol):
    """What a workload reads of the plan's protocol (``llm_bench.plan.Protocol``)."""

    @property
    def prompt(self) -> str: ...
    @property
    def max_tokens(self) -> int: ...
    @property
    def runs(self) -> int: ...
    @property
    def temperature(self) -> float: ...
    @property
    def seed(self) -> int: ...
    @property
    def prompt_cache(self) -> bool: ...
    @property
    def precision(self) -> float | None: ...
    @property
    def max_runs(self) -> int: ...
    @property
    def thinking(self) -> str:  # engines.stream.THINKING
        ...
    @property
    def settings(self) -> Mapping[str, Any]:  # workload name -> its settings
        ...


# Where a workload puts each record, sharing the base's provenance, as it finishes or is cut short (the
# runner's list for the alias): what was measured never travels up inside an exception.
Keep = Callable[[AliasRecord], None]
# (engine, alias, protocol, the alias's base record, log, keep): its records go to keep, in order
Run = Callable[[Engine, str, RunParameters, AliasRecord, Log, Keep], None]
# (every row, the baseline row or None) -> what the report shows
Tables = Callable[[Sequence[Row], Row | None], list[Table]]
Marks = Callable[[Sequence[Row], Row | None], dict[str, str]]
Summary = Callable[[Sequence[Row], Row | None], list[Section]]


@dataclass(frozen=True)
class Flag:
    """A command-line flag that sets one of the workload's settings; its help ends with that setting's default."""

    name: str  # e.g. "--concurrency"
    setting: str  # the settings field it sets
    help: str
    item: type = str  # the value's type (each item's, for a list)
    many: bool = False  # a list flag: repeatable, and comma-separated within one value
    example: str = ""  # a good value, for the message when one does not parse


@dataclass(frozen=True)
class MainColumn:
    """A column the workload adds to the main table (before Notes), shown when any row has a cell in it."""

    name: str
    cells: Callable[[Sequence[Row], Row | None], dict[str, Cell]]  # by configuration
    missing: Cell  # the cell of a row without one
    text: bool = True  # words, not a figure


@dataclass(frozen=True)
class Chart:
    """A chart of the workload's own records, beside the report's bar chart (``--chart X.png``: ``X-<suffix>.png``)."""

    suffix: str
    caption: str  # under it in the HTML report
    draw: Callable[[Sequence[Row], Path], Path]  # raises support.plotting.ChartError when there is nothing to draw
    wanted: Callable[[Sequence[Row]], bool]  # the rows hold something to draw

    def path_beside(self, chart: Path) -> Path:
        return chart.with_name(f"{chart.stem}-{self.suffix}{chart.suffix}")


@dataclass(frozen=True)
class NoSettings:
    """The settings of a workload that reads only the protocol's own."""


def _no_tables(_rows: Sequence[Row], _baseline: Row | None) -> list[Table]:
    return []


@dataclass(frozen=True)
class Workload(Generic[S]):
    name: str  # in plans, flags and meta.protocol.workloads
    settings: type[S]  # its settings: a frozen dataclass whose defaults are the defaults
    run: Run
    record: str = ""  # the ``workload`` its records carry (default: the name)
    # Its records' own part (a results.Part dataclass with from_toml): what only it measures, kept in
    # AliasRecord.part and written under [aliases.<record name>]; None: its records are runs alone.
    part: type | None = None
    legacy: Mapping[str, str] = field(default_factory=dict)  # flat [protocol] key -> its settings field
    flags: tuple[Flag, ...] = ()
    speed: bool = False  # its records are one-stream speed runs: the main table, chart and verdicts compare them
    needs_prompt_cache: bool = False  # it measures the server's prompt cache (a preset without one is a finding)
    streams: Callable[[S], int] = lambda _settings: 1  # the most simultaneous streams it opens
    last: bool = False  # runs after every other workload of the protocol: it must not warm anything they time
    # The settings for the configurations measured after these records (the quality workload hands on
    # the reference text the first configuration made); None: every configuration is measured alike.
    carry: Callable[[S, Sequence[AliasRecord]], S] | None = None
    tables: Tables = _no_tables
    column: MainColumn | None = None
    marks: Marks | None = None
    summary: Summary | None = None
    chart: Chart | None = None

    @property
    def record_name(self) -> str:
        return self.record or self.name

    def settings_in(self, protocol: RunParameters) -> S:
        return typing.cast(S, protocol.settings[self.name])

    def configure(self, current: S, changes: Mapping[str, Any], spelled: Mapping[str, str] | None = None) -> S:
        """``current`` with ``changes``, checked; a message names a setting as the user spelled it
        (``spelled``: field -> a flat [protocol] key or a flag)."""
        try:
            return replace(current, **changes)  # type: ignore[type-var]  # S is a dataclass
        except FieldError as e:
            raise e.renamed((spelled or {}).get(e.field, e.field)) from None
