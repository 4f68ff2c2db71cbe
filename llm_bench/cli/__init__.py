"""The ``llm-bench`` command line: a thin layer that turns flags into plans and errors into exit codes.

One module per command (group); ``options.py`` holds what they share.
"""

from __future__ import annotations

import click

from llm_bench import __version__
from llm_bench.cli.capacity import capacity
from llm_bench.cli.demo import demo
from llm_bench.cli.doctor import doctor
from llm_bench.cli.engine import engine
from llm_bench.cli.failover import failover
from llm_bench.cli.history import history
from llm_bench.cli.options import log
from llm_bench.cli.power import power
from llm_bench.cli.report import report, telemetry
from llm_bench.cli.run import run
from llm_bench.cli.soak import soak
from llm_bench.cli.sweep import sweep
from llm_bench.cli.tune import tune
from llm_bench.power.limits import restore_leftover
from llm_bench.support.ctrl_c import ctrl_c_not_lost


@click.group()
@click.version_option(__version__, prog_name="llm-bench")
def main() -> None:
    """Benchmark llama.cpp router presets (and other engines) with one fixed protocol."""
    # Every command stops on Ctrl-C and keeps what it measured, even one the garbage collector swallowed.
    click.get_current_context().with_resource(ctrl_c_not_lost())
    # A power sweep that was killed left its limits behind; every start puts them back and says so.
    try:
        restore_leftover(log)
    except Exception as e:  # noqa: BLE001 - the safety net must never stop the command the user asked for
        log(f"llm-bench: could not check for power limits to restore: {e}")


for command in (run, report, demo, sweep, engine, doctor, power, soak, telemetry, tune, capacity, failover, history):
    main.add_command(command)
