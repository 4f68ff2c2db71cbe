"""``llm-bench report`` and ``llm-bench telemetry``: read results files back, print tables, draw charts."""

from __future__ import annotations

from pathlib import Path

import click

from llm_bench.cli.options import log
from llm_bench.gpu.telemetry import draw_telemetry_chart
from llm_bench.report import find_baseline, load_rows, markdown_table
from llm_bench.report.chart import draw_chart
from llm_bench.results import ResultsFileError, load_results
from llm_bench.support.numbers import fmt
from llm_bench.support.plotting import ChartError


@click.command()
@click.argument("results", nargs=-1, required=True, type=click.Path(exists=True, dir_okay=False, path_type=Path))
@click.option("--baseline", help="Configuration (alias or 'label / alias') to compare the others with.")
@click.option("--chart", "chart_path", type=click.Path(dir_okay=False, path_type=Path),
              help="Also draw the bar chart to this .png or .svg file.")
@click.option("--title", help="Chart title.")
def report(results, baseline, chart_path, title) -> None:
    """Merge results files and print the comparison table (Markdown)."""
    try:
        rows = load_rows(list(results))
        base = find_baseline(rows, baseline)
        click.echo(markdown_table(rows, base), nl=False)
        if chart_path:
            draw_chart(rows, chart_path, base, title)
            log(f"Chart written to {chart_path}")
    except (ResultsFileError, ChartError, ValueError) as e:
        raise click.ClickException(str(e)) from e


@click.command()
@click.argument("results", nargs=-1, required=True, type=click.Path(exists=True, dir_okay=False, path_type=Path))
@click.option("--chart", "chart_path", type=click.Path(dir_okay=False, path_type=Path),
              help="Draw the time series (VRAM, power, temperature, SM clock) to this .png/.svg.")
@click.option("--title")
def telemetry(results, chart_path, title) -> None:
    """Print the GPU telemetry summary of results files (peak VRAM, power, energy per token) and chart it."""
    series = []
    lines = ["| Configuration | Peak VRAM MiB | Mean power W | Max temp C | J/token | Tokens/J | Energy from |",
             "|---|---|---|---|---|---|---|"]
    try:
        for path in results:
            for record in load_results(path).aliases:
                t = record.telemetry
                if not t:
                    continue
                series.append((record.configuration, t))

                def cell(key, digits=1, reduce=max):
                    value = t.get(key)
                    if value is None:
                        return "-"
                    value = reduce(value) if isinstance(value, list) else value
                    return f"{value:.{digits}f}"

                lines.append(f"| {record.configuration} | {cell('peak_vram_mib', 0)} | {cell('mean_power_w', 1, sum)} | "
                             f"{cell('max_temperature_c', 0)} | {cell('joules_per_token', 3)} | "
                             f"{cell('tokens_per_joule', 3)} | {t.get('energy_source', '-')} |")
    except ResultsFileError as e:
        raise click.ClickException(str(e)) from e
    if not series:
        raise click.ClickException("no record carries telemetry (NVML was not available during those runs)")
    click.echo("\n".join(lines))
    if chart_path:
        draw_telemetry_chart(series, chart_path, title)
        log(f"Chart written to {chart_path}")
