"""The vocabulary every table is declared in, whichever layer declares it.

``Row`` is one configuration's record as the report names it; a ``Cell`` is the text a person reads and
the raw values behind it (named keys, for the JSON and CSV exports); a ``Column`` makes a cell of a row;
a ``Table`` is the rendered result, which ``markdown`` writes. ``Section`` is a heading and its items,
the summary's unit. A leaf: it needs only the records, so a workload declares its own tables here and the
report assembles them, neither importing the other.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

from llm_bench.results import AliasRecord

C = TypeVar("C")


@dataclass(frozen=True)
class Row:
    configuration: str
    record: AliasRecord
    label: str
    engine: str
    # The configuration the record belongs to, without what sets the record apart (its depth, its workload):
    # a workload's table groups its rows by it. Empty: the record's alias.
    group_name: str = ""

    @property
    def group(self) -> str:
        return self.group_name or self.record.alias

    @property
    def decode_tps(self) -> float | None:
        s = self.record.summary(self.decode_metric)
        return None if s is None else s.median

    @property
    def decode_metric(self) -> str:
        """The run field the row's decode rate comes from: the engine's, else the stream's."""
        return "decode_tps" if self.record.summary("decode_tps") else "client_decode_tps"

    def decode_values(self) -> list[float | None]:
        return [getattr(run, self.decode_metric) for run in self.record.runs]


@dataclass(frozen=True)
class Cell:
    text: str
    values: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Column(Generic[C]):
    """A column of a table whose cells need a context ``C`` beyond their own row (the main table's: the
    baseline and the verdicts against it)."""

    name: str
    cell: Callable[[Row, C], Cell]
    shown: Callable[[C], bool] = lambda ctx: True
    text: bool = False  # its cells are words, not figures (the HTML report aligns figures right)


@dataclass(frozen=True)
class Table:
    """A rendered table: its title (None for the main one), column names and cells, row by row."""

    title: str | None
    key: str
    columns: list[str]
    rows: list[list[Cell]]
    text_columns: frozenset[str] = frozenset({"Configuration", "Notes"})

    def records(self) -> list[dict[str, Any]]:
        """One mapping per row: every column's raw values, keyed (the JSON/CSV export)."""
        return [{k: v for cell in cells for k, v in cell.values.items()} for cells in self.rows]

    def keys(self) -> list[str]:
        seen: dict[str, None] = {}
        for cells in self.rows:
            for cell in cells:
                seen.update(dict.fromkeys(cell.values))
        return list(seen)


@dataclass(frozen=True)
class Section:
    heading: str | None
    items: list[str]


def _md_cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def markdown(table: Table) -> str:
    out = ["| " + " | ".join(_md_cell(c) for c in table.columns) + " |",
           "|" + "|".join("---" for _ in table.columns) + "|"]
    out.extend("| " + " | ".join(_md_cell(c.text) for c in cells) + " |" for cells in table.rows)
    text = "\n".join(out) + "\n"
    return f"### {table.title}\n\n{text}" if table.title else text


def notes_of(record: AliasRecord) -> str:
    notes = []
    if record.errors:
        notes.append("FAILED: " + "; ".join(record.errors))
    if not record.comparable:
        notes.append(f"not comparable: {record.not_comparable_reason}")
    if record.thinking:
        notes.append(f"thinking = {record.thinking} (protocol).")
    notes.extend(record.warnings)
    notes.extend(route_notes(record))
    return " ".join(notes).replace("\n", " ")


def route_notes(record: AliasRecord) -> list[str]:
    """What the proxy said of the runs: the backend (when one answered them all) and its own overhead."""
    backends = {run.backend for run in record.runs if run.backend}
    overheads = [run.proxy_overhead_ms for run in record.runs if run.proxy_overhead_ms is not None]
    notes = []
    if len(backends) == 1 and not any(f"answered by {next(iter(backends))}" in w for w in record.warnings):
        notes.append(f"answered by {next(iter(backends))}")
    if overheads:
        notes.append(f"proxy overhead median {statistics.median(overheads):.1f} ms")
    return notes


def acceptance_text(record: AliasRecord) -> str:
    spec = record.spec
    if spec is None or not spec.draft_tokens:
        return "-"
    text = f"{spec.acceptance_rate:.1%}"
    if spec.mean_acceptance_length is not None:
        text += f" (len {spec.mean_acceptance_length:.2f})"
    return text


def acceptance_cell(record: AliasRecord) -> Cell:
    spec = record.spec
    drafted = spec is not None and bool(spec.draft_tokens)
    return Cell(acceptance_text(record), {
        "draft_acceptance": spec.acceptance_rate if drafted and spec else None,
        "mean_acceptance_length": spec.mean_acceptance_length if drafted and spec else None,
    })
