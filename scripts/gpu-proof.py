#!/usr/bin/env python3
"""The GPU proof (issue #56): a CUDA llama-server and llm-bench's real NVML paths on a lent NVIDIA card.

Called by ``scripts/gpu-proof.sh``, which says how a session runs it (docs/gpu.md, "The GPU proof"):

    gpu-proof.py pack                 # on a CPU machine with network: the sdist and the wheels into .gpu-proof/
    gpu-proof.py build [--arch 90]    # on the GPU machine: llama-server with CUDA for this card only
    gpu-proof.py measure              # on the GPU machine: router, run, doctor, telemetry, NVML facts, checks

It only reads the accelerator: no power limit, clock, persistence or application setting is written,
and ``--set``-style arguments are refused before anything runs. ``measure`` exits 1 when a check fails,
naming it; every NVML fact it read is in ``$OUT/gpu-proof.json``.
"""

from __future__ import annotations

import argparse
import ctypes
import dataclasses
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tarfile
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:  # run as a file: the package and tests/fake_nvml come from this checkout
    sys.path.insert(0, str(REPO))

from llm_bench.testbed.llama_server import (  # noqa: E402 - after the path above
    CMAKE_FLAGS,
    SDIST_PACKAGE,
    SDIST_SHA256,
    SDIST_VERSION,
    sha256_of,
)

PACK = REPO / ".gpu-proof"  # ignored; carried to the GPU machine (the device call's `carry`)
WORK = Path(os.environ.get("GPU_PROOF_WORK", "/tmp/llm-bench-gpu-proof"))  # kept while the machine stays warm
SDIST_NAME = f"{SDIST_PACKAGE}-{SDIST_VERSION}.tar.gz"

# What the GPU machine's image lacks of llm-bench's dependencies (pyproject.toml), at the versions the
# project's environment runs: its python3 (3.12) has numpy, matplotlib, tqdm, pyyaml, requests, anyio,
# certifi, idna and nvidia-ml-py (the device tool's KINDS.md). httpx, httpcore, h11 and click are there
# too, at versions nobody read: carried so that the ones llm-bench was tested with are used.
WHEELS = (
    "httpx==0.29.0", "httpcore==1.0.9", "h11==0.16.0", "httpx-sse==0.4.3", "click==8.5.1",
    "pydantic==2.14.4", "pydantic-core==2.50.5", "annotated-types==0.8.0", "typing-inspection==0.4.5",
    "typing-extensions==4.16.0", "tomli-w==1.2.0", "gguf==0.19.0",
)
# llm-bench's dependencies the GPU image has already, and those of the carried wheels (httpx: anyio, certifi,
# idna; gguf: pyyaml, requests).
IN_THE_IMAGE = ("numpy", "matplotlib", "tqdm", "nvidia-ml-py", "pyyaml", "requests", "anyio", "certifi", "idna")
WHEEL_PYTHON = "3.12"
WHEEL_PLATFORMS = ("manylinux_2_28_x86_64", "manylinux_2_27_x86_64", "manylinux_2_17_x86_64",
                   "manylinux2014_x86_64", "manylinux1_x86_64")

# The CUDA build: the CPU bed's flags (the same pinned source, the same build number), plus CUDA for
# the lent card's architecture only (one architecture builds in minutes, the default list in far more).
# NCCL off: one GPU, and whether find_package(NCCL) finds the image's copy would change the build.
# FlashAttention vector kernels for q8_0 K/V (and f16, always built): what the quantized-KV preset uses.
CUDA_FLAGS = ("-DGGML_CUDA=ON", "-DGGML_CUDA_NCCL=OFF", "-DGGML_CUDA_FA_QUANTS=q8_0-q8_0")

# Arguments that would change the accelerator's settings: a --set path (scripts/gpu-check.py had one) and
# nvidia-smi's setters. The proof has none of them; they are refused before anything runs.
REFUSED = re.compile(r"^(-{0,2}set\b.*|--?(pl|pm|ac|rac|lgc|rgc|lmc|rmc|power-limit|persistence-mode|"
                     r"applications-clocks|reset-applications-clocks|lock-gpu-clocks|reset-gpu-clocks|"
                     r"lock-memory-clocks|reset-memory-clocks)(=.*)?)$", re.IGNORECASE)
REFUSAL = ("gpu-proof changes no accelerator setting (power limit, clocks, persistence mode, application "
           "clocks): it has no --set path. Power-limit sweeps are tested against tests/fake_nvml.py; run "
           "`llm-bench power` on your own machine, not on a lent one.")

# The model: random weights (nothing can be downloaded there, SmolLM2 is too big to carry), heads 64 wide
# (CUDA's FlashAttention kernels have no 16-wide ones, so the test bed's default 64/4 would fall back and
# refuse a quantized V cache). 512 x 8 layers, f32: 100 MB, enough work per token for the GPU's time, not
# the launches, to dominate; the CPU test passes a smaller one.
HEAD_DIM = 64
MODEL_EMBD = 512
MODEL_LAYERS = 8
ALIASES = ("gpu-plain", "gpu-self-draft", "gpu-kv-q8")
# The doctor probes the presets without drafting: a draft-free probe is what its acceptance check
# leaves alone, and the GPU checks are the same for all three.
DOCTOR_ALIASES = ("gpu-plain", "gpu-kv-q8")
# The doctor's checks that concern the GPU (docs/gpu.md, "The doctor's checks").
GPU_CHECKS = frozenset({"vram", "offload", "no-gpu", "flash-attention", "gpu-xid", "pcie-link", "pcie-replay",
                        "power-limit"})


class ProofError(RuntimeError):
    """Something the proof cannot go on without; the message says what and what to do."""


# --- refusing settings ---

def refuse_settings(argv: Sequence[str]) -> None:
    bad = [a for a in argv if REFUSED.match(a)]
    if bad:
        raise ProofError(f"refused {' '.join(bad)}: {REFUSAL}")


# --- the card's architecture ---

