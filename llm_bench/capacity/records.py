"""What capacity keeps: every request with its schedule, each level's verdict, each search's answer.

Nothing here talks to a server: a level is judged from its requests alone, so every rule can be tested
with made-up records. Tails follow the results file's one rule (``support.stats.tail_of``): a percentile only
where the samples are enough for it, else the extreme value, labelled so. For the objective that is the
stricter reading: the max TTFT is at least its p95, the min decode rate at most its p10.
"""

from __future__ import annotations

import statistics
from dataclasses import asdict, dataclass, field, fields
from typing import Any

from llm_bench.capacity.settings import Objective
from llm_bench.engines.stream import StreamMeasurement
from llm_bench.support.stats import Tail, min_samples, percentile, tail_of

PROBE, WARMUP, WINDOW, COOLDOWN = "probe", "warmup", "window", "cooldown"
# An open-loop level that stopped because too many requests were in flight: it breaks the objective.
OVERLOADED = "overloaded"


@dataclass
class RequestRecord:
    """One request. Times are seconds from the start of its level (the probe's: from its own start);
    ``lag_ms`` is the client's delay from when the request was due to when its last byte was written."""

    level: float  # streams (closed loop) or requests per minute (open loop)
    phase: str  # probe, warmup, window (counted), cooldown
    scheduled_s: float
    sent_s: float | None = None
    lag_ms: float | None = None
    ended_s: float | None = None
    stream: int | None = None  # closed loop: which of the N streams sent it
    turn: int | None = None  # prompts from a session: which of its turns (1 = the first request of a conversation)
    ttft_ms: float | None = None
    decode_tps: float | None = None  # the engine's decode rate (decode_source): llama.cpp's own timings
    server_decode_tps: float | None = None  # timings.predicted_per_second
    client_decode_tps: float | None = None  # (output tokens - 1) / first-to-last token chunk
    decode_ms: float | None = None  # timings.predicted_ms
    prompt_ms: float | None = None  # timings.prompt_ms: from a slot taking the request to its first token
    wait_ms: float | None = None  # ttft_ms - prompt_ms: before a slot took it (queue, transport, router)
    output_tokens: int | None = None
    prompt_tokens: int | None = None
    cache_n: int | None = None
    finish_reason: str | None = None
    error: str | None = None

    @property
    def counted(self) -> bool:
        return self.phase == WINDOW

    def meets(self, objective: Objective) -> bool:
        """This request alone got what the objective asks of every request (goodput counts these)."""
        return (self.error is None and self.decode_tps is not None and self.ttft_ms is not None
                and self.decode_tps >= objective.min_stream_tps and self.ttft_ms <= objective.max_ttft_ms)

    def to_toml(self) -> dict[str, Any]:
        return {k: v for k, v in asdict(self).items() if v is not None}

    @classmethod
    def from_toml(cls, data: dict[str, Any]) -> RequestRecord:
        return cls(**_known(cls, data))


def _known(cls: type, data: dict[str, Any]) -> dict[str, Any]:
    """The keys a dataclass has (a newer file's extra keys are left out rather than refused)."""
    names = {f.name for f in fields(cls)}
    return {k: v for k, v in data.items() if k in names}


def request_record(m: StreamMeasurement, *, level: float, phase: str, scheduled: float, origin: float,
                   server_decode_rate: bool, stream: int | None = None, turn: int | None = None) -> RequestRecord:
    """A finished stream as a record; ``origin`` is the level's start on the same clock as ``m``;
    ``server_decode_rate``: the engine's decode rate is the server's own (its capabilities say)."""
    timings = m.timings or {}
    sent = m.written_at if m.written_at is not None else m.sent_at
    ttft_ms = None if m.ttft_s is None else m.ttft_s * 1000.0
    prompt_ms = timings.get("prompt_ms")
    server_tps = timings.get("predicted_per_second")
    return RequestRecord(
        level=level, phase=phase, scheduled_s=scheduled - origin, sent_s=sent - origin,
        lag_ms=max(0.0, (sent - scheduled) * 1000.0),
        ended_s=None if m.done_at is None else m.done_at - origin, stream=stream, turn=turn, ttft_ms=ttft_ms,
        decode_tps=server_tps if server_decode_rate else m.client_decode_tps,
        server_decode_tps=server_tps, client_decode_tps=m.client_decode_tps,
        decode_ms=timings.get("predicted_ms"), prompt_ms=prompt_ms,
        wait_ms=None if ttft_ms is None or prompt_ms is None else ttft_ms - prompt_ms,
        output_tokens=m.output_tokens, prompt_tokens=m.prompt_tokens, cache_n=m.cached_tokens,
        finish_reason=m.finish_reason,
    )


