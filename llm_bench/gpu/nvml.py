"""NVIDIA GPU facts through NVML.

All NVML access goes through ``Nvml``, which takes the ``pynvml`` module (or a test double
with the same functions, constants and ``NVMLError``) so that every path can be tested
without a GPU. A missing library or driver is "unavailable", never a reading of zero.
"""

from __future__ import annotations

import functools
import importlib
import os
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from types import ModuleType
from typing import Any

MIB = 1024 * 1024
# The NVML seam: "package.module:factory" names a zero-argument callable returning an object with
# pynvml's functions, constants and NVMLError, used instead of pynvml. The tests fill it with their
# test double to drive a real `llm-bench` process without a GPU; never set it on a real machine.
NVML_MODULE_ENV = "LLM_BENCH_NVML_MODULE"


@dataclass(frozen=True)
class GpuInfo:
    index: int
    name: str
    memory_total_mib: float


@dataclass(frozen=True)
class VramReading:
    """Memory in use per GPU, or why it could not be read."""

    used_mib: tuple[float, ...] | None
    unavailable: str | None = None

    def over(self, threshold_mib: float) -> list[int]:
        return [i for i, used in enumerate(self.used_mib or ()) if used > threshold_mib]


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def default_nvml_module() -> Any:
    """pynvml, or what the documented seam ``LLM_BENCH_NVML_MODULE`` names."""
    named = os.environ.get(NVML_MODULE_ENV)
    if named:
        module_name, _, factory = named.partition(":")
        try:
            made = getattr(importlib.import_module(module_name), factory or "nvml")()
        except (ImportError, AttributeError) as e:
            raise ImportError(f"{NVML_MODULE_ENV}={named} cannot be loaded ({e}); unset it to use the real NVML") from e
        print(f"llm-bench: using the NVML stand-in {named} ({NVML_MODULE_ENV})", file=sys.stderr)
        return made
    import pynvml  # noqa: PLC0415 - optional at import time for users without NVIDIA

    return pynvml


def error_code(e: BaseException) -> int | None:
    """The NVML return code of a pynvml.NVMLError (``value``), None for anything else."""
    return getattr(e, "value", None) if type(e).__name__.startswith("NVMLError") else None


NVML_ERROR_NOT_SUPPORTED = 3  # pynvml.NVML_ERROR_NOT_SUPPORTED
NVML_ERROR_NO_PERMISSION = 4  # pynvml.NVML_ERROR_NO_PERMISSION
NVML_ERROR_NOT_FOUND = 6  # pynvml.NVML_ERROR_NOT_FOUND: e.g. no utilization sample since the time stamp given
NVML_ERROR_TIMEOUT = 10  # pynvml.NVML_ERROR_TIMEOUT: nvmlEventSetWait found no event in time
EVENT_XID_CRITICAL = 0x8  # pynvml.nvmlEventTypeXidCriticalError


class PowerLimitError(RuntimeError):
    """A power limit could not be read or set; the message says why and what to do."""


@dataclass(frozen=True)
class GpuSample:
    """One reading of one GPU; a figure the GPU does not report is None, never 0."""

    index: int
    t: float  # time.monotonic() when read
    vram_used_mib: float | None = None
    power_w: float | None = None
    energy_j: float | None = None  # the driver's cumulative energy counter
    sm_clock_mhz: float | None = None
    mem_clock_mhz: float | None = None
    temperature_c: float | None = None


@dataclass(frozen=True)
class PowerLimits:
    index: int
    current_w: float
    default_w: float | None
    min_w: float | None
    max_w: float | None


@dataclass(frozen=True)
class PcieLink:
    """One GPU's PCIe link as NVML reports it; a figure the GPU does not report is None."""

    index: int
    gen: int | None
    max_gen: int | None
    width: int | None
    max_width: int | None
    replays: int | None  # nvmlDeviceGetPcieReplayCounter: link-level retransmissions since boot
    busy_pct: int | None  # nvmlDeviceGetUtilizationRates().gpu: idle GPUs downshift their link


@dataclass(frozen=True)
class GpuProcess:
    """A process holding GPU ``index`` (nvmlDeviceGet{Compute,Graphics}RunningProcesses)."""

    index: int
    pid: int
    kind: str  # "compute" or "graphics"
    used_mib: float | None  # None where NVML cannot say (it reports "not available")