def arch_from_compute_caps(caps: Iterable[str]) -> str:
    """CMAKE_CUDA_ARCHITECTURES for the compute capabilities nvidia-smi prints ("9.0" -> "90"); several
    different cards give a list."""
    archs = []
    for cap in caps:
        cap = cap.strip()
        if not cap:
            continue
        m = re.fullmatch(r"(\d+)\.(\d+)", cap)
        if not m:
            raise ProofError(f"{cap!r} is not a compute capability (major.minor, e.g. 9.0)")
        arch = f"{m[1]}{m[2]}"
        if arch not in archs:
            archs.append(arch)
    if not archs:
        raise ProofError("no GPU reported a compute capability")
    return ";".join(archs)


def detect_arch() -> str:
    """The lent card's architecture, read-only: nvidia-smi's compute_cap, else NVML's."""
    smi = shutil.which("nvidia-smi")
    if smi:
        done = subprocess.run([smi, "--query-gpu=compute_cap", "--format=csv,noheader"], capture_output=True,
                              text=True, timeout=60)
        if done.returncode == 0 and done.stdout.strip():
            return arch_from_compute_caps(done.stdout.splitlines())
    import pynvml  # noqa: PLC0415 - only on the GPU machine

    pynvml.nvmlInit()
    try:
        caps = []
        for i in range(pynvml.nvmlDeviceGetCount()):
            major, minor = pynvml.nvmlDeviceGetCudaComputeCapability(pynvml.nvmlDeviceGetHandleByIndex(i))
            caps.append(f"{major}.{minor}")
    finally:
        pynvml.nvmlShutdown()
    return arch_from_compute_caps(caps)


# --- the build ---

@dataclass(frozen=True)
class CudaLibraries:
    """Where CMake finds cuBLAS and the driver library when the toolkit itself lacks them (the GPU image's
    CUDA may come without cuBLAS, which PyTorch's environment carries as a wheel), and the folders the
    binary loads them from."""

    cmake_flags: tuple[str, ...]
    runtime_dirs: tuple[str, ...]
    notes: tuple[str, ...]


TOOLKIT_ROOTS = (Path("/usr/local/cuda"),)
DRIVER_DIRS = (Path("/usr/lib/x86_64-linux-gnu"), Path("/usr/local/nvidia/lib64"), Path("/usr/lib64"),
               Path("/usr/local/cuda/lib64/stubs"), Path("/usr/local/cuda/targets/x86_64-linux/lib/stubs"))


def python_library_roots() -> list[Path]:
    """site-packages folders of this python (where nvidia-cublas wheels put their lib/ and include/)."""
    import site  # noqa: PLC0415

    roots = [Path(p) for p in [*site.getsitepackages(), site.getusersitepackages()]]
    return [r for r in roots if r.is_dir()]


def _first(patterns: Sequence[str], folders: Iterable[Path], recursive: bool) -> Path | None:
    for folder in folders:
        for pattern in patterns:
            found = sorted(folder.rglob(pattern) if recursive else folder.glob(pattern))
            if found:
                return found[0]
    return None


def find_cuda_libraries(links: Path, toolkit_roots: Sequence[Path] = TOOLKIT_ROOTS,
                        driver_dirs: Sequence[Path] = DRIVER_DIRS, wheel_roots: Sequence[Path] = (),
                        extra_dirs: Sequence[Path] = ()) -> CudaLibraries:
    """cuBLAS (headers and libraries) and libcuda: the toolkit's own where it has them; else the first found in
    ``extra_dirs`` or a CUDA wheel, linked under the names CMake looks for in ``links`` (find_library wants
    libcublas.so, a wheel ships libcublas.so.13; only the cuBLAS headers are linked, so that the wheel's copies
    of the toolkit's other headers stay out of the build). No libcuda at all: ggml-cuda is built without its
    virtual-memory pool (GGML_CUDA_NO_VMM), the one thing it links the driver library for."""
    lib_dirs = [d for root in toolkit_roots for d in (root / "lib64", root / "targets/x86_64-linux/lib")]
    inc_dirs = [d for root in toolkit_roots for d in (root / "include", root / "targets/x86_64-linux/include")]
    notes: list[str] = []
    flags: list[str] = []
    runtime: list[str] = []
    links.mkdir(parents=True, exist_ok=True)
    if _first(["cublas_v2.h"], inc_dirs, recursive=False) is None:
        header = _first(["cublas_v2.h"], [*extra_dirs, *wheel_roots], recursive=True)
        if header is None:
            notes.append("cublas_v2.h is neither in the CUDA toolkit nor in a wheel: ggml-cuda will not compile")
        else:
            include = links / "include"
            shutil.rmtree(include, ignore_errors=True)
            include.mkdir()
            for h in sorted(header.parent.glob("cublas*.h")):
                (include / h.name).symlink_to(h.resolve())
            flags += [f"-DCMAKE_CUDA_FLAGS=-I{include}", f"-DCMAKE_CXX_FLAGS=-I{include}"]
            notes.append(f"cuBLAS headers from {header.parent}")
    linked = False
    for name, places in (("cublas", None), ("cublasLt", None), ("cuda", driver_dirs)):
        if name != "cuda" and _first([f"lib{name}.so"], lib_dirs, recursive=False):
            continue
        search = [*extra_dirs, *(places if places is not None else wheel_roots)]
        found = _first([f"lib{name}.so", f"lib{name}.so.*"], search, recursive=places is None)
        if found is None:
            if name == "cuda":
                flags.append("-DGGML_CUDA_NO_VMM=ON")
                notes.append("libcuda.so is in no driver folder: building without the CUDA VMM pool "
                             "(GGML_CUDA_NO_VMM=ON), which needs no driver library at link time")
            else:
                notes.append(f"lib{name}.so is neither in the CUDA toolkit nor in a wheel: the link will fail")
            continue
        link = links / f"lib{name}.so"
        link.unlink(missing_ok=True)
        link.symlink_to(found.resolve())
        linked = True
        # cuBLAS from a wheel is loaded from there (and the linker finds libcublasLt.so.13, which libcublas
        # needs, there too); the driver's libcuda.so.1 the loader finds itself: a stub folder on
        # LD_LIBRARY_PATH would shadow it
        if name != "cuda" and str(found.parent) not in runtime:
            runtime.append(str(found.parent))
        notes.append(f"lib{name}.so: {found}")
    if linked:
        flags.insert(0, f"-DCMAKE_LIBRARY_PATH={links}")
    return CudaLibraries(tuple(flags), tuple(runtime), tuple(notes))


