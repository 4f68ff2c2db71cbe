"""``llm-bench soak``: bounded mixed traffic against one model; failures, restarts, GPU errors, percentiles, drift."""

from __future__ import annotations

from datetime import datetime, timezone
from pathlib import Path

import click

from llm_bench.cli.exits import CouldNotRun, Interrupted, RanWithFailures
from llm_bench.cli.power import run_meta
from llm_bench.cli.options import DEFAULTS, default_of, log, open_server, server_options
from llm_bench.soak import traffic as s
from llm_bench.diagnostics.gpu_errors import GpuErrorWatch, KernelLog
from llm_bench.diagnostics.restarts import (
    CounterWatch,
    RestartWatch,
    RouterInstanceWatch,
)
from llm_bench.diagnostics.server_log import JOURNAL_UNIT, journal_available
from llm_bench.engines import select_models
from llm_bench.engines.errors import ServerError
from llm_bench.gpu.nvml import Nvml
from llm_bench.plan import DEFAULT_URL
from llm_bench.results import reserve_path, results_stem, write_toml

DEFAULT_MIX = ",".join(f"{k}={v}" for k, v in s.DEFAULT_MIX.items())


def restart_watches(server, unit: str | None, container: str | None) -> list[RestartWatch]:
    watches: list[RestartWatch] = []
    if server.capabilities.model_events:
        watches.append(RouterInstanceWatch(server.base_url, server.auth_headers()))
    unit = unit or (JOURNAL_UNIT if journal_available() else None)
    if unit:
        watches.append(CounterWatch.systemd(unit))
    if container:
        watches.append(CounterWatch.container(container))
    return watches


@click.command()
@server_options
@click.option("--alias", help="Model to soak (default: the first the server lists).")
@click.option("--duration", "duration_s", type=float, required=True, help="Stop after this many seconds.")
@click.option("--max-requests", type=int, required=True, help="Stop after this many requests.")
@click.option("--max-tokens", type=int, default=128, show_default=True)
@click.option("--burst", type=int, default=4, show_default=True, help="Streams in each concurrent burst.")
@click.option("--long-tokens", type=int, default=4000, show_default=True, help="Approximate long-prompt tokens.")
@click.option("--mix", default=DEFAULT_MIX, show_default=True,
              help=f"Request kinds and their weights, e.g. prose=2,tool=1 (kinds: {', '.join(s.KINDS)}); "
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
    url = url or DEFAULT_URL
    try:
        settings = s.SoakSettings(duration_s, max_requests, max_tokens, burst, long_tokens, mix=s.parse_mix(mix))
        settings.check()
    except ValueError as e:
        raise click.BadParameter(str(e)) from e
    path = None
    server = open_server(url, engine, api_key_file, api_key_env, metrics_url, metrics_key, timeout_s, streams=burst)
    try:
        with Nvml() as nvml:
            try:
                model = alias or select_models(server, ())[0]
                if alias:
                    select_models(server, (alias,))
            except ServerError as e:  # unreachable, or the alias is not listed: nothing was measured
                raise CouldNotRun(str(e)) from e
            log(f"Soaking {model} at {url} for at most {duration_s:.0f} s / {max_requests} requests (mix {mix})")
            meta = run_meta("soak", url, nvml) | {"alias": model, "max_tokens": max_tokens, "complete": False}
            path = reserve_path(output_dir, results_stem(datetime.now(timezone.utc), f"soak-{model}"))
            log(f"Results: {path}")
            result = s.SoakResult()
            try:
                s.soak(server, model, settings, nvml=nvml, restarts=restart_watches(server, unit, container),
                       gpu_errors=GpuErrorWatch(nvml, KernelLog(kernel_log, kernel_log_command)), log=log,
                       result=result, checkpoint=lambda r: write_toml(path, {"meta": meta, "soak": r.to_toml()}))
                meta["complete"] = True
            except KeyboardInterrupt:
                result.stopped_by = "interrupted"
                raise
            finally:  # Ctrl-C or a crash: what was measured stays on disk, marked incomplete
                write_toml(path, {"meta": meta, "soak": result.to_toml()})
    except KeyboardInterrupt:
        raise Interrupted(f"interrupted; what was measured is in {path}" if path else "interrupted") from None
    finally:
        server.close()
    log(f"Results written to {path}")
    click.echo(s.markdown(result), nl=False)
    if chart_path:
        s.draw_soak_chart(result, chart_path)
        log(f"Chart written to {chart_path}")
    failed = sum(result.failures.values())
    problems = ([f"{failed} request(s) failed (allowed: {max_failures})"] if failed > max_failures else []) \
        + ([f"{result.restart_count} server restart(s)"] if result.restart_count else []) \
        + ([f"{result.gpu_error_count} new GPU error(s)"] if result.gpu_error_count else [])
    if problems:
        raise RanWithFailures("; ".join(problems))
