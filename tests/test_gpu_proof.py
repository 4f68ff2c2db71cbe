"""The GPU proof (scripts/gpu-proof.sh and scripts/gpu-proof.py, issue #56), tested on the CPU: what a session
lent an NVIDIA card runs first must not fail there on something a CPU machine could have caught.

- the shell script parses (bash -n, and shellcheck where it is installed: ./dev installs it);
- it refuses every --set-style argument before anything runs, and neither proof script calls a setter;
- the card's architecture becomes CMAKE_CUDA_ARCHITECTURES ("9.0" -> "90");
- cuBLAS and libcuda are found where a CUDA wheel and the driver put them;
- the build step's CMake flags: each is declared by the pinned llama.cpp source, and a configure-only run
  with CUDA's real compiler builds for that one architecture;
- the presets it writes pass the project's own preset check against the real llama-server's --help;
- its measure step, run end to end on the CPU llama-server with the NVML test double, produces every file
  and passes every check a CPU can pass, and fails the ones that prove the GPU: layers on the GPU, the CUDA
  build, the doctor's no-gpu error.
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from llm_bench.testbed.llama_server import CMAKE_FLAGS, ensure_sdist
from tests.fake_nvml import FakeNvml, use_in_subprocesses, write_state

ROOT = Path(__file__).resolve().parents[1]
SHELL = ROOT / "scripts" / "gpu-proof.sh"
SCRIPT = ROOT / "scripts" / "gpu-proof.py"


def load_script():
    spec = importlib.util.spec_from_file_location("gpu_proof", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


proof = load_script()


def test_the_shell_script_parses():
    done = subprocess.run(["bash", "-n", str(SHELL)], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    if shutil.which("shellcheck") is None:
        pytest.skip("shellcheck is not installed (./dev test installs it with apt-get)")
    done = subprocess.run(["shellcheck", str(SHELL)], capture_output=True, text=True)
    assert done.returncode == 0, done.stdout


@pytest.mark.parametrize("args", [["--set"], ["build", "--set"], ["measure", "--set=power"], ["set"],
                                  ["all", "-pl", "200"], ["measure", "--persistence-mode=1"], ["build", "-lgc"],
                                  ["measure", "--applications-clocks=1593,1755"]])
def test_settings_are_refused_before_anything_runs(args, tmp_path):
    out = tmp_path / "out"
    for command in ([str(SHELL), *args], [sys.executable, str(SCRIPT), *args]):
        done = subprocess.run(command, capture_output=True, text=True, timeout=60,
                              env={"PATH": "/usr/bin:/bin", "OUT": str(out), "GPU_PROOF_WORK": str(tmp_path)})
        assert done.returncode == 2, (command, done.stdout, done.stderr)
        assert "refused" in done.stderr and "no --set path" in done.stderr, done.stderr
    assert not any(out.iterdir()) if out.exists() else True


def test_every_dependency_travels_or_is_on_the_gpu_machine():
    """Each of llm-bench's dependencies (pyproject.toml), and each of theirs, is a carried wheel whose pinned
    version the project accepts, or one the GPU image has: a dependency added to the project and not here
    would stop the proof on the lent machine, where nothing can be downloaded."""
    import tomllib
    from importlib.metadata import requires

    from packaging.requirements import Requirement

    carried = {Requirement(w).name.lower(): Requirement(w) for w in proof.WHEELS}
    pinned = {name: next(iter(r.specifier)).version for name, r in carried.items()}
    needed = [Requirement(d) for d in tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]]
    for name in list(carried):
        needed += [Requirement(d) for d in requires(name) or [] if "extra ==" not in d]
    for req in needed:
        name = req.name.lower().replace("_", "-")
        if req.marker is not None and not req.marker.evaluate({"python_version": proof.WHEEL_PYTHON}):
            continue
        if name in pinned:
            assert req.specifier.contains(pinned[name]), f"{req} but the proof carries {name}=={pinned[name]}"
        else:
            assert name in proof.IN_THE_IMAGE, (
                f"{req.name} is neither carried (scripts/gpu-proof.py WHEELS) nor in the GPU image")


def test_a_step_past_its_time_is_stopped_with_what_it_started(tmp_path):
    started = time.monotonic()
    rc = proof.run_logged(["bash", "-c", "sleep 6 & sleep 6; wait"], tmp_path / "log", timeout=0.5)
    assert rc == 124 and time.monotonic() - started < 5
    assert "stopped after" in (tmp_path / "log").read_text()


def test_the_proof_scripts_call_no_setter():
    """Read-only by construction: no NVML setter, no llm-bench power-limit call, no nvidia-smi setting."""
    setters = re.compile(r"nvmlDeviceSet|set_power_limit|save_originals|nvidia-smi\s+(?:-pl|-pm|-ac|-lgc|-lmc)\b|"
                         r"llm_bench\.power|_llm_bench\(\"power\"")
    for path in (SCRIPT, SHELL, ROOT / "scripts" / "gpu-check.py"):
        found = setters.findall(path.read_text())
        assert not found, f"{path.name} calls {found}"


def test_gpu_check_refuses_set():
    done = subprocess.run([sys.executable, str(ROOT / "scripts" / "gpu-check.py"), "--set"], capture_output=True,
                          text=True, timeout=60)
    assert done.returncode == 2 and "no --set path" in done.stderr, done.stderr


@pytest.mark.parametrize("caps, arch", [(["9.0"], "90"), (["9.0\n", ""], "90"), (["8.6", "9.0", "8.6"], "86;90"),
                                        (["12.0"], "120")])
def test_compute_capability_becomes_the_cuda_architecture(caps, arch):
    assert proof.arch_from_compute_caps(caps) == arch
    assert f"-DCMAKE_CUDA_ARCHITECTURES={arch}" in proof.cuda_cmake_flags(arch)


@pytest.mark.parametrize("caps", [[], ["[N/A]"], ["9"]])
def test_an_unreadable_compute_capability_is_an_error(caps):
    with pytest.raises(proof.ProofError):
        proof.arch_from_compute_caps(caps)


def test_an_architecture_that_is_no_list_is_refused():
    with pytest.raises(proof.ProofError, match="not a CUDA architecture"):
        proof.cuda_cmake_flags("sm_90; rm -rf /")


def test_cublas_from_a_wheel_and_the_driver_library_are_found(tmp_path):
    """The layout of an nvidia-cublas wheel (versioned libraries only) and a driver folder with libcuda.so.1;
    the toolkit here has neither."""
    toolkit = tmp_path / "cuda"
    (toolkit / "include").mkdir(parents=True)
    (toolkit / "lib64").mkdir()
    wheel = tmp_path / "site-packages" / "nvidia" / "cu13"
    (wheel / "lib").mkdir(parents=True)
    (wheel / "include").mkdir()
    for name in ("libcublas.so.13", "libcublasLt.so.13"):
        (wheel / "lib" / name).write_bytes(b"")
    for name in ("cublas_v2.h", "cublas_api.h", "cuda_runtime_api.h"):
        (wheel / "include" / name).write_text("")
    driver = tmp_path / "driver"
    driver.mkdir()
    (driver / "libcuda.so.1").write_bytes(b"")
    links = tmp_path / "links"
    found = proof.find_cuda_libraries(links, toolkit_roots=[toolkit], driver_dirs=[driver],
                                      wheel_roots=[tmp_path / "site-packages"])
    assert f"-DCMAKE_LIBRARY_PATH={links}" in found.cmake_flags
    assert f"-DCMAKE_CUDA_FLAGS=-I{links / 'include'}" in found.cmake_flags
    # only cuBLAS's headers: the wheel's copies of the toolkit's own stay out
    assert sorted(p.name for p in (links / "include").iterdir()) == ["cublas_api.h", "cublas_v2.h"]
    assert "-DGGML_CUDA_NO_VMM=ON" not in found.cmake_flags
    assert (links / "libcublas.so").resolve() == (wheel / "lib" / "libcublas.so.13").resolve()
    assert (links / "libcublasLt.so").resolve() == (wheel / "lib" / "libcublasLt.so.13").resolve()
    assert (links / "libcuda.so").resolve() == (driver / "libcuda.so.1").resolve()
    # the wheel's folder is where the binary loads cuBLAS from; the driver's is left to the loader
    assert found.runtime_dirs == (str(wheel / "lib"),)


def toolkit_with_cublas(root):
    """A CUDA toolkit's folder layout holding cuBLAS's header and libraries (empty files: no toolkit here)."""
    toolkit = root / "cuda"
    (toolkit / "include").mkdir(parents=True)
    (toolkit / "lib64").mkdir()
    (toolkit / "include" / "cublas_v2.h").write_text("")
    for name in ("libcublas.so", "libcublasLt.so"):
        (toolkit / "lib64" / name).write_bytes(b"")
    return toolkit


def test_without_a_driver_library_the_build_needs_none(tmp_path):
    """No libcuda anywhere (the driver's folder not where it is looked for): ggml-cuda without its VMM pool,
    the one part that links the driver library."""
    toolkit = toolkit_with_cublas(tmp_path)
    found = proof.find_cuda_libraries(tmp_path / "links", toolkit_roots=[toolkit], driver_dirs=[tmp_path / "none"])
    assert found.cmake_flags == ("-DGGML_CUDA_NO_VMM=ON",)


def test_a_toolkit_with_cublas_needs_nothing_more(tmp_path):
    toolkit = toolkit_with_cublas(tmp_path)
    driver = tmp_path / "driver"
    driver.mkdir()
    (driver / "libcuda.so").write_bytes(b"")
    found = proof.find_cuda_libraries(tmp_path / "links", toolkit_roots=[toolkit], driver_dirs=[driver])
    assert found.cmake_flags == (f"-DCMAKE_LIBRARY_PATH={tmp_path / 'links'}",) and found.runtime_dirs == ()


HAVE_CUDA_COMPILER = all(shutil.which(t) for t in ("cmake", "ninja", "nvcc"))


@pytest.fixture(scope="module")
def configured(tmp_path_factory: pytest.TempPathFactory) -> tuple[subprocess.CompletedProcess, Path, Path]:
    """The build step's configure-only run with CUDA's real compiler (nvcc is on this machine; cuBLAS and the
    driver library cannot be, so empty stand-ins take their place: CMake only looks them up when configuring)."""
    if not HAVE_CUDA_COMPILER:
        pytest.skip("cmake, ninja or nvcc (CUDA's compiler) is not installed")
    tmp = tmp_path_factory.mktemp("gpu-proof-configure")
    stand_ins = tmp / "stand-ins"
    stand_ins.mkdir()
    for name in ("libcublas.so", "libcublasLt.so", "libcuda.so"):
        (stand_ins / name).write_bytes(b"")
    work = tmp / "work"
    done = subprocess.run([sys.executable, str(SCRIPT), "build", "--arch", "90", "--configure-only",
                           "--sdist", str(ensure_sdist()), "--work", str(work), "--out", str(tmp / "out"),
                           "--library-dir", str(stand_ins)], capture_output=True, text=True, timeout=300)
    return done, work, tmp / "out" / "build.log"


def test_every_cmake_flag_is_one_the_pinned_source_reads(configured):
    """Each -D of the CUDA build is declared by the pinned llama.cpp's own CMake files (an option, a cached
    setting) or, for CMAKE_CUDA_ARCHITECTURES, read by ggml-cuda instead of its default list."""
    _, work, _ = configured
    (source,) = (work / "src").glob("*/llama.cpp")
    text = "\n".join(p.read_text(errors="replace") for p in [*source.rglob("CMakeLists.txt"), *source.rglob("*.cmake")])
    flags = proof.cuda_cmake_flags("90")
    assert list(CMAKE_FLAGS) == flags[:len(CMAKE_FLAGS)]  # the CPU bed's flags, then CUDA's
    for flag in [*flags, "-DGGML_CUDA_NO_VMM=ON"]:  # and the one added without a driver library
        name = re.match(r"-D(\w+)=", flag)[1]
        if name == "CMAKE_BUILD_TYPE":  # CMake's own
            continue
        if name == "CMAKE_CUDA_ARCHITECTURES":
            assert "if (NOT DEFINED CMAKE_CUDA_ARCHITECTURES)" in text
            continue
        declared = re.search(rf"option\({name}\s|set\s*\({name}\s[^)]*CACHE|if \(NOT DEFINED {name}\)", text)
        assert declared, f"{flag}: llama.cpp {proof.SDIST_VERSION} declares no {name}"


def test_the_build_configures_for_the_one_architecture(configured):
    """The configure-only run: the CUDA backend is in, every CUDA file compiles for compute_90 alone, and
    FlashAttention has the q8_0 kernels the KV preset needs."""
    done, work, build_log = configured
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    log = build_log.read_text()
    assert "-- Including CUDA backend" in log
    assert "Using CMAKE_CUDA_ARCHITECTURES=90 " in log
    assert "FlashAttention K-V type combinations: f16-f16;q8_0-q8_0" in log
    cache = (work / "build" / "CMakeCache.txt").read_text()
    assert "GGML_CUDA:BOOL=ON" in cache and "GGML_CUDA_NCCL:BOOL=OFF" in cache
    targets = set(re.findall(r"--generate-code=(\S+)", (work / "build" / "build.ninja").read_text()))
    assert targets == {"arch=compute_90,code=[compute_90,sm_90]"}


def test_the_presets_pass_the_preset_check(llama_server_bin, tmp_path):
    ini = proof.write_presets(tmp_path, embd=128, layers=1)
    done = subprocess.run(proof.check_presets_command(llama_server_bin, ini), capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr
    text = ini.read_text()
    assert text.count("n-gpu-layers = 99") == 3 and "spec-draft-ngl = 99" in text


def test_the_measure_step_runs_end_to_end_on_the_cpu(llama_server_bin, tmp_path, monkeypatch):
    """The whole measure step through the shell script, on the CPU llama-server, NVML being the test double:
    every file comes back, the checks a CPU run can pass pass, and the ones only a GPU can pass fail, naming
    what they saw. (The wheels are for the GPU machine's Python 3.12: here the project's environment has
    them, so their installation is marked done.)"""
    use_in_subprocesses(monkeypatch, write_state(tmp_path / "nvml.json", FakeNvml()))
    monkeypatch.setenv("PYTHONPATH", str(ROOT))
    work, out = tmp_path / "work", tmp_path / "out"
    (work / "site").mkdir(parents=True)
    (work / "site" / ".installed").touch()
    done = subprocess.run([str(SHELL), "measure", "--allow-nvml-stand-in", "--llama-server", str(llama_server_bin),
                           "--runs", "1", "--max-tokens", "16", "--model-embd", "128", "--model-layers", "2"],
                          capture_output=True, text=True, timeout=600,
                          env={**os.environ, "PYTHON": sys.executable, "GPU_PROOF_WORK": str(work), "OUT": str(out)})
    assert done.returncode == 1, done.stdout[-4000:] + done.stderr[-4000:]
    assert {p.name for p in out.iterdir()} >= {"proof.log", "results.toml", "report.md", "router.log",
                                               "telemetry.png", "gpu-proof.json"}
    summary = json.loads((out / "gpu-proof.json").read_text())
    checks = {c["name"]: c for c in summary["checks"]}
    for name in ("presets-validate", "measured", "decode-from-server-timings", "vram-before-load",
                 "fingerprint-from-nvml", "telemetry-power-energy", "roofline-from-nvml", "nvml-process-listing"):
        assert checks[name]["ok"], checks[name]
    assert "Nvml.gpu_processes" in checks["nvml-process-listing"]["evidence"]  # llm-bench's own listing too
    for name in ("cuda-build", "layers-on-gpu", "doctor-no-gpu-errors"):
        assert not checks[name]["ok"], checks[name]
    assert "no-gpu" in checks["layers-on-gpu"]["evidence"]
    assert "936" in checks["roofline-from-nvml"]["evidence"]  # the double's RTX 3090: 9751 MHz x 2 x 384 / 8
    gpu = summary["nvml"]["gpus"][0]["reads"]
    assert gpu["nvmlDeviceGetName(handle)"]["value"] == "NVIDIA GeForce RTX 3090"
    assert "nvmlDeviceGetComputeRunningProcesses(handle)" in gpu
    assert summary["double_differences"] == []  # the double compared with itself
    assert "FAIL layers-on-gpu" in (out / "proof.log").read_text()


# --- the checks, on what a GPU run writes (the keys of a real results file; figures of an H100) ---

def gpu_run() -> tuple[dict, str, str, dict]:
    """A results file, router log, doctor output and NVML facts as an H100 run would give them."""
    rig_gpu = {"index": 0, "name": "NVIDIA H100 80GB HBM3", "power_limit_enforced_w": 700.0,
               "power_limit_default_w": 700.0, "pcie_gen": 5, "pcie_width": 16, "pcie_gen_max": 5,
               "pcie_width_max": 16, "persistence_mode": "enabled", "memory_used_mib": 520.0, "sm_clock_mhz": 345,
               "mem_clock_mhz": 2619, "max_sm_clock_mhz": 1980, "max_mem_clock_mhz": 2619}
    record = {
        "workload": "standard", "decode_source": "server timings", "vram_used_mib_before": [520.0],
        "runs": [{"decode_tps": 910.5, "server_decode_tps": 910.5}, {"decode_tps": 905.0, "server_decode_tps": 905.0}],
        "telemetry": {"samples": [{"t": 0.0, "gpu": 0, "power_w": 120.0, "energy_j": 1000.0},
                                  {"t": 0.6, "gpu": 0, "power_w": 180.0, "energy_j": 1090.0}],
                      "energy_source": "energy counter", "energy_j": 90.0, "joules_per_token": 0.18,
                      "mean_power_w": 150.0},
        "memory_bandwidth_gbs": 3352.32, "model_bytes": 11_000_000, "roofline_tps": 304_756.4,
    }
    results = {"meta": {"fingerprint": {"rig": {"driver": "580.159.04", "gpus": [rig_gpu]}}},
               "aliases": [{"alias": a, **json.loads(json.dumps(record))} for a in proof.ALIASES]}
    log = "\n".join(
        f"load: spawning server instance with name={a} on port {4000 + i}\n"
        f"[{4000 + i}] ggml_cuda_init: found 1 CUDA devices (Total VRAM: 81559 MiB):\n"
        f"[{4000 + i}] load_model: loading model '/tmp/gpu-proof-target.gguf'\n"
        f"[{4000 + i}] load_tensors: offloaded 5/5 layers to GPU"
        for i, a in enumerate(proof.ALIASES))
    doctor = ("WARNING [roofline] gpu-plain: decode 910 t/s is 0.3 % of the roofline Fix: ...\n"
              "0 error(s), 1 warning(s)\n")
    facts = {"gpus": [{"index": 0, "reads": {
        "nvmlDeviceGetMaxClockInfo(handle, NVML_CLOCK_MEM)": {"value": 2619},
        "nvmlDeviceGetMemoryBusWidth(handle)": {"value": 5120},
        "nvmlDeviceGetComputeRunningProcesses(handle)": {"value": [{"pid": 4242, "usedGpuMemory": 600 << 20}]}}}],
        "own_pids": [4241, 4242]}
    return results, log, doctor, facts


def test_a_gpu_run_passes_every_check():
    results, log, doctor, facts = gpu_run()
    # llm-bench's own listing (Nvml.gpu_processes), where the checkout has it, agreeing with the raw calls
    facts["llm_bench_listing"] = {"processes": [{"index": 0, "pid": 4242, "kind": "compute", "used_mib": 600.0}],
                                  "unavailable": None}
    checks = proof.evaluate(results, log, doctor, facts)
    assert [c.name for c in checks if not c.ok] == [], [c.line() for c in checks]
    by_name = {c.name: c for c in checks}
    assert "3352.32 GB/s" in by_name["roofline-from-nvml"].evidence  # 2619 MHz x 2 x 5120 bit / 8
    assert "among them: [4242]" in by_name["nvml-process-listing"].evidence


def _break(what: str):
    results, log, doctor, facts = gpu_run()
    kv = results["aliases"][2]
    if what == "partial offload":
        log = log.replace(f"[{4002}] load_tensors: offloaded 5/5", f"[{4002}] load_tensors: offloaded 3/5")
    elif what == "partial target offload, the draft's line last":  # the doctor's check reads the last line only
        log = log.replace(f"[{4001}] load_tensors: offloaded 5/5", f"[{4001}] load_tensors: offloaded 3/5 layers "
                          f"to GPU\n[{4001}] load_tensors: offloaded 5/5")
    elif what == "no CUDA":
        log = "\n".join(line for line in log.splitlines() if "ggml_cuda_init" not in line)
    elif what == "client decode":
        kv["decode_source"] = "client"
    elif what == "a run without server timings":
        del kv["runs"][1]["server_decode_tps"]
    elif what == "VRAM unread":
        del kv["vram_used_mib_before"]
        kv["vram_unavailable"] = "NVML is not available"
    elif what == "fingerprint fact missing":
        results["meta"]["fingerprint"]["rig"]["gpus"][0]["pcie_gen"] = "not available: nvmlDeviceGet...: Not Supported"
    elif what == "energy integrated":
        kv["telemetry"]["energy_source"] = "power integration"
    elif what == "a sample without power":
        del kv["telemetry"]["samples"][0]["power_w"]
    elif what == "bandwidth not NVML's":
        kv["memory_bandwidth_gbs"] = 936.0
    elif what == "doctor GPU error":
        doctor = "ERROR [offload] gpu-plain: only 3 of 5 layers are on the GPU Fix: ...\n" + doctor
    elif what == "doctor blind":
        doctor = "llm-bench: NVML could not start: Driver Not Loaded\n" + doctor
    elif what == "process listing failed":
        facts["gpus"][0]["reads"]["nvmlDeviceGetComputeRunningProcesses(handle)"] = {"error": "NVMLError: Not Supported"}
    elif what == "llm-bench's listing disagrees":
        facts["llm_bench_listing"] = {"processes": [], "unavailable": None}
    elif what == "alias missing":
        results["aliases"].pop()
    return proof.evaluate(results, log, doctor, facts)


@pytest.mark.parametrize("what, check", [
    ("partial offload", "layers-on-gpu"), ("partial target offload, the draft's line last", "layers-on-gpu"),
    ("no CUDA", "cuda-build"), ("client decode", "decode-from-server-timings"),
    ("a run without server timings", "decode-from-server-timings"), ("VRAM unread", "vram-before-load"),
    ("fingerprint fact missing", "fingerprint-from-nvml"), ("energy integrated", "telemetry-power-energy"),
    ("a sample without power", "telemetry-power-energy"), ("bandwidth not NVML's", "roofline-from-nvml"),
    ("doctor GPU error", "doctor-no-gpu-errors"), ("doctor blind", "doctor-no-gpu-errors"),
    ("process listing failed", "nvml-process-listing"), ("llm-bench's listing disagrees", "nvml-process-listing"),
    ("alias missing", "measured"),
])
def test_each_check_fails_on_what_it_guards(what, check):
    failed = [c.name for c in _break(what) if not c.ok]
    if what == "alias missing":  # then nothing of it can pass
        assert check in failed, failed
    else:
        assert failed == [check]