def low_tail(values: list[float], q: float) -> Tail:
    """The q-th percentile from below (p10) where the samples are enough that one lies under it, else the min."""
    if len(values) >= min_samples(100.0 - q):
        return Tail(percentile(values, q), f"p{q:g}", len(values))
    return Tail(min(values), "min", len(values))


def tail_phrase(tail: Tail | None, name: str, scale: float = 1.0, digits: int = 1, unit: str = "") -> str:
    """'p95 TTFT 2.31 s', or 'max TTFT 2.31 s (n=12)' where the samples were too few for the percentile."""
    if tail is None:
        return f"{name} n/a"
    shown = f"{tail.label} {name} {tail.value * scale:.{digits}f}{unit}"
    return shown if tail.label.startswith("p") else f"{shown} (n={tail.samples})"


@dataclass
class SlotEvidence:
    """The server's own view of its slots, sampled during a level (llama.cpp's /slots and /metrics)."""

    slots: int | None = None
    samples: int = 0
    busy_max: int = 0
    all_busy_samples: int = 0  # samples in which every slot was processing
    # samples in which every slot was busy and requests waited: the server's requests_deferred (llama.cpp,
    # with metrics on) above 0, or more requests in flight on the client than slots processing
    queued_samples: int = 0
    deferred_max: int | None = None  # the most requests_deferred seen
    waiting_max: int = 0  # the most requests in flight beyond the busy slots while all were busy

    @classmethod
    def from_toml(cls, data: dict[str, Any]) -> SlotEvidence:
        return cls(**_known(cls, data))

    @property
    def queued(self) -> bool:
        """The server held requests back while every slot was busy."""
        return self.queued_samples > 0

    def to_toml(self) -> dict[str, Any]:
        return {k: v for k, v in asdict(self).items() if v is not None}


