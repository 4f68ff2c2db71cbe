"""``llm-bench sweep``: switch through specialisations and engines, measure each, merge the comparison."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import click

from llm_bench.cli.exits import CouldNotRun, Interrupted, RanWithFailures
from llm_bench.cli.options import apply_protocol_flags, log, protocol_options
from llm_bench.engines.errors import ServerError
from llm_bench.plan import PlanError, load_plan_file
from llm_bench.sweep import SweepError, report_sweep, run_sweep, sweep_plan_from_mapping


@click.command()
@click.option("--plan", "plan_file", required=True, type=click.Path(exists=True, dir_okay=False, path_type=Path),
              help="TOML sweep plan: [[targets]] and [protocol].")
@click.option("--baseline", help="Configuration the chart's dashed line marks (default: the base system's control).")
@protocol_options
def sweep(plan_file, baseline, **flags) -> None:
    """Switch through specialisations and engines, measure each, and merge the comparison.

    Started again with the same plan, it resumes: what is already measured is not measured again.
    """
    try:
        plan = sweep_plan_from_mapping(load_plan_file(plan_file), relative_to=plan_file.parent)
        plan = replace(plan, protocol=apply_protocol_flags(plan.protocol, flags))
        outcome = run_sweep(plan, log)
    except (PlanError, SweepError, ServerError) as e:
        raise CouldNotRun(str(e)) from e
    except KeyboardInterrupt:
        raise Interrupted("interrupted; the machine was switched back and what was measured is kept: "
                                   "run the same command again to resume") from None
    if outcome.merged is None:
        raise RanWithFailures("nothing was measured: " + "; ".join(f"{k}: {v}" for k, v in outcome.failures.items()))
    click.echo(report_sweep(plan, outcome.merged, outcome.failures, baseline, log))
    if outcome.failures:
        raise RanWithFailures(f"{len(outcome.failures)} target(s) failed: {', '.join(outcome.failures)}; "
                                   "fix them and run the same command again to measure only what is missing")