@dataclass(frozen=True)
class ProcessUtilization:
    """One nvmlDeviceGetProcessUtilization sample: a process's share of GPU ``index``'s SMs, in percent."""

    index: int
    pid: int
    t_us: int  # NVML's time stamp (microseconds)
    sm_pct: int


@dataclass(frozen=True)
class XidEvent:
    """A critical Xid event NVML delivered (nvmlEventTypeXidCriticalError)."""

    index: int | None  # GPU index; None when the event names no device NVML knows
    xid: int


class XidWatch:
    """An NVML event set registered for critical Xid errors on every GPU that supports them.

    ``poll()`` drains the events that arrived since the last call; ``unavailable`` says why
    nothing can be watched (no NVML, or no GPU supports the event type)."""

    def __init__(self, lib: Any, handles: list[Any]):
        self._lib = lib
        self._set: Any = None
        self.unavailable: str | None = None
        self.watched: list[int] = []
        if lib is None:
            self.unavailable = "NVML is not available"
            return
        try:
            self._set = lib.nvmlEventSetCreate()
        except Exception as e:
            if error_code(e) is None:
                raise
            self.unavailable = f"nvmlEventSetCreate failed: {e}"
            return
        reasons = []
        for i, h in enumerate(handles):
            try:
                lib.nvmlDeviceRegisterEvents(h, EVENT_XID_CRITICAL, self._set)
                self.watched.append(i)
            except Exception as e:
                if error_code(e) is None:
                    raise
                reasons.append(f"GPU{i}: {e}")
        if not self.watched:
            self.unavailable = "no GPU accepts Xid event registration (" + "; ".join(reasons) + ")"

    def poll(self) -> list[XidEvent]:
        events: list[XidEvent] = []
        if self._set is None or not self.watched:
            return events
        while True:
            try:
                data = self._lib.nvmlEventSetWait(self._set, 0)
            except Exception as e:
                if error_code(e) is None:
                    raise
                return events  # NVML_ERROR_TIMEOUT: nothing more is waiting
            if data.eventType & EVENT_XID_CRITICAL:
                events.append(XidEvent(self._index(data.device), int(data.eventData)))

    def _index(self, device: Any) -> int | None:
        # ctypes handles compare by identity, so the event's device is named by NVML itself
        try:
            return int(self._lib.nvmlDeviceGetIndex(device))
        except Exception as e:
            if error_code(e) is None:
                raise
            return None

    def close(self) -> None:
        if self._set is not None:
            try:
                self._lib.nvmlEventSetFree(self._set)
            except Exception as e:
                if error_code(e) is None:
                    raise
            self._set = None


