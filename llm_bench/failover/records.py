"""What a failover run records (each request, the two commands) and the figures computed from them.

Times are seconds since the run's start (one monotonic clock for the requests and the commands), so
each figure is a difference of two readings of the same clock.
"""

from __future__ import annotations

import statistics
from collections import Counter
from dataclasses import asdict, dataclass, field
from typing import Any

FORMAT = "llm-bench-failover/1"


@dataclass
class Request:
    """One request of the load."""

    sent_s: float
    done_s: float
    ok: bool
    backend: str | None = None  # the proxy's x-litellm-model-api-base
    fallbacks: int | None = None  # the proxy's x-litellm-attempted-fallbacks
    error: str | None = None
    ttft_ms: float | None = None
    decode_tps: float | None = None  # from the stream: tokens after the first over their span
    output_tokens: int | None = None
    proxy_overhead_ms: float | None = None


@dataclass
class Command:
    """A stop or start command as it ran."""

    command: str
    started_s: float
    ended_s: float | None = None
    exit_code: int | None = None
    output: str = ""  # its last lines (stdout and stderr), for the report of a failure

    @property
    def duration_s(self) -> float | None:
        return None if self.ended_s is None else self.ended_s - self.started_s


@dataclass
class Phase:
    """The requests sent in one span of the run."""

    name: str
    answered: int
    failed: int
    by_backend: dict[str, int]
    decode_tps_median: float | None
    ttft_ms_median: float | None
    answered_per_s: float | None


@dataclass
class Figures:
    requests: int
    failed: int
    failover_s: float | None  # stop command's start -> first request answered by another backend
    return_s: float | None  # start command's start -> first request answered by the primary again
    phases: list[Phase]
    errors: dict[str, int]  # message -> count


@dataclass
class FailoverRun:
    url: str
    model: str
    primary: str | None = None
    requests: list[Request] = field(default_factory=list)
    stop: Command | None = None
    start: Command | None = None
    ended_s: float | None = None
    problems: list[str] = field(default_factory=list)

    def figures(self) -> Figures:
        return figures(self)

    def to_toml(self, meta: dict[str, Any]) -> dict[str, Any]:
        data: dict[str, Any] = {"meta": {**meta, "format": FORMAT}, "url": self.url, "model": self.model}
        data |= _drop_none({"primary": self.primary, "ended_s": self.ended_s})
        if self.problems:
            data["problems"] = list(self.problems)
        for name in ("stop", "start"):
            command = getattr(self, name)
            if command is not None:
                data[name] = _drop_none(asdict(command))
        f = self.figures()
        data["figures"] = _drop_none({"requests": f.requests, "failed": f.failed, "failover_s": f.failover_s,
                                      "return_s": f.return_s, "errors": f.errors or None})
        data["phases"] = [_drop_none(asdict(p)) for p in f.phases]
        data["requests"] = [_drop_none(asdict(r)) for r in sorted(self.requests, key=lambda r: r.sent_s)]
        return data

    @classmethod
    def from_toml(cls, data: dict[str, Any]) -> FailoverRun:
        """The run as its file keeps it (the figures and phases are computed again from the requests)."""
        commands = {name: Command(**_known(Command, data[name])) for name in ("stop", "start") if name in data}
        return cls(url=str(data["url"]), model=str(data["model"]), primary=data.get("primary"),
                   requests=[Request(**_known(Request, r)) for r in data.get("requests", [])],
                   stop=commands.get("stop"), start=commands.get("start"), ended_s=data.get("ended_s"),
                   problems=list(data.get("problems", [])))


def _known(kind: Any, data: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in data.items() if k in kind.__dataclass_fields__}


def _drop_none(data: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in data.items() if v is not None}


def _median(values: list[float | None]) -> float | None:
    present = [v for v in values if v is not None]
    return statistics.median(present) if present else None


def phase_of(requests: list[Request], name: str, start: float, end: float | None) -> Phase:
    """The requests sent in [start, end); speeds are medians of the answered ones."""
    inside = [r for r in requests if r.sent_s >= start and (end is None or r.sent_s < end)]
    answered = [r for r in inside if r.ok]
    span = None
    if answered:
        last = max(r.done_s for r in answered)
        span = last - start
    return Phase(
        name=name,
        answered=len(answered),
        failed=len(inside) - len(answered),
        by_backend=dict(Counter(r.backend or "unknown" for r in answered)),
        decode_tps_median=_median([r.decode_tps for r in answered]),
        ttft_ms_median=_median([r.ttft_ms for r in answered]),
        answered_per_s=len(answered) / span if span else None,
    )


def figures(run: FailoverRun) -> Figures:
    requests = run.requests
    failover_s = return_s = None
    if run.stop is not None:
        elsewhere = [r.done_s for r in requests
                     if r.ok and r.backend != run.primary and r.done_s >= run.stop.started_s]
        failover_s = min(elsewhere) - run.stop.started_s if elsewhere else None
    if run.start is not None:
        back = [r.done_s for r in requests if r.ok and r.backend == run.primary and r.done_s >= run.start.started_s]
        return_s = min(back) - run.start.started_s if back else None
    phases = []
    stop_at = run.stop.started_s if run.stop else None
    start_at = run.start.started_s if run.start else None
    phases.append(phase_of(requests, "before", 0.0, stop_at))
    if stop_at is not None:
        phases.append(phase_of(requests, "during", stop_at, start_at))
    if start_at is not None:
        phases.append(phase_of(requests, "after", start_at, None))
    errors = Counter(r.error or "unknown error" for r in requests if not r.ok)
    return Figures(len(requests), sum(1 for r in requests if not r.ok), failover_s, return_s, phases,
                   dict(errors.most_common(5)))
