"""What ``llm-bench capacity`` looks for: the objective, the loops and the bounds of the search.

A plan file carries them in ``[capacity]`` (the same names as the flags, units in the names); the rest
of the plan (url, aliases, label, output_dir, engine, API key, ``[protocol]``) is a ``run`` plan's.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any

from llm_bench.plan import PLAN_KEYS, Plan, plan_from_mapping
from llm_bench.validation import PlanError, check_fields, check_keys
from llm_bench.workloads.session import Session, SessionSettings, load_session

LOOPS = ("closed", "open")
# A level whose client lag (p99 of sent - scheduled) is above this share of the TTFT objective measured the
# client, not the server: its result is refused.
MAX_LAG_SHARE = 0.01


@dataclass(frozen=True)
class Objective:
    """What every request of a level must get, in the tails: p10 of per-request decode t/s at least
    ``min_stream_tps`` and p95 TTFT at most ``max_ttft_s``."""

    min_stream_tps: float = field(metadata={"above": 0.0})
    max_ttft_s: float = field(metadata={"above": 0.0})

    def __post_init__(self) -> None:
        check_fields(self)

    @property
    def max_ttft_ms(self) -> float:
        return self.max_ttft_s * 1000.0

    @property
    def max_lag_ms(self) -> float:
        return self.max_ttft_ms * MAX_LAG_SHARE

    def describe(self) -> str:
        return f">= {self.min_stream_tps:g} t/s each with p95 TTFT <= {self.max_ttft_s:g} s"


@dataclass(frozen=True)
class CapacitySettings:
    # The objective; both are required (a flag or the plan's [capacity]).
    min_stream_tps: float | None = field(default=None, metadata={"above": 0.0})
    max_ttft_s: float | None = field(default=None, metadata={"above": 0.0})
    loops: tuple[str, ...] = ("closed",)
    # Each level: a warm-up (not counted), then a window of at least window_s seconds and at least
    # min_window_requests requests (20: the fewest for which p95 is a percentile rather than the max).
    warmup_s: float = field(default=10.0, metadata={"min": 0.0})
    window_s: float = field(default=30.0, metadata={"above": 0.0})
    min_window_requests: int = field(default=20, metadata={"min": 1})
    # Closed loop: the most streams searched (a llama.cpp preset's slot count + 1 bounds it further).
    max_streams: int = field(default=64, metadata={"min": 1})
    # Open loop: the first rate (default: half of what one stream got through in the probe), how close
    # the bisection brackets the answer (hi / lo - 1), the arrivals' seed, and the most requests in flight.
    start_rate_per_min: float | None = field(default=None, metadata={"above": 0.0})
    rate_resolution: float = field(default=0.1, metadata={"min": 0.01, "max": 1.0})
    arrival_seed: int = 42
    max_in_flight: int = field(default=256, metadata={"min": 1})
    # The whole search (every alias and loop) stops by itself after this many requests or seconds.
    max_requests: int = field(default=5000, metadata={"min": 1})
    max_duration_s: float = field(default=3600.0, metadata={"above": 0.0})
    # How often the server's slots are sampled during a level (llama.cpp's /slots and /metrics).
    slot_poll_s: float = field(default=0.5, metadata={"above": 0.0})
    # Prompts from the session workload's turns (each stream an agent replaying them) instead of the plan's
    # prompt: the shipped coding-agent session, or session_file (which implies session).
    session: bool = False
    session_file: Path | None = None

    def __post_init__(self) -> None:
        if isinstance(self.session_file, str):  # from a plan file
            object.__setattr__(self, "session_file", Path(self.session_file))
        check_fields(self)
        if self.session_file is not None:
            object.__setattr__(self, "session", True)
        unknown = [loop for loop in self.loops if loop not in LOOPS]
        if unknown or not self.loops:
            raise PlanError(f"loops must be one or more of {', '.join(LOOPS)}, not {list(self.loops)!r}")
        object.__setattr__(self, "loops", tuple(dict.fromkeys(self.loops)))

    def objective(self) -> Objective:
        missing = [name for name in ("min_stream_tps", "max_ttft_s") if getattr(self, name) is None]
        if missing:
            flags = " and ".join(f"--{name.replace('_', '-')}" for name in missing)
            raise PlanError(f"capacity needs an objective: give {flags} (or {' and '.join(missing)} in the "
                            "plan's [capacity])")
        return Objective(self.min_stream_tps, self.max_ttft_s)  # type: ignore[arg-type]

    def to_toml(self) -> dict[str, Any]:
        values = {f.name: getattr(self, f.name) for f in fields(self)}
        return {k: list(v) if isinstance(v, tuple) else str(v) if isinstance(v, Path) else v
                for k, v in values.items() if v is not None}

    def read_session(self) -> Session | None:
        """The session whose turns the requests replay (the session workload's loader and checks); None: the
        plan's prompt. Raises SessionFileError (a PlanError) for a file that cannot be read or is not one."""
        return load_session(SessionSettings(session_file=self.session_file)) if self.session else None


CAPACITY_KEYS = {f.name for f in fields(CapacitySettings)}


def settings_from_mapping(data: dict[str, Any], base: CapacitySettings = CapacitySettings(),
                          where: str = "[capacity]") -> CapacitySettings:
    check_keys(where, data, CAPACITY_KEYS)
    try:
        return replace(base, **data)
    except PlanError as e:
        raise PlanError(f"{where}: {e}") from e


@dataclass(frozen=True)
class CapacityPlan:
    plan: Plan = Plan()
    settings: CapacitySettings = CapacitySettings()


def capacity_plan_from_mapping(data: dict[str, Any], relative_to: Path | None = None) -> CapacityPlan:
    """A plan file: a ``run`` plan's keys plus ``[capacity]``."""
    data = dict(data)
    capacity = data.pop("capacity", {})
    if not isinstance(capacity, dict):
        raise PlanError(f"plan: capacity must be a table ([capacity]), not {capacity!r}")
    plan = plan_from_mapping(data, relative_to=relative_to, allowed=PLAN_KEYS)
    if isinstance(capacity.get("session_file"), str) and relative_to is not None:
        capacity = dict(capacity, session_file=relative_to / capacity["session_file"])
    return CapacityPlan(plan, settings_from_mapping(capacity))