@dataclass
class Judgement:
    """A level's figures over its window and whether they meet the objective."""

    counted: int
    failed: int
    decode_p10: Tail | None
    decode_median: float | None
    ttft_p95: Tail | None
    ttft_median: float | None
    prompt_ms_p95: Tail | None
    wait_ms_p95: Tail | None
    lag_p99: Tail | None
    window_s: float | None
    throughput_per_min: float | None  # window requests that finished, per minute of window
    goodput_per_min: float | None  # window requests that met the objective on their own, per minute
    output_tps: float | None  # output tokens of the window's requests per second of window
    decode_ok: bool | None
    ttft_ok: bool | None
    client_bound: bool  # the client lagged more than the objective allows: the level measured the client
    meets: bool | None  # None: not judged (cut short, nothing measured, or client-bound)

    def broken(self) -> list[str]:
        """Which parts of the objective the level breaks ("decode", "TTFT")."""
        return (["decode"] if self.decode_ok is False else []) + (["TTFT"] if self.ttft_ok is False else [])

    def to_toml(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for name, value in asdict(self).items():
            if value is None:
                continue
            if isinstance(value, dict):  # a Tail
                out[name] = value["value"]
                out[f"{name}_label"] = value["label"]
            else:
                out[name] = value
        return out


def _median(values: list[float]) -> float | None:
    return statistics.median(values) if values else None


def _tail(values: list[float], q: float) -> Tail | None:
    return tail_of(values, q) if values else None


def judge(requests: list[RequestRecord], objective: Objective, window: tuple[float, float] | None,
          cut_short: str | None) -> Judgement:
    """The level's verdict from its counted (window) requests. A failed request breaks the level: a session
    that gets an error is not carried."""
    counted = [r for r in requests if r.counted]
    finished = [r for r in counted if r.error is None]
    decode = [r.decode_tps for r in finished if r.decode_tps is not None]
    ttft = [r.ttft_ms for r in finished if r.ttft_ms is not None]
    lags = [r.lag_ms for r in counted if r.lag_ms is not None]
    decode_p10 = low_tail(decode, 10) if decode else None
    ttft_p95 = _tail(ttft, 95)
    lag_p99 = _tail(lags, 99)
    span = None if window is None else window[1] - window[0]
    per_min = None if not span else 60.0 / span
    decode_ok = None if decode_p10 is None else decode_p10.value >= objective.min_stream_tps
    ttft_ok = None if ttft_p95 is None else ttft_p95.value <= objective.max_ttft_ms
    client_bound = lag_p99 is not None and lag_p99.value > objective.max_lag_ms
    failed = len(counted) - len(finished)
    if cut_short == OVERLOADED:
        meets = False
    elif cut_short or not counted or client_bound:
        meets = None
    elif failed or decode_ok is False or ttft_ok is False:
        meets = False
    else:
        meets = decode_ok is True and ttft_ok is True
    return Judgement(
        counted=len(counted), failed=failed, decode_p10=decode_p10, decode_median=_median(decode),
        ttft_p95=ttft_p95, ttft_median=_median(ttft),
        prompt_ms_p95=_tail([r.prompt_ms for r in finished if r.prompt_ms is not None], 95),
        wait_ms_p95=_tail([r.wait_ms for r in finished if r.wait_ms is not None], 95),
        lag_p99=lag_p99, window_s=span,
        throughput_per_min=None if per_min is None else len(finished) * per_min,
        goodput_per_min=None if per_min is None else sum(r.meets(objective) for r in counted) * per_min,
        output_tps=None if not span else sum(r.output_tokens or 0 for r in finished) / span,
        decode_ok=decode_ok, ttft_ok=ttft_ok, client_bound=client_bound, meets=meets,
    )


def _slots(n: int | None) -> str:
    return f"{n} slot{'' if n == 1 else 's'}"


@dataclass
class Level:
    """One level of one loop: N streams (closed) or R requests per minute (open), with every request."""

    loop: str
    level: float
    started_at: str
    requests: list[RequestRecord] = field(default_factory=list)
    duration_s: float | None = None
    window: tuple[float, float] | None = None  # the window's start and end, seconds from the level's start
    cut_short: str | None = None  # why the level ended before its window closed (then it is not judged)
    slots: SlotEvidence | None = None
    judgement: Judgement | None = None

    def judge(self, objective: Objective) -> Judgement:
        self.judgement = judge(self.requests, objective, self.window, self.cut_short)
        return self.judgement

    def cause(self, objective: Objective) -> str:
        """Why the level breaks the objective, in words; empty when it meets it."""
        j = self.judgement or self.judge(objective)
        reasons = []
        if self.cut_short == OVERLOADED:
            reasons.append("the server fell behind the arrivals: too many requests in flight (--max-in-flight)")
        if j.failed:
            reasons.append(f"{j.failed} of {j.counted} requests failed")
        if j.decode_ok is False and j.decode_p10 is not None:
            reasons.append(f"{tail_phrase(j.decode_p10, 'decode', unit=' t/s')}: decoding slowed")
        if j.ttft_ok is False and j.ttft_p95 is not None:
            reasons.append(self._ttft_cause(j, objective))
        return "; ".join(reasons)

    def _ttft_cause(self, j: Judgement, objective: Objective) -> str:
        ttft = tail_phrase(j.ttft_p95, "TTFT", 0.001, 2, " s")
        if j.prompt_ms_p95 is None:
            return ttft
        if j.prompt_ms_p95.value > objective.max_ttft_ms:
            own = tail_phrase(j.prompt_ms_p95, "prompt time", 0.001, 2, " s")
            return f"{ttft}: prompt processing slowed (the server's own {own})"
        # the server's own prompt time fits the objective: the time before a slot took the request does not
        slots = self.slots.slots if self.slots else None
        more_streams = self.loop == "closed" and slots is not None and self.level > slots
        if more_streams:
            return f"{ttft}: requests queued for a slot ({self.level:g} streams on {_slots(slots)})"
        if self.slots is not None and self.slots.queued:
            every = "the slot" if slots == 1 else f"all {slots} slots"
            return f"{ttft}: requests queued for a slot ({every} busy, up to {self._waiting()} waiting)"
        wait = tail_phrase(j.wait_ms_p95, "wait", 0.001, 2, " s")
        return f"{ttft}: requests waited before the server started their prompt ({wait})"

    def _waiting(self) -> int:
        assert self.slots is not None
        return max(self.slots.deferred_max or 0, self.slots.waiting_max)

    def to_toml(self) -> dict[str, Any]:
        out: dict[str, Any] = {"loop": self.loop, "level": self.level, "started_at": self.started_at}
        for name in ("duration_s", "cut_short"):
            if getattr(self, name) is not None:
                out[name] = getattr(self, name)
        if self.window is not None:
            out["window_start_s"], out["window_end_s"] = self.window
        if self.judgement is not None:
            out.update(self.judgement.to_toml())
        if self.slots is not None:
            out["slots"] = self.slots.to_toml()
        out["requests"] = [r.to_toml() for r in self.requests]
        return out

    @classmethod
    def from_toml(cls, data: dict[str, Any], objective: Objective) -> Level:
        """A level read back, judged again from its requests: the file's figures are recomputed, never trusted."""
        window = (data["window_start_s"], data["window_end_s"]) if "window_start_s" in data else None
        level = cls(data["loop"], data["level"], data["started_at"],
                    [RequestRecord.from_toml(r) for r in data.get("requests", [])], data.get("duration_s"), window,
                    data.get("cut_short"), SlotEvidence.from_toml(data["slots"]) if "slots" in data else None)
        level.judge(objective)
        return level


@dataclass
class Search:
    """One loop's search for one alias: the levels in the order measured, and where it ended."""

    loop: str
    levels: list[Level] = field(default_factory=list)
    carried: float | None = None  # the largest level that met the objective (below the first that broke it)
    broken_at: float | None = None  # the smallest level that broke it
    stopped_by: str | None = None  # found, ceiling, none-meets, max_requests, max_duration, client-bound, ...
    ceiling: float | None = None
    ceiling_reason: str | None = None
    answer: str = ""

    def level(self, value: float) -> Level | None:
        return next((lv for lv in self.levels if lv.level == value and lv.judgement is not None
                     and lv.judgement.meets is not None), None)

    def to_toml(self) -> dict[str, Any]:
        out: dict[str, Any] = {"loop": self.loop, "answer": self.answer}
        for name in ("carried", "broken_at", "stopped_by", "ceiling", "ceiling_reason"):
            if getattr(self, name) is not None:
                out[name] = getattr(self, name)
        out["levels"] = [lv.to_toml() for lv in self.levels]
        return out

    @classmethod
    def from_toml(cls, data: dict[str, Any], objective: Objective) -> Search:
        return cls(data["loop"], [Level.from_toml(lv, objective) for lv in data.get("levels", [])],
                   data.get("carried"), data.get("broken_at"), data.get("stopped_by"), data.get("ceiling"),
                   data.get("ceiling_reason"), data.get("answer", ""))


@dataclass
class AliasCapacity:
    alias: str
    engine: str
    decode_source: str
    slots: int | None = None
    preset_args: list[str] = field(default_factory=list)
    server_build: str | None = None
    probes: list[RequestRecord] = field(default_factory=list)  # the model's load, then the probe itself
    searches: list[Search] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)

    @property
    def probe(self) -> RequestRecord | None:
        """The request alone on the loaded model: what the objective's check and the first rate read."""
        return self.probes[-1] if self.probes else None

    def to_toml(self) -> dict[str, Any]:
        out: dict[str, Any] = {"alias": self.alias, "engine": self.engine, "decode_source": self.decode_source}
        if self.slots is not None:
            out["slots"] = self.slots
        if self.preset_args:
            out["preset_args"] = self.preset_args
        if self.server_build is not None:
            out["server_build"] = self.server_build
        if self.probes:
            out["probes"] = [p.to_toml() for p in self.probes]
        out["errors"] = self.errors
        out["searches"] = [s.to_toml() for s in self.searches]
        return out

    @classmethod
    def from_toml(cls, data: dict[str, Any], objective: Objective) -> AliasCapacity:
        return cls(data["alias"], data.get("engine", ""), data.get("decode_source", ""), data.get("slots"),
                   list(data.get("preset_args", [])), data.get("server_build"),
                   [RequestRecord.from_toml(p) for p in data.get("probes", [])],
                   [Search.from_toml(s, objective) for s in data.get("searches", [])], list(data.get("errors", [])))
