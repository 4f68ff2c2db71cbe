"""A soak run: bounded mixed traffic against one model, watching for failures and drift.

Requests cycle through kinds - prose, code, JSON, a long prompt, and a burst of concurrent
streams - until the duration or the request count runs out (whichever comes first; both are
required bounds). Every request records when it started, its kind, TTFT, decode t/s, and
either success or the kind of failure. VRAM is read after each request. Drift is the least
squares slope over time (per minute) of decode t/s, TTFT and VRAM; VRAM that keeps growing
(a positive slope that explains most of the variance and adds up to more than a threshold over
the run) is flagged as a possible leak.
"""

from __future__ import annotations

import statistics
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from llm_bench.engines.stream import ChatRequest
from llm_bench.engines.errors import ServerError, ServerUnreachable
from llm_bench.engines import Engine
from llm_bench.gpu.nvml import Nvml
from llm_bench.plan import shipped_prompt
from llm_bench.results import percentile
from llm_bench.workloads.common import long_prompt, run_record
from llm_bench.support.plotting import figure

Log = Callable[[str], None]
KINDS = ("prose", "code", "json", "long", "concurrent")
LEAK_MIB = 256.0  # VRAM growth over the run that, with a steady slope, is flagged
LEAK_R2 = 0.8


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

    def to_toml(self) -> dict[str, Any]:
        return dict(self.__dict__)


@dataclass
class SoakResult:
    requests: list[SoakRequest] = field(default_factory=list)
    duration_s: float = 0.0
    stopped_by: str = ""
    trends: list[Trend] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)

    @property
    def failures(self) -> dict[str, int]:
        counts: dict[str, int] = {}
        for r in self.requests:
            if not r.ok:
                counts[r.failure or "other"] = counts.get(r.failure or "other", 0) + 1
        return counts

    def percentiles(self, metric: str) -> dict[str, float]:
        values = sorted(getattr(r, metric) for r in self.requests if r.ok and getattr(r, metric) is not None)
        return {f"p{q}": percentile(values, q) for q in (50, 90, 99)} if values else {}

    def to_toml(self) -> dict[str, Any]:
        return {
            "duration_s": self.duration_s, "stopped_by": self.stopped_by,
            "requests_total": len(self.requests), "requests_failed": sum(self.failures.values()),
            "failures": self.failures,
            "ttft_ms": self.percentiles("ttft_ms"), "decode_tps": self.percentiles("decode_tps"),
            "latency_s": self.percentiles("wall_s"),
            "trends": [t.to_toml() for t in self.trends], "warnings": self.warnings,
            "requests": [r.to_toml() for r in self.requests],
        }


def classify(error: ServerError) -> str:
    text = str(error)
    if isinstance(error, ServerUnreachable):
        return "unreachable"
    if "timed out" in text:
        return "timeout"
    if text.startswith("HTTP ") or " HTTP " in text:
        return "http"
    if "stream" in text:
        return "dropped"
    return "other"


def trend(metric: str, points: Sequence[tuple[float, float]]) -> Trend | None:
    """Least-squares line through (seconds, value); slope reported per minute."""
    if len(points) < 3:
        return None
    xs = [p[0] for p in points]
    ys = [p[1] for p in points]
    mx, my = statistics.fmean(xs), statistics.fmean(ys)
    sxx = sum((x - mx) ** 2 for x in xs)
    if sxx == 0:
        return None
    slope = sum((x - mx) * (y - my) for x, y in points) / sxx
    syy = sum((y - my) ** 2 for y in ys)
    r2 = 1.0 if syy == 0 else (slope * slope * sxx) / syy
    span = max(xs) - min(xs)
    return Trend(metric, len(points), slope * 60.0, r2, ys[0], ys[-1], slope * span)


def analyse(result: SoakResult, leak_mib: float = LEAK_MIB) -> None:
    ok = [r for r in result.requests if r.ok]
    for metric in ("decode_tps", "ttft_ms", "vram_mib"):
        points = [(r.t_s, getattr(r, metric)) for r in (result.requests if metric == "vram_mib" else ok)
                  if getattr(r, metric) is not None]
        t = trend(metric, points)
        if t is not None:
            result.trends.append(t)
    for t in result.trends:
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


