"""Workloads run against a model that the runner has already loaded and warmed up.

Each is one ``Workload`` object (``base.py``) in its own module; ``REGISTRY`` below is the list of them,
and everything that names workloads (plans and their ``[protocol.<workload>]`` tables, flags, the
runner, the report's tables) reads it. ``standard`` is the reference protocol's measurement; the others
are opt-in. Adding a workload: one module, one line here (docs/layout.md, "Adding a workload").
"""

from __future__ import annotations

from typing import Any

from llm_bench.workloads.base import Workload
from llm_bench.workloads.categories import CATEGORIES
from llm_bench.workloads.concurrency import CONCURRENCY
from llm_bench.workloads.depth import DEPTH
from llm_bench.workloads.prefix_cache import PREFIX_CACHE
from llm_bench.workloads.quality import QUALITY
from llm_bench.workloads.session import SESSION
from llm_bench.workloads.standard import STANDARD

REGISTRY: tuple[Workload[Any], ...] = (STANDARD, CATEGORIES, CONCURRENCY, PREFIX_CACHE, DEPTH, SESSION, QUALITY)
NAMES = tuple(w.name for w in REGISTRY)
# Each workload's record part type by the ``workload`` its records carry: what results.load_results reads parts with.
PARTS = {w.record_name: w.part for w in REGISTRY if w.part is not None}
# Plans and flags written before the default workload was named "standard" call it "protocol".
LEGACY_NAMES = {"protocol": STANDARD.name}


def workload(name: str) -> Workload[Any]:
    return next(w for w in REGISTRY if w.name == name)


def of_record(record_workload: str) -> Workload[Any] | None:
    """The workload that writes records with this ``workload`` field."""
    return next((w for w in REGISTRY if w.record_name == record_workload), None)
