"""``llm-bench soak``: bounded mixed traffic against one model; failures, restarts, GPU errors, percentiles, drift."""

from __future__ import annotations

from pathlib import Path

import click

from llm_bench.cli.exits import CouldNotRun, Interrupted, RanWithFailures
from llm_bench.cli.options import DEFAULTS, default_of, log, open_server, server_options
from llm_bench.diagnostics.gpu_errors import KernelLog
from llm_bench.diagnostics.server_log import JOURNAL_UNIT
from llm_bench.engines.errors import ServerError
from llm_bench.soak import report, traffic
from llm_bench.soak.command import SoakInterrupted, Watching, choose_model, problems, run_soak

DEFAULT_MIX = ",".join(f"{k}={v}" for k, v in traffic.DEFAULT_MIX.items())


@click.command()
@server_options
@click.option("--alias", help="Model to soak (default: the first the server lists).")
@click.option("--duration", "duration_s", type=float, required=True, help="Stop after this many seconds.")
@click.option("--max-requests", type=int, required=True, help="Stop after this many requests.")
@click.option("--max-tokens", type=int, default=128, show_default=True)
@click.option("--burst", type=int, default=4, show_default=True, help="Streams in each concurrent burst.")
@click.option("--long-tokens", type=int, default=4000, show_default=True, help="Approximate long-prompt tokens.")
@click.option("--mix", default=DEFAULT_MIX, show_default=True,
              help=f"Request kinds and their weights, e.g. prose=2,tool=1 (kinds: {', '.join(traffic.KINDS)}); "
                   "kinds not named are not sent.")
@click.option("--unit", help=f"systemd unit whose restarts count (default: {JOURNAL_UNIT} when it is active).")
@click.option("--container", help="Container whose restarts count (docker inspect RestartCount), e.g. for HyperQwen.")
@click.option("--kernel-log", type=click.Path(exists=True, dir_okay=False, path_type=Path),
              help="A file of kernel log lines to watch for new Xid lines (default: journalctl -k, else dmesg).")
@click.option("--kernel-log-command", help="A shell command printing kernel log lines.")
@click.option("--timeout", "timeout_s", type=float, default=DEFAULTS.request_timeout_s,
              help=f"Seconds before one request counts as failed (default {default_of('request_timeout_s')}).")
@click.option("--max-failures", type=int, default=0, show_default=True, help="Exit 1 above this many failures.")
@click.option("--output-dir", type=click.Path(file_okay=False, path_type=Path), default=Path("results"),
              show_default=True)
@click.option("--chart", "chart_path", type=click.Path(dir_okay=False, path_type=Path))
def soak(url, engine, api_key_file, api_key_env, metrics_url, metrics_key, alias, duration_s, max_requests, max_tokens, burst,
         long_tokens, mix, unit, container, kernel_log, kernel_log_command, timeout_s, max_failures, output_dir,
         chart_path) -> None:
    """Bounded mixed traffic (prose, code, JSON, long prompts, concurrent streams, tool calls, thinking, images):
    failures by kind, restarts, new GPU errors, percentiles and drift.

    Exits 1 above --max-failures failures, or on any restart or new GPU error."""
    try:
        settings = traffic.SoakSettings(duration_s, max_requests, max_tokens, burst, long_tokens,
                                        mix=traffic.parse_mix(mix))
        settings.check()
    except ValueError as e:
        raise click.BadParameter(str(e)) from e
    server = open_server(url, engine, api_key_file, api_key_env, metrics_url, metrics_key, timeout_s, streams=burst)
    try:
        try:
            model = choose_model(server, alias)
        except ServerError as e:  # unreachable, or the alias is not listed: nothing was measured
            raise CouldNotRun(str(e)) from e
        log(f"Soaking {model} at {server.base_url} for at most {duration_s:.0f} s / {max_requests} requests (mix {mix})")
        result, _path = run_soak(server, model, settings, Watching(unit, container, KernelLog(kernel_log,
                                                                                               kernel_log_command)),
                                 output_dir, log)
    except SoakInterrupted as e:
        raise Interrupted(f"interrupted; what was measured is in {e.path}") from None
    except KeyboardInterrupt:
        raise Interrupted("interrupted") from None
    finally:
        server.close()
    click.echo(report.markdown(result), nl=False)
    if chart_path:
        report.draw_soak_chart(result, chart_path)
        log(f"Chart written to {chart_path}")
    failed = problems(result, max_failures)
    if failed:
        raise RanWithFailures("; ".join(failed))
