"""llm-bench doctor and the in-run checks, against the real llama-server and the NVML test double."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from llm_bench.cli import main
from llm_bench.demo import write_demo_bed
from llm_bench.diagnostics.checks import (
    check_enforce_eager,
    check_fa_fallback,
    check_offload,
    check_power_floor,
    check_vram,
    vllm_command_lines,
)
from llm_bench.diagnostics.findings import ERROR, WARNING
from llm_bench.gpu.nvml import Nvml, VramReading
from llm_bench.plan import Checks, Plan, Protocol
from llm_bench.results import load_results
from llm_bench.runner import run_plan
from llm_bench.testbed.llama_server import read_source_file
from llm_bench.testbed.presets import render_presets_ini
from llm_bench.testbed.router import start_router
from tests.fake_nvml import FakeGpu, FakeNvml, use_in_subprocesses, write_state

# The exact format strings of llama.cpp build 11434, as a CUDA build prints them under the router.
OFFLOAD_LINE = "[51234] 0.01.234.567 I load_tensors: offloaded {}/{} layers to GPU"
FA_LINE = ("[51234] 0.02.000.000 W ggml_cuda_flash_attn_ext_vec: no FlashAttention vector kernel compiled for K/V "
           "types q8_0-q4_0, converting K and V to f16 instead (slow). Add \"q8_0-q4_0\" to GGML_CUDA_FA_QUANTS to "
           "compile it.")
SPAWN_LINE = "0.00.136.376 I srv          load: spawning server instance with name=qwen-27b on port 51234"


@pytest.fixture(scope="module")
def bed(tmp_path_factory, tiny_models) -> Path:
    folder = tmp_path_factory.mktemp("bed")
    ini = write_demo_bed(folder)
    models = folder / "models"
    # draft-simple with synthetic acceptance length 1: the real router drafts and accepts nothing
    ini.write_text(ini.read_text() + "\n" + render_presets_ini({"tiny-trap": {
        "model": str(models / "tiny-target.gguf"), "spec-type": "draft-simple",
        "model-draft": str(models / "tiny-draft.gguf"), "spec-draft-n-max": 4, "spec-synth-len": 1}}))
    return ini


@pytest.fixture(scope="module")
def router(llama_server_bin, bed):
    router = start_router(llama_server_bin, bed, log_path=bed.parent / "router.log")
    yield router
    router.stop()


@pytest.fixture
def fake_nvml(tmp_path, monkeypatch):
    def make(fake: FakeNvml) -> Path:
        state = write_state(tmp_path / "nvml.json", fake)
        use_in_subprocesses(monkeypatch, state)
        monkeypatch.setenv("LLM_BENCH_STATE_DIR", str(tmp_path / "state"))
        return state
    return make


def doctor(*args: str):
    return CliRunner().invoke(main, ["doctor", *args], catch_exceptions=False)


def test_vram_busy_before_a_load():
    [finding] = check_vram(VramReading((3000.0,)), 2048.0)
    assert finding.severity == ERROR and "GPU0 3000 MiB" in finding.evidence and "nvidia-smi" in finding.fix
    [finding] = check_vram(VramReading((3000.0,)), 2048.0, loaded=["tiny-plain"])
    assert finding.severity == WARNING and "tiny-plain" in finding.evidence
    assert check_vram(VramReading((300.0,)), 2048.0) == []


def test_layers_off_the_gpu_and_missing_fa_kernel_from_log_lines():
    log = "\n".join([SPAWN_LINE, OFFLOAD_LINE.format(40, 65), FA_LINE])
    [offload] = check_offload(log, gpu_count=1)
    assert offload.severity == ERROR and "qwen-27b: only 40 of 65 layers" in offload.evidence
    [fa] = check_fa_fallback(log)
    assert fa.severity == ERROR and "K/V types q8_0-q4_0" in fa.evidence and "GGML_CUDA_FA_QUANTS" in fa.fix
    assert check_offload("\n".join([SPAWN_LINE, OFFLOAD_LINE.format(65, 65)]), gpu_count=1) == []


def test_the_fa_message_is_llama_cpps_own():
    source = read_source_file("ggml/src/ggml-cuda/fattn.cu")
    assert "no FlashAttention vector kernel compiled for K/V types %s-%s, converting K and V to f16 instead" \
        in source


def test_real_router_log_of_a_cpu_build_with_a_gpu_present(router):
    import httpx

    httpx.post(f"{router.url}/v1/chat/completions", timeout=60,
               json={"model": "tiny-plain", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4})
    log = router.log()
    [finding] = check_offload(log, gpu_count=1)
    assert finding.severity == WARNING and "tiny-plain: the model was loaded" in finding.evidence
    assert "without CUDA" in finding.evidence
    assert check_offload(log, gpu_count=0) == []


def test_enforce_eager_from_a_real_process_command_line():
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)", "vllm", "serve", "Qwen/Qwen3-8B",
                             "--enforce-eager"])
    try:
        lines = vllm_command_lines()
        assert any("--enforce-eager" in line for line in lines)
        [finding] = check_enforce_eager(lines)
        assert finding.severity == ERROR and "remove --enforce-eager" in finding.fix
    finally:
        proc.kill()
        proc.wait()
    assert check_enforce_eager(["vllm serve Qwen/Qwen3-8B --dtype bfloat16"]) == []
    metrics = 'vllm:compilation_config_info{enforce_eager="True",level="0"} 1.0\n'
    assert check_enforce_eager([], metrics)[0].check == "vllm-eager"


def test_power_limit_below_the_floor():
    with Nvml(FakeNvml(gpus=[FakeGpu(power_limit_mw=150000), FakeGpu()])) as nvml:
        [finding] = check_power_floor(nvml, 200.0)
    assert "GPU0 power limit is 150 W, below the floor of 200 W" in finding.evidence
    assert "nvidia-smi -i 0 -pl 350" in finding.fix


def test_doctor_finds_the_acceptance_trap_and_exits_1(router, fake_nvml):
    fake_nvml(FakeNvml())
    result = doctor("--url", router.url, "--alias", "tiny-trap", "--log-file", str(router.log_path))
    assert result.exit_code == 1, result.output
    assert "ERROR [acceptance]" in result.output and "accepted 0" in result.output
    assert "WARNING [roofline]" in result.output  # a CPU build against a (test-double) RTX 3090


def test_doctor_on_a_healthy_alias_warns_but_passes(router, fake_nvml):
    fake_nvml(FakeNvml(gpus=[FakeGpu(power_limit_mw=150000)]))
    result = doctor("--url", router.url, "--alias", "tiny-plain", "--log-file", str(router.log_path),
                    "--power-floor-w", "200")
    assert result.exit_code == 0, result.output
    assert "[acceptance]" not in result.output
    assert "WARNING [power-limit]" in result.output and "WARNING [offload]" in result.output


def test_doctor_vram_busy_is_an_error(router, fake_nvml):
    import httpx

    for alias in ("tiny-plain", "tiny-trap"):
        httpx.post(f"{router.url}/models/unload", json={"model": alias})
    fake_nvml(FakeNvml(gpus=[FakeGpu(used_mib=5000)]))
    result = doctor("--url", router.url)
    assert result.exit_code == 1 and "ERROR [vram]" in result.output


def test_checks_run_during_every_run(router, tmp_path):
    fake = FakeNvml(gpus=[FakeGpu(power_limit_mw=250000)])
    plan = Plan(url=router.url, aliases=("tiny-plain", "tiny-trap"), output_dir=tmp_path,
                protocol=Protocol(runs=1, max_tokens=32),
                checks=Checks(log_file=router.log_path, power_floor_w=300))
    records = {r.alias: r for r in load_results(run_plan(plan, lambda m: None, nvml=Nvml(fake)).path).aliases}
    for record in records.values():
        text = " ".join(record.warnings)
        assert "DOCTOR offload:" in text and "without CUDA" in text  # from this alias's part of the log
        assert "DOCTOR power-limit:" in text and "DOCTOR roofline:" in text
        assert record.roofline_tps and record.memory_bandwidth_gbs == pytest.approx(936.096)
    assert any(w.startswith("ACCEPTANCE TRAP") for w in records["tiny-trap"].warnings)
