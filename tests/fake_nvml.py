"""A stand-in for the ``pynvml`` module on machines without an NVIDIA GPU.

It follows pynvml's real calls, return types and errors: byte counts in memory info, plain
``str`` names (pynvml >= 11.5), and the real ``pynvml.NVMLError`` classes built from NVML
return codes, so code under test cannot tell the difference.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import pynvml
from pynvml import NVMLError  # noqa: F401 - part of the module surface code under test uses

MIB = 1024 * 1024


@dataclass
class _Memory:  # pynvml's c_nvmlMemory_t has these three fields, in bytes
    total: int
    free: int
    used: int


@dataclass
class FakeGpu:
    name: str = "NVIDIA GeForce RTX 3090"
    total_mib: int = 24576
    used_mib: int = 300


@dataclass
class FakeNvml:
    gpus: list[FakeGpu] = field(default_factory=lambda: [FakeGpu()])
    driver: str = "580.95.05"
    init_error: int | None = None  # an NVML_ERROR_* code nvmlInit raises, e.g. DRIVER_NOT_LOADED
    initialised: bool = False

    def nvmlInit(self) -> None:
        if self.init_error is not None:
            raise pynvml.NVMLError(self.init_error)
        self.initialised = True

    def nvmlShutdown(self) -> None:
        self._check()
        self.initialised = False

    def _check(self) -> None:
        if not self.initialised:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_UNINITIALIZED)

    def nvmlSystemGetDriverVersion(self) -> str:
        self._check()
        return self.driver

    def nvmlDeviceGetCount(self) -> int:
        self._check()
        return len(self.gpus)

    def nvmlDeviceGetHandleByIndex(self, index: int) -> FakeGpu:
        self._check()
        if not 0 <= index < len(self.gpus):
            raise pynvml.NVMLError(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        return self.gpus[index]

    def nvmlDeviceGetName(self, handle: FakeGpu) -> str:
        self._check()
        return handle.name

    def nvmlDeviceGetMemoryInfo(self, handle: FakeGpu) -> _Memory:
        self._check()
        used = handle.used_mib * MIB
        total = handle.total_mib * MIB
        return _Memory(total=total, free=total - used, used=used)
