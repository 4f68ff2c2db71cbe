"""``llm-bench report`` and ``llm-bench telemetry``: read results files back, print tables, draw charts."""

from __future__ import annotations

from pathlib import Path

import click

from llm_bench.cli.exits import CouldNotRun
from llm_bench.cli.options import log, parse_fraction
from llm_bench.gpu.telemetry import draw_telemetry_chart
from llm_bench.report import load_sets
from llm_bench.report.command import FORMATS, ReportOptions, make_report
from llm_bench.report.table import telemetry_table
from llm_bench.report.verdict import MIN_EFFECT
from llm_bench.results import ResultsFileError
from llm_bench.sources import SOURCES
from llm_bench.support.plotting import ChartError
from llm_bench.tables import Row, markdown


@click.command()
@click.argument("results", nargs=-1, required=True, type=click.Path(exists=True, dir_okay=False, path_type=Path))
@click.option("--baseline", help="Configuration (alias or 'label / alias') to compare the others with.")
@click.option("--format", "output_format", type=click.Choice(FORMATS), default="markdown",
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
    by `llm-bench capacity`, `soak` and `failover` print their own report, and draw their charts (--chart,
    --html)."""
    effect = None if min_effect is None else parse_fraction(min_effect, "--min-effect", zero_ok=True)
    options = ReportOptions(baseline, output_format, table_key, chart_path, html_path, effect, title)
    try:
        make_report(results, SOURCES, options, lambda text: click.echo(text, nl=False), log)
    except (ResultsFileError, ChartError, ValueError) as e:
        raise CouldNotRun(str(e)) from e


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
