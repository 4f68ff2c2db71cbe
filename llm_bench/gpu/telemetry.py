"""GPU telemetry sampled in the background while llm-bench measures.

A ``TelemetrySampler`` reads every GPU through ``Nvml.sample()`` every ``interval_s`` in a
daemon thread. ``sampling(nvml)`` makes one the active sampler for a block (a context
variable, so lower layers need no extra argument), and ``recording(record)`` - used by the
workloads around their measured requests - takes an exact reading at the start and the end
and stores the span's samples and summary on the record:

- peak VRAM, mean power, maximum temperature, mean SM clock, per GPU;
- energy: the difference of the driver's energy counter (``nvmlDeviceGetTotalEnergyConsumption``)
  between the two exact readings; where a GPU does not support the counter, the trapezoidal
  integral of its power readings instead. ``energy_source`` says which was used;
- joules per output token and output tokens per joule (all GPUs together).
"""

from __future__ import annotations

import itertools
import threading
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from contextvars import ContextVar
from pathlib import Path
from typing import Any

from llm_bench.gpu.nvml import GpuSample, Nvml
from llm_bench.support.plotting import figure

DEFAULT_INTERVAL_S = 0.5
COUNTER = "energy counter"
INTEGRATION = "power integration"

_active: ContextVar[TelemetrySampler | None] = ContextVar("llm_bench_telemetry", default=None)


class TelemetrySampler:
    def __init__(self, nvml: Nvml, interval_s: float = DEFAULT_INTERVAL_S):
        self.nvml = nvml
        self.interval_s = interval_s
        self.samples: list[GpuSample] = []
        self.error: str | None = None
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="llm-bench-telemetry", daemon=True)

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            self.mark()

    def mark(self, end: bool = False) -> float:
        """Take one reading of every GPU now; returns a time (monotonic) from before the reading, or after
        it with ``end=True``, so that ``between(start_mark, end_mark)`` includes both readings."""
        t = time.monotonic()
        try:
            readings = self.nvml.sample()
        except Exception as e:  # a GPU fell off the bus, the driver went away: keep measuring
            self.error = f"telemetry read failed: {e}"
            readings = []
        with self._lock:
            self.samples.extend(readings)
        return time.monotonic() if end else t

    def between(self, t0: float, t1: float) -> list[GpuSample]:
        with self._lock:
            return [s for s in self.samples if t0 <= s.t <= t1]

    def start(self) -> TelemetrySampler:
        self.mark()
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(self.interval_s + 5.0)
        self.mark()

    def __enter__(self) -> TelemetrySampler:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


@contextmanager
def sampling(nvml: Nvml, interval_s: float = DEFAULT_INTERVAL_S) -> Iterator[TelemetrySampler | None]:
    """Run a sampler for the block and make it the active one; nothing happens without NVML."""
    if not nvml.available:
        yield None
        return
    sampler = TelemetrySampler(nvml, interval_s)
    token = _active.set(sampler)
    try:
        with sampler:
            yield sampler
    finally:
        _active.reset(token)


@contextmanager
def recording(record: Any) -> Iterator[None]:
    """Store the telemetry of the block's span on ``record.telemetry`` (when a sampler is active)."""
    sampler = _active.get()
    if sampler is None:
        yield
        return
    t0 = sampler.mark()
    try:
        yield
    finally:
        t1 = sampler.mark(end=True)
        tokens = sum(r.output_tokens or 0 for r in record.runs)
        record.telemetry = summarise(sampler.between(t0, t1), tokens, t0, sampler.interval_s)


def _by_gpu(samples: Sequence[GpuSample]) -> dict[int, list[GpuSample]]:
    out: dict[int, list[GpuSample]] = {}
    for s in samples:
        out.setdefault(s.index, []).append(s)
    return out


def gpu_energy(series: Sequence[GpuSample]) -> tuple[float | None, str | None]:
    """Joules one GPU used over the series: counter delta, else the integral of power."""
    counters = [s.energy_j for s in series if s.energy_j is not None]
    if len(counters) >= 2 and len(counters) == len(series):
        return counters[-1] - counters[0], COUNTER
    powered = [(s.t, s.power_w) for s in series if s.power_w is not None]
    if len(powered) >= 2:
        joules = sum((tb - ta) * (pa + pb) / 2 for (ta, pa), (tb, pb) in itertools.pairwise(powered))
        return joules, INTEGRATION
    return None, None


