"""``llm-bench report`` end to end: every file given read once through the source that recognises it
(``report.sources``), the run results merged into rows against a baseline, and what each source shows
printed (Markdown, or the tables as JSON or CSV), drawn (--chart) and put on the HTML page (--html).

The registry of sources is a parameter: it names sources of higher layers (capacity, soak, failover,
power), so it lives above them (``llm_bench.sources``) and ``cli`` hands it in.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from llm_bench.report.chart import draw_chart
from llm_bench.report.export import to_csv, to_json
from llm_bench.report.html import write_html
from llm_bench.report.rows import find_baseline, rows_of, speed_rows
from llm_bench.report.sources import RUN, Loaded, Shown, Source, source_of
from llm_bench.report.table import markdown_table
from llm_bench.results import read_toml
from llm_bench.tables import Row
from llm_bench.workloads import REGISTRY

Say = Callable[[str], None]
FORMATS = ("markdown", "json", "csv")


@dataclass(frozen=True)
class ReportOptions:
    baseline: str | None = None  # a configuration (alias or "label / alias") the others are compared with
    output_format: str = "markdown"  # what is printed: one of FORMATS
    table: str = "main"  # with csv: which table, by its JSON key
    chart: Path | None = None
    html: Path | None = None
    min_effect: float | None = None  # None: the verdicts' default
    title: str | None = None


class ReportError(ValueError):
    """The report asked for cannot be made from these files (the message says what to ask instead)."""


def load_files(paths: Sequence[Path], sources: Sequence[Source]) -> Loaded:
    """Every file read once (a file given twice, under any spelling of its path, counts once), each by the
    source that recognises it; an unknown file stops the report before anything is loaded."""
    files = {path: read_toml(path) for path in {p.resolve(): p for p in paths}.values()}
    chosen = [(path, data, source_of(path, data, sources)) for path, data in files.items()]
    loaded = Loaded({s.name: (s, []) for s in sources})
    for path, data, source in chosen:
        loaded.add(source, source.load(path, data))
    return loaded


def make_report(paths: Sequence[Path], sources: Sequence[Source], options: ReportOptions, out: Say,
                log: Say) -> None:
    """The report of these files: its text to ``out`` (stdout), the files written to ``log``. Raises
    ResultsFileError (a file), ReportError or ValueError (the options), ChartError (a chart)."""
    if options.output_format not in FORMATS:
        raise ReportError(f"--format {options.output_format}: the report prints one of {', '.join(FORMATS)}")
    given = load_files(paths, sources).given()
    with_rows = any(s.beside_rows for s, _ in given)  # a run report: rows, main table, verdicts, bar chart
    alone = [s.name for s, _ in given if not s.beside_rows]
    if alone and options.output_format != "markdown":
        raise ReportError(f"--format {options.output_format} does not cover {', '.join(alone)} results: their "
                          "every figure is in the TOML file itself; use the Markdown output, --chart or --html")
    sets = next((items for s, items in given if s.name == RUN.name), [])
    rows = rows_of(sets)
    base = find_baseline(rows, options.baseline)
    shown: list[tuple[Source, Shown]] = [(s, s.show(items)) for s, items in given]
    extra = [t for s, sh in shown if s.beside_rows for t in sh.tables]
    effect = options.min_effect
    if options.output_format == "json":
        out(to_json(rows, base, effect, extra))
    elif options.output_format == "csv":
        out(to_csv(rows, base, effect, options.table, extra))
    else:
        blocks = ([markdown_table(rows, base, effect)] if with_rows else []) + [sh.markdown for _, sh in shown]
        out("\n".join(b for b in blocks if b))
    if options.chart:
        _charts(options, given, rows, base, with_rows, log)
    if options.html:
        write_html(options.html, sets, options.baseline, title=options.title, min_effect=effect, rows=rows,
                   tables=extra, sections=[sec for _, sh in shown for sec in sh.sections],
                   provenance=[p for _, sh in shown for p in sh.provenance])
        log(f"HTML report written to {options.html}")


def _charts(options: ReportOptions, given: list[tuple[Source, list[Any]]], rows: Sequence[Row], base: Row | None,
            with_rows: bool, log: Say) -> None:
    """The run's bar chart (and each workload's own) at the chart path; each other source's charts there
    too when its files are all that was given, else beside it with the source's name (``X-capacity.png``)."""
    path = options.chart
    assert path is not None
    if with_rows:
        charts = [w.chart for w in REGISTRY if w.chart is not None and w.chart.wanted(rows)]
        if speed_rows(rows) or not charts:  # results of the depth workload alone have only its chart
            draw_chart(rows, path, base, options.title, min_effect=options.min_effect)
            log(f"Chart written to {path}")
        for chart in charts:
            log(f"Chart written to {chart.draw(rows, chart.path_beside(path))}")
    own = [(s, items) for s, items in given if not s.beside_rows]
    for source, items in own:
        target = path if len(own) == 1 and not with_rows else path.with_name(f"{path.stem}-{source.name}{path.suffix}")
        for drawn in source.charts(items, target):
            log(f"Chart written to {drawn}")

