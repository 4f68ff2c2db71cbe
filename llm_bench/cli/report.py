"""``llm-bench report`` and ``llm-bench telemetry``: read results files back, print tables, draw charts."""

from __future__ import annotations

from pathlib import Path

import click

from llm_bench.capacity.chart import draw_capacity_chart
from llm_bench.capacity.report import (
    CapacityResults,
    capacity_html,
    capacity_of,
    capacity_provenance,
)
from llm_bench.capacity.session import FORMAT as CAPACITY_FORMAT
from llm_bench.cli.exits import CouldNotRun
from llm_bench.cli.options import log, parse_fraction
from llm_bench.gpu.telemetry import draw_telemetry_chart
from llm_bench.report import find_baseline, load_sets, markdown_table, rows_of
from llm_bench.report.chart import draw_chart
from llm_bench.report.export import to_csv, to_json
from llm_bench.report.html import write_html
from llm_bench.report.rows import POWER_FORMAT, inputs_of, speed_rows
from llm_bench.report.table import power_table, telemetry_table
from llm_bench.report.verdict import MIN_EFFECT
from llm_bench.results import FORMAT as RESULTS_FORMAT
from llm_bench.results import ResultsFileError, file_format, read_toml
from llm_bench.support.plotting import ChartError
from llm_bench.tables import Row, markdown
from llm_bench.workloads import REGISTRY


@click.command()
@click.argument("results", nargs=-1, required=True, type=click.Path(exists=True, dir_okay=False, path_type=Path))
@click.option("--baseline", help="Configuration (alias or 'label / alias') to compare the others with.")
@click.option("--format", "output_format", type=click.Choice(["markdown", "json", "csv"]), default="markdown",
              show_default=True, help="What to print on stdout: the Markdown tables, or every column as JSON or CSV.")
@click.option("--table", "table_key", default="main", show_default=True,
              help="With --format csv: which table to print, by its key in the JSON (main, depth, session, "
                   "session_turns, concurrency, prefix_cache, quality, ...).")
@click.option("--chart", "chart_path", type=click.Path(dir_okay=False, path_type=Path),
              help="Also draw the bar chart to this .png or .svg file (and a workload's own chart beside it: "
                   "X-depth.png for the depth workload).")
@click.option("--html", "html_path", type=click.Path(dir_okay=False, path_type=Path),
              help="Also write the self-contained HTML report (summary, chart, tables, provenance) to this file.")
@click.option("--min-effect", default=None,
              help=f"Smallest difference a verdict calls faster or slower, e.g. 5% (default {MIN_EFFECT:.0%}).")
@click.option("--title", help="Chart and HTML report title.")
def report(results, baseline, output_format, table_key, chart_path, html_path, min_effect, title) -> None:
    """Merge results files and print the comparison table (Markdown, JSON or CSV).

    Files written by `llm-bench power` may be given too: they become the power-limit section; files written
    by `llm-bench capacity` print their answers and levels, and draw their curve (--chart, --html)."""
    effect = None if min_effect is None else parse_fraction(min_effect, "--min-effect", zero_ok=True)
    try:
        # a file given twice (under any spelling of its path) is read and shown once
        files = {path: read_toml(path) for path in {p.resolve(): p for p in results}.values()}
        for path, data in files.items():
            if file_format(data) not in READ:
                raise CouldNotRun(_not_read(path, file_format(data)))
        capacity = [capacity_of(p, data) for p, data in files.items() if file_format(data) == CAPACITY_FORMAT]
        others = {p: data for p, data in files.items() if file_format(data) != CAPACITY_FORMAT}
        if capacity and output_format != "markdown":
            raise CouldNotRun(f"--format {output_format} does not cover capacity results: their every figure is "
                              "in the TOML file itself; use the Markdown output, --chart or --html")
        sets, power = inputs_of(others)
        rows = rows_of(sets)
        base = find_baseline(rows, baseline)
        if capacity and not others:
            click.echo("\n".join(c.markdown() for c in capacity), nl=False)
        elif output_format == "json":
            click.echo(to_json(rows, base, effect, power), nl=False)
        elif output_format == "csv":
            click.echo(to_csv(rows, base, effect, table_key), nl=False)
        else:
            power_section = power_table(power)
            click.echo("\n".join(t for t in (markdown_table(rows, base, effect),
                                              markdown(power_section) if power_section else "",
                                              *(c.markdown() for c in capacity)) if t), nl=False)
        if chart_path and capacity:
            _capacity_charts(capacity, chart_path if not others else chart_path.with_name(
                f"{chart_path.stem}-capacity{chart_path.suffix}"))
        if chart_path and others:
            charts = [w.chart for w in REGISTRY if w.chart is not None and w.chart.wanted(rows)]
            if speed_rows(rows) or not charts:  # results of the depth workload alone have only its chart
                draw_chart(rows, chart_path, base, title, min_effect=effect)
                log(f"Chart written to {chart_path}")
            for chart in charts:
                log(f"Chart written to {chart.draw(rows, chart.path_beside(chart_path))}")
        if html_path:
            write_html(html_path, sets, baseline, title=title, min_effect=effect, rows=rows, power=power,
                       sections=[capacity_html(capacity)] if capacity else [],
                       provenance=capacity_provenance(capacity))
            log(f"HTML report written to {html_path}")
    except (ResultsFileError, ChartError, ValueError) as e:
        raise CouldNotRun(str(e)) from e


# What ``report`` reads: results of run, tune, sweep and demo; power sweeps; capacity searches.
READ = (RESULTS_FORMAT, POWER_FORMAT, CAPACITY_FORMAT)


def _not_read(path: Path, found: str | None) -> str:
    what = f"its meta.format is {found!r}" if found else "it has no meta.format"
    return (f"{path}: {what}; `llm-bench report` reads the results files of run, tune, sweep and demo "
            f"({RESULTS_FORMAT!r}), power ({POWER_FORMAT!r}) and capacity ({CAPACITY_FORMAT!r})")


def _capacity_charts(capacity: list[CapacityResults], path: Path) -> None:
    """Each capacity file's curve: to ``path`` for one file, else ``path`` with the file's number."""
    for n, result in enumerate(capacity, 1):
        target = path if len(capacity) == 1 else path.with_name(f"{path.stem}-{n}{path.suffix}")
        log(f"Chart written to {draw_capacity_chart(result.aliases, result.objective, target)}")


@click.command()
@click.argument("results", nargs=-1, required=True, type=click.Path(exists=True, dir_okay=False, path_type=Path))
@click.option("--chart", "chart_path", type=click.Path(dir_okay=False, path_type=Path),
              help="Draw the time series (VRAM, power, temperature, SM clock) to this .png/.svg.")
@click.option("--title")
def telemetry(results, chart_path, title) -> None:
    """Print the GPU telemetry summary of results files (peak VRAM, power, energy per token) and chart it."""
    try:
        rows = [Row(r.configuration, r, r.target, r.engine) for s in load_sets(list(results)) for r in s.aliases]
    except ResultsFileError as e:
        raise CouldNotRun(str(e)) from e
    table = telemetry_table(rows)
    if table is None:
        raise CouldNotRun("no record carries telemetry (NVML was not available during those runs)")
    click.echo(markdown(table), nl=False)
    if chart_path:
        draw_telemetry_chart([(r.configuration, r.record.telemetry) for r in rows if r.record.telemetry], chart_path,
                             title)
        log(f"Chart written to {chart_path}")