def _mean(values: list[float]) -> float | None:
    return sum(values) / len(values) if values else None


def summarise(samples: Sequence[GpuSample], output_tokens: int, t0: float,
              interval_s: float = DEFAULT_INTERVAL_S) -> dict[str, Any]:
    """The summary and the samples of one measured span, ready for the results file."""
    per_gpu = _by_gpu(samples)
    gpus = sorted(per_gpu)
    summary: dict[str, Any] = {"interval_s": interval_s, "gpus": gpus}
    if samples:
        summary["duration_s"] = max(s.t for s in samples) - min(s.t for s in samples)

    def column(attr: str, reduce) -> list[float] | None:
        values = []
        for i in gpus:
            present = [getattr(s, attr) for s in per_gpu[i] if getattr(s, attr) is not None]
            if not present:
                return None
            values.append(reduce(present))
        return values or None

    summary["peak_vram_mib"] = column("vram_used_mib", max)
    summary["mean_power_w"] = column("power_w", _mean)
    summary["max_temperature_c"] = column("temperature_c", max)
    summary["mean_sm_clock_mhz"] = column("sm_clock_mhz", _mean)
    summary["mean_mem_clock_mhz"] = column("mem_clock_mhz", _mean)

    energies = [gpu_energy(per_gpu[i]) for i in gpus]
    measured = [(j, src) for j, src in energies if j is not None and src is not None]
    if energies and len(measured) == len(energies):
        total = sum(j for j, _ in measured)
        summary["energy_j"] = total
        summary["energy_source"] = " + ".join(sorted({src for _, src in measured}))
        summary["energy_source_per_gpu"] = [src for _, src in measured]
        summary["output_tokens"] = output_tokens
        if output_tokens and total > 0:
            summary["joules_per_token"] = total / output_tokens
            summary["tokens_per_joule"] = output_tokens / total
    else:
        summary["energy_unavailable"] = "neither the energy counter nor power readings were available"
    summary["samples"] = [
        {k: v for k, v in (("t", round(s.t - t0, 3)), ("gpu", s.index), ("vram_mib", s.vram_used_mib),
                           ("power_w", s.power_w), ("energy_j", s.energy_j), ("sm_mhz", s.sm_clock_mhz),
                           ("mem_mhz", s.mem_clock_mhz), ("temp_c", s.temperature_c)) if v is not None}
        for s in samples
    ]
    return {k: v for k, v in summary.items() if v is not None}


PANELS = (("vram_mib", "VRAM MiB"), ("power_w", "power W"), ("temp_c", "temperature C"), ("sm_mhz", "SM clock MHz"))


def draw_telemetry_chart(series: Sequence[tuple[str, dict[str, Any]]], path: Path, title: str | None = None) -> Path:
    """Time series of VRAM, power, temperature and SM clock; one line per configuration and GPU."""

    drawn = [(name, t) for name, t in series if t.get("samples")]
    if not drawn:
        raise ValueError("no record carries telemetry samples (was NVML available during the run?)")
    with figure(path, dpi=110, nrows=len(PANELS), ncols=1, figsize=(10, 8), sharex=True) as (fig, axes):
        for name, telemetry in drawn:
            gpus = sorted({s["gpu"] for s in telemetry["samples"]})
            for gpu in gpus:
                points = [s for s in telemetry["samples"] if s["gpu"] == gpu]
                label = name if len(gpus) == 1 else f"{name} GPU{gpu}"
                for ax, (key, _) in zip(axes, PANELS, strict=True):
                    xy = [(s["t"], s[key]) for s in points if key in s]
                    if xy:
                        ax.plot([p[0] for p in xy], [p[1] for p in xy], "-", linewidth=1.2, label=label)
        for ax, (_, label) in zip(axes, PANELS, strict=True):
            ax.set_ylabel(label)
            ax.spines[["top", "right"]].set_visible(False)
        axes[0].legend(loc="upper left", fontsize=7, ncol=2)
        axes[-1].set_xlabel("seconds since the start of the measured runs")
        fig.suptitle(title or "GPU telemetry during the measured runs")
    return path
