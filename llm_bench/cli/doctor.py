"""``llm-bench doctor``: the traps that silently ruin benchmark numbers, checked on a server and this machine."""

from __future__ import annotations

from pathlib import Path

import click

from llm_bench.cli.exits import CouldNotRun, RanWithFailures
from llm_bench.cli.options import list_option, log, open_server, server_options
from llm_bench.diagnostics.doctor import DoctorSettings, run_doctor
from llm_bench.diagnostics.findings import ERROR, WARNING
from llm_bench.diagnostics.gpu_errors import KernelLog
from llm_bench.diagnostics.server_log import log_source
from llm_bench.engines.errors import ServerError

DEFAULTS = DoctorSettings()


@click.command()
@server_options
@list_option("--alias", "aliases",
             help="Models to probe with one short request (default: the models already loaded).")
@click.option("--log-file", type=click.Path(exists=True, dir_okay=False, path_type=Path),
              help="The server's log (default: the llama-cpp.service journal when it runs under systemd).")
@click.option("--log-command", help="A shell command that prints the server's log, e.g. 'docker logs vllm'.")
@click.option("--vllm-cmdline", help="vLLM's command line (default: read local processes from /proc).")
@click.option("--config-file", "config_files", multiple=True,
              type=click.Path(exists=True, dir_okay=False, path_type=Path),
              help="A compose file or .env file the engine was started with (repeatable): dtype, speculative "
                   "decoding and prefix caching are read from it.")
@click.option("--kernel-log", type=click.Path(exists=True, dir_okay=False, path_type=Path),
              help="A file of kernel log lines (default: `journalctl -k`, else `dmesg --time-format iso`).")
@click.option("--kernel-log-command", help="A shell command printing kernel log lines, e.g. 'ssh gpu-box dmesg'.")
@click.option("--since", type=click.DateTime(formats=["%Y-%m-%dT%H:%M:%S", "%Y-%m-%d %H:%M:%S", "%Y-%m-%d"]),
              help="Xid lines before this local time are old news (default: the current boot).")
@click.option("--build", help="Name the llama.cpp build (e.g. llamampere) when neither "
                              "/etc/llama-cpp/active.json nor /props says which it is.")
@click.option("--vram-threshold-mib", type=float, default=DEFAULTS.vram_threshold_mib, show_default=True,
              help="VRAM in use before a load above this is a finding.")
@click.option("--power-floor-w", type=float, help="A power limit below this many watts is a finding.")
@click.option("--roofline-min", type=float, default=DEFAULTS.roofline_min, show_default=True,
              help="Decode below this fraction of the memory-bandwidth roofline is a finding.")
@click.option("--model-bytes", type=int, help="Bytes read per token for the roofline (default: the model file size).")
@click.option("--max-tokens", type=int, default=DEFAULTS.max_tokens, show_default=True,
              help="Tokens per probe request.")
def doctor(url, engine, api_key_file, api_key_env, metrics_url, metrics_key, aliases, log_file, log_command, vllm_cmdline,
           config_files, kernel_log, kernel_log_command, since, build,
           vram_threshold_mib, power_floor_w, roofline_min, model_bytes, max_tokens) -> None:
    """Check a server and this machine for the traps that silently ruin benchmark numbers.

    Exits 1 when any finding is an error."""
    settings = DoctorSettings(tuple(aliases), vllm_cmdline, vram_threshold_mib, power_floor_w, roofline_min,
                              model_bytes, max_tokens, tuple(config_files),
                              KernelLog(file=kernel_log, command=kernel_log_command),
                              since.astimezone() if since else None, build)
    server = open_server(url, engine, api_key_file, api_key_env, metrics_url, metrics_key)
    try:
        findings = run_doctor(server, settings, log_source(log_file, log_command), log)
    except ServerError as e:
        raise CouldNotRun(str(e)) from e
    finally:
        server.close()
    for finding in findings:
        click.echo(finding.text())
    errors = [f for f in findings if f.severity == ERROR]
    warnings = [f for f in findings if f.severity == WARNING]
    click.echo(f"{len(errors)} error(s), {len(warnings)} warning(s)")
    if errors:
        raise RanWithFailures(f"{len(errors)} error finding(s)")