class Nvml:
    """A session with NVML; use as a context manager."""

    def __init__(self, nvml: ModuleType | Any | None = None):
        self._module = nvml
        self._lib: Any = None
        self.unavailable: str | None = None

    def __enter__(self) -> Nvml:
        try:
            lib = self._module
            if lib is None:
                lib = default_nvml_module()
            lib.nvmlInit()
            self._lib = lib
        except ImportError as e:
            self.unavailable = f"pynvml is not installed ({e})"
        except Exception as e:  # pynvml.NVMLError and its subclasses, e.g. "Driver Not Loaded"
            self.unavailable = f"NVML could not start: {e}"
        return self

    def __exit__(self, *exc: object) -> None:
        if self._lib is not None:
            try:
                self._lib.nvmlShutdown()
            except Exception:
                pass
            self._lib = None

    @property
    def available(self) -> bool:
        return self._lib is not None

    def driver_version(self) -> str | None:
        if not self.available:
            return None
        return _text(self._lib.nvmlSystemGetDriverVersion())

    def gpus(self) -> list[GpuInfo]:
        if not self.available:
            return []
        result = []
        for i in range(self._lib.nvmlDeviceGetCount()):
            handle = self._lib.nvmlDeviceGetHandleByIndex(i)
            memory = self._lib.nvmlDeviceGetMemoryInfo(handle)
            result.append(GpuInfo(i, _text(self._lib.nvmlDeviceGetName(handle)), memory.total / MIB))
        return result

    def vram_used(self) -> VramReading:
        if not self.available:
            return VramReading(None, self.unavailable or "NVML is not initialised")
        try:
            used = []
            for i in range(self._lib.nvmlDeviceGetCount()):
                handle = self._lib.nvmlDeviceGetHandleByIndex(i)
                used.append(self._lib.nvmlDeviceGetMemoryInfo(handle).used / MIB)
        except Exception as e:
            return VramReading(None, f"NVML read failed: {e}")
        if not used:
            return VramReading(None, "NVML reports no GPUs")
        return VramReading(tuple(used))

    # --- telemetry, power limits and the memory system (GPU issue 5) ---

    def _handle(self, index: int) -> Any:
        return self._lib.nvmlDeviceGetHandleByIndex(index)

    def count(self) -> int:
        return self._lib.nvmlDeviceGetCount() if self.available else 0

    def _optional(self, fn: str, *args: Any) -> Any:
        """A reading the GPU may not support: None on any NVML error (e.g. Not Supported)."""
        try:
            return getattr(self._lib, fn)(*args)
        except Exception as e:
            if error_code(e) is None and not isinstance(e, AttributeError):
                raise
            return None

    def _handles(self) -> Iterator[tuple[int, Any]]:
        """Every GPU's index and NVML handle; none without NVML."""
        if not self.available:
            return
        for i in range(self._lib.nvmlDeviceGetCount()):
            yield i, self._handle(i)

    def sample(self) -> list[GpuSample]:
        """One reading of every GPU: memory, power (W), energy counter (J), clocks, temperature."""
        lib = self._lib
        out = []
        for i, h in self._handles():
            memory = self._optional("nvmlDeviceGetMemoryInfo", h)
            power = self._optional("nvmlDeviceGetPowerUsage", h)
            energy = self._optional("nvmlDeviceGetTotalEnergyConsumption", h)
            out.append(GpuSample(
                index=i, t=time.monotonic(),
                vram_used_mib=None if memory is None else memory.used / MIB,
                power_w=None if power is None else power / 1000.0,
                energy_j=None if energy is None else energy / 1000.0,
                sm_clock_mhz=_float(self._optional("nvmlDeviceGetClockInfo", h, lib.NVML_CLOCK_SM)),
                mem_clock_mhz=_float(self._optional("nvmlDeviceGetClockInfo", h, lib.NVML_CLOCK_MEM)),
                temperature_c=_float(self._optional("nvmlDeviceGetTemperature", h, lib.NVML_TEMPERATURE_GPU)),
            ))
        return out

    def query(self, fn: str, index: int, *constants: str) -> tuple[Any, str | None]:
        """One read-only NVML reading of GPU ``index``: (value, None), or (None, why it could not be read).
        ``constants`` name the module's constants passed after the handle (``"NVML_CLOCK_SM"``)."""
        return self._read(fn, lambda call: call(self._handle(index), *(getattr(self._lib, c) for c in constants)))

    def query_system(self, fn: str) -> tuple[Any, str | None]:
        """A system-wide reading (``nvmlSystemGetDriverVersion``) the same way as ``query``."""
        return self._read(fn, lambda call: call())

    def _read(self, fn: str, call: Callable[[Any], Any]) -> tuple[Any, str | None]:
        if not self.available:
            return None, self.unavailable or "NVML is not initialised"
        try:
            return call(getattr(self._lib, fn)), None
        except AttributeError:
            return None, f"{fn} is not in this NVML library (too old a pynvml)"
        except Exception as e:
            if error_code(e) is None:
                raise
            return None, f"{fn}: {e}"

    def details(self) -> list[dict[str, Any]]:
        """Static facts per GPU for provenance and the roofline; unsupported facts are left out."""
        lib = self._lib
        out = []
        for i, h in self._handles():
            memory = self._optional("nvmlDeviceGetMemoryInfo", h)
            limits = self.power_limits(i)
            facts = {
                "index": i,
                "name": _text(lib.nvmlDeviceGetName(h)),
                "uuid": _maybe_text(self._optional("nvmlDeviceGetUUID", h)),
                "memory_total_mib": None if memory is None else memory.total / MIB,
                "power_limit_w": None if limits is None else limits.current_w,
                "power_default_w": None if limits is None else limits.default_w,
                "power_min_w": None if limits is None else limits.min_w,
                "power_max_w": None if limits is None else limits.max_w,
                "max_sm_clock_mhz": _float(self._optional("nvmlDeviceGetMaxClockInfo", h, lib.NVML_CLOCK_SM)),
                "max_mem_clock_mhz": _float(self._optional("nvmlDeviceGetMaxClockInfo", h, lib.NVML_CLOCK_MEM)),
                "memory_bus_width_bits": _float(self._optional("nvmlDeviceGetMemoryBusWidth", h)),
                "pcie_gen": self._optional("nvmlDeviceGetCurrPcieLinkGeneration", h),
                "pcie_width": self._optional("nvmlDeviceGetCurrPcieLinkWidth", h),
            }
            facts["memory_bandwidth_gbs"] = memory_bandwidth_gbs(facts["max_mem_clock_mhz"],
                                                                 facts["memory_bus_width_bits"])
            out.append({k: v for k, v in facts.items() if v is not None})
        return out

    def memory_bandwidth_gbs(self, index: int = 0) -> float | None:
        if not self.available or index >= self.count():
            return None
        h = self._handle(index)
        return memory_bandwidth_gbs(_float(self._optional("nvmlDeviceGetMaxClockInfo", h, self._lib.NVML_CLOCK_MEM)),
                                    _float(self._optional("nvmlDeviceGetMemoryBusWidth", h)))

    def power_limits(self, index: int) -> PowerLimits | None:
        """The power limit in watts (None when the GPU does not report one)."""
        h = self._handle(index)
        current = self._optional("nvmlDeviceGetPowerManagementLimit", h)
        if current is None:
            return None
        default = self._optional("nvmlDeviceGetPowerManagementDefaultLimit", h)
        bounds = self._optional("nvmlDeviceGetPowerManagementLimitConstraints", h)
        low, high = (bounds[0] / 1000.0, bounds[1] / 1000.0) if bounds else (None, None)
        return PowerLimits(index, current / 1000.0, None if default is None else default / 1000.0, low, high)

    def pcie_links(self) -> list[PcieLink]:
        """Every GPU's PCIe link: current and maximum generation and width, replay counter, load."""
        if not self.available:
            return []
        out = []
        for i in range(self.count()):
            h = self._handle(i)
            util = self._optional("nvmlDeviceGetUtilizationRates", h)
            out.append(PcieLink(
                i, self._optional("nvmlDeviceGetCurrPcieLinkGeneration", h),
                self._optional("nvmlDeviceGetMaxPcieLinkGeneration", h),
                self._optional("nvmlDeviceGetCurrPcieLinkWidth", h),
                self._optional("nvmlDeviceGetMaxPcieLinkWidth", h),
                self._optional("nvmlDeviceGetPcieReplayCounter", h),
                None if util is None else int(util.gpu)))
        return out

    def pci_indexes(self) -> dict[tuple[int, int, int], int]:
        """(PCI domain, bus, device) -> GPU index, to name the GPU of a kernel log's Xid line."""
        if not self.available:
            return {}
        out = {}
        for i in range(self.count()):
            info = self._optional("nvmlDeviceGetPciInfo", self._handle(i))
            if info is not None:
                out[(int(info.domain), int(info.bus), int(info.device))] = i
        return out

    def xid_watch(self) -> XidWatch:
        """Start watching for critical Xid events (close the watch when done)."""
        if not self.available:
            return XidWatch(None, [])
        return XidWatch(self._lib, [self._handle(i) for i in range(self.count())])

    # --- who else is on the GPU (issue 55: interference during the measured runs) ---

    def gpu_processes(self) -> tuple[list[GpuProcess], str | None]:
        """Every process holding a GPU, compute (CUDA) and graphics (a desktop, a game), with its memory where
        NVML reports it; the second value says why a listing failed (the list then has what could be read)."""
        out: list[GpuProcess] = []
        why: list[str] = []
        for i, h in self._handles():
            for kind, fn in (("compute", "nvmlDeviceGetComputeRunningProcesses"),
                             ("graphics", "nvmlDeviceGetGraphicsRunningProcesses")):
                listed, error = self._read(fn, functools.partial(_call_with, h))
                if error is not None:
                    why.append(f"GPU{i}: {error}")
                    continue
                for p in listed or ():
                    used = getattr(p, "usedGpuMemory", None)  # None: NVML cannot say (pynvml maps its N/A)
                    out.append(GpuProcess(i, int(p.pid), kind, None if used is None else used / MIB))
        if not self.available:
            why.append(self.unavailable or "NVML is not initialised")
        return out, "; ".join(why) or None

    def process_name(self, pid: int) -> str | None:
        """NVML's name of a process (a full path), for a pid this machine's /proc does not show (a container)."""
        value, _ = self.query_system_arg("nvmlSystemGetProcessName", pid)
        return None if value is None else _text(value)

    def query_system_arg(self, fn: str, *args: Any) -> tuple[Any, str | None]:
        return self._read(fn, lambda call: call(*args))

    def clock_event_reasons(self, index: int) -> tuple[int | None, str | None]:
        """Why GPU ``index``'s clocks are held down now (a bit mask of nvmlClocksEventReason*): the newer call,
        else its deprecated name, which older drivers have."""
        value, why = self.query("nvmlDeviceGetCurrentClocksEventReasons", index)
        if value is None:
            value, older = self.query("nvmlDeviceGetCurrentClocksThrottleReasons", index)
            why = None if value is not None else f"{why}; {older}"
        return (None, why) if value is None else (int(value), None)

    def process_utilization(self, index: int, since_us: int) -> tuple[list[ProcessUtilization], str | None]:
        """Per-process SM utilization samples of GPU ``index`` newer than ``since_us`` (NVML's microsecond time
        stamps; 0: what the driver still holds). No sample in that span is an empty list, not an error."""
        if not self.available:
            return [], self.unavailable or "NVML is not initialised"
        try:
            samples = self._lib.nvmlDeviceGetProcessUtilization(self._handle(index), since_us)
        except AttributeError:
            return [], "nvmlDeviceGetProcessUtilization is not in this NVML library (too old a pynvml)"
        except Exception as e:
            code = error_code(e)
            if code is None:
                raise
            return [], None if code == NVML_ERROR_NOT_FOUND else f"nvmlDeviceGetProcessUtilization: {e}"
        return [ProcessUtilization(index, int(s.pid), int(s.timeStamp), int(s.smUtil)) for s in samples], None

    def set_power_limit(self, index: int, watts: float) -> None:
        """Set one GPU's power limit (needs root); raises PowerLimitError with the reason."""
        try:
            self._lib.nvmlDeviceSetPowerManagementLimit(self._handle(index), int(round(watts * 1000)))
        except Exception as e:
            code = error_code(e)
            if code is None:
                raise
            if code == NVML_ERROR_NO_PERMISSION:
                raise PowerLimitError(f"GPU{index}: setting the power limit needs root ({e}); "
                                      "run as root (sudo) or set it with `nvidia-smi -pl`") from e
            if code == NVML_ERROR_NOT_SUPPORTED:
                raise PowerLimitError(f"GPU{index}: this GPU does not support setting a power limit ({e})") from e
            raise PowerLimitError(f"GPU{index}: could not set the power limit to {watts:.0f} W ({e})") from e


def memory_bandwidth_gbs(max_mem_clock_mhz: float | None, bus_width_bits: float | None) -> float | None:
    """Peak memory bandwidth in GB/s (10^9 bytes) = memory clock x 2 (double data rate) x bus bits / 8.

    NVML reports GDDR6X's memory clock at half its per-pin data rate (RTX 3090: 9751 MHz for
    19.5 Gbit/s per pin), and HBM's at half its data rate too, so the same x2 holds for both:
    RTX 3090: 9751 MHz x 2 x 384 / 8 = 936 GB/s; H100 SXM: 2619 x 2 x 5120 / 8 = 3352 GB/s.
    """
    if not max_mem_clock_mhz or not bus_width_bits:
        return None
    return max_mem_clock_mhz * 1e6 * 2 * bus_width_bits / 8 / 1e9


def _call_with(handle: Any, call: Any) -> Any:
    return call(handle)


def _float(value: Any) -> float | None:
    return None if value is None else float(value)


def _maybe_text(value: Any) -> str | None:
    return None if value is None else _text(value)
