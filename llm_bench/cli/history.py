"""``llm-bench history``: results over time, each step judged against the build before it."""

from __future__ import annotations

from pathlib import Path

import click

from llm_bench.cli.exits import NEWEST_IS_REGRESSION, CouldNotRun, NewestIsRegression
from llm_bench.cli.options import log, parse_fraction
from llm_bench.history.chart import draw_history_chart
from llm_bench.history.command import prune, run_history, write_skip
from llm_bench.history.html import write_history_html
from llm_bench.history.points import HistoryInputError
from llm_bench.history.table import markdown_lines, to_csv, to_json
from llm_bench.report.verdict import MIN_EFFECT
from llm_bench.support.plotting import ChartError


@click.command()
@click.argument("paths", nargs=-1, type=click.Path(path_type=Path))
@click.option("--format", "output_format", type=click.Choice(["markdown", "json", "csv"]), default="markdown",
              show_default=True, help="What to print on stdout: the table with its notes, or every column as JSON or CSV.")
@click.option("--chart", "chart_path", type=click.Path(dir_okay=False, path_type=Path),
              help="Also draw decode t/s and TTFT over builds to this .png or .svg file.")
@click.option("--html", "html_path", type=click.Path(dir_okay=False, path_type=Path),
              help="Also write the history as a self-contained HTML page.")
@click.option("--min-effect", default=None,
              help=f"Smallest difference a verdict calls faster or slower, e.g. 5% (default {MIN_EFFECT:.0%}).")
@click.option("--keep", type=int, default=None,
              help="After reading, delete the files under the folders given whose every result is older than "
                   "the newest N of its configuration (skip records: of their alias).")
@click.option("--skipped", "skip_reason", default=None,
              help="Instead of reading: write a skip record with this reason into the one folder given "
                   "(the watch's when it does not measure), with --alias.")
@click.option("--alias", default="-", show_default=True, help="With --skipped: the configuration not measured.")
@click.option("--title", help="Chart and HTML title.")
def history(paths, output_format, chart_path, html_path, min_effect, keep, skip_reason, alias, title) -> None:
    """Follow results files (and folders of them) over time, per configuration.

    Each result is judged against the one before it in its configuration (alias, preset arguments, model,
    protocol, specialisation; not the label): a new build slower beyond noise is a REGRESSION, named by
    both builds, whatever else changed (a changed driver or power limit is named beside it as a
    co-suspect); the same build twice is twins (the noise), or a rig change when a power limit, PCIe
    width, driver, busy GPU memory or CPU governor changed. Results of another model, preset arguments or
    protocol are not compared, and the reason is printed.
    Exit code 4 when the newest step of any configuration is a regression."""
    if skip_reason is not None:
        if len(paths) != 1:
            raise CouldNotRun("--skipped writes into one folder: give exactly one (e.g. /var/lib/llm-bench/history)")
        log(f"Skip recorded in {write_skip(paths[0], alias, skip_reason)}")
        return
    if not paths:
        raise CouldNotRun("name results files or folders (e.g. llm-bench history /var/lib/llm-bench/history)")
    effect = None if min_effect is None else parse_fraction(min_effect, "--min-effect", zero_ok=True)
    try:
        outcome = run_history(list(paths), effect)
        if output_format == "json":
            click.echo(to_json(outcome.history, outcome.inputs, effect), nl=False)
        elif output_format == "csv":
            click.echo(to_csv(outcome.history), nl=False)
        else:
            click.echo(markdown_lines(outcome.history, outcome.inputs), nl=False)
        if chart_path:
            log(f"Chart written to {draw_history_chart(outcome.history, chart_path, title)}")
        if html_path:
            log(f"HTML written to {write_history_html(html_path, outcome.history, outcome.inputs, title)}")
        if keep is not None:
            for path in prune(outcome, [p for p in paths if p.is_dir()], keep):
                log(f"Removed {path} (older than the newest {keep} of its configuration)")
    except (HistoryInputError, ChartError, ValueError, OSError) as e:
        raise CouldNotRun(str(e)) from e
    newest = outcome.history.newest_regressions()
    if newest:
        raise NewestIsRegression("; ".join(s.describe() + f" [{s.point.name}]" for s in newest)
                                 + f" (exit {NEWEST_IS_REGRESSION})")
