"""Several boxes in one run: the plan measured on each server URL in turn, the results merged into one
file with the box (its host) as every record's target, as a sweep's targets are."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path

import httpx

from llm_bench.engines.errors import ServerError
from llm_bench.plan import Plan, PlanError
from llm_bench.results import load_results
from llm_bench.runner import RunAborted, run_plan
from llm_bench.sweep import merge_sets
from llm_bench.workloads import PARTS

Log = Callable[[str], None]


def box_names(urls: Sequence[str]) -> list[str]:
    """Each URL's host, with its port where two boxes share a host (several servers on one machine)."""
    hosts = [httpx.URL(u).host or u for u in urls]
    names = [h if hosts.count(h) == 1 else f"{h}:{httpx.URL(u).port}" for h, u in zip(hosts, urls, strict=True)]
    if len(set(names)) != len(names):
        raise PlanError(f"the boxes' URLs must differ: {', '.join(urls)}")
    return names


@dataclass
class BoxesOutcome:
    merged: Path | None = None
    measured: list[Path] = field(default_factory=list)
    failures: dict[str, str] = field(default_factory=dict)


def run_boxes(plan: Plan, urls: Sequence[str], log: Log) -> BoxesOutcome:
    """Measure the plan on each URL; a box that cannot be reached or stops partway is a failure of its own,
    and the others are still measured."""
    outcome = BoxesOutcome()
    names = box_names(urls)
    for name, url in zip(names, urls, strict=True):
        log(f"== box {name} ({url})")
        try:
            writer = run_plan(replace(plan, url=url, label=plan.label or name), log, target=name)
            outcome.measured.append(writer.path)
        except RunAborted as e:
            outcome.failures[name] = str(e)
            log(f"box {name} FAILED: {e}")
        except ServerError as e:
            outcome.failures[name] = str(e)
            log(f"box {name} FAILED: {e}")
    sets = [load_results(path, PARTS) for path in outcome.measured]
    if sets:
        outcome.merged = merge_sets(plan.output_dir, sets, "boxes", names, plan.protocol.to_toml(), log)
    return outcome
