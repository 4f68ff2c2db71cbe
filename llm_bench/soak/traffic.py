"""A soak run: bounded mixed traffic against one model, watching for failures, restarts, GPU errors and drift.

Requests follow the mix - prose, code, JSON, a long prompt, a burst of concurrent streams, a tool
call, thinking and image input, each as often as its weight says - until the duration or the
request count runs out (whichever comes first; both are required bounds). A kind the model cannot
take (no vision, no thinking in its chat template) is skipped and the reason recorded. Every
request records when it started, its kind, TTFT, decode t/s, and success or the kind of failure;
VRAM is read after each. Restarts (the router's model instances, systemd's counter for the unit,
a container's restart count) and new GPU errors (Xid lines in the kernel log, NVML's critical Xid
events) are counted over the whole soak; where no source of them could be read, the soak says they were
not watched instead of counting 0. Drift is the least-squares slope over time (per minute) of decode
t/s, TTFT and VRAM with its 95 % confidence interval; only a slope whose interval excludes 0 is drift
beyond noise, and only such a slope is reported as drift or flagged: VRAM that keeps growing (a
positive slope that explains most of the variance and adds up to more than a threshold over the run)
as a possible leak, decode slowing or TTFT growing steadily.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from llm_bench.diagnostics.gpu_errors import GpuErrorWatch, check_xid, check_xid_events
from llm_bench.diagnostics.restarts import Restart, RestartWatch
from llm_bench.engines import Engine
from llm_bench.engines.errors import RequestRefused, RequestTimeout, ServerError, ServerUnreachable, StreamBroken
from llm_bench.engines.stream import ChatRequest
from llm_bench.gpu.nvml import Nvml
from llm_bench.prompts import shipped_prompt
from llm_bench.results import run_record
from llm_bench.soak.requests import (
    SPECIAL_KINDS,
    Capabilities,
    capabilities,
    send,
)
from llm_bench.support.fanout import fan_out
from llm_bench.support.stats import CONFIDENCE, Tail, slope_interval, tail_of
from llm_bench.workloads.common import long_prompt

Log = Callable[[str], None]
# The soak's results file (written by soak.command, read back by soak.report for `llm-bench report`).
FORMAT = "llm-bench-soak/1"
KINDS = ("prose", "code", "json", "long", "concurrent", "tool", "thinking", "image")
DEFAULT_MIX = dict.fromkeys(KINDS, 1)
LEAK_MIB = 256.0  # VRAM growth over the run that, with a steady slope, is flagged
LEAK_R2 = 0.8


def parse_mix(text: str) -> dict[str, int]:
    """``prose=2,tool=1,...``: each named kind's weight; kinds not named are not sent."""
    mix: dict[str, int] = {}
    for item in (part.strip() for part in text.split(",")):
        if not item:
            continue
        kind, _, weight = item.partition("=")
        kind = kind.strip()
        if kind not in KINDS:
            raise ValueError(f"unknown request kind {kind!r} in the mix; the kinds are {', '.join(KINDS)}")
        try:
            mix[kind] = int(weight) if weight else 1
        except ValueError:
            raise ValueError(f"the weight of {kind!r} must be a whole number, e.g. {kind}=2 (got {weight!r})") \
                from None
        if mix[kind] < 0:
            raise ValueError(f"the weight of {kind!r} must not be negative")
    if not any(mix.values()):
        raise ValueError(f"the mix sends nothing; give at least one kind, e.g. prose=1 (kinds: {', '.join(KINDS)})")
    return mix


def schedule(mix: dict[str, int]) -> list[str]:
    """One cycle of the mix, interleaved: prose=2,code=1 -> prose, code, prose."""
    top = max(mix.values(), default=0)
    return [kind for r in range(top) for kind in KINDS if mix.get(kind, 0) > r]


@dataclass
class SoakRequest:
    t_s: float  # since the start of the soak
    kind: str
    ok: bool
    ttft_ms: float | None = None
    decode_tps: float | None = None
    output_tokens: int | None = None
    wall_s: float | None = None
    failure: str | None = None  # kind of failure: unreachable, timeout, http, dropped, length, other
    message: str | None = None
    vram_mib: float | None = None  # summed over GPUs, read after the request

    def to_toml(self) -> dict[str, Any]:
        return {k: v for k, v in self.__dict__.items() if v is not None}


@dataclass
class Trend:
    metric: str
    n: int
    slope_per_min: float
    r2: float
    first: float
    last: float
    change: float  # fitted change over the run
    slope_low_per_min: float  # the slope's 95 % confidence interval
    slope_high_per_min: float

    @property
    def beyond_noise(self) -> bool:
        """The slope's interval excludes 0: a drift the scatter of the points does not explain."""
        return self.slope_low_per_min > 0.0 or self.slope_high_per_min < 0.0

    def to_toml(self) -> dict[str, Any]:
        return dict(self.__dict__) | {"confidence": CONFIDENCE, "beyond_noise": self.beyond_noise}


