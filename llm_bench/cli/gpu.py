"""GPU commands: ``doctor``, ``power``, ``soak``, ``telemetry``; and the power-limit restore at every start."""

from __future__ import annotations

import functools
import sys
from datetime import datetime, timezone
from pathlib import Path

import click
import tomli_w

from llm_bench.cli_common import MIB_PER_GIB, log
from llm_bench.client import ServerError
from llm_bench.engines import ENGINES, open_engine, select_models
from llm_bench.gpu import Nvml, PowerLimitError
from llm_bench.plan import DEFAULT_URL, PlanError, shipped_prompt
from llm_bench.results import ResultsFileError, load_results, results_stem


def install_restore_hook(group: click.Group) -> None:
    """Every llm-bench start restores power limits that a killed sweep left behind, and says so."""
    callback = group.callback

    @functools.wraps(callback)
    def wrapped(*args, **kwargs):
        from llm_bench.power import restore_leftover

        try:
            restore_leftover(log)
        except Exception as e:  # never let the safety net stop the command the user asked for
            log(f"llm-bench: could not check for power limits to restore: {e}")
        return callback(*args, **kwargs)

    group.callback = wrapped


def _engine(kind: str, url: str, timeout: float = 600.0):
    return open_engine(kind, url, timeout=timeout)


def _write_toml(folder: Path, stem: str, data: dict) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    for n in range(1, 1000):
        path = folder / (f"{stem}.toml" if n == 1 else f"{stem}-{n}.toml")
        try:
            with path.open("x") as f:
                f.write(tomli_w.dumps(data))
            return path
        except FileExistsError:
            continue
    raise click.ClickException(f"no free file name for {stem} in {folder}")


def _meta(kind: str, url: str, nvml: Nvml) -> dict:
    return {k: v for k, v in {
        "format": f"llm-bench-{kind}/1", "server_url": url,
        "started_at": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "gpu_driver": nvml.driver_version(), "gpus": nvml.details(),
        "nvml_unavailable": None if nvml.available else nvml.unavailable,
    }.items() if v is not None}


# --- doctor ---

@click.command()
@click.option("--url", default=DEFAULT_URL, show_default=True, help="Server to check.")
@click.option("--engine", "engine_kind", type=click.Choice(ENGINES), default="llama-cpp", show_default=True)
@click.option("--alias", "aliases", multiple=True,
              help="Model to probe with one short request (repeat; default: the models already loaded).")
@click.option("--log-file", type=click.Path(exists=True, dir_okay=False, path_type=Path),
              help="The server's log (default: the llama-cpp.service journal when it runs under systemd).")
@click.option("--log-command", help="A shell command that prints the server's log, e.g. 'docker logs vllm'.")
@click.option("--vllm-cmdline", help="vLLM's command line (default: read local processes from /proc).")
@click.option("--vram-threshold-gib", type=float, default=2.0,
              show_default=True, help="VRAM in use before a load above this is a finding.")
@click.option("--power-floor-w", type=float, help="A power limit below this many watts is a finding.")
@click.option("--roofline-min", type=float, default=0.25, show_default=True,
              help="Decode below this fraction of the memory-bandwidth roofline is a finding.")
