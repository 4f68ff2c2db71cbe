"""Workloads run against a model that the runner has already loaded and warmed up.

Each takes (engine, alias, protocol, base record, log) and returns finished ``AliasRecord``s that
share the alias's provenance (VRAM before the load, cold load, preset arguments) and add their own
figures. ``standard`` is the reference protocol's measurement; the others are opt-in.
"""

from __future__ import annotations

from llm_bench.workloads.categories import categories
from llm_bench.workloads.concurrency import concurrency
from llm_bench.workloads.depth import depth
from llm_bench.workloads.prefix_cache import prefix_cache
from llm_bench.workloads.quality import quality
from llm_bench.workloads.session import check_session, session
from llm_bench.workloads.standard import standard

RUNNERS = {"standard": standard, "categories": categories, "concurrency": concurrency, "prefix-cache": prefix_cache,
           "depth": depth, "session": session, "quality": quality}
# Checks of a workload's own input (a file it reads) before anything is measured; a PlanError stops the run.
PREFLIGHT = {"session": check_session}