@dataclass
class SoakResult:
    requests: list[SoakRequest] = field(default_factory=list)
    duration_s: float = 0.0
    stopped_by: str = ""
    trends: list[Trend] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    mix: dict[str, int] = field(default_factory=dict)
    skipped: dict[str, str] = field(default_factory=dict)  # kind -> why the model cannot take it
    restarts: list[Restart] = field(default_factory=list)
    unwatched: list[str] = field(default_factory=list)  # restart or GPU-error sources that could not be read
    gpu_errors: list[str] = field(default_factory=list)  # one line per new Xid finding (kernel log or NVML)
    gpu_error_count: int = 0
    gpu_errors_watched: bool = False  # False: no source of GPU errors could be read, so none were counted

    @property
    def failures(self) -> dict[str, int]:
        counts: dict[str, int] = {}
        for r in self.requests:
            if not r.ok:
                counts[r.failure or "other"] = counts.get(r.failure or "other", 0) + 1
        return counts

    @property
    def failures_by_kind(self) -> dict[str, dict[str, int]]:
        """Request kind -> failure class -> count."""
        out: dict[str, dict[str, int]] = {}
        for r in self.requests:
            if not r.ok:
                per = out.setdefault(r.kind, {})
                per[r.failure or "other"] = per.get(r.failure or "other", 0) + 1
        return out

    @property
    def restart_count(self) -> int:
        return sum(r.count for r in self.restarts)

    def counts_by_kind(self) -> dict[str, int]:
        counts: dict[str, int] = {}
        for r in self.requests:
            counts[r.kind] = counts.get(r.kind, 0) + 1
        return counts

    def tails(self, metric: str) -> dict[int, Tail]:
        """p50, p90, p99 of the successful requests, each only where the samples are enough for it
        (stats.min_samples: p90 needs 10, p99 100); else the max, labelled "max"."""
        values = [getattr(r, metric) for r in self.requests if r.ok and getattr(r, metric) is not None]
        return {q: tail_of(values, q) for q in (50, 90, 99)} if values else {}

    def percentiles(self, metric: str) -> dict[str, float]:
        """What the results file keeps: the percentiles the samples are enough for, the max and n."""
        tails = self.tails(metric)
        if not tails:
            return {}
        out: dict[str, Any] = {t.label: t.value for t in tails.values() if t.label != "max"}
        return out | {"max": max(t.value for t in tails.values()), "n": tails[50].samples}

    def to_toml(self) -> dict[str, Any]:
        return {
            "duration_s": self.duration_s, "stopped_by": self.stopped_by,
            "requests_total": len(self.requests), "requests_failed": sum(self.failures.values()),
            "mix": self.mix, "requests_by_kind": self.counts_by_kind(), "skipped": self.skipped,
            "failures": self.failures, "failures_by_kind": self.failures_by_kind,
            "restarts": self.restart_count,
            "restart_sources": [r.__dict__ for r in self.restarts], "unwatched": self.unwatched,
            # TOML has no null: a count nothing was watched for is left out, never written as 0
            **({"new_gpu_errors": self.gpu_error_count} if self.gpu_errors_watched else {}),
            "gpu_errors": self.gpu_errors,
            "ttft_ms": self.percentiles("ttft_ms"), "decode_tps": self.percentiles("decode_tps"),
            "latency_s": self.percentiles("wall_s"),
            "trends": [t.to_toml() for t in self.trends], "warnings": self.warnings,
            "requests": [r.to_toml() for r in self.requests],
        }

    @classmethod
    def from_toml(cls, data: dict[str, Any]) -> SoakResult:
        """The soak as its file keeps it; the failures, counts and percentiles are computed again from the
        requests, and a GPU-error count that is absent stays unwatched."""
        return cls(
            requests=[SoakRequest(**_known(SoakRequest, r)) for r in data.get("requests", [])],
            duration_s=float(data.get("duration_s", 0.0)), stopped_by=str(data.get("stopped_by", "")),
            trends=[Trend(**_known(Trend, t)) for t in data.get("trends", [])],
            warnings=list(data.get("warnings", [])), mix=dict(data.get("mix", {})),
            skipped=dict(data.get("skipped", {})),
            restarts=[Restart(**_known(Restart, r)) for r in data.get("restart_sources", [])],
            unwatched=list(data.get("unwatched", [])), gpu_errors=list(data.get("gpu_errors", [])),
            gpu_error_count=int(data.get("new_gpu_errors", 0)), gpu_errors_watched="new_gpu_errors" in data)


def _known(kind: Any, data: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in data.items() if k in kind.__dataclass_fields__}


