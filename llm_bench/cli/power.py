"""``llm-bench power``: sweep GPU power limits (always restored) and measure at each."""

from __future__ import annotations

from pathlib import Path

import click

from llm_bench.cli.exits import CouldNotRun, Interrupted
from llm_bench.cli.options import list_option, log, open_server, server_options
from llm_bench.engines.errors import ServerError
from llm_bench.gpu.nvml import Nvml, PowerLimitError
from llm_bench.plan import PlanError
from llm_bench.power.command import PowerInterrupted, PowerSettings, run_power, show_limits


def _parse_limits(values: tuple[str, ...]) -> list[float]:
    try:
        limits = [float(x) for x in values]
    except ValueError as e:
        raise click.BadParameter(f"comma-separated watts, e.g. 200,250,300,350 ({e})") from e
    if not limits or any(w <= 0 for w in limits):
        raise click.BadParameter("give at least one positive limit in watts")
    return limits


@click.command()
@list_option("--limits", help="Power limits in watts to measure at, e.g. 200,250,300,350.")
@list_option("--gpu", "gpus", help="GPU indexes to limit (default: every GPU).")
@server_options
@click.option("--alias", help="Model to measure (default: the first the server lists).")
@click.option("--runs", type=int, default=3, show_default=True, help="Measured requests at each limit.")
@click.option("--max-tokens", type=int, default=512, show_default=True)
@click.option("--prompt", "prompt_name", default="code", show_default=True)
@click.option("--settle", "settle_s", type=float, default=5.0, show_default=True,
              help="Seconds to wait after setting a limit before measuring.")
@click.option("--output-dir", type=click.Path(file_okay=False, path_type=Path), default=Path("results"),
              show_default=True)
@click.option("--chart", "chart_path", type=click.Path(dir_okay=False, path_type=Path), help="Draw the sweep (.png/.svg).")
@click.option("--show", is_flag=True, help="Only print each GPU's power limit and range; change nothing.")
def power(limits, gpus, url, engine, api_key_file, api_key_env, metrics_url, metrics_key, alias, runs, max_tokens, prompt_name, settle_s, output_dir, chart_path,
          show) -> None:
    """Sweep GPU power limits, measuring decode t/s, tokens per joule and temperature at each.

    Needs root. The original limits are saved before the first change and restored on every exit
    path; if the process is killed, the next llm-bench start restores them."""
    with Nvml() as nvml:
        if not nvml.available:
            raise CouldNotRun(f"NVML is not available: {nvml.unavailable}")
        if show:
            click.echo("\n".join(show_limits(nvml)))
            return
        if not limits:
            raise click.UsageError("give --limits (or --show)")
        try:
            settings = PowerSettings(tuple(_parse_limits(limits)), tuple(int(g) for g in gpus), alias, runs,
                                     max_tokens, prompt_name, settle_s)
        except ValueError as e:
            raise click.BadParameter(f"GPU indexes are whole numbers ({e})", param_hint="--gpu") from e
        server = open_server(url, engine, api_key_file, api_key_env, metrics_url, metrics_key)
        try:
            done = run_power(server, nvml, settings, output_dir, log, chart_path)
        except (PowerLimitError, ServerError, PlanError) as e:
            raise CouldNotRun(str(e)) from e
        except PowerInterrupted as e:
            kept = f"every limit measured is in {e.path}" if e.path else "no limit was measured yet"
            raise Interrupted(f"interrupted; the original power limits are restored and {kept}") from None
        finally:
            server.close()
    click.echo(done.table, nl=False)
