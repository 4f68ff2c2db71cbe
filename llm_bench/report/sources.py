"""The results files ``llm-bench report`` reads, one ``Source`` per format.

Each command that writes a results file of its own format owns a ``Source`` beside its writer: how its
file is recognised (``meta.format``) and loaded, and what the report shows of it (its Markdown, its tables
for JSON, CSV and the HTML page, its HTML section, its charts, its provenance). ``report.command`` reads
every file through the source that recognises it, and the registry of sources is given to it from above
(``llm_bench.sources``), so a source living in a higher layer (capacity, soak, ...) is never imported here.

The ``run`` source is the one whose records become the comparison rows (the main table, the verdicts,
the bar chart); every other source adds what it shows beside them.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from llm_bench.results import FORMAT, ResultSet, ResultsFileError, file_format, result_set_of
from llm_bench.tables import Table
from llm_bench.workloads import PARTS


@dataclass(frozen=True)
class Shown:
    """What a source's files add to the report."""

    markdown: str = ""  # printed with the Markdown output
    tables: tuple[Table, ...] = ()  # in the JSON and CSV exports and the HTML page's "Other measurements"
    sections: tuple[str, ...] = ()  # HTML sections of their own, before the provenance
    provenance: tuple[dict[str, Any], ...] = ()  # each file's meta, labelled, for the provenance section


def _nothing(loaded: Sequence[Any]) -> Shown:
    return Shown()


def _no_charts(loaded: Sequence[Any], path: Path) -> list[Path]:
    return []


@dataclass(frozen=True)
class Source:
    """One results-file format and what ``report`` makes of it.

    ``load(path, data)`` turns a file's TOML (as ``results.read_toml`` read it) into this source's object,
    or raises ``ResultsFileError`` naming the file. ``show`` and ``charts`` take every loaded file of this
    source at once (several files of one kind share one table). ``beside_rows``: its figures join the run
    report (its tables in the JSON and CSV exports, the main table printed with them); otherwise its files
    make a report of their own, which the exports do not cover (their every figure is in the TOML file)."""

    name: str  # the command that writes it
    format: str  # its meta.format
    written_by: str  # the commands that write it, as the "not read" message names them
    load: Callable[[Path, dict[str, Any]], Any]
    show: Callable[[Sequence[Any]], Shown] = _nothing
    charts: Callable[[Sequence[Any], Path], list[Path]] = _no_charts  # drawn to the path (numbered for several)
    beside_rows: bool = False

    def recognises(self, data: dict[str, Any]) -> bool:
        return file_format(data) == self.format


def numbered(path: Path, n: int, total: int) -> Path:
    """Where the n-th (1-based) of ``total`` charts of one kind goes: ``path`` itself for one, else ``path``
    with its number (``chart-2.png``)."""
    return path if total == 1 else path.with_name(f"{path.stem}-{n}{path.suffix}")


# The results of run, tune, sweep and demo: the records the comparison rows are made of.
def run_results_of(path: Path, data: dict[str, Any]) -> ResultSet:
    return result_set_of(path, data, PARTS)


RUN = Source("run", FORMAT, "run, tune, sweep and demo", load=run_results_of, beside_rows=True)


def source_of(path: Path, data: dict[str, Any], sources: Sequence[Source]) -> Source:
    """The source that reads this file, or a ResultsFileError naming the file, what it is and the fix."""
    for source in sources:
        if source.recognises(data):
            return source
    found = file_format(data)
    what = f"its meta.format is {found!r}" if found else "it has no meta.format"
    known = [f"{s.written_by} ({s.format!r})" for s in sources]
    listed = ", ".join(known[:-1]) + " and " + known[-1] if len(known) > 1 else "".join(known)
    raise ResultsFileError(f"{path}: {what}; `llm-bench report` reads the results files of {listed}: give it "
                           "a file one of those commands wrote (a newer format needs a newer llm-bench)")


@dataclass
class Loaded:
    """Every file given, loaded by its source, in the registry's order."""

    by_source: dict[str, tuple[Source, list[Any]]] = field(default_factory=dict)

    def add(self, source: Source, item: Any) -> None:
        self.by_source.setdefault(source.name, (source, []))[1].append(item)

    def given(self) -> list[tuple[Source, list[Any]]]:
        return [entry for entry in self.by_source.values() if entry[1]]