FAILURES = {ServerUnreachable: "unreachable", RequestTimeout: "timeout", RequestRefused: "http",
            StreamBroken: "dropped"}


def classify(error: ServerError) -> str:
    return next((name for kind, name in FAILURES.items() if isinstance(error, kind)), "other")


def trend(metric: str, points: Sequence[tuple[float, float]]) -> Trend | None:
    """Least-squares line through (seconds, value) with the slope's 95 % interval; slopes reported per minute."""
    xs = [p[0] for p in points]
    ys = [p[1] for p in points]
    fit = slope_interval(xs, ys)
    if fit is None:
        return None
    span = max(xs) - min(xs)
    return Trend(metric, len(points), fit.slope * 60.0, fit.r2, ys[0], ys[-1], fit.slope * span,
                 fit.low * 60.0, fit.high * 60.0)


def analyse(result: SoakResult, leak_mib: float = LEAK_MIB) -> None:
    ok = [r for r in result.requests if r.ok]
    for metric in ("decode_tps", "ttft_ms", "vram_mib"):
        points = [(r.t_s, getattr(r, metric)) for r in (result.requests if metric == "vram_mib" else ok)
                  if getattr(r, metric) is not None]
        t = trend(metric, points)
        if t is not None:
            result.trends.append(t)
    for t in (t for t in result.trends if t.beyond_noise):
        if t.metric == "vram_mib" and t.slope_per_min > 0 and t.r2 >= LEAK_R2 and t.change >= leak_mib:
            result.warnings.append(
                f"POSSIBLE LEAK: VRAM grew steadily by {t.change:.0f} MiB over the run ({t.slope_per_min:.1f} MiB/min, "
                f"R^2 {t.r2:.2f}); run longer to confirm, and check the server's cache settings and version")
        if t.metric == "decode_tps" and t.first and t.change < -0.1 * t.first and t.r2 >= 0.5:
            result.warnings.append(f"decode slowed steadily by {-t.change:.1f} t/s over the run "
                                   f"({t.slope_per_min:.2f} t/s per min): thermal throttling or a growing cache?")
        if t.metric == "ttft_ms" and t.first and t.change > 0.5 * t.first and t.r2 >= 0.5:
            result.warnings.append(f"TTFT grew steadily by {t.change:.0f} ms over the run")


def _vram(nvml: Nvml | None) -> float | None:
    if nvml is None or not nvml.available:
        return None
    reading = nvml.vram_used()
    return None if reading.used_mib is None else sum(reading.used_mib)


@dataclass
class SoakSettings:
    duration_s: float
    max_requests: int
    max_tokens: int = 128
    concurrency: int = 4  # streams in a concurrent burst
    long_tokens: int = 4000
    temperature: float = 1.0
    seed: int = 42
    mix: dict[str, int] = field(default_factory=lambda: dict(DEFAULT_MIX))

    def check(self) -> None:
        if self.duration_s <= 0 or self.max_requests < 1:
            raise ValueError("a soak needs a positive --duration and --max-requests of at least 1")
        if self.concurrency < 1:
            raise ValueError(f"--burst must be at least 1 (streams in each concurrent burst; got {self.concurrency})")


def soak(engine: Engine, model: str, settings: SoakSettings, *, nvml: Nvml | None = None,
         restarts: Sequence[RestartWatch] = (), gpu_errors: GpuErrorWatch | None = None,
         log: Log = lambda m: None, clock=time.monotonic, result: SoakResult | None = None,
         checkpoint: Callable[[SoakResult], None] = lambda r: None) -> SoakResult:
    """Fills ``result`` (a new one when not given, so a caller can save what a crash left) and calls
    ``checkpoint`` after every request or burst."""
    settings.check()
    prompts = {k: shipped_prompt(k) for k in ("prose", "code", "json")}
    result = result if result is not None else SoakResult()
    result.mix = dict(settings.mix)
    for watch in restarts:
        watch.start()
    if gpu_errors is not None:
        gpu_errors.start()
    caps: Capabilities | None = None
    cycle = schedule(settings.mix)
    start = clock()
    n = 0
    while True:
        if len(result.requests) >= settings.max_requests:
            result.stopped_by = "max-requests"
            break
        if clock() - start >= settings.duration_s:
            result.stopped_by = "duration"
            break
        kind = cycle[n % len(cycle)]
        n += 1
        if kind in SPECIAL_KINDS:
            if caps is None and result.requests:  # asked once the model is loaded, until it answers
                caps = capabilities(engine, model)
            reason = caps.skip_reason(kind) if caps else None
            if reason:
                if kind not in result.skipped:
                    result.skipped[kind] = reason
                    log(f"  skipping {kind}: {reason}")
                if all(k in result.skipped for k in cycle):
                    result.stopped_by = "every kind skipped"
                    break
                continue
        t_s = clock() - start
        width = min(settings.concurrency, settings.max_requests - len(result.requests))
        done = _send(engine, model, kind, settings, n, prompts, caps, width)
        vram = _vram(nvml)
        for outcome in done:
            outcome.t_s, outcome.kind, outcome.vram_mib = t_s, kind, vram
            result.requests.append(outcome)
        if gpu_errors is not None:
            gpu_errors.poll()
        result.duration_s = clock() - start
        checkpoint(result)
        failed = [o for o in done if not o.ok]
        log(f"  [{t_s:6.1f} s] {kind}" + (f" x{len(done)}" if len(done) > 1 else "") + ": "
            + (f"{len(failed)} failed ({failed[0].failure}: {failed[0].message})" if failed else
               f"TTFT {done[0].ttft_ms or 0:.0f} ms, {done[0].decode_tps or 0:.1f} t/s" if done[0].ttft_ms else
               f"ok in {done[0].wall_s or 0:.2f} s")
            + f"  ({len(result.requests)}/{settings.max_requests})")
        if len(result.requests) >= 3 and all(not r.ok and r.failure == "unreachable" for r in result.requests[-3:]):
            result.stopped_by = "server unreachable"
            break
    result.duration_s = clock() - start
    for watch in restarts:
        counted = watch.stop()
        if counted is None:
            result.unwatched.append(f"restarts: {watch.unavailable}")
        else:
            result.restarts.append(counted)
    if gpu_errors is not None:
        _count_gpu_errors(result, gpu_errors, nvml)
    analyse(result)
    return result