def cuda_cmake_flags(arch: str) -> list[str]:
    """The CPU bed's CMake flags with CUDA for ``arch`` only (e.g. "90" for Hopper)."""
    if not re.fullmatch(r"\d+[af]?(;\d+[af]?)*", arch):
        raise ProofError(f"--arch {arch!r} is not a CUDA architecture list such as 90 or 86;90")
    return [*CMAKE_FLAGS, *CUDA_FLAGS, f"-DCMAKE_CUDA_ARCHITECTURES={arch}"]


def pinned_source(sdist: Path, work: Path, log: Callable[[str], None]) -> Path:
    """The llama.cpp tree of the pinned sdist, extracted once into ``work``."""
    if not sdist.is_file():
        raise ProofError(f"{sdist} is missing: run `scripts/gpu-proof.sh pack` on a CPU machine with network and "
                         "carry .gpu-proof to this one")
    if sha256_of(sdist) != SDIST_SHA256:
        raise ProofError(f"{sdist} does not have the pinned sha256 {SDIST_SHA256}; pack it again")
    stamp = work / f"src-{SDIST_SHA256[:16]}.done"
    source_root = work / "src"
    if not stamp.is_file():
        log(f"extracting {sdist.name}")
        shutil.rmtree(source_root, ignore_errors=True)
        source_root.mkdir(parents=True)
        with tarfile.open(sdist) as tar:
            tar.extractall(source_root, filter="data")
        stamp.touch()
    (source,) = source_root.glob("*/llama.cpp")
    return source


def run_logged(command: Sequence[str], log_file: Path, timeout: float | None = None,
               env: dict[str, str] | None = None) -> int:
    """Run ``command`` with its output appended to ``log_file`` and echoed; 124 when it ran past ``timeout``
    (its whole process group killed then, compilers included)."""
    import threading  # noqa: PLC0415

    with log_file.open("a") as log:
        log.write(f"$ {' '.join(command)}\n")
        log.flush()
        proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                env={**os.environ, **(env or {})}, start_new_session=True)
        expired = threading.Event()

        def expire() -> None:
            expired.set()
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass

        timer = threading.Timer(timeout, expire) if timeout is not None else None
        if timer is not None:
            timer.start()
        try:
            assert proc.stdout is not None
            for line in proc.stdout:
                log.write(line)
                sys.stdout.write(line)
            rc = proc.wait()
        finally:
            if timer is not None:
                timer.cancel()
        if expired.is_set():
            log.write(f"stopped after {timeout:.0f} s\n")
            return 124
        return rc


def build(args: argparse.Namespace) -> int:
    work, out = Path(args.work), Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    log_file = out / "build.log"

    def log(message: str) -> None:
        print(f"gpu-proof: {message}", flush=True)
        with log_file.open("a") as f:
            f.write(f"gpu-proof: {message}\n")

    arch = args.arch or detect_arch()
    log(f"CUDA architecture: {arch} ({'given' if args.arch else 'read from the card'})")
    source = pinned_source(Path(args.sdist), work, log)
    libraries = find_cuda_libraries(work / "cuda-links", wheel_roots=python_library_roots(),
                                    extra_dirs=[Path(d) for d in args.library_dir])
    for note in libraries.notes:
        log(note)
    build_dir = work / "build"
    generator = ["-G", "Ninja"] if shutil.which("ninja") else []
    nvcc = shutil.which("nvcc") or next((str(p) for p in (r / "bin" / "nvcc" for r in TOOLKIT_ROOTS) if p.is_file()),
                                        None)
    for tool in (["cmake", "--version"], [nvcc or "nvcc", "--version"]):
        run_logged(tool, log_file)
    configure = ["cmake", "-S", str(source), "-B", str(build_dir), *generator, *cuda_cmake_flags(arch),
                 *libraries.cmake_flags, *([f"-DCMAKE_CUDA_COMPILER={nvcc}"] if nvcc else [])]
    started = time.monotonic()
    (work / "bin").mkdir(parents=True, exist_ok=True)
    (work / "bin" / "runtime-dirs").write_text("\n".join(libraries.runtime_dirs))
    if run_logged(configure, log_file) != 0:
        log("the CMake configure failed (see above)")
        return 1
    if args.configure_only:
        log(f"configured in {time.monotonic() - started:.0f} s (--configure-only: nothing built)")
        return 0
    jobs = args.jobs or os.cpu_count() or 4
    rc = run_logged(["cmake", "--build", str(build_dir), "--target", "llama-server", f"-j{jobs}"], log_file,
                    timeout=args.timeout, env=runtime_env(work))
    took = time.monotonic() - started
    if rc == 124:
        log(f"the build ran past --timeout {args.timeout:.0f} s: it stopped at the last [done/total] line above; "
            f"a `scripts/gpu-proof.sh build` call made at once, while this machine is still held, resumes it "
            f"(the tree stays under {work})")
        return 1
    if rc != 0:
        log(f"the build failed after {took:.0f} s (see above)")
        return 1
    binary = work / "bin" / "llama-server"
    shutil.copy2(build_dir / "bin" / "llama-server", binary)
    (work / "bin" / "build.json").write_text(json.dumps(
        {"arch": arch, "seconds": round(took), "jobs": jobs, "configure": configure, "notes": libraries.notes},
        indent=1))
    log(f"built {binary} in {took:.0f} s with -j{jobs}")
    listed = subprocess.run([str(binary), "--list-devices"], capture_output=True, text=True, timeout=120,
                            env={**os.environ, **runtime_env(work)})
    log("llama-server --list-devices:\n" + listed.stdout + listed.stderr)
    if "CUDA0" not in listed.stdout + listed.stderr:
        log("the binary lists no CUDA0 device: it was built without CUDA, or the driver cannot be reached")
        return 1
    return 0


