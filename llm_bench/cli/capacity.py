"""``llm-bench capacity``: how many concurrent sessions (or requests per minute) a preset carries at an objective."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import click

from llm_bench.capacity.command import run_capacity_command
from llm_bench.capacity.session import CapacityAborted, ObjectiveUncheckable
from llm_bench.capacity.settings import (
    LOOPS,
    CapacityPlan,
    CapacitySettings,
    capacity_plan_from_mapping,
    settings_from_mapping,
)
from llm_bench.cli.exits import Aborted, CouldNotRun, Interrupted, RanWithFailures
from llm_bench.cli.options import api_key_source, apply_protocol_flags, default_of, list_option, log, server_options
from llm_bench.engines.errors import ServerError
from llm_bench.plan import PlanError, load_plan_file
from llm_bench.support.plotting import ChartError, check_chart_path

SETTINGS = CapacitySettings()


def _default(name: str) -> str:
    value = getattr(SETTINGS, name)
    return ",".join(value) if isinstance(value, tuple) else f"{value:g}" if isinstance(value, float) else str(value)


@click.command()
@server_options
@click.option("--plan", "plan_file", type=click.Path(dir_okay=False, path_type=Path),
              help="TOML plan: a run plan's keys plus [capacity] with the settings below.")
@list_option("--alias", "aliases", help="Presets to search (default: every preset the server lists).")
@click.option("--label", help="Free-form label stored with the results.")
@click.option("--output-dir", type=click.Path(file_okay=False, path_type=Path), help="Folder for the results file.")
@click.option("--min-stream-tps", type=float, help="Objective: the p10 of per-request decode t/s at least this.")
@click.option("--max-ttft-s", type=float, help="Objective: the p95 TTFT at most this many seconds.")
@list_option("--loop", "loops", help=f"{' and/or '.join(LOOPS)}: N streams back to back, or Poisson arrivals "
                                     f"(default {_default('loops')}).")
@click.option("--warmup-s", type=float, help=f"Seconds of each level not counted (default {_default('warmup_s')}).")
@click.option("--window-s", type=float, help=f"Seconds of each level's measured window, at least "
                                             f"(default {_default('window_s')}).")
@click.option("--min-window-requests", type=int,
              help=f"Requests in each level's window, at least (default {_default('min_window_requests')}).")
@click.option("--max-streams", type=int, help="Closed loop: the most streams searched; a llama.cpp preset's slots "
                                              f"+ 1 bound it further (default {_default('max_streams')}).")
@click.option("--start-rate-per-min", type=float,
              help="Open loop: the first rate (default: half of what one stream got through in the probe).")
@click.option("--rate-resolution", type=float, help="Open loop: stop bisecting when the broken rate is within this "
                                                    f"share of the met one (default {_default('rate_resolution')}).")
@click.option("--arrival-seed", type=int, help=f"Open loop: the arrivals' seed (default {_default('arrival_seed')}).")
@click.option("--max-in-flight", type=int, help="Open loop: a level with more requests in flight breaks the objective "
                                                f"(default {_default('max_in_flight')}).")
@click.option("--max-requests", type=int, help=f"The search stops after this many requests (default "
                                               f"{_default('max_requests')}).")
@click.option("--max-duration-s", type=float, help=f"The search stops after this many seconds (default "
                                                   f"{_default('max_duration_s')}).")
@click.option("--max-tokens", type=int, help=f"Output tokens per request (default {default_of('max_tokens')}).")
@click.option("--temperature", type=float, help=f"Sampling temperature (default {default_of('temperature')}).")
@click.option("--seed", type=int, help=f"Sampling seed (default {default_of('seed')}).")
@click.option("--prompt", "prompt_name", help=f"Shipped prompt: code, prose or json (default {default_of('prompt_name')}).")
@click.option("--prompt-file", type=click.Path(dir_okay=False, path_type=Path), help="Use this file's text as the prompt.")
@click.option("--session/--no-session", "session", default=None,
              help="Each stream an agent replaying the session workload's turns (the shipped coding-agent session), "
                   "its context growing turn by turn, instead of --prompt (default: no).")
@click.option("--session-file", type=click.Path(dir_okay=False, path_type=Path),
              help="Replay this session instead (a JSON file of OpenAI chat messages, as the session workload's "
                   "--session-file); implies --session.")
@click.option("--prompt-cache/--no-prompt-cache", "prompt_cache", default=None,
              help=f"Let the server reuse a cached prompt prefix (default {default_of('prompt_cache')}).")
@click.option("--timeout", "request_timeout_s", type=float,
              help=f"Seconds before a request counts as failed (default {default_of('request_timeout_s')}).")
@click.option("--unload/--no-unload", "unload_after", default=None,
              help=f"Unload each alias after its search (default {default_of('unload_after')}).")
@click.option("--chart", "chart_path", type=click.Path(dir_okay=False, path_type=Path),
              help="Draw each search's curve (.png or .svg).")
def capacity(url, engine, api_key_file, api_key_env, metrics_url, metrics_key, plan_file, aliases, label,
             output_dir, chart_path, **flags) -> None:
    """How many concurrent sessions (closed loop) or requests per minute (open loop) each preset carries while
    the p10 of per-request decode t/s stays >= --min-stream-tps and the p95 TTFT <= --max-ttft-s.

    Exits 0 with an answer for every alias (also "not even one session"), 1 when an alias could not be
    searched, 2 when nothing could be measured (bad flags, unknown alias, an objective the server's answers
    cannot show), 3 when the server went away partway, 130 on Ctrl-C; what was measured is always saved."""
    try:
        if chart_path is not None:
            check_chart_path(chart_path)
        cplan = capacity_plan_from_mapping(load_plan_file(plan_file), relative_to=plan_file.parent) \
            if plan_file else CapacityPlan()
        given = {k: v for k, v in flags.items() if k in SETTINGS.__dataclass_fields__ and v not in (None, ())}
        settings = settings_from_mapping(given, base=cplan.settings, where="command line")
        plan = cplan.plan
        plan = replace(
            plan, url=url or plan.url, aliases=tuple(aliases) or plan.aliases,
            label=label if label is not None else plan.label, output_dir=output_dir or plan.output_dir,
            protocol=apply_protocol_flags(plan.protocol, flags), engine=engine or plan.engine,
            api_key=api_key_source(api_key_file, api_key_env) or plan.api_key,
            metrics_url=metrics_url or plan.metrics_url, metrics_key=metrics_key or plan.metrics_key)
        settings.objective()
        done = run_capacity_command(CapacityPlan(plan, settings), log, chart_path)
    except (PlanError, ChartError, ObjectiveUncheckable, ServerError) as e:
        raise CouldNotRun(str(e)) from e
    except CapacityAborted as e:
        raise Aborted(str(e)) from e
    except KeyboardInterrupt:
        raise Interrupted("interrupted; every level measured is in the results file named above") from None
    click.echo(done.table, nl=False)
    if done.failed:
        raise RanWithFailures("; ".join(done.failed))
