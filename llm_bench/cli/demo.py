"""``llm-bench demo``: the whole protocol on a local CPU router with small models, from nothing."""

from __future__ import annotations

import subprocess
import time
from pathlib import Path

import click

from llm_bench.cli.exits import Aborted, CouldNotRun
from llm_bench.cli.options import apply_protocol_flags, log, protocol_options
from llm_bench.demo import DEMO_PROTOCOL, run_demo
from llm_bench.engines.errors import ServerError
from llm_bench.plan import PlanError
from llm_bench.runner import RunAborted
from llm_bench.testbed.llama_server import LlamaServerNotFound
from llm_bench.testbed.router import RouterStartError


@click.command()
@click.option("--output-dir", type=click.Path(file_okay=False, path_type=Path), default=Path("llm-bench-demo"),
              show_default=True, help="Folder for the models, results, table and chart.")
@protocol_options
def demo(output_dir, **flags) -> None:
    """Build or find a CPU llama-server, serve SmolLM2-135M under several presets, measure speed and quality.

    Defaults sized for 2 cores: 96 output tokens, 3 runs (the fewest for a verdict), the standard and
    quality workloads; then the depth and session workloads on two presets of their own."""
    started = time.monotonic()
    try:
        out = run_demo(output_dir, apply_protocol_flags(DEMO_PROTOCOL, flags), log)
    except RunAborted as e:
        raise Aborted(str(e)) from e
    except (PlanError, ServerError, RouterStartError, LlamaServerNotFound) as e:
        raise CouldNotRun(str(e)) from e
    except subprocess.CalledProcessError as e:
        raise CouldNotRun(f"building llama-server failed: {e}; the output above says why "
                                   "(set LLAMA_SERVER=/path/to/llama-server to use an existing one)") from e
    click.echo(out.table.read_text())
    log(f"Results: {out.results}" + (f" and {out.agent_results}" if out.agent_results else "")
        + f"\nTable:   {out.table}\nChart:   {out.chart}" + (f" and {out.depth_chart}" if out.depth_chart else "")
        + f"\nHTML:    {out.html}\nThe demo took {time.monotonic() - started:.0f} s.")