def runtime_env(work: Path) -> dict[str, str]:
    """LD_LIBRARY_PATH for the CUDA libraries the build found outside the toolkit."""
    dirs_file = work / "bin" / "runtime-dirs"
    dirs = [d for d in (dirs_file.read_text().splitlines() if dirs_file.is_file() else []) if d]
    if not dirs:
        return {}
    current = os.environ.get("LD_LIBRARY_PATH")
    return {"LD_LIBRARY_PATH": ":".join([*dirs, *([current] if current else [])])}


# --- packing (on a CPU machine with network) ---

def pip_download_command(python: str, dest: Path) -> list[str]:
    """The exact command that fetches the wheels the GPU machine lacks, for its Python 3.12."""
    platforms = [arg for p in WHEEL_PLATFORMS for arg in ("--platform", p)]
    return [python, "-m", "pip", "download", "--quiet", "--no-deps", "--only-binary=:all:", "--python-version",
            WHEEL_PYTHON, "--implementation", "cp", *platforms, "-d", str(dest), *WHEELS]


def pack(args: argparse.Namespace) -> int:
    from llm_bench.testbed.llama_server import ensure_sdist  # noqa: PLC0415

    pack_dir = Path(args.pack)
    wheels = pack_dir / "wheels"
    shutil.rmtree(wheels, ignore_errors=True)
    wheels.mkdir(parents=True)
    sdist = ensure_sdist(lambda m: print(f"gpu-proof: {m}"))
    shutil.copy2(sdist, pack_dir / SDIST_NAME)
    command = pip_download_command(sys.executable, wheels)
    print("gpu-proof: " + " ".join(command), flush=True)
    subprocess.run(command, check=True)
    total = sum(p.stat().st_size for p in pack_dir.rglob("*") if p.is_file())
    print(f"gpu-proof: {pack_dir} holds {total / 2**20:.1f} MiB (the device call carries at most 64 MiB with the "
          "working tree)")
    return 0


# --- the presets ---

def proof_presets(target: Path) -> dict[str, dict[str, str | int | float | bool]]:
    """Three presets of one tiny model, every layer on the GPU: plain, drafting (the model drafting for itself,
    its draft on the GPU too) and a q8_0 KV cache (flash attention on)."""
    gpu: dict[str, str | int | float | bool] = {"model": str(target), "n-gpu-layers": 99}
    return {
        "*": {"ctx-size": 4096, "parallel": 1},
        "gpu-plain": dict(gpu),
        "gpu-self-draft": {**gpu, "spec-type": "draft-simple", "model-draft": str(target), "spec-draft-n-max": 4,
                           "spec-draft-ngl": 99},
        "gpu-kv-q8": {**gpu, "cache-type-k": "q8_0", "cache-type-v": "q8_0", "flash-attn": "on"},
    }


def write_presets(folder: Path, embd: int = MODEL_EMBD, layers: int = MODEL_LAYERS) -> Path:
    from llm_bench.testbed.presets import render_presets_ini  # noqa: PLC0415
    from llm_bench.testbed.tiny_gguf import TinyModelSpec, write_tiny_model  # noqa: PLC0415

    if embd % HEAD_DIM:
        raise ProofError(f"--model-embd {embd} is not a multiple of {HEAD_DIM} (the heads are {HEAD_DIM} wide)")
    spec = TinyModelSpec(seed=1, n_embd=embd, n_head=embd // HEAD_DIM, n_layer=layers, n_ff=embd * 11 // 4,
                         name="gpu-proof-target")
    target = write_tiny_model(folder / "gpu-proof-target.gguf", spec)
    ini = folder / "presets.ini"
    ini.write_text(render_presets_ini(proof_presets(target)))
    return ini


def check_presets_command(binary: Path, ini: Path) -> list[str]:
    """The project's own preset check (pkgs/check-preset-keys) against the built server's --help."""
    return [sys.executable, str(REPO / "pkgs" / "check-preset-keys" / "check-preset-keys.py"), "--server",
            str(binary), str(ini)]


# --- NVML facts, read-only ---

# Every read-only pynvml call the proof records per GPU: (function, constants passed after the handle).
GPU_READS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("nvmlDeviceGetName", ()), ("nvmlDeviceGetUUID", ()), ("nvmlDeviceGetIndex", ()),
    ("nvmlDeviceGetCudaComputeCapability", ()), ("nvmlDeviceGetArchitecture", ()),
    ("nvmlDeviceGetMemoryInfo", ()), ("nvmlDeviceGetMemoryBusWidth", ()),
    ("nvmlDeviceGetPowerUsage", ()), ("nvmlDeviceGetTotalEnergyConsumption", ()),
    ("nvmlDeviceGetPowerManagementLimit", ()), ("nvmlDeviceGetEnforcedPowerLimit", ()),
    ("nvmlDeviceGetPowerManagementDefaultLimit", ()), ("nvmlDeviceGetPowerManagementLimitConstraints", ()),
    ("nvmlDeviceGetClockInfo", ("NVML_CLOCK_SM",)), ("nvmlDeviceGetClockInfo", ("NVML_CLOCK_MEM",)),
    ("nvmlDeviceGetClockInfo", ("NVML_CLOCK_GRAPHICS",)),
    ("nvmlDeviceGetMaxClockInfo", ("NVML_CLOCK_SM",)), ("nvmlDeviceGetMaxClockInfo", ("NVML_CLOCK_MEM",)),
    ("nvmlDeviceGetApplicationsClock", ("NVML_CLOCK_SM",)), ("nvmlDeviceGetApplicationsClock", ("NVML_CLOCK_MEM",)),
    ("nvmlDeviceGetTemperature", ("NVML_TEMPERATURE_GPU",)),
    ("nvmlDeviceGetCurrPcieLinkGeneration", ()), ("nvmlDeviceGetCurrPcieLinkWidth", ()),
    ("nvmlDeviceGetMaxPcieLinkGeneration", ()), ("nvmlDeviceGetMaxPcieLinkWidth", ()),
    ("nvmlDeviceGetPcieReplayCounter", ()), ("nvmlDeviceGetPersistenceMode", ()),
    ("nvmlDeviceGetUtilizationRates", ()), ("nvmlDeviceGetPciInfo", ()), ("nvmlDeviceGetComputeMode", ()),
    ("nvmlDeviceGetPerformanceState", ()),
    # the busy-machine issue's process listing: called as it is, whatever llm-bench does with it
    ("nvmlDeviceGetComputeRunningProcesses", ()), ("nvmlDeviceGetGraphicsRunningProcesses", ()),
)
SYSTEM_READS = ("nvmlSystemGetDriverVersion", "nvmlSystemGetNVMLVersion", "nvmlSystemGetCudaDriverVersion",
                "nvmlDeviceGetCount")