@click.option("--model-bytes", type=int, help="Bytes read per token for the roofline (default: the model file size).")
@click.option("--max-tokens", type=int, default=64, show_default=True, help="Tokens per probe request.")
def doctor(url, engine_kind, aliases, log_file, log_command, vllm_cmdline, vram_threshold_gib, power_floor_w,
           roofline_min, model_bytes, max_tokens) -> None:
    """Check a server and this machine for the traps that silently ruin benchmark numbers.

    Exits 1 when any finding is an error."""
    from llm_bench import doctor as d
    from llm_bench import roofline

    findings: list[d.Finding] = []
    source = (d.LogSource(file=log_file) if log_file else d.LogSource(command=log_command) if log_command
              else d.LogSource.journal() if d.journal_available() else None)
    engine = _engine(engine_kind, url)
    try:
        with Nvml() as nvml:
            loaded: list[str] = []
            try:
                listed = select_models(engine, ())
                if engine_kind == "llama-cpp":
                    loaded = [m.id for m in engine.client.models() if m.status != "unloaded"]
                else:
                    loaded = listed
            except ServerError as e:
                raise click.ClickException(str(e)) from e
            findings += d.check_vram(nvml.vram_used(), vram_threshold_gib * MIB_PER_GIB, loaded)
            findings += d.check_power_floor(nvml, power_floor_w)
            if source is not None:
                where = f"the server log ({source.describe()})"
                try:
                    text = source.read()
                    findings += d.check_offload(text, nvml.count(), where)
                    findings += d.check_fa_fallback(text, where)
                except OSError as e:
                    findings.append(d.Finding("log", d.WARNING, f"could not read {where}: {e}",
                                              "give --log-file or --log-command"))
            else:
                findings.append(d.Finding("log", d.INFO, "no server log to read (not under systemd, and no "
                                          "--log-file/--log-command), so GPU offload and FlashAttention kernels "
                                          "were not checked.", "give --log-file FILE or --log-command CMD"))
            metrics = None
            if engine_kind == "openai":
                try:
                    response = engine.client.http.get(engine.metrics_path)
                    metrics = response.text if response.status_code == 200 else None
                except Exception:
                    metrics = None
            lines = [vllm_cmdline] if vllm_cmdline else d.vllm_command_lines()
            findings += d.check_enforce_eager(lines, metrics)
            bandwidth = nvml.memory_bandwidth_gbs(0)
            for alias in aliases or tuple(loaded):
                log(f"probing {alias} with one {max_tokens}-token request ...")
                try:
                    record = d.probe_alias(engine, alias, max_tokens)
                except ServerError as e:
                    findings.append(d.Finding("probe", d.ERROR, f"{alias}: the probe request failed: {e}",
                                              "check the server's log for the failure"))
                    continue
                findings += d.check_acceptance(record)
                if bandwidth:
                    roofline.apply(record, bandwidth, model_bytes)
                    findings += d.check_roofline(record, roofline_min)
                    if record.roofline_tps:
                        s = record.summary("decode_tps")
                        log(f"  {alias}: {s.median if s else 0:.1f} t/s of a {record.roofline_tps:.1f} t/s roofline")
    finally:
        engine.close()
    for finding in findings:
        click.echo(finding.text())
    errors = [f for f in findings if f.severity == d.ERROR]
    warnings = [f for f in findings if f.severity == d.WARNING]
    click.echo(f"{len(errors)} error(s), {len(warnings)} warning(s)")
    if errors:
        sys.exit(1)


# --- power ---

def _parse_limits(text: str) -> list[float]:
    try:
        limits = [float(x) for x in text.split(",") if x.strip()]
    except ValueError as e:
        raise click.BadParameter(f"comma-separated watts, e.g. 200,250,300,350 ({e})") from e
    if not limits or any(w <= 0 for w in limits):
        raise click.BadParameter("give at least one positive limit in watts")
    return limits


@click.command()
@click.option("--limits", help="Power limits in watts to measure at, e.g. 200,250,300,350.")
@click.option("--gpu", "gpus", type=int, multiple=True, help="GPU index to limit (repeat; default: every GPU).")
@click.option("--url", default=DEFAULT_URL, show_default=True)
@click.option("--engine", "engine_kind", type=click.Choice(ENGINES), default="llama-cpp", show_default=True)
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
def power(limits, gpus, url, engine_kind, alias, runs, max_tokens, prompt_name, settle_s, output_dir, chart_path,
          show) -> None:
    """Sweep GPU power limits, measuring decode t/s, tokens per joule and temperature at each.

    Needs root. The original limits are saved before the first change and restored on every exit
    path; if the process is killed, the next llm-bench start restores them."""
    from llm_bench import power as p
    from llm_bench.client import ChatRequest

    with Nvml() as nvml:
        if not nvml.available:
            raise click.ClickException(f"NVML is not available: {nvml.unavailable}")
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
        chosen = list(gpus) or list(range(nvml.count()))
        engine = _engine(engine_kind, url)
        try:
            model = alias or select_models(engine, ())[0]
            if alias:
                select_models(engine, (alias,))
            request = ChatRequest(model, shipped_prompt(prompt_name), max_tokens, 1.0, 42)
            log(f"Warming up {model} ...")
            engine.stream(request)
            meta = _meta("power", url, nvml) | {"alias": model, "gpus_limited": chosen, "limits_w": watts,
                                                "runs": runs, "max_tokens": max_tokens, "settle_s": settle_s}
            results = p.sweep(nvml, chosen, watts, p.measurer(engine, request, runs, nvml, log), log,
                              settle_s=settle_s)
        except (PowerLimitError, ServerError, PlanError) as e:
            raise click.ClickException(str(e)) from e
        finally:
            engine.close()
    path = _write_toml(output_dir, results_stem(datetime.now(timezone.utc), f"power-{model}"),
                       {"meta": meta, "limits": [r.to_toml() for r in results]})
    log(f"Results written to {path}")
    click.echo(p.markdown(results), nl=False)
    if chart_path:
        p.draw_power_chart(results, chart_path, f"Power sweep: {model}")
        log(f"Chart written to {chart_path}")


