"""A stand-in for the ``pynvml`` module on machines without an NVIDIA GPU.

It follows pynvml's real calls, return types, units and errors (nvidia-ml-py 13.x):

- memory info in bytes (``total``, ``free``, ``used``), plain ``str`` names (pynvml >= 11.5);
- power figures in milliwatts (``nvmlDeviceGetPowerUsage``, ``...PowerManagementLimit``,
  ``...PowerManagementDefaultLimit``, ``...EnforcedPowerLimit``), the limit constraints as a
  ``[min_mw, max_mw]`` list, ``nvmlDeviceSetPowerManagementLimit(handle, mw)`` returning None;
- the energy counter in millijoules since the driver loaded (``nvmlDeviceGetTotalEnergyConsumption``),
  which advances with the power drawn over wall-clock time;
- clocks in MHz (``nvmlDeviceGetClockInfo`` / ``nvmlDeviceGetMaxClockInfo`` with ``NVML_CLOCK_SM`` /
  ``NVML_CLOCK_MEM``), temperature in degrees C, PCIe generation and width, memory bus width in bits;
- the PCIe link's current and maximum generation and width, its replay counter, utilization as the
  real ``c_nvmlUtilization_t`` and the PCI address as the real ``nvmlPciInfo_t`` (``domain``, ``bus``,
  ``device``, ``busId``);
- persistence mode as the ``_nvmlEnableState_t`` value (``NVML_FEATURE_ENABLED`` = 1, disabled = 0);
- critical Xid events: ``nvmlEventSetCreate``, ``nvmlDeviceRegisterEvents(handle, types, set)``
  (``NVML_ERROR_NOT_SUPPORTED`` on a GPU with ``xid_events=False``), ``nvmlEventSetWait(set, ms)``
  returning an event with ``device``, ``eventType``, ``eventData`` (the Xid) or raising
  ``NVML_ERROR_TIMEOUT`` when none is pending, ``nvmlEventSetFree``; ``FakeNvml.raise_xid(index, xid)``
  makes the driver report one;
- processes holding a GPU (``FakeGpu.processes``) as ``nvmlDeviceGetComputeRunningProcesses`` /
  ``nvmlDeviceGetGraphicsRunningProcesses`` hand them back: ``nvmlStructToFriendlyObject`` of the real
  ``c_nvmlProcessInfo_v3_t`` (``.pid``, ``.usedGpuMemory`` in bytes, None where NVML reports it not
  available); their SM shares as the real ``c_nvmlProcessUtilizationSample_t`` list from
  ``nvmlDeviceGetProcessUtilization(handle, timeStamp)`` (``NVML_ERROR_NOT_FOUND`` when no sample is newer);
  ``nvmlSystemGetProcessName(pid)`` as a ``str``; the clock event (throttle) reasons as a bit mask;
- errors as the real ``pynvml.NVMLError`` subclasses built from NVML return codes.

Any call can be made to fail: ``fail={"nvmlDeviceGetTotalEnergyConsumption": NVML_ERROR_NOT_SUPPORTED}``
(every GPU) or ``FakeGpu(fail={...})`` (one GPU). Setting a power limit without ``root=True``
raises ``NVML_ERROR_NO_PERMISSION`` as the real library does for a non-root user.

``FileBackedFakeNvml`` keeps the GPUs' state in a JSON file so that power limits persist across
processes. A real ``llm-bench`` process uses it through the package's documented NVML seam:
``use_in_subprocesses(monkeypatch, state_file)`` sets ``LLM_BENCH_NVML_MODULE=tests.fake_nvml:from_env``
and names the state file in ``LLM_BENCH_FAKE_NVML`` (read only here).
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import pynvml
from pynvml import NVMLError  # noqa: F401 - part of the module surface code under test uses

MIB = 1024 * 1024

# The constants code under test passes in; the real module's values.
NVML_CLOCK_SM = pynvml.NVML_CLOCK_SM
NVML_CLOCK_MEM = pynvml.NVML_CLOCK_MEM
NVML_CLOCK_GRAPHICS = pynvml.NVML_CLOCK_GRAPHICS
NVML_TEMPERATURE_GPU = pynvml.NVML_TEMPERATURE_GPU
NVML_ERROR_NOT_SUPPORTED = pynvml.NVML_ERROR_NOT_SUPPORTED
NVML_ERROR_NO_PERMISSION = pynvml.NVML_ERROR_NO_PERMISSION
nvmlEventTypeXidCriticalError = pynvml.nvmlEventTypeXidCriticalError


@dataclass
class _Memory:  # pynvml's c_nvmlMemory_t has these three fields, in bytes
    total: int
    free: int
    used: int


@dataclass
class _EventData:  # pynvml's c_nvmlEventData_t fields (device is the handle the event came from)
    device: object
    eventType: int
    eventData: int
    gpuInstanceId: int = 0xFFFFFFFF
    computeInstanceId: int = 0xFFFFFFFF


@dataclass
class _EventSet:
    devices: list = field(default_factory=list)


@dataclass
class FakeProcess:
    """A process holding a GPU: a compute (CUDA) one or a graphics one (a desktop), with what NVML reports of it."""

    pid: int
    used_mib: int | None = 500  # None: NVML reports NVML_VALUE_NOT_AVAILABLE (pynvml hands back None)
    kind: str = "compute"  # "compute" or "graphics"
    sm_pct: int | None = None  # its nvmlDeviceGetProcessUtilization share of the SMs; None: no samples
    name: str = ""  # nvmlSystemGetProcessName (the process's path)


@dataclass
class FakeGpu:
    """An RTX 3090 by default: 24 GiB GDDR6X on a 384-bit bus, NVML max memory clock 9751 MHz."""

    name: str = "NVIDIA GeForce RTX 3090"
    total_mib: int = 24576
    used_mib: int = 300
    uuid: str = "GPU-00000000-0000-0000-0000-000000000000"
    power_limit_mw: int = 350000
    default_limit_mw: int = 350000
    min_limit_mw: int = 100000
    max_limit_mw: int = 400000
    draw_mw: int = 280000  # drawn under load, capped by the power limit
    energy_mj: int = 1_000_000  # counter value at the start; advances with draw_mw over time
    sm_clock_mhz: int = 1695
    mem_clock_mhz: int = 9501
    max_sm_clock_mhz: int = 2100
    max_mem_clock_mhz: int = 9751
    bus_width_bits: int = 384
    temperature_c: int = 62
    pcie_gen: int = 4
    pcie_width: int = 16
    max_pcie_gen: int = 4
    max_pcie_width: int = 16
    pcie_replays: int = 0
    persistence_mode: int = 0  # NVML_FEATURE_DISABLED (0) or NVML_FEATURE_ENABLED (1), as nvmlDeviceGetPersistenceMode
    utilization_pct: int = 0  # GPU busy percentage; idle GPUs downshift their PCIe link
    pci_bus: int = 1  # PCI 0000:01:00.0 (domain 0, device 0)
    xid_events: bool = True  # whether the GPU accepts Xid event registration
    pending_xids: list[int] = field(default_factory=list)
    fail: dict[str, int] = field(default_factory=dict)  # function name -> NVML_ERROR_* code
    energy_since: float | None = None  # wall-clock start of the counter (time.time()), set at init
    processes: list[FakeProcess] = field(default_factory=list)  # who holds this GPU
    clock_reasons: int = 0  # nvmlClocksEventReason* bits now (0x4 software power cap, 0x20 thermal, ...)
    # the driver's per-process utilization samples are stamped with this (microseconds), advancing per read
    sample_clock_us: int = 1_000_000

    def drawn_mw(self) -> int:
        return min(self.draw_mw, self.power_limit_mw)


@dataclass
class FakeNvml:
    gpus: list[FakeGpu] = field(default_factory=lambda: [FakeGpu()])
    driver: str = "580.95.05"
    init_error: int | None = None  # an NVML_ERROR_* code nvmlInit raises, e.g. DRIVER_NOT_LOADED
    initialised: bool = False
    root: bool = False  # setting power limits needs root
    fail: dict[str, int] = field(default_factory=dict)  # function name -> NVML_ERROR_* code, every GPU
    calls: list[tuple] = field(default_factory=list)  # (function name, gpu index, args...) of every setter

    NVMLError = pynvml.NVMLError
    NVML_CLOCK_SM = NVML_CLOCK_SM
    NVML_CLOCK_MEM = NVML_CLOCK_MEM
    NVML_CLOCK_GRAPHICS = NVML_CLOCK_GRAPHICS
    NVML_TEMPERATURE_GPU = NVML_TEMPERATURE_GPU

    def nvmlInit(self) -> None:
        if self.init_error is not None:
            raise pynvml.NVMLError(self.init_error)
        now = time.time()
        for gpu in self.gpus:
            if gpu.energy_since is None:
                gpu.energy_since = now
        self.initialised = True

    def nvmlShutdown(self) -> None:
        self._check()
        self.initialised = False

    def _check(self, name: str | None = None, handle: FakeGpu | None = None) -> None:
        if not self.initialised:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_UNINITIALIZED)
        code = None
        if name is not None:
            code = (handle.fail.get(name) if handle is not None else None) or self.fail.get(name)
        if code is not None:
            raise pynvml.NVMLError(code)

    def nvmlSystemGetDriverVersion(self) -> str:
        self._check("nvmlSystemGetDriverVersion")
        return self.driver

    def nvmlDeviceGetCount(self) -> int:
        self._check("nvmlDeviceGetCount")
        return len(self.gpus)

    def nvmlDeviceGetHandleByIndex(self, index: int) -> FakeGpu:
        self._check("nvmlDeviceGetHandleByIndex")
        if not 0 <= index < len(self.gpus):
            raise pynvml.NVMLError(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        return self.gpus[index]

    def nvmlDeviceGetName(self, handle: FakeGpu) -> str:
        self._check("nvmlDeviceGetName", handle)
        return handle.name

    def nvmlDeviceGetUUID(self, handle: FakeGpu) -> str:
        self._check("nvmlDeviceGetUUID", handle)
        return handle.uuid

    def nvmlDeviceGetMemoryInfo(self, handle: FakeGpu) -> _Memory:
        self._check("nvmlDeviceGetMemoryInfo", handle)
        used = handle.used_mib * MIB
        total = handle.total_mib * MIB
        return _Memory(total=total, free=total - used, used=used)

    # power, in milliwatts
    def nvmlDeviceGetPowerUsage(self, handle: FakeGpu) -> int:
        self._check("nvmlDeviceGetPowerUsage", handle)
        return handle.drawn_mw()

    def nvmlDeviceGetPowerManagementLimit(self, handle: FakeGpu) -> int:
        self._check("nvmlDeviceGetPowerManagementLimit", handle)
        return handle.power_limit_mw

    def nvmlDeviceGetEnforcedPowerLimit(self, handle: FakeGpu) -> int:
        self._check("nvmlDeviceGetEnforcedPowerLimit", handle)
        return handle.power_limit_mw

    def nvmlDeviceGetPowerManagementDefaultLimit(self, handle: FakeGpu) -> int:
        self._check("nvmlDeviceGetPowerManagementDefaultLimit", handle)
        return handle.default_limit_mw

    def nvmlDeviceGetPowerManagementLimitConstraints(self, handle: FakeGpu) -> list[int]:
        self._check("nvmlDeviceGetPowerManagementLimitConstraints", handle)
        return [handle.min_limit_mw, handle.max_limit_mw]

    def nvmlDeviceSetPowerManagementLimit(self, handle: FakeGpu, limit: int) -> None:
        self._check("nvmlDeviceSetPowerManagementLimit", handle)
        if not self.root:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_NO_PERMISSION)
        if not handle.min_limit_mw <= int(limit) <= handle.max_limit_mw:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        self._advance_energy(handle)
        handle.power_limit_mw = int(limit)
        self.calls.append(("nvmlDeviceSetPowerManagementLimit", self.gpus.index(handle), int(limit)))
        self._saved()

    def _advance_energy(self, handle: FakeGpu) -> None:
        """Fold the energy drawn so far into the counter (before the draw changes)."""
        now = time.time()
        if handle.energy_since is not None:
            handle.energy_mj += int(handle.drawn_mw() * (now - handle.energy_since))
        handle.energy_since = now

    # energy, in millijoules since the driver loaded
    def nvmlDeviceGetTotalEnergyConsumption(self, handle: FakeGpu) -> int:
        self._check("nvmlDeviceGetTotalEnergyConsumption", handle)
        self._advance_energy(handle)
        return handle.energy_mj

    # clocks in MHz
    def nvmlDeviceGetClockInfo(self, handle: FakeGpu, type: int) -> int:  # noqa: A002 - pynvml's name
        self._check("nvmlDeviceGetClockInfo", handle)
        return self._clock(handle, type, handle.sm_clock_mhz, handle.mem_clock_mhz)

    def nvmlDeviceGetMaxClockInfo(self, handle: FakeGpu, type: int) -> int:  # noqa: A002
        self._check("nvmlDeviceGetMaxClockInfo", handle)
        return self._clock(handle, type, handle.max_sm_clock_mhz, handle.max_mem_clock_mhz)

    @staticmethod
    def _clock(handle: FakeGpu, type: int, sm: int, mem: int) -> int:  # noqa: A002
        if type in (NVML_CLOCK_SM, NVML_CLOCK_GRAPHICS):
            return sm
        if type == NVML_CLOCK_MEM:
            return mem
        raise pynvml.NVMLError(pynvml.NVML_ERROR_INVALID_ARGUMENT)

    def nvmlDeviceGetMemoryBusWidth(self, handle: FakeGpu) -> int:
        self._check("nvmlDeviceGetMemoryBusWidth", handle)
        return handle.bus_width_bits

    def nvmlDeviceGetTemperature(self, handle: FakeGpu, sensor: int) -> int:
        self._check("nvmlDeviceGetTemperature", handle)
        if sensor != NVML_TEMPERATURE_GPU:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        return handle.temperature_c

    def nvmlDeviceGetCurrPcieLinkGeneration(self, handle: FakeGpu) -> int:
        self._check("nvmlDeviceGetCurrPcieLinkGeneration", handle)
        return handle.pcie_gen

    def nvmlDeviceGetCurrPcieLinkWidth(self, handle: FakeGpu) -> int:
        self._check("nvmlDeviceGetCurrPcieLinkWidth", handle)
        return handle.pcie_width

    def nvmlDeviceGetMaxPcieLinkGeneration(self, handle: FakeGpu) -> int:
        self._check("nvmlDeviceGetMaxPcieLinkGeneration", handle)
        return handle.max_pcie_gen

    def nvmlDeviceGetMaxPcieLinkWidth(self, handle: FakeGpu) -> int:
        self._check("nvmlDeviceGetMaxPcieLinkWidth", handle)
        return handle.max_pcie_width

    def nvmlDeviceGetPcieReplayCounter(self, handle: FakeGpu) -> int:
        self._check("nvmlDeviceGetPcieReplayCounter", handle)
        return handle.pcie_replays

    def nvmlDeviceGetPersistenceMode(self, handle: FakeGpu) -> int:
        self._check("nvmlDeviceGetPersistenceMode", handle)
        return handle.persistence_mode

    def nvmlDeviceGetUtilizationRates(self, handle: FakeGpu) -> pynvml.c_nvmlUtilization_t:
        self._check("nvmlDeviceGetUtilizationRates", handle)
        return pynvml.c_nvmlUtilization_t(gpu=handle.utilization_pct, memory=handle.utilization_pct)

    def nvmlDeviceGetPciInfo(self, handle: FakeGpu) -> pynvml.nvmlPciInfo_t:
        self._check("nvmlDeviceGetPciInfo", handle)
        return pynvml.nvmlPciInfo_t(busIdLegacy=f"0000:{handle.pci_bus:02x}:00.0".encode(), domain=0,
                                    bus=handle.pci_bus, device=0, pciDeviceId=0x220410DE,
                                    busId=f"00000000:{handle.pci_bus:02x}:00.0".encode())

    # Processes on the GPU, as pynvml hands them back: nvmlStructToFriendlyObject of a c_nvmlProcessInfo_v3_t
    # (.pid, .usedGpuMemory in bytes, .gpuInstanceId, .computeInstanceId), usedGpuMemory None where NVML says
    # NVML_VALUE_NOT_AVAILABLE; an empty list when none (NVML_SUCCESS on the sizing call).
    def _listed(self, handle: FakeGpu, kind: str) -> list:
        out = []
        for p in handle.processes:
            if p.kind != kind:
                continue
            used = pynvml.NVML_VALUE_NOT_AVAILABLE_ulonglong.value if p.used_mib is None else p.used_mib * MIB
            obj = pynvml.nvmlStructToFriendlyObject(pynvml.c_nvmlProcessInfo_v3_t(
                pid=p.pid, usedGpuMemory=used, gpuInstanceId=0xFFFFFFFF, computeInstanceId=0xFFFFFFFF))
            if obj.usedGpuMemory == pynvml.NVML_VALUE_NOT_AVAILABLE_ulonglong.value:
                obj.usedGpuMemory = None
            out.append(obj)
        return out

    def nvmlDeviceGetComputeRunningProcesses(self, handle: FakeGpu) -> list:
        self._check("nvmlDeviceGetComputeRunningProcesses", handle)
        return self._listed(handle, "compute")

    def nvmlDeviceGetGraphicsRunningProcesses(self, handle: FakeGpu) -> list:
        self._check("nvmlDeviceGetGraphicsRunningProcesses", handle)
        return self._listed(handle, "graphics")

    def nvmlDeviceGetProcessUtilization(self, handle: FakeGpu, timeStamp: int) -> list:
        """c_nvmlProcessUtilizationSample_t (pid, timeStamp, smUtil, memUtil, encUtil, decUtil) newer than
        timeStamp; NVML_ERROR_NOT_FOUND when there is none (pynvml raises whatever is not INSUFFICIENT_SIZE)."""
        self._check("nvmlDeviceGetProcessUtilization", handle)
        handle.sample_clock_us += 100_000
        samples = [pynvml.c_nvmlProcessUtilizationSample_t(pid=p.pid, timeStamp=handle.sample_clock_us,
                                                           smUtil=p.sm_pct, memUtil=p.sm_pct, encUtil=0, decUtil=0)
                   for p in handle.processes if p.sm_pct is not None and handle.sample_clock_us > timeStamp]
        if not samples:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_FOUND)
        return samples

    def nvmlSystemGetProcessName(self, pid: int) -> str:
        self._check("nvmlSystemGetProcessName")
        for gpu in self.gpus:
            for p in gpu.processes:
                if p.pid == pid:
                    return p.name or f"/usr/bin/process-{pid}"
        raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_FOUND)

    def nvmlDeviceGetCurrentClocksEventReasons(self, handle: FakeGpu) -> int:
        self._check("nvmlDeviceGetCurrentClocksEventReasons", handle)
        return handle.clock_reasons

    def nvmlDeviceGetCurrentClocksThrottleReasons(self, handle: FakeGpu) -> int:
        self._check("nvmlDeviceGetCurrentClocksThrottleReasons", handle)
        return handle.clock_reasons

    def nvmlDeviceGetIndex(self, handle: FakeGpu) -> int:
        self._check("nvmlDeviceGetIndex", handle)
        return self.gpus.index(handle)

    def nvmlEventSetCreate(self) -> _EventSet:
        self._check("nvmlEventSetCreate")
        return _EventSet()

    def nvmlDeviceRegisterEvents(self, handle: FakeGpu, eventTypes: int, eventSet: _EventSet) -> None:
        self._check("nvmlDeviceRegisterEvents", handle)
        if not handle.xid_events:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)
        eventSet.devices.append(handle)

    def nvmlEventSetWait(self, eventSet: _EventSet, timeoutms: int) -> _EventData:
        self._check("nvmlEventSetWait")
        for gpu in eventSet.devices:
            if gpu.pending_xids:
                return _EventData(gpu, nvmlEventTypeXidCriticalError, gpu.pending_xids.pop(0))
        raise pynvml.NVMLError(pynvml.NVML_ERROR_TIMEOUT)

    def nvmlEventSetFree(self, eventSet: _EventSet) -> None:
        self._check("nvmlEventSetFree")

    def raise_xid(self, index: int, xid: int) -> None:
        """The driver reports a critical Xid on one GPU (what a test makes happen)."""
        self.gpus[index].pending_xids.append(xid)

    def _saved(self) -> None:
        """Hook for the file-backed variant."""

    # JSON state (for the file-backed variant and for tests that set up a state file)
    def to_json(self) -> dict:
        return {"driver": self.driver, "root": self.root, "fail": self.fail,
                "gpus": [asdict(g) for g in self.gpus]}

    @classmethod
    def state_from_json(cls, data: dict) -> dict:
        return {"driver": data.get("driver", "580.95.05"), "root": bool(data.get("root", False)),
                "fail": dict(data.get("fail", {})),
                "gpus": [FakeGpu(**(g | {"processes": [FakeProcess(**p) for p in g.get("processes", [])]}))
                         for g in data.get("gpus", [asdict(FakeGpu())])]}


class FileBackedFakeNvml(FakeNvml):
    """GPU state (limits above all) read from and written back to a JSON file, across processes."""

    def __init__(self, path: str | Path):
        self.path = Path(path)
        super().__init__(**self.state_from_json(json.loads(self.path.read_text())))

    def nvmlInit(self) -> None:
        for key, value in self.state_from_json(json.loads(self.path.read_text())).items():
            setattr(self, key, value)
        super().nvmlInit()

    def _saved(self) -> None:
        staged = self.path.with_name(self.path.name + ".partial")
        staged.write_text(json.dumps(self.to_json(), indent=1))
        staged.replace(self.path)


def write_state(path: Path, fake: FakeNvml) -> Path:
    path.write_text(json.dumps(fake.to_json(), indent=1))
    return path


def read_state(path: Path) -> FakeNvml:
    return FakeNvml(**FakeNvml.state_from_json(json.loads(Path(path).read_text())))


STATE_ENV = "LLM_BENCH_FAKE_NVML"


def from_env() -> FileBackedFakeNvml:
    """The factory the package's NVML seam calls: the double whose state file the tests named."""
    return FileBackedFakeNvml(os.environ[STATE_ENV])


def use_in_subprocesses(monkeypatch, state: Path) -> None:
    """Make every llm-bench started from now on (in this process or a child) see the double."""
    monkeypatch.setenv("LLM_BENCH_NVML_MODULE", "tests.fake_nvml:from_env")
    monkeypatch.setenv(STATE_ENV, str(state))