def plain(value: Any) -> Any:
    """A pynvml return value as JSON: ctypes structures and the double's dataclasses as their fields."""
    if isinstance(value, bytes):
        return value.decode(errors="replace")
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, (list, tuple)):
        return [plain(v) for v in value]
    if isinstance(value, ctypes.Structure):
        return {name: plain(getattr(value, name)) for name, *_ in value._fields_}
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: plain(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, ctypes._SimpleCData):
        return plain(value.value)
    if hasattr(value, "__dict__"):  # pynvml's nvmlFriendlyObject (the process listing's entries)
        return {k: plain(v) for k, v in vars(value).items()}
    return repr(value)


def shape(value: Any) -> Any:
    """What a return value is, for comparing the real library with the double: scalar type names, a
    sequence's type and its first element's shape, a structure's field names."""
    if isinstance(value, (list, tuple)):
        return [type(value).__name__, shape(value[0]) if value else None]
    if isinstance(value, ctypes.Structure):
        return {"fields": sorted(name for name, *_ in value._fields_)}
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {"fields": sorted(f.name for f in dataclasses.fields(value))}
    if hasattr(value, "__dict__") and not isinstance(value, type):
        return {"fields": sorted(vars(value))}
    return type(value).__name__


def call_label(fn: str, constants: Sequence[str]) -> str:
    return f"{fn}({', '.join(['handle', *constants])})"


def read_call(lib: Any, fn: str, *args: Any) -> dict[str, Any]:
    """One read: its value and type, or the error it raised (NVML's code where it has one)."""
    try:
        value = getattr(lib, fn)(*args)
    except AttributeError as e:
        return {"error": f"not in this pynvml ({e})"}
    except Exception as e:
        code = getattr(e, "value", None)
        return {"error": f"{type(e).__name__}: {e}", **({"nvml_code": code} if isinstance(code, int) else {})}
    return {"value": plain(value), "shape": shape(value)}


def nvml_facts(lib: Any, own_pids: Sequence[int] = ()) -> dict[str, Any]:
    """Every NVML fact the proof reads, straight from ``lib`` (pynvml), read-only."""
    facts: dict[str, Any] = {"pynvml": getattr(lib, "__file__", type(lib).__name__)}
    try:
        lib.nvmlInit()
    except Exception as e:
        return {**facts, "init_error": f"{type(e).__name__}: {e}"}
    try:
        facts["system"] = {fn: read_call(lib, fn) for fn in SYSTEM_READS}
        count = facts["system"]["nvmlDeviceGetCount"].get("value") or 0
        gpus = []
        for index in range(count):
            handle = lib.nvmlDeviceGetHandleByIndex(index)
            reads = {call_label(fn, constants): read_call(lib, fn, handle, *(getattr(lib, c) for c in constants))
                     for fn, constants in GPU_READS if all(hasattr(lib, c) for c in constants)}
            gpus.append({"index": index, "reads": reads})
        facts["gpus"] = gpus
        facts["own_pids"] = list(own_pids)
    finally:
        try:
            lib.nvmlShutdown()
        except Exception:
            pass
    return facts


def api_differences(real: dict[str, Any], double_facts: dict[str, Any]) -> list[dict[str, Any]]:
    """Where the real library's answers differ in shape from the double's (tests/fake_nvml.py), call by call;
    calls the double lacks are listed as such."""
    out = []
    real_reads = real.get("gpus", [{}])[0].get("reads", {}) if real.get("gpus") else {}
    fake_reads = double_facts.get("gpus", [{}])[0].get("reads", {}) if double_facts.get("gpus") else {}
    for call, got in real_reads.items():
        fake = fake_reads.get(call, {"error": "not read"})
        if "value" not in got:
            continue
        if "value" not in fake:
            out.append({"call": call, "real": got["shape"], "double": fake.get("error")})
        elif fake["shape"] != got["shape"]:
            out.append({"call": call, "real": got["shape"], "double": fake["shape"]})
    return out


def llm_bench_listing(lib: Any) -> dict[str, Any] | None:
    """llm-bench's own listing of the processes on the GPUs (``Nvml.gpu_processes``, the busy-machine issue), where
    this checkout has it: the processes and why a listing failed."""
    from llm_bench.gpu.nvml import Nvml  # noqa: PLC0415

    with Nvml(lib) as nvml:
        listing = getattr(nvml, "gpu_processes", None)
        if listing is None:
            return None
        processes, why = listing()
    return {"processes": plain(processes), "unavailable": why}


def double_facts() -> dict[str, Any]:
    """The same reads of the test double, for ``api_differences``."""
    try:
        from tests.fake_nvml import FakeNvml  # noqa: PLC0415 - the double the tests use, as it is now
    except Exception as e:  # the proof goes on without the comparison
        return {"init_error": f"tests.fake_nvml cannot be imported: {e}"}
    return nvml_facts(FakeNvml())


