"""The ``llm-bench`` command line: a thin layer that turns flags into plans and errors into exit codes."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
import click

from llm_bench import __version__
from llm_bench.chart import ChartError, draw_chart
from llm_bench.client import ServerError
from llm_bench.cli_common import apply_protocol_flags, log, protocol_options
from llm_bench.engines import ENGINES
from llm_bench.plan import ApiKeySource, Plan, PlanError, Protocol, load_plan_file, plan_from_mapping
from llm_bench.protocol import RunAborted, run_plan
from llm_bench.report import find_baseline, load_rows, markdown_table, summary
from llm_bench.results import ResultsFileError

@click.group()
@click.version_option(__version__, prog_name="llm-bench")
def main() -> None:
    """Benchmark llama.cpp router presets (and other engines) with one fixed protocol."""


@main.command()
@click.option("--url", help="Router URL (default http://127.0.0.1:48123).")
@click.option("--plan", "plan_file", type=click.Path(dir_okay=False, path_type=Path), help="TOML plan file.")
@click.option("--alias", "aliases", multiple=True, help="Preset to measure; repeat for several (default: all).")
@click.option("--label", help="Free-form label stored with the results, e.g. the engine or specialisation.")
@click.option("--output-dir", type=click.Path(file_okay=False, path_type=Path), help="Folder for results files.")
@click.option("--engine", type=click.Choice(ENGINES),
              help="llama-cpp: a llama.cpp router (default); openai: any OpenAI-compatible server.")
@click.option("--api-key-file", type=click.Path(dir_okay=False, path_type=Path),
              help="Read a Bearer API key from this file (never written to results or logs).")
@click.option("--api-key-env", help="Read a Bearer API key from this environment variable.")
@click.option("--metrics-url", help="Prometheus metrics of an OpenAI engine (default: URL/metrics).")
@click.option("--log-file", type=click.Path(dir_okay=False, path_type=Path),
              help="The server's log, for the in-run checks (default: llama-cpp.service's journal).")
@click.option("--log-command", help="A command printing the server's log, e.g. 'docker logs hyperqwen'.")
@click.option("--power-floor-w", type=float, help="Warn when a GPU's power limit is below this many watts.")
@click.option("--roofline-min", type=float,
              help="Warn when decode reaches less than this fraction of the memory-bandwidth roofline (0.25).")
@protocol_options
def run(url, plan_file, aliases, label, output_dir, engine, api_key_file, api_key_env, metrics_url,
        log_file, log_command, power_floor_w, roofline_min, **flags) -> None:
    """Measure presets of a llama.cpp router (or models of an OpenAI server); write a new results file."""
    try:
        plan = plan_from_mapping(load_plan_file(plan_file), relative_to=plan_file.parent) if plan_file else Plan()
        plan = replace(
            plan,
            url=url or plan.url,
            aliases=tuple(aliases) or plan.aliases,
            label=label if label is not None else plan.label,
            output_dir=output_dir or plan.output_dir,
            protocol=apply_protocol_flags(plan.protocol, flags),
            engine=engine or plan.engine,
            api_key=ApiKeySource(api_key_file, api_key_env) if (api_key_file or api_key_env) else plan.api_key,
            metrics_url=metrics_url or plan.metrics_url,
            checks=replace(plan.checks, **{k: v for k, v in (
                ("log_file", log_file), ("log_command", log_command),
                ("power_floor_w", power_floor_w), ("roofline_min", roofline_min)) if v is not None}),
        )
        writer = run_plan(plan, log)
    except (PlanError, RunAborted, ServerError) as e:
        raise click.ClickException(str(e)) from e
    log(f"Results written to {writer.path}")
    rows = load_rows([writer.path])
    click.echo(markdown_table(rows))
    if any(r.record.errors for r in rows):
        raise click.ClickException(f"some aliases failed; see the errors column and {writer.path}")


@main.command()
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


@main.command()
@click.option("--output-dir", type=click.Path(file_okay=False, path_type=Path), default=Path("llm-bench-demo"),
              show_default=True, help="Folder for the models, results, table and chart.")
@protocol_options
def demo(output_dir, **flags) -> None:
    """Build or find a CPU llama-server, serve tiny models and run the full protocol on them."""
    import subprocess

    from llm_bench.demo import run_demo
    from llm_bench.testbed.llama_server import LlamaServerNotFound
    from llm_bench.testbed.router import RouterStartError

    try:
        out = run_demo(output_dir, apply_protocol_flags(Protocol(), flags), log)
    except (PlanError, RunAborted, ServerError, RouterStartError, LlamaServerNotFound) as e:
        raise click.ClickException(str(e)) from e
    except subprocess.CalledProcessError as e:
        raise click.ClickException(f"building llama-server failed: {e}; the output above says why "
                                   "(set LLAMA_SERVER=/path/to/llama-server to use an existing one)") from e
    click.echo(out.table.read_text())
    log(f"Results: {out.results}\nTable:   {out.table}\nChart:   {out.chart}")




@main.command()
@click.option("--plan", "plan_file", required=True, type=click.Path(exists=True, dir_okay=False, path_type=Path),
              help="TOML sweep plan: [[targets]] and [protocol].")
@click.option("--baseline", help="Configuration the chart's dashed line marks (default: the base system's control).")
@protocol_options
def sweep(plan_file, baseline, **flags) -> None:
    """Switch through specialisations and engines, measure each, and merge the comparison.

    Started again with the same plan, it resumes: what is already measured is not measured again.
    """
    from llm_bench.sweep import SweepError, default_baseline, run_sweep, sweep_plan_from_mapping

    try:
        plan = sweep_plan_from_mapping(load_plan_file(plan_file), relative_to=plan_file.parent)
        plan = replace(plan, protocol=apply_protocol_flags(plan.protocol, flags))
        outcome = run_sweep(plan, log)
    except (PlanError, SweepError, ServerError) as e:
        raise click.ClickException(str(e)) from e
    except KeyboardInterrupt:
        raise click.ClickException("interrupted; the machine was switched back and what was measured is kept: "
                                   "run the same command again to resume") from None
    if outcome.merged is None:
        raise click.ClickException("nothing was measured: " + "; ".join(f"{k}: {v}" for k, v in outcome.failures.items()))
    rows = load_rows([outcome.merged])
    try:
        base = find_baseline(rows, baseline or default_baseline(plan))
    except ValueError as e:
        log(f"no baseline: {e}")
        base = None
    table = markdown_table(rows, base)
    text = summary(rows, base, outcome.failures)
    (plan.output_dir / "report.md").write_text(text + "\n" + table)
    try:
        draw_chart(rows, plan.output_dir / "chart.png", base, "Decode speed by configuration, all targets")
    except ChartError as e:
        log(f"no chart: {e}")
    click.echo(text + "\n" + table)
    log(f"Merged results: {outcome.merged}\nReport: {plan.output_dir / 'report.md'}\nChart: {plan.output_dir / 'chart.png'}")
    if outcome.failures:
        raise click.ClickException(f"{len(outcome.failures)} target(s) failed: {', '.join(outcome.failures)}; "
                                   "fix them and run the same command again to measure only what is missing")


from llm_bench.cli_engine import engine  # noqa: E402

main.add_command(engine)

from llm_bench.cli_gpu import doctor, install_restore_hook, power, soak, telemetry  # noqa: E402

main.add_command(doctor)
main.add_command(power)
main.add_command(soak)
main.add_command(telemetry)
install_restore_hook(main)
