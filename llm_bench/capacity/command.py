"""``llm-bench capacity``'s flow once its plan is settled: the search over every alias (its results file
kept on disk), the answer table and the chart."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from llm_bench.capacity.answer import markdown
from llm_bench.capacity.chart import draw_capacity_chart
from llm_bench.capacity.session import run_capacity
from llm_bench.capacity.settings import CapacityPlan
from llm_bench.support.plotting import ChartError

Log = Callable[[str], None]


@dataclass(frozen=True)
class CapacityDone:
    path: Path | None
    table: str  # the answers and each search's levels, Markdown
    failed: list[str]  # aliases that could not be searched, with why


def run_capacity_command(cplan: CapacityPlan, log: Log, chart_path: Path | None = None) -> CapacityDone:
    """Search, then report; a chart that cannot be drawn is said, never fatal. Raises what run_capacity
    raises (ServerError, ObjectiveUncheckable, CapacityAborted, KeyboardInterrupt)."""
    run = run_capacity(cplan, log)
    log(f"Results written to {run.path}")
    table = markdown(run.aliases, run.objective)
    if chart_path is not None:
        try:
            draw_capacity_chart(run.aliases, run.objective, chart_path)
            log(f"Chart written to {chart_path}")
        except ChartError as e:
            log(f"no chart: {e}")
    return CapacityDone(run.path, table, list(run.failed))