def router_pids(router_pid: int) -> list[int]:
    """The router and the model instances it spawned (its process group), for the process listing."""
    group = os.getpgid(router_pid)
    pids = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if int(fields[2]) == group:  # field 5 of /proc/PID/stat: the process group
            pids.append(int(stat.parent.name))
    return sorted(pids)


# --- the checks ---

@dataclass(frozen=True)
class Check:
    name: str
    ok: bool
    evidence: str

    def line(self) -> str:
        return f"{'PASS' if self.ok else 'FAIL'} {self.name}: {self.evidence}"


def _standard(results: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {a["alias"]: a for a in results.get("aliases", []) if a.get("workload", "standard") == "standard"}


def _read_value(facts: dict[str, Any], index: int, call: str) -> Any:
    gpus = facts.get("gpus") or []
    return gpus[index]["reads"].get(call, {}).get("value") if index < len(gpus) else None


def bandwidth_from_facts(facts: dict[str, Any], index: int = 0) -> float | None:
    """Peak memory bandwidth (GB/s) from the raw NVML reads: max memory clock x 2 x bus width / 8."""
    clock = _read_value(facts, index, "nvmlDeviceGetMaxClockInfo(handle, NVML_CLOCK_MEM)")
    width = _read_value(facts, index, "nvmlDeviceGetMemoryBusWidth(handle)")
    if not isinstance(clock, (int, float)) or not isinstance(width, (int, float)):
        return None
    return clock * 2 * width / 8 / 1000


def evaluate(results: dict[str, Any], router_log: str, doctor_output: str, facts: dict[str, Any],
             aliases: Sequence[str] = ALIASES) -> list[Check]:
    """What the run must show (issue #56), each a Check with the evidence seen."""
    from llm_bench.diagnostics.findings import ERROR  # noqa: PLC0415
    from llm_bench.diagnostics.log_checks import CUDA_FOUND, OFFLOADED, check_offload, instance_lines  # noqa: PLC0415
    from llm_bench.fingerprint import is_available  # noqa: PLC0415

    checks: list[Check] = []
    records = _standard(results)
    missing = [a for a in aliases if a not in records]
    checks.append(Check("measured", not missing and all(not records[a].get("errors") for a in aliases),
                        f"missing {missing}" if missing else
                        "; ".join(f"{a}: {records[a].get('errors') or 'no errors'}"
                                  + (f" (not comparable: {records[a].get('not_comparable_reason')})"
                                     if records[a].get("comparable") is False else "") for a in aliases)))
    cuda = CUDA_FOUND.search(router_log)
    checks.append(Check("cuda-build", cuda is not None,
                        cuda.group(0) if cuda else "the router log never says ggml_cuda_init: found N CUDA devices"))

    gpu_count = len(facts.get("gpus") or [])
    errors = [f.text() for f in check_offload(router_log, gpu_count) if f.severity == ERROR]
    per_alias = instance_lines(router_log)
    offloads = {a: [m.group(0) for line in per_alias.get(a, []) if (m := OFFLOADED.search(line))] for a in aliases}
    partial = [f"{a}: {line}" for a, lines in offloads.items() for line in lines
               if (m := OFFLOADED.search(line)) and int(m[1]) < int(m[2])]
    unseen = [a for a, lines in offloads.items() if not lines]
    checks.append(Check("layers-on-gpu", not errors and not partial and not unseen,
                        "; ".join(errors + partial + [f"{a}: no offload line" for a in unseen])
                        or "; ".join(f"{a}: {', '.join(lines)}" for a, lines in offloads.items())))

    decode = []
    decode_ok = True
    for a in aliases:
        r = records.get(a, {})
        runs = r.get("runs", [])
        from_timings = [run.get("server_decode_tps") for run in runs]
        ok = (r.get("decode_source") == "server timings" and bool(runs)
              and all(isinstance(v, (int, float)) and v > 0 and run.get("decode_tps") == v
                      for v, run in zip(from_timings, runs, strict=True)))
        decode_ok = decode_ok and ok
        decode.append(f"{a}: {r.get('decode_source')!r}, runs {[round(v, 1) for v in from_timings if v]}")
    checks.append(Check("decode-from-server-timings", decode_ok, "; ".join(decode)))

    vram = [(a, records.get(a, {}).get("vram_used_mib_before"), records.get(a, {}).get("vram_unavailable"))
            for a in aliases]
    checks.append(Check("vram-before-load", all(isinstance(v, list) and v and not why for _, v, why in vram),
                        "; ".join(f"{a}: {v if v else why}" for a, v, why in vram)))

    print_ = (results.get("meta") or {}).get("fingerprint") or {}
    rig = print_.get("rig") or {}
    gpus = rig.get("gpus")
    blank = [f"driver: {rig.get('driver')}"] if not is_available(rig.get("driver")) else []
    if isinstance(gpus, list) and gpus:
        blank += [f"GPU{g.get('index')} {k}: {v}" for g in gpus for k, v in g.items() if not is_available(v)]
    else:
        blank.append(f"gpus: {gpus}")
    checks.append(Check("fingerprint-from-nvml", not blank,
                        "; ".join(blank) or f"driver {rig.get('driver')}; " + "; ".join(
                            ", ".join(f"{k}={v}" for k, v in g.items()) for g in gpus or [])))

    telemetry = []
    telemetry_ok = True
    for a in aliases:
        t = records.get(a, {}).get("telemetry") or {}
        samples = t.get("samples") or []
        ok = (len(samples) >= 2 and all("power_w" in s and "energy_j" in s for s in samples)
              and t.get("energy_source") == "energy counter" and (t.get("energy_j") or 0) > 0
              and (t.get("joules_per_token") or 0) > 0)
        telemetry_ok = telemetry_ok and ok
        telemetry.append(f"{a}: {len(samples)} samples, energy {t.get('energy_j')} J from "
                         f"{t.get('energy_source')!r}, {t.get('joules_per_token')} J/token, mean power "
                         f"{t.get('mean_power_w')} W")
    checks.append(Check("telemetry-power-energy", telemetry_ok, "; ".join(telemetry)))

    expected = bandwidth_from_facts(facts)
    roof = []
    roof_ok = expected is not None
    for a in aliases:
        r = records.get(a, {})
        bw, tps, size = r.get("memory_bandwidth_gbs"), r.get("roofline_tps"), r.get("model_bytes")
        ok = (expected is not None and isinstance(bw, (int, float)) and abs(bw - expected) <= 1e-6 * expected
              and isinstance(tps, (int, float)) and tps > 0 and isinstance(size, int) and size > 0)
        roof_ok = roof_ok and ok
        roof.append(f"{a}: {bw} GB/s, {size} bytes, roofline {tps} t/s")
    checks.append(Check("roofline-from-nvml", roof_ok,
                        f"NVML max memory clock x 2 x bus width / 8 = {expected} GB/s; " + "; ".join(roof)))

    findings = [line for line in doctor_output.splitlines() if re.match(r"^(ERROR|WARNING|INFO) \[", line)]
    gpu_errors = [line for line in findings if (m := re.match(r"^ERROR \[([^\]]+)\]", line)) and m[1] in GPU_CHECKS]
    blind = [why for why in ("NVML could not start", "pynvml is not installed") if why in doctor_output]
    tally = re.search(r"\d+ error\(s\), \d+ warning\(s\)", doctor_output)  # the doctor's last line
    checks.append(Check("doctor-no-gpu-errors", not gpu_errors and not blind and tally is not None,
                        "; ".join(gpu_errors + blind) or "; ".join(findings + [tally[0] if tally else
                                                                              "the doctor did not finish"])))

    listing = []
    listing_ok = bool(facts.get("gpus"))
    for gpu in facts.get("gpus") or []:
        got = gpu["reads"].get("nvmlDeviceGetComputeRunningProcesses(handle)", {"error": "not read"})
        listing_ok = listing_ok and "value" in got
        listed = [int(p["pid"]) for p in got.get("value") or [] if isinstance(p, dict) and "pid" in p]
        ours = sorted(set(listed) & {int(pid) for pid in facts.get("own_pids") or []})
        listing.append(f"GPU{gpu['index']}: {got.get('value', got.get('error'))} (the router's processes among "
                       f"them: {ours or 'none'})")
    own = facts.get("llm_bench_listing")
    if own is not None:  # llm-bench's listing must agree with the raw calls it is made of
        raw = {int(p["pid"]) for gpu in facts.get("gpus") or [] for call in ("nvmlDeviceGetComputeRunningProcesses"
               "(handle)", "nvmlDeviceGetGraphicsRunningProcesses(handle)")
               for p in gpu["reads"].get(call, {}).get("value") or [] if isinstance(p, dict) and "pid" in p}
        theirs = {int(p["pid"]) for p in own.get("processes") or [] if "pid" in p}
        listing_ok = listing_ok and own.get("unavailable") is None and theirs == raw
        listing.append(f"llm-bench's Nvml.gpu_processes: {own.get('processes')} "
                       f"({own.get('unavailable') or 'complete'}; the raw calls list pids {sorted(raw)})")
    checks.append(Check("nvml-process-listing", listing_ok, "; ".join(listing) or "no GPU"))
    return checks


# --- measuring ---

def _text(output: str | bytes | None) -> str:
    return output.decode(errors="replace") if isinstance(output, bytes) else output or ""


def _llm_bench(*args: str) -> list[str]:
    return [sys.executable, "-m", "llm_bench", *args]


def measure(args: argparse.Namespace) -> int:
    from llm_bench.gpu.nvml import NVML_MODULE_ENV, default_nvml_module  # noqa: PLC0415
    from llm_bench.testbed.router import RouterStartError, start_router  # noqa: PLC0415

    work, out = Path(args.work), Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    work.mkdir(parents=True, exist_ok=True)
    if os.environ.get(NVML_MODULE_ENV) and not args.allow_nvml_stand_in:
        raise ProofError(f"{NVML_MODULE_ENV} is set: the proof reads the real NVML; unset it")
    binary = Path(args.llama_server) if args.llama_server else work / "bin" / "llama-server"
    if not binary.is_file():
        raise ProofError(f"{binary} does not exist: run `scripts/gpu-proof.sh build` first (on this machine, "
                         "while it is warm)")
    log_path = out / "proof.log"

    def say(message: str) -> None:
        print(f"gpu-proof: {message}", flush=True)
        with log_path.open("a") as f:
            f.write(f"gpu-proof: {message}\n")

    def step(name: str, command: list[str], timeout: float) -> subprocess.CompletedProcess[str]:
        say(f"{name}: {' '.join(command)}")
        try:
            done = subprocess.run(command, capture_output=True, text=True, timeout=timeout, cwd=work)
        except subprocess.TimeoutExpired as e:
            done = subprocess.CompletedProcess(command, 124, _text(e.stdout), _text(e.stderr) + f"\nstopped after "
                                               f"{timeout:.0f} s")
        with log_path.open("a") as f:
            f.write(done.stdout + done.stderr + f"[exit {done.returncode}]\n")
        print(done.stdout + done.stderr, flush=True)
        return done

    if shutil.which("nvidia-smi"):  # the driver's own view, for the record (a query: it sets nothing)
        step("nvidia-smi", ["nvidia-smi", "-q"], 60)
    # llm-bench's own NVML wrapper on the card, read-only (it refuses a stand-in, so on the CPU it only says so)
    step("gpu-check", [sys.executable, str(REPO / "scripts" / "gpu-check.py")], 60)
    run_dir = work / "measure"
    shutil.rmtree(run_dir, ignore_errors=True)
    (run_dir / "results").mkdir(parents=True)
    ini = write_presets(run_dir, args.model_embd, args.model_layers)
    checked = step("preset check", check_presets_command(binary, ini), 120)
    router_log = run_dir / "router.log"
    started = time.monotonic()
    failed_steps: list[Check] = []
    not_run = subprocess.CompletedProcess([], -1, "", "not run")
    ran = doctor = not_run
    facts: dict[str, Any] = {}
    try:
        router = start_router(binary, ini, log_path=router_log, env=runtime_env(work), timeout=120)
    except RouterStartError as e:
        failed_steps.append(Check("router-start", False, str(e)[-2000:]))
        facts = nvml_facts(default_nvml_module())
    else:
        try:
            say(f"router on {router.url} (pid {router.process.pid})")
            ran = step("run", _llm_bench("run", "--url", router.url, "--output-dir", str(run_dir / "results"),
                                         "--log-file", str(router_log), "--label", "gpu-proof",
                                         "--runs", str(args.runs), "--max-tokens", str(args.max_tokens)), 300)
            doctor = step("doctor", _llm_bench("doctor", "--url", router.url, "--log-file", str(router_log),
                                               *[x for a in DOCTOR_ALIASES for x in ("--alias", a)]), 180)
            # while the doctor's last probe keeps its model loaded: the listing should show that instance
            facts = nvml_facts(default_nvml_module(), router_pids(router.process.pid))
            facts["llm_bench_listing"] = llm_bench_listing(default_nvml_module())
        finally:
            router.stop()
    say(f"router and measurements took {time.monotonic() - started:.0f} s")
    files = sorted((run_dir / "results").glob("*.toml"))
    results: dict[str, Any] = {}
    if files:
        import tomllib  # noqa: PLC0415

        results = tomllib.loads(files[-1].read_text())
        shutil.copy2(files[-1], out / "results.toml")
        step("telemetry", _llm_bench("telemetry", str(files[-1]), "--chart", str(out / "telemetry.png")), 120)
        report = step("report", _llm_bench("report", str(files[-1]), "--baseline", "gpu-plain"), 120)
        (out / "report.md").write_text(report.stdout)
    elif not failed_steps:
        failed_steps.append(Check("results-file", False, f"llm-bench run wrote no results file (exit {ran.returncode})"))
    if router_log.is_file():
        shutil.copy2(router_log, out / "router.log")
    log_text = router_log.read_text(errors="replace") if router_log.is_file() else ""
    checks = [Check("presets-validate", checked.returncode == 0,
                    (checked.stdout + checked.stderr).strip() or "check-preset-keys accepted every key"),
              *failed_steps, *evaluate(results, log_text, doctor.stdout + doctor.stderr, facts)]
    summary = {
        "issue": 56, "llama_server": str(binary), "server_build": (results.get("meta") or {}).get("server_build"),
        "build": json.loads(build_facts.read_text()) if (build_facts := work / "bin" / "build.json").is_file() else None,
        "presets": proof_presets(Path("gpu-proof-target.gguf")), "run_exit": ran.returncode,
        "doctor_exit": doctor.returncode, "nvml": facts, "llm_bench_gpus": (results.get("meta") or {}).get("gpus"),
        "fingerprint": (results.get("meta") or {}).get("fingerprint"),
        "double_differences": api_differences(facts, double_facts()),
        "checks": [dataclasses.asdict(c) for c in checks],
    }
    (out / "gpu-proof.json").write_text(json.dumps(summary, indent=1, default=repr))
    for c in checks:
        say(c.line())
    failed = [c.name for c in checks if not c.ok]
    say(f"{len(checks) - len(failed)} passed, {len(failed)} failed" + (f": {', '.join(failed)}" if failed else ""))
    return 1 if failed else 0


# --- the command line ---

def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    sub = p.add_subparsers(dest="command", required=True)
    out_default = os.environ.get("OUT") or str(WORK / "out")
    pk = sub.add_parser("pack", help="the sdist and the wheels into .gpu-proof/ (CPU machine, network)")
    pk.add_argument("--pack", default=str(PACK))
    b = sub.add_parser("build", help="llama-server with CUDA for this card's architecture only")
    b.add_argument("--arch", help="CMAKE_CUDA_ARCHITECTURES (default: read from the card, e.g. 90)")
    b.add_argument("--sdist", default=str(PACK / SDIST_NAME))
    b.add_argument("--work", default=str(WORK))
    b.add_argument("--out", default=out_default)
    b.add_argument("--jobs", type=int)
    b.add_argument("--timeout", type=float, default=540.0,
                   help="seconds for the compile (default 540; `gpu-proof.sh all` gives it 450, leaving the rest of "
                        "a 10-minute call to measure)")
    b.add_argument("--library-dir", action="append", default=[],
                   help="another folder to look for cuBLAS and libcuda in (repeatable)")
    b.add_argument("--configure-only", action="store_true", help="run CMake's configure step and stop")
    m = sub.add_parser("measure", help="router, run, doctor, telemetry and the checks")
    m.add_argument("--work", default=str(WORK))
    m.add_argument("--out", default=out_default)
    m.add_argument("--llama-server", help="the binary (default: what build made)")
    m.add_argument("--runs", type=int, default=3)
    m.add_argument("--max-tokens", type=int, default=1024,
                   help="output tokens per request (default 1024: a second or more per preset, for the energy counter)")
    m.add_argument("--model-embd", type=int, default=MODEL_EMBD, help=f"the model's width (default {MODEL_EMBD})")
    m.add_argument("--model-layers", type=int, default=MODEL_LAYERS,
                   help=f"the model's layers (default {MODEL_LAYERS})")
    # test-only: the CPU tests drive the whole step with tests/fake_nvml.py; never on a GPU machine
    m.add_argument("--allow-nvml-stand-in", action="store_true", help=argparse.SUPPRESS)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        refuse_settings(argv)
        args = parser().parse_args(argv)
        return {"pack": pack, "build": build, "measure": measure}[args.command](args)
    except ProofError as e:
        print(f"gpu-proof: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