# --- soak ---

@click.command()
@click.option("--url", default=DEFAULT_URL, show_default=True)
@click.option("--engine", "engine_kind", type=click.Choice(ENGINES), default="llama-cpp", show_default=True)
@click.option("--alias", help="Model to soak (default: the first the server lists).")
@click.option("--duration", "duration_s", type=float, required=True, help="Stop after this many seconds.")
@click.option("--max-requests", type=int, required=True, help="Stop after this many requests.")
@click.option("--max-tokens", type=int, default=128, show_default=True)
@click.option("--concurrency", type=int, default=4, show_default=True, help="Streams in each concurrent burst.")
@click.option("--long-tokens", type=int, default=4000, show_default=True, help="Approximate long-prompt tokens.")
@click.option("--timeout", "timeout_s", type=float, default=300.0, show_default=True)
@click.option("--max-failures", type=int, default=0, show_default=True, help="Exit 1 above this many failures.")
@click.option("--output-dir", type=click.Path(file_okay=False, path_type=Path), default=Path("results"),
              show_default=True)
@click.option("--chart", "chart_path", type=click.Path(dir_okay=False, path_type=Path))
def soak(url, engine_kind, alias, duration_s, max_requests, max_tokens, concurrency, long_tokens, timeout_s,
         max_failures, output_dir, chart_path) -> None:
    """Bounded mixed traffic (prose, code, JSON, long prompts, concurrent streams): failures, percentiles, drift."""
    from llm_bench import soak as s

    engine = _engine(engine_kind, url, timeout_s)
    try:
        with Nvml() as nvml:
            try:
                model = alias or select_models(engine, ())[0]
                if alias:
                    select_models(engine, (alias,))
            except ServerError as e:
                raise click.ClickException(str(e)) from e
            log(f"Soaking {model} at {url} for at most {duration_s:.0f} s / {max_requests} requests")
            meta = _meta("soak", url, nvml) | {"alias": model, "max_tokens": max_tokens}
            try:
                result = s.soak(engine, model, duration_s=duration_s, max_requests=max_requests,
                                max_tokens=max_tokens, concurrency=concurrency, long_tokens=long_tokens,
                                nvml=nvml, log=log)
            except ValueError as e:
                raise click.ClickException(str(e)) from e
    finally:
        engine.close()
    path = _write_toml(output_dir, results_stem(datetime.now(timezone.utc), f"soak-{model}"),
                       {"meta": meta, "soak": result.to_toml()})
    log(f"Results written to {path}")
    click.echo(s.markdown(result), nl=False)
    if chart_path:
        s.draw_soak_chart(result, chart_path)
        log(f"Chart written to {chart_path}")
    failed = sum(result.failures.values())
    if failed > max_failures:
        raise click.ClickException(f"{failed} request(s) failed (allowed: {max_failures})")


# --- telemetry ---

@click.command()
@click.argument("results", nargs=-1, required=True, type=click.Path(exists=True, dir_okay=False, path_type=Path))
@click.option("--chart", "chart_path", type=click.Path(dir_okay=False, path_type=Path),
              help="Draw the time series (VRAM, power, temperature, SM clock) to this .png/.svg.")
@click.option("--title")
def telemetry(results, chart_path, title) -> None:
    """Print the GPU telemetry summary of results files (peak VRAM, power, energy per token) and chart it."""
    from llm_bench.telemetry import draw_telemetry_chart

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
