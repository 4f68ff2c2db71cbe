"""``llm-bench power``: sweep GPU power limits (always restored) and measure at each."""

from __future__ import annotations

from datetime import datetime, timezone
from pathlib import Path

import click

from llm_bench.cli.exits import CouldNotRun
from llm_bench.cli.options import list_option, log, open_server, server_options
from llm_bench.engines import select_models
from llm_bench.engines.errors import ServerError
from llm_bench.engines.stream import ChatRequest
from llm_bench.power import limits as p
from llm_bench.gpu.nvml import Nvml, PowerLimitError
from llm_bench.plan import DEFAULT_URL, PlanError
from llm_bench.prompts import shipped_prompt
from llm_bench.power.measure import measurer
from llm_bench.results import reserve_path, results_stem, write_toml


def run_meta(kind: str, url: str, nvml: Nvml) -> dict:
    """The provenance a power sweep's or a soak's results file starts with."""
    return {k: v for k, v in {
        "format": f"llm-bench-{kind}/1", "server_url": url,
        "started_at": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "gpu_driver": nvml.driver_version(), "gpus": nvml.details(),
        "nvml_unavailable": None if nvml.available else nvml.unavailable,
    }.items() if v is not None}


def write_new(folder: Path, stem: str, data: dict) -> Path:
    path = reserve_path(folder, stem)
    write_toml(path, data)
    return path


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
            for i in range(nvml.count()):
                lim = nvml.power_limits(i)
                click.echo(f"GPU{i}: " + ("no power limit reported" if lim is None else
                           f"limit {lim.current_w:.0f} W (default {lim.default_w or 0:.0f} W, "
                           f"range {lim.min_w or 0:.0f}-{lim.max_w or 0:.0f} W)"))
            return
        if not limits:
            raise click.UsageError("give --limits (or --show)")
        watts = _parse_limits(limits)
        try:
            chosen = [int(g) for g in gpus] or list(range(nvml.count()))
        except ValueError as e:
            raise click.BadParameter(f"GPU indexes are whole numbers ({e})", param_hint="--gpu") from e
        url = url or DEFAULT_URL
        server = open_server(url, engine, api_key_file, api_key_env, metrics_url, metrics_key)
        try:
            model = alias or select_models(server, ())[0]
            if alias:
                select_models(server, (alias,))
            request = ChatRequest(model, shipped_prompt(prompt_name), max_tokens, 1.0, 42)
            log(f"Warming up {model} ...")
            server.stream(request)
            meta = run_meta("power", url, nvml) | {"alias": model, "gpus_limited": chosen, "limits_w": watts,
                                                "runs": runs, "max_tokens": max_tokens, "settle_s": settle_s}
            results = p.sweep(nvml, chosen, watts, measurer(server, request, runs, nvml, log), log,
                              settle_s=settle_s)
        except (PowerLimitError, ServerError, PlanError) as e:
            raise CouldNotRun(str(e)) from e
        finally:
            server.close()
    path = write_new(output_dir, results_stem(datetime.now(timezone.utc), f"power-{model}"),
                       {"meta": meta, "limits": [r.to_toml() for r in results]})
    log(f"Results written to {path}")
    click.echo(p.markdown(results), nl=False)
    if chart_path:
        p.draw_power_chart(results, chart_path, f"Power sweep: {model}")
        log(f"Chart written to {chart_path}")
