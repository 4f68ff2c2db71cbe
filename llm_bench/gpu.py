"""NVIDIA GPU facts through NVML.

All NVML access goes through ``Nvml``, which takes the ``pynvml`` module (or a test double
with the same functions, constants and ``NVMLError``) so that every path can be tested
without a GPU. A missing library or driver is "unavailable", never a reading of zero.
"""

from __future__ import annotations

from dataclasses import dataclass
from types import ModuleType
from typing import Any

MIB = 1024 * 1024


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
                import pynvml as lib  # noqa: PLC0415 - optional at import time for users without NVIDIA
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
