"""``llm-bench tune``: search a grid of presets for the fastest that keeps its answers, and print how to adopt it."""

from __future__ import annotations

import signal
from dataclasses import replace
from pathlib import Path

import click

from llm_bench.cli.exits import Aborted, CouldNotRun, Interrupted
from llm_bench.cli.options import (
    URL,
    UrlParam,
    api_key_source,
    apply_protocol_flags,
    list_option,
    log,
    protocol_options,
)
from llm_bench.engines.errors import ServerError
from llm_bench.plan import ApiKeySource, PlanError
from llm_bench.runner import RunAborted
from llm_bench.tune.plan import OFF_MIN_AGREEMENT, Budget, QualityGate, TunePlan, load_tune_plan, with_flags
from llm_bench.tune.serve import ServeError
from llm_bench.tune.session import run_tune


def _interrupt(_signum, _frame) -> None:
    raise KeyboardInterrupt  # SIGTERM restores the machine's router on the same path as Ctrl-C


@click.command()
@click.option("--plan", "plan_file", type=click.Path(exists=True, dir_okay=False, path_type=Path),
              help="TOML tune plan: [base], [axes], [budget], [quality], [protocol].")
@click.option("--name", help="Prefix of the candidates' preset names (default tune).")
@click.option("--model", help="The base preset's model (a GGUF path); same as --set model=PATH.")
@click.option("--set", "sets", multiple=True, metavar="KEY=VALUE",
              help="A fixed setting of the base preset (repeatable), e.g. --set ctx-size=8192.")
@click.option("--axis", "axes", multiple=True, metavar="KEY=V1,V2",
              help="An axis to vary (repeatable); KEY may join keys set together: "
                   "--axis cache-type-k+cache-type-v=f16,q8_0,q4_0. The first value makes the control.")
@click.option("--url", type=URL, help="Measure presets an existing router already serves instead of serving a grid.")
@list_option("--preset", "presets", help="With --url: the presets to compare.")
@click.option("--control", help="With --url: the control preset (default: the first --preset).")
@click.option("--main-url", type=UrlParam(off=("", "none")), help="The machine's router, whose models are unloaded first and loaded again "
                                 "after ('none' to leave it alone; default http://127.0.0.1:48123).")
@click.option("--api-key-file", type=click.Path(dir_okay=False, path_type=Path),
              help="Read the machine's router's Bearer API key (for --url and --main-url) from this file's first "
                   "line (never written to results or logs).")
@click.option("--api-key-env", help="Read the machine's router's Bearer API key from this environment variable.")
@click.option("--llama-server", type=click.Path(dir_okay=False, path_type=Path),
              help="llama-server for the temporary router (default: on PATH, else llama-cpp.service's).")
@click.option("--output-dir", type=click.Path(file_okay=False, path_type=Path),
              help="Folder for the results, report and chart (default tune-results); a tune resumes from it.")
@click.option("--finalists", type=int, help="Candidates that get full runs after the screen (default 4).")
@click.option("--screen-tokens", "screen_max_tokens", type=int, help="Tokens of the screen's one run (default 64).")
@click.option("--max-rounds", type=int, help=f"Rounds of full runs at most (default {Budget.max_rounds}).")
@click.option("--max-requests", type=int, help=f"Measured requests at most (default {Budget.max_requests}).")
@click.option("--max-time", "max_time_s", type=float, help=f"Seconds at most (default {Budget.max_time_s:g}).")
@click.option("--accept", type=click.Choice(["lossless", "near-lossless", "any", "off"]),
              help=f"The worst quality verdict against the control a winner may have (default {QualityGate.accept}); "
                   "any: measured, not gating; off: not measured, --min-agreement gates instead.")
@click.option("--min-agreement", type=float,
              help=f"Share of greedy outputs identical to the control's a winner needs (default: "
                   f"{OFF_MIN_AGREEMENT:g} with --accept off, else none).")
@click.option("--max-recall-drop", type=float,
              help=f"How far recall may fall below the control's (default {QualityGate.max_recall_drop:g}).")
@click.option("--fresh", is_flag=True, help="Start over instead of resuming from the output folder.")
@protocol_options
def tune(plan_file, name, model, sets, axes, url, presets, control, main_url, api_key_file, api_key_env,
         llama_server, output_dir, finalists,
         screen_max_tokens, max_rounds, max_requests, max_time_s, accept, min_agreement, max_recall_drop, fresh,
         **flags) -> None:
    """Find the fastest preset that keeps its answers, and print the Nix that adopts it.

    Serves every combination of the axes over the base preset on a temporary router (the machine's
    router freed first and restored after), screens each with one short run, gives the most
    promising full runs in rounds until the leader is faster than the rest beyond noise or the budget
    is spent, and refuses a winner whose answers differ from the control's. Started again with the
    same settings, it resumes.
    """
    signal.signal(signal.SIGTERM, _interrupt)
    plan = TunePlan()
    try:
        key = (api_key_source(api_key_file, api_key_env) or ApiKeySource()).read()
        plan = load_tune_plan(plan_file) if plan_file else plan
        budget = replace(plan.budget, **{k: v for k, v in (("max_rounds", max_rounds), ("max_requests", max_requests),
                                                            ("max_time_s", max_time_s)) if v is not None})
        quality = replace(plan.quality, **{k: v for k, v in (("accept", accept), ("min_agreement", min_agreement),
                                                             ("max_recall_drop", max_recall_drop)) if v is not None})
        plan = with_flags(
            plan, sets=sets, axes=axes, model=model, name=name, url=url, presets=tuple(presets), control=control,
            llama_server=llama_server, output_dir=output_dir, finalists=finalists,
            screen_max_tokens=screen_max_tokens, budget=budget, quality=quality,
            protocol=apply_protocol_flags(plan.protocol, flags),
        )
        if main_url is not None:
            plan = replace(plan, main_url=None if main_url.lower() in ("", "none") else main_url)
        result = run_tune(plan, log, fresh=fresh, api_key=key)
    except (PlanError, ServeError, ServerError) as e:
        raise CouldNotRun(str(e)) from e
    except RunAborted as e:
        raise Aborted(str(e)) from e
    except KeyboardInterrupt:
        restored = "the machine's router was restored and " if plan.main_url and plan.url is None else ""
        raise Interrupted(f"interrupted; {restored}what was measured is kept in {plan.output_dir}: "
                          "run the same command again to resume") from None
    click.echo(result.report.read_text())
    log(f"Report: {result.report}" + (f", chart: {result.chart}" if result.chart else "")
        + (f", HTML: {result.html}" if result.html else "") + f", results: {result.outcome.results}")
