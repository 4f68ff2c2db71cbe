"""``llm-bench run``: measure presets of a router (or models of an OpenAI server) into a new results file."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import click

from llm_bench.boxes import run_boxes
from llm_bench.cli.exits import Aborted, CouldNotRun, Interrupted, RanWithFailures
from llm_bench.cli.options import (
    api_key_source,
    apply_protocol_flags,
    boxes_server_options,
    list_option,
    log,
    protocol_options,
)
from llm_bench.engines.errors import ServerError
from llm_bench.plan import Checks, Plan, PlanError, load_plan_file, plan_from_mapping
from llm_bench.report import load_rows, load_sets, markdown_table, rows_of
from llm_bench.runner import RunAborted, RunInterrupted, run_plan


@click.command()
@boxes_server_options
@click.option("--plan", "plan_file", type=click.Path(dir_okay=False, path_type=Path), help="TOML plan file.")
@list_option("--alias", "aliases", help="Presets to measure (default: every preset the server lists).")
@click.option("--label", help="Free-form label stored with the results, e.g. the engine or specialisation.")
@click.option("--output-dir", type=click.Path(file_okay=False, path_type=Path), help="Folder for results files.")
@click.option("--log-file", type=click.Path(dir_okay=False, path_type=Path),
              help="The server's log, for the in-run checks (default: llama-cpp.service's journal).")
@click.option("--log-command", help="A command printing the server's log, e.g. 'docker logs hyperqwen'.")
@click.option("--power-floor-w", type=float, help="Warn when a GPU's power limit is below this many watts.")
@click.option("--roofline-min", type=float,
              help="Warn when decode reaches less than this fraction of the memory-bandwidth roofline "
                   f"(default {Checks.roofline_min:g}).")
@protocol_options
def run(urls, plan_file, metrics_key, aliases, label, output_dir, engine, api_key_file, api_key_env, metrics_url,
        log_file, log_command, power_floor_w, roofline_min, **flags) -> None:
    """Measure presets of a llama.cpp router (or models of an OpenAI server); write a new results file."""
    try:
        plan = plan_from_mapping(load_plan_file(plan_file), relative_to=plan_file.parent) if plan_file else Plan()
        plan = replace(
            plan,
            url=urls[0] if urls else plan.url,
            aliases=tuple(aliases) or plan.aliases,
            label=label if label is not None else plan.label,
            output_dir=output_dir or plan.output_dir,
            protocol=apply_protocol_flags(plan.protocol, flags),
            engine=engine or plan.engine,
            api_key=api_key_source(api_key_file, api_key_env) or plan.api_key,
            metrics_url=metrics_url or plan.metrics_url,
            metrics_key=metrics_key or plan.metrics_key,
            checks=replace(plan.checks, **{k: v for k, v in (
                ("log_file", log_file), ("log_command", log_command),
                ("power_floor_w", power_floor_w), ("roofline_min", roofline_min)) if v is not None}),
        )
        boxes = list(dict.fromkeys(urls or plan.urls))
        if len(boxes) > 1:
            return _run_boxes(plan, boxes)
        writer = run_plan(replace(plan, url=boxes[0]) if boxes else plan, log)
    except RunAborted as e:
        raise Aborted(str(e)) from e
    except (PlanError, ServerError) as e:
        raise CouldNotRun(str(e)) from e
    except RunInterrupted as e:
        rows = load_rows([e.path])
        if rows:  # what was measured, the interrupted alias's finished runs too
            click.echo(markdown_table(rows))
        raise Interrupted(f"interrupted; everything measured, with the finished runs of the alias it was on, "
                          f"is in {e.path}") from None
    except KeyboardInterrupt:
        raise Interrupted("interrupted before anything was measured") from None
    log(f"Results written to {writer.path}")
    rows = load_rows([writer.path])
    click.echo(markdown_table(rows))
    if any(r.record.errors for r in rows):
        raise RanWithFailures(f"some aliases failed; see the errors column and {writer.path}")


def _run_boxes(plan: Plan, urls: list[str]) -> None:
    """The plan on each box; one merged report with the box in every row."""
    outcome = run_boxes(plan, urls, log)
    if outcome.merged is None:
        raise CouldNotRun("no box was measured: " + "; ".join(f"{k}: {v}" for k, v in outcome.failures.items()))
    rows = rows_of(load_sets([outcome.merged]))
    click.echo(markdown_table(rows))
    failed = [f"box {name}: {message}" for name, message in outcome.failures.items()]
    if failed or any(r.record.errors for r in rows):
        raise RanWithFailures("; ".join(failed) or f"some aliases failed; see the errors column and {outcome.merged}")
