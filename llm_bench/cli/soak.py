"""``llm-bench soak``: bounded mixed traffic against one model; failures, percentiles and drift."""

from __future__ import annotations

from datetime import datetime, timezone
from pathlib import Path

import click

from llm_bench.cli.gpu import run_meta, write_new
from llm_bench.cli.options import log, open_server, server_options
from llm_bench.diagnostics import soak as s
from llm_bench.engines import select_models
from llm_bench.engines.errors import ServerError
from llm_bench.gpu.nvml import Nvml
from llm_bench.plan import DEFAULT_URL
from llm_bench.results import results_stem


@click.command()
@server_options
@click.option("--alias", help="Model to soak (default: the first the server lists).")
@click.option("--duration", "duration_s", type=float, required=True, help="Stop after this many seconds.")
@click.option("--max-requests", type=int, required=True, help="Stop after this many requests.")
@click.option("--max-tokens", type=int, default=128, show_default=True)
@click.option("--burst", type=int, default=4, show_default=True, help="Streams in each concurrent burst.")
@click.option("--long-tokens", type=int, default=4000, show_default=True, help="Approximate long-prompt tokens.")
@click.option("--timeout", "timeout_s", type=float, default=300.0, show_default=True)
@click.option("--max-failures", type=int, default=0, show_default=True, help="Exit 1 above this many failures.")
@click.option("--output-dir", type=click.Path(file_okay=False, path_type=Path), default=Path("results"),
              show_default=True)
@click.option("--chart", "chart_path", type=click.Path(dir_okay=False, path_type=Path))
def soak(url, engine, api_key_file, api_key_env, metrics_url, alias, duration_s, max_requests, max_tokens, burst, long_tokens, timeout_s,
         max_failures, output_dir, chart_path) -> None:
    """Bounded mixed traffic (prose, code, JSON, long prompts, concurrent streams): failures, percentiles, drift."""
    url = url or DEFAULT_URL
    server = open_server(url, engine, api_key_file, api_key_env, metrics_url, timeout_s)
    try:
        with Nvml() as nvml:
            try:
                model = alias or select_models(server, ())[0]
                if alias:
                    select_models(server, (alias,))
            except ServerError as e:
                raise click.ClickException(str(e)) from e
            log(f"Soaking {model} at {url} for at most {duration_s:.0f} s / {max_requests} requests")
            meta = run_meta("soak", url, nvml) | {"alias": model, "max_tokens": max_tokens}
            try:
                result = s.soak(server, model, duration_s=duration_s, max_requests=max_requests,
                                max_tokens=max_tokens, concurrency=burst, long_tokens=long_tokens,
                                nvml=nvml, log=log)
            except ValueError as e:
                raise click.ClickException(str(e)) from e
    finally:
        server.close()
    path = write_new(output_dir, results_stem(datetime.now(timezone.utc), f"soak-{model}"),
                       {"meta": meta, "soak": result.to_toml()})
    log(f"Results written to {path}")
    click.echo(s.markdown(result), nl=False)
    if chart_path:
        s.draw_soak_chart(result, chart_path)
        log(f"Chart written to {chart_path}")
    failed = sum(result.failures.values())
    if failed > max_failures:
        raise click.ClickException(f"{failed} request(s) failed (allowed: {max_failures})")
