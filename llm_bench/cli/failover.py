"""``llm-bench failover``: a steady load through a LiteLLM proxy while the primary backend is stopped and
started again by the user's commands (llm_bench.failover)."""

from __future__ import annotations

from pathlib import Path

import click

from llm_bench.cli.exits import Aborted, CouldNotRun, Interrupted, RanWithFailures
from llm_bench.cli.options import URL, api_key_source, log
from llm_bench.failover.chart import draw_timeline
from llm_bench.failover.command import (
    CommandFailed,
    FailoverError,
    FailoverInterrupted,
    FailoverSettings,
    ProxyProblem,
    run_failover,
)
from llm_bench.failover.records import FailoverRun
from llm_bench.failover.report import failover_of
from llm_bench.failover.summary import summary
from llm_bench.plan import DEFAULT_PROMPT, PlanError, shipped_prompt
from llm_bench.results import read_toml
from llm_bench.support.plotting import ChartError, check_chart_path

DEFAULTS = FailoverSettings(url="", model="", stop_command="", start_command="", prompt="")


@click.command()
@click.option("--url", type=URL, required=True, help="The LiteLLM proxy's URL.")
@click.option("--model", required=True, help="The model group to ask the proxy for.")
@click.option("--stop-cmd", "stop_command", required=True,
              help="Shell command that stops the primary backend, e.g. 'ssh box1 systemctl stop vllm'.")
@click.option("--start-cmd", "start_command", required=True,
              help="Shell command that starts it again; always run once the stop command has run.")
@click.option("--primary", help="The primary's URL as the proxy names it (x-litellm-model-api-base); "
                                "default: the backend that answers the first request.")
@click.option("--before-s", type=float, default=DEFAULTS.before_s, show_default=True, help="Load before the stop.")
@click.option("--down-s", type=float, default=DEFAULTS.down_s, show_default=True,
              help="Load between the stop command's end and the start command.")
@click.option("--after-s", type=float, default=DEFAULTS.after_s, show_default=True,
              help="Load after the primary answered again.")
@click.option("--return-timeout-s", type=float, default=DEFAULTS.return_timeout_s, show_default=True,
              help="Longest wait for the primary to answer after the start command.")
@click.option("--streams", type=click.IntRange(1, 64), default=DEFAULTS.streams, show_default=True,
              help="Requests in flight at once.")
@click.option("--max-tokens", type=click.IntRange(1), default=DEFAULTS.max_tokens, show_default=True)
@click.option("--max-requests", type=click.IntRange(1), default=DEFAULTS.max_requests, show_default=True,
              help="Requests in all, at most.")
@click.option("--request-timeout-s", type=float, default=DEFAULTS.request_timeout_s, show_default=True)
@click.option("--command-timeout-s", type=float, default=DEFAULTS.command_timeout_s, show_default=True,
              help="Longest run of the stop or the start command.")
@click.option("--prompt", "prompt_name", default=DEFAULT_PROMPT, show_default=True,
              help="Shipped prompt: code, prose or json.")
@click.option("--output-dir", type=click.Path(file_okay=False, path_type=Path), default=Path("."),
              show_default=True, help="Folder for the results file and the chart.")
@click.option("--chart", "chart_path", type=click.Path(dir_okay=False, path_type=Path),
              help="The timeline chart (.png or .svg; default: beside the results file, .png).")
@click.option("--api-key-file", type=click.Path(dir_okay=False, path_type=Path),
              help="Read the proxy's Bearer key from this file's first line.")
@click.option("--api-key-env", help="Read the proxy's Bearer key from this environment variable.")
def failover(prompt_name, chart_path, api_key_file, api_key_env, **flags) -> None:
    """Stop the primary backend behind a LiteLLM proxy under a steady load, start it again, and report what
    was lost, how soon the fallback answered, and how soon the primary took traffic back."""
    try:
        if chart_path is not None:
            check_chart_path(chart_path)
        source = api_key_source(api_key_file, api_key_env)
        settings = FailoverSettings(prompt=shipped_prompt(prompt_name), api_key=source.read() if source else None,
                                    **flags)
    except (PlanError, ChartError) as e:
        raise CouldNotRun(str(e)) from e
    try:
        outcome = run_failover(settings, log)
    except ProxyProblem as e:
        raise CouldNotRun(str(e)) from e
    except FailoverError as e:
        if e.path is not None:
            _report(failover_of(e.path, read_toml(e.path)).run, e.path, chart_path)
        if isinstance(e, FailoverInterrupted):
            raise Interrupted(f"interrupted; what was measured is in {e.path}") from None
        assert isinstance(e, CommandFailed)
        raise Aborted(f"{e}; what was measured is in {e.path}") from e
    _report(outcome.run, outcome.path, chart_path)
    if outcome.problems:
        raise RanWithFailures("; ".join(outcome.problems))


def _report(run: FailoverRun, path: Path, chart_path: Path | None) -> None:
    click.echo(summary(run))
    try:
        drawn = draw_timeline(run, chart_path or path.with_suffix(".png"))
        log(f"timeline: {drawn}")
    except ChartError as e:
        log(f"no timeline: {e}")
    log(f"results: {path}")