def _count_gpu_errors(result: SoakResult, watch: GpuErrorWatch, nvml: Nvml | None) -> None:
    lines, events = watch.stop()
    result.unwatched += [f"GPU errors: {reason}" for reason in watch.unavailable]
    result.gpu_errors_watched = bool(watch.watched())
    pci = nvml.pci_indexes() if nvml is not None else {}
    result.gpu_errors = [f.evidence for f in check_xid(lines, pci, watch.log.describe()) + check_xid_events(events)]
    # the kernel log and NVML report the same Xid twice; count what the fuller of the two saw
    result.gpu_error_count = max(len(lines), len(events))


def _one(engine: Engine, request: ChatRequest) -> SoakRequest:
    try:
        m = engine.stream(request)
        run = run_record(m, engine)
    except ServerError as e:
        return SoakRequest(0.0, "", False, failure=classify(e), message=str(e)[:300])
    except Exception as e:  # noqa: BLE001 - any other error is this request's failure, not the soak's end
        return SoakRequest(0.0, "", False, failure="other", message=f"{type(e).__name__}: {e}"[:300])
    if run.finish_reason != "length":
        return SoakRequest(0.0, "", False, run.ttft_ms, run.decode_tps, run.output_tokens, run.wall_s,
                           failure="length", message=f"stopped on {run.finish_reason!r} after {run.output_tokens}")
    return SoakRequest(0.0, "", True, run.ttft_ms, run.decode_tps, run.output_tokens, run.wall_s)


def _special(engine: Engine, model: str, kind: str, settings: SoakSettings, seed: int,
             caps: Capabilities | None) -> SoakRequest:
    try:
        reply = send(engine, kind, model, settings.max_tokens, settings.temperature, seed)
    except ServerError as e:
        return SoakRequest(0.0, kind, False, failure=classify(e), message=str(e)[:300])
    except Exception as e:  # noqa: BLE001 - any other error is this request's failure, not the soak's end
        return SoakRequest(0.0, kind, False, failure="other", message=f"{type(e).__name__}: {e}"[:300])
    message = None if reply.message is None else reply.message + (caps.note(kind) if caps else "")
    return SoakRequest(0.0, kind, reply.ok, None, reply.decode_tps, reply.output_tokens, reply.wall_s,
                       failure=reply.failure, message=message)


def _send(engine: Engine, model: str, kind: str, settings: SoakSettings, n: int, prompts: dict[str, str],
          caps: Capabilities | None, width: int) -> list[SoakRequest]:
    seed = settings.seed + n
    if kind in SPECIAL_KINDS:
        return [_special(engine, model, kind, settings, seed, caps)]
    prompt = long_prompt(settings.long_tokens, 4.0) if kind == "long" else prompts.get(kind, prompts["prose"])
    request = ChatRequest(model, prompt, settings.max_tokens, settings.temperature, seed)
    if kind != "concurrent":
        return [_one(engine, request)]
    outcomes, _ = fan_out([lambda: _one(engine, request)] * max(1, width))
    return [o.value if o.ok and o.value is not None else
            SoakRequest(0.0, kind, False, failure="other", message=f"{type(o.error).__name__}: {o.error}"[:300])
            for o in outcomes]