def soak(engine: Engine, model: str, *, duration_s: float, max_requests: int, max_tokens: int = 128,
         concurrency: int = 4, long_tokens: int = 4000, temperature: float = 1.0, seed: int = 42,
         nvml: Nvml | None = None, log: Log = lambda m: None, clock=time.monotonic) -> SoakResult:
    if duration_s <= 0 or max_requests < 1:
        raise ValueError("a soak needs a positive --duration and --max-requests of at least 1")
    prompts = {k: shipped_prompt(k) for k in ("prose", "code", "json")}
    result = SoakResult()
    start = clock()
    n = 0
    while True:
        if len(result.requests) >= max_requests:
            result.stopped_by = "max-requests"
            break
        if clock() - start >= duration_s:
            result.stopped_by = "duration"
            break
        kind = KINDS[n % len(KINDS)]
        n += 1
        width = min(concurrency, max_requests - len(result.requests)) if kind == "concurrent" else 1
        prompt = long_prompt(long_tokens, 4.0) if kind == "long" else prompts.get(kind, prompts["prose"])
        request = ChatRequest(model, prompt, max_tokens, temperature, seed + n)
        t_s = clock() - start
        done = _send(engine, request, width)
        vram = _vram(nvml)
        for outcome in done:
            outcome.t_s, outcome.kind, outcome.vram_mib = t_s, kind, vram
            result.requests.append(outcome)
        failed = [o for o in done if not o.ok]
        log(f"  [{t_s:6.1f} s] {kind}" + (f" x{width}" if width > 1 else "") + ": "
            + (f"{len(failed)} failed ({failed[0].failure}: {failed[0].message})" if failed else
               f"TTFT {done[0].ttft_ms or 0:.0f} ms, {done[0].decode_tps or 0:.1f} t/s")
            + f"  ({len(result.requests)}/{max_requests})")
        if failed and all(o.failure == "unreachable" for o in failed) and len(result.requests) >= 3 and all(
                not r.ok and r.failure == "unreachable" for r in result.requests[-3:]):
            result.stopped_by = "server unreachable"
            break
    result.duration_s = clock() - start
    analyse(result)
    return result


def _one(engine: Engine, request: ChatRequest) -> SoakRequest:
    try:
        m = engine.stream(request)
    except ServerError as e:
        return SoakRequest(0.0, "", False, failure=classify(e), message=str(e)[:300])
    run = run_record(m, engine.kind)
    if run.finish_reason != "length":
        return SoakRequest(0.0, "", False, run.ttft_ms, run.decode_tps, run.output_tokens, run.wall_s,
                           failure="length", message=f"stopped on {run.finish_reason!r} after {run.output_tokens}")
    return SoakRequest(0.0, "", True, run.ttft_ms, run.decode_tps, run.output_tokens, run.wall_s)


def _send(engine: Engine, request: ChatRequest, width: int) -> list[SoakRequest]:
    if width == 1:
        return [_one(engine, request)]
    out: list[SoakRequest | None] = [None] * width
    barrier = threading.Barrier(width)

    def worker(i: int) -> None:
        barrier.wait()
        out[i] = _one(engine, request)

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(width)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return [o for o in out if o is not None]


def markdown(result: SoakResult) -> str:
    fails = result.failures
    lines = [f"Soak: {len(result.requests)} requests in {result.duration_s:.0f} s (stopped by {result.stopped_by}), "
             f"{sum(fails.values())} failed" + (": " + ", ".join(f"{k} {v}" for k, v in sorted(fails.items()))
                                               if fails else ""), ""]
    lines += ["| Metric | p50 | p90 | p99 |", "|---|---|---|---|"]
    for metric, label in (("ttft_ms", "TTFT ms"), ("decode_tps", "Decode t/s"), ("wall_s", "Latency s")):
        p = result.percentiles(metric)
        if p:
            lines.append(f"| {label} | {p['p50']:.2f} | {p['p90']:.2f} | {p['p99']:.2f} |")
    if result.trends:
        lines += ["", "| Drift | slope per min | R^2 | first | last |", "|---|---|---|---|---|"]
        lines += [f"| {t.metric} | {t.slope_per_min:+.3f} | {t.r2:.2f} | {t.first:.1f} | {t.last:.1f} |"
                  for t in result.trends]
    if result.warnings:
        lines += [""] + [f"- {w}" for w in result.warnings]
    return "\n".join(lines) + "\n"


def draw_soak_chart(result: SoakResult, path: Path, title: str | None = None) -> Path:
    """Decode t/s, TTFT and VRAM over the soak, with the fitted drift lines."""

    metrics = [("decode_tps", "decode t/s"), ("ttft_ms", "TTFT ms"), ("vram_mib", "VRAM MiB (all GPUs)")]
    with figure(path, dpi=110, nrows=len(metrics), ncols=1, figsize=(9, 7), sharex=True) as (fig, axes):
        trends = {t.metric: t for t in result.trends}
        for ax, (metric, label) in zip(axes, metrics):
            pts = [(r.t_s, getattr(r, metric)) for r in result.requests if getattr(r, metric) is not None]
            bad = [r.t_s for r in result.requests if not r.ok]
            if pts:
                ax.plot([p[0] for p in pts], [p[1] for p in pts], ".", color="#2b6cb0", markersize=4)
            t = trends.get(metric)
            if t is not None and pts:
                x0, x1 = pts[0][0], pts[-1][0]
                slope = t.slope_per_min / 60.0
                mx = statistics.fmean(p[0] for p in pts)
                my = statistics.fmean(p[1] for p in pts)
                ax.plot([x0, x1], [my + slope * (x0 - mx), my + slope * (x1 - mx)], "--", color="#c53030",
                        label=f"drift {t.slope_per_min:+.2f}/min (R^2 {t.r2:.2f})")
                ax.legend(loc="upper right", fontsize=8)
            for x in bad:
                ax.axvline(x, color="#e53e3e", alpha=0.3, linewidth=1)
            ax.set_ylabel(label)
            ax.spines[["top", "right"]].set_visible(False)
        axes[-1].set_xlabel("seconds since the start of the soak (red lines: failed requests)")
        fig.suptitle(title or f"Soak: {len(result.requests)} requests, {sum(result.failures.values())} failed")
    return path
