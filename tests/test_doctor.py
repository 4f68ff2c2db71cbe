"""llm-bench doctor and the in-run checks, against the real llama-server and the NVML test double."""

from __future__ import annotations

import subprocess
import sys
from datetime import datetime, timezone
from pathlib import Path

import pytest
from click.testing import CliRunner

from llm_bench.cli import main
from llm_bench.demo import write_demo_bed
from llm_bench.diagnostics import acceptance, gpu_errors, vllm_evidence
from llm_bench.diagnostics.findings import ERROR, WARNING
from llm_bench.diagnostics.gpu_checks import check_power_floor, check_vram
from llm_bench.diagnostics.log_checks import check_fa_fallback, check_offload
from llm_bench.diagnostics.vllm_evidence import check_enforce_eager, vllm_command_lines
from llm_bench.engines.client import RouterClient
from llm_bench.gpu.nvml import Nvml, VramReading
from llm_bench.plan import Checks, Plan, Protocol
from llm_bench.results import load_results
from llm_bench.runner import run_plan
from llm_bench.support.poll import poll_until
from llm_bench.testbed.llama_server import read_source_file
from llm_bench.testbed.presets import render_presets_ini
from llm_bench.testbed.router import start_router
from llm_bench.workloads import PARTS
from tests.fake_nvml import FakeGpu, FakeNvml, use_in_subprocesses, write_state
from tests.fake_vllm import FakeVllm, FakeVllmConfig

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


def loaded(router, alias: str) -> None:
    """``alias`` loaded on the module's router (its load in the router's log), whatever ran before."""
    client = RouterClient(router.url)
    if client.model(alias).status not in ("loaded", "loading"):  # the router refuses to load it twice
        client.load(alias)
    client.wait_for_status(alias, "loaded", 120)


def unloaded_all(router) -> None:
    """Nothing loaded on the module's router, whatever ran before: every unload posted and waited for."""
    client = RouterClient(router.url)
    for info in client.models():
        if info.status != "unloaded":
            client.unload(info.id)
            client.wait_for_status(info.id, "unloaded", 60)


def test_real_router_log_of_a_cpu_build_with_a_gpu_present(router):
    """The real CPU router's log: a GPU per NVML, a model loaded, no CUDA device and no offload."""
    loaded(router, "tiny-plain")
    log = router.log()
    assert "ggml_cuda_init" not in log and "offloaded" not in log
    # one finding per instance the router ever loaded (other tests of this module load other presets)
    findings = {f.evidence.split(":")[0]: f for f in check_offload(log, gpu_count=1)}
    finding = findings["tiny-plain"]
    assert finding.check == "no-gpu" and finding.severity == ERROR
    assert "tiny-plain: the router runs without a GPU" in finding.evidence
    assert "names no CUDA device" in finding.evidence and "built without CUDA" in finding.evidence
    assert "--list-devices" in finding.fix
    assert all(f.check == "no-gpu" and f.severity == ERROR for f in findings.values())
    assert check_offload(log, gpu_count=0) == []


CUDA_FAILED = "ggml_cuda_init: failed to initialize CUDA: no CUDA-capable device is detected"


def test_a_cuda_build_that_could_not_open_the_gpu_quotes_why():
    """A CUDA build whose driver, /dev/nvidia-uvm or DeviceAllow is missing logs CUDA's own error,
    then loads every layer on the CPU (no offload line); the finding quotes that error."""
    source = read_source_file("ggml/src/ggml-cuda/ggml-cuda.cu")
    assert '"%s: failed to initialize " GGML_CUDA_NAME ": %s\\n"' in source
    assert '"%s: found %d " GGML_CUDA_NAME " devices (Total VRAM: %zu MiB):\\n"' in source
    log = "\n".join([CUDA_FAILED, SPAWN_LINE, "[51234] 0.01.000.000 I srv    load_model: loading model '/m.gguf'"])
    [finding] = check_offload(log, gpu_count=1)
    assert finding.check == "no-gpu" and finding.severity == ERROR
    assert f'CUDA could not start ("{CUDA_FAILED}")' in finding.evidence and "qwen-27b:" in finding.evidence


def test_enforce_eager_from_a_real_process_command_line():
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)", "vllm", "serve", "Qwen/Qwen3-8B",
                             "--enforce-eager"])
    try:
        # the kernel fills /proc/PID/cmdline a moment after the process starts
        lines = poll_until(lambda: [l for l in vllm_command_lines() if "--enforce-eager" in l] or None, timeout=10,
                           interval=0.1)
        assert lines
        [finding] = check_enforce_eager(lines)
        assert finding.severity == ERROR and "remove --enforce-eager" in finding.fix
    finally:
        proc.kill()
        proc.wait()
    assert check_enforce_eager(["vllm serve Qwen/Qwen3-8B --dtype bfloat16"]) == []
    # no upstream vLLM labels its metrics with enforce_eager: the log's config line says it (vllm/config/vllm.py)
    logged = ("(EngineCore pid=9) INFO 12-07 17:40:02 [core.py:134] Initializing a V1 LLM engine (v0.32.0) with config: "
              "model='Qwen/Qwen3-8B', speculative_config=None, dtype=torch.bfloat16, max_seq_len=4096, "
              "enforce_eager=True, kv_cache_dtype=auto")
    [finding] = check_enforce_eager([], logged)
    assert finding.check == "vllm-eager" and "enforce_eager=True in the server log's config line" in finding.evidence
    assert check_enforce_eager([], logged.replace("enforce_eager=True", "enforce_eager=False")) == []


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


def test_doctor_on_a_healthy_alias_warns_but_passes(router, fake_nvml, tmp_path):
    fake_nvml(FakeNvml(gpus=[FakeGpu(power_limit_mw=150000)]))
    # A log without a model load: the CPU bed's own log would (rightly) fail the no-gpu check.
    quiet = tmp_path / "quiet.log"
    quiet.write_text("main: server is listening on http://127.0.0.1:8080\n")
    result = doctor("--url", router.url, "--alias", "tiny-plain", "--log-file", str(quiet), "--power-floor-w", "200")
    assert result.exit_code == 0, result.output
    assert "[acceptance]" not in result.output
    assert "WARNING [power-limit]" in result.output and "INFO [offload]" in result.output


def test_the_log_is_read_after_the_probe_loads_the_model(router, fake_nvml):
    """A fresh router: nothing loaded until doctor's probe asks for the alias. The log checks must see
    that load (here: no GPU), so the doctor reads the log after probing. The log is read from this
    test's start only, so no earlier load of the alias can stand in for it."""
    unloaded_all(router)
    start = router.log_path.stat().st_size
    fake_nvml(FakeNvml(gpus=[FakeGpu()]))
    result = doctor("--url", router.url, "--alias", "tiny-plain",
                    "--log-command", f"tail -c +{start + 1} {router.log_path}")
    assert result.exit_code == 1, result.output
    assert "ERROR [no-gpu]" in result.output and "tiny-plain: the router runs without a GPU" in result.output


def test_doctor_reports_a_router_without_a_gpu_as_an_error(router, fake_nvml):
    """NVML (the test double) sees an RTX 3090; the real CPU router loads its model with no CUDA
    device and no offload: the doctor fails, naming the check."""
    loaded(router, "tiny-plain")
    fake_nvml(FakeNvml(gpus=[FakeGpu()]))
    result = doctor("--url", router.url, "--log-file", str(router.log_path))
    assert result.exit_code == 1, result.output
    assert "ERROR [no-gpu]" in result.output and "the router runs without a GPU" in result.output
    # Without a GPU in NVML a CPU router is what was asked for.
    fake_nvml(FakeNvml(gpus=[]))
    assert "[no-gpu]" not in doctor("--url", router.url, "--log-file", str(router.log_path)).output


def test_doctor_vram_busy_is_an_error(router, fake_nvml):
    unloaded_all(router)  # else the VRAM in use is the router's own model: a warning, not an error
    fake_nvml(FakeNvml(gpus=[FakeGpu(used_mib=5000)]))
    result = doctor("--url", router.url)
    assert result.exit_code == 1, result.output
    assert "ERROR [vram] VRAM in use above 2048 MiB before a load (GPU0 5000 MiB) with no model" in result.output


def test_checks_run_during_every_run(router, tmp_path):
    fake = FakeNvml(gpus=[FakeGpu(power_limit_mw=250000)])
    plan = Plan(url=router.url, aliases=("tiny-plain", "tiny-trap"), output_dir=tmp_path,
                protocol=Protocol(runs=1, max_tokens=32),
                checks=Checks(log_file=router.log_path, power_floor_w=300))
    records = {r.alias: r for r in load_results(run_plan(plan, lambda m: None, nvml=Nvml(fake)).path, PARTS).aliases}
    for record in records.values():
        text = " ".join(record.warnings)
        assert "DOCTOR no-gpu:" in text and "without CUDA" in text  # from this alias's part of the log
        assert "DOCTOR power-limit:" in text and "DOCTOR roofline:" in text
        assert record.roofline_tps and record.memory_bandwidth_gbs == pytest.approx(936.096)
    assert any(w.startswith("ACCEPTANCE TRAP") for w in records["tiny-trap"].warnings)


# --- the reports' traps from their own lines: vLLM's command line, log and config files; the kernel log ---

FIXTURES = Path(__file__).parent / "fixtures"
REPORT_CMDLINE = (FIXTURES / "vllm-serve-half-spec.cmdline").read_text().strip()


def test_dtype_half_with_a_drafter_from_the_command_line_the_compose_file_and_metrics():
    [finding] = vllm_evidence.check_dtype_with_speculation(vllm_evidence.vllm_config([REPORT_CMDLINE]))
    assert finding.severity == ERROR and "dtype half" in finding.evidence and "--speculative-config" in finding.evidence
    assert "--dtype bfloat16" in finding.fix
    compose = {"docker-compose.yml": (FIXTURES / "vllm-compose.yml").read_text()}
    [finding] = vllm_evidence.check_dtype_with_speculation(vllm_evidence.vllm_config([], compose))
    assert "dtype float16 (docker-compose.yml: --dtype float16)" in finding.evidence
    env = {".env": "VLLM_DTYPE=half\nSPEC=dflash2\n"}
    [finding] = vllm_evidence.check_dtype_with_speculation(vllm_evidence.vllm_config([], env))
    assert ".env: VLLM_DTYPE=half" in finding.evidence and ".env: SPEC=dflash2" in finding.evidence
    # the log's config line (no upstream vLLM labels a metric with the dtype)
    logged = ("INFO 12-07 17:40:02 [core.py:134] Initializing a V1 LLM engine (v0.32.0) with config: model='q', "
              "speculative_config=SpeculativeConfig(method='eagle3', model='d', num_spec_tokens=3), "
              "dtype=torch.float16, max_seq_len=4096, enforce_eager=False, kv_cache_dtype=auto")
    [finding] = vllm_evidence.check_dtype_with_speculation(vllm_evidence.vllm_config([], None, None, logged))
    assert "dtype float16 (the server log's config line" in finding.evidence
    # no drafter, or bfloat16: nothing to say
    assert vllm_evidence.check_dtype_with_speculation(vllm_evidence.vllm_config(["vllm serve m --dtype half"])) == []
    assert vllm_evidence.check_dtype_with_speculation(vllm_evidence.vllm_config(
        [REPORT_CMDLINE.replace("--dtype half", "--dtype bfloat16")])) == []
    assert vllm_evidence.check_dtype_with_speculation(vllm_evidence.vllm_config([], {".env": "VLLM_DTYPE=half\nSPEC=off\n"})) == []


NGRAM_CMDLINE = REPORT_CMDLINE.split(" --speculative-config ")[0] + ' --speculative-config {"method":"ngram"}'


def test_vllms_n_gram_drafting_has_no_drafter_whose_dtype_could_be_wrong():
    config = vllm_evidence.vllm_config([NGRAM_CMDLINE])
    assert config.speculative and config.speculative_method == "ngram" and config.drafts_from_context
    assert vllm_evidence.check_dtype_with_speculation(config) == []
    # each spelling vLLM reads as n-gram drafting (vllm/config/speculative.py), and its GPU and suffix kin
    for spelling, method in (('{"method": "ngram_gpu", "num_speculative_tokens": 5}', "ngram_gpu"),
                             ('{"method": "[ngram]"}', "ngram"), ('{"model": "[ngram]", "num_speculative_tokens": 3}',
                                                                  "ngram"), ('{"method":"suffix"}', "suffix")):
        config = vllm_evidence.vllm_config([f"vllm serve m --dtype half --speculative-config '{spelling}'"])
        assert config.speculative_method == method and vllm_evidence.check_dtype_with_speculation(config) == [], spelling
    older = "python -m vllm.entrypoints.openai.api_server --model m --dtype half --speculative-model [ngram]"
    assert vllm_evidence.vllm_config([older]).speculative_method == "ngram"
    for env in ("VLLM_DTYPE=half\nSPEC=suffix\n", "VLLM_DTYPE=half\nSPECULATIVE_CONFIG='{\"method\": \"ngram\"}'\n"):
        assert vllm_evidence.check_dtype_with_speculation(vllm_evidence.vllm_config([], {".env": env})) == [], env
    # another flag's JSON with a "method" of its own says nothing of speculation
    quantised = ("vllm serve m --dtype half --hf-overrides '{\"quantization_config\": {\"quant_method\": \"fp8\"}}' "
                 "--speculative-config '{\"method\": \"ngram\"}'")
    assert vllm_evidence.vllm_config([quantised]).speculative_method == "ngram"
    # the methods with a drafter keep the trap: the report's dflash, the compose file's mtp, HyperQwen's SPEC
    assert vllm_evidence.vllm_config([REPORT_CMDLINE]).speculative_method == "dflash"
    compose = {"docker-compose.yml": (FIXTURES / "vllm-compose.yml").read_text()}
    assert vllm_evidence.vllm_config([], compose).speculative_method == "mtp"
    assert vllm_evidence.vllm_config([], {".env": "VLLM_DTYPE=half\nSPEC=dflash2\n"}).drafts_from_context is False


def test_acceptance_trap_from_vllms_log_line():
    [finding] = acceptance.check_acceptance_log((FIXTURES / "vllm-spec-trap.log").read_text(), "vllm.log")
    assert finding.severity == ERROR and finding.check == "acceptance-log"
    assert "Mean acceptance length: 1.00, Accepted throughput: 0.00 tokens/s, Drafted throughput: 258.30" \
        in finding.evidence and "latest of 2" in finding.evidence
    assert acceptance.check_acceptance_log((FIXTURES / "vllm-spec-healthy.log").read_text()) == []
    # the issue's own excerpt, without the logger's prefix
    line = "Mean acceptance length: 1.00, Accepted throughput: 0.00 tokens/s, Drafted throughput: 259.68 tokens/s"
    assert acceptance.check_acceptance_log(line)[0].check == "acceptance-log"
    # nothing drafted (speculation off, idle server): no trap
    assert acceptance.check_acceptance_log(line.replace("259.68", "0.00")) == []


def test_the_spec_decoding_line_is_vllms_own():
    from llm_bench.diagnostics.acceptance import VLLM_SPEC_LOG

    # vllm/v1/spec_decode/metrics.py, SpecDecodingLogging.log(), with its format arguments filled in
    fmt = ("SpecDecoding metrics: Mean acceptance length: %.2f, Accepted throughput: %.2f tokens/s, "
           "Drafted throughput: %.2f tokens/s, Accepted: %d tokens, Drafted: %d tokens, "
           "Per-position acceptance rate: %s, Avg Draft acceptance rate: %.1f%%")
    m = VLLM_SPEC_LOG.search(fmt % (1.0, 0.0, 259.68, 0, 2597, "0.000, 0.000", 0.0))
    assert m and m[1] == "1.00" and m[3] == "259.68" and m[5] == "2597"


def test_xid_lines_name_the_gpu_and_code():
    lines = gpu_errors.xid_lines((FIXTURES / "kernel-xid.log").read_text())
    assert [x.xid for x in lines] == [13, 13, 13, 79]
    found = {f.evidence.split(" logged")[0]: f for f in gpu_errors.check_xid(lines, {(0, 1, 0): 0, (0, 0x41, 0): 1})}
    assert set(found) == {"GPU0 (PCI 0000:01:00)", "GPU1 (PCI 0000:41:00)"}
    assert "Xid 13 (Graphics Engine Exception" in found["GPU0 (PCI 0000:01:00)"].evidence
    assert "3 time(s)" in found["GPU0 (PCI 0000:01:00)"].evidence
    assert "Out Of Range Address" in found["GPU0 (PCI 0000:01:00)"].evidence
    assert "fallen off the bus" in found["GPU1 (PCI 0000:41:00)"].evidence and "reseat" in found["GPU1 (PCI 0000:41:00)"].fix
    # since a moment between the two: only the later line is new
    since = datetime(2026, 11, 28, 23, 0, tzinfo=timezone.utc)
    assert [x.xid for x in gpu_errors.xid_lines((FIXTURES / "kernel-xid.log").read_text(), since)] == [79]
    # the journal's short-iso format and a bare dmesg line
    journal = "2026-11-28T22:04:17+0000 rig kernel: NVRM: Xid (PCI:0000:01:00): 13, pid=1234, name=python3, x"
    assert gpu_errors.xid_lines(journal, since) == [] and gpu_errors.xid_lines(journal)[0].at.hour == 22
    assert gpu_errors.xid_lines("[ 9351.201887] NVRM: Xid (PCI:0000:01:00): 31, pid=77, name=llama-server, Ch 00000008")[0].xid == 31


def test_xid_events_and_the_pcie_link_from_nvml():
    fake = FakeNvml(gpus=[FakeGpu(), FakeGpu(pci_bus=0x41, pcie_gen=1, pcie_width=4, utilization_pct=95)])
    with Nvml(fake) as nvml:
        assert nvml.pci_indexes() == {(0, 1, 0): 0, (0, 0x41, 0): 1}
        watch = nvml.xid_watch()
        fake.raise_xid(1, 79)
        [finding] = gpu_errors.check_xid_events(watch.poll())
        watch.close()
        assert "GPU1 reported critical Xid 79" in finding.evidence
        before = nvml.pcie_links()
        fake.gpus[1].pcie_replays = 17
        after = nvml.pcie_links()
    link, replay = gpu_errors.check_pcie(before, before, after)
    assert link.check == "pcie-link" and "GPU1's PCIe link runs at Gen1 x4 while 95% busy" in link.evidence
    assert "Gen4 x16" in link.evidence
    assert replay.check == "pcie-replay" and "grew by 17" in replay.evidence and replay.severity == WARNING
    idle = [FakeGpu(pcie_gen=1, utilization_pct=0)]
    with Nvml(FakeNvml(gpus=idle)) as nvml:  # an idle GPU downshifts: not a finding
        assert gpu_errors.check_pcie(nvml.pcie_links()) == []
    with Nvml(FakeNvml(gpus=[FakeGpu(xid_events=False)])) as nvml:
        assert "no GPU accepts Xid event registration" in nvml.xid_watch().unavailable


def test_prefix_caching_off():
    [finding] = vllm_evidence.check_prefix_caching(vllm_evidence.vllm_config(["vllm serve m --no-enable-prefix-caching"]))
    assert finding.severity == WARNING and "--no-enable-prefix-caching" in finding.evidence
    env = {".env": (FIXTURES / "hyperqwen-half.env").read_text()}
    assert "PREFIX_CACHE=0" in vllm_evidence.check_prefix_caching(vllm_evidence.vllm_config([], env))[0].evidence
    metrics = (FIXTURES / "vllm-metrics.txt").read_text()
    assert vllm_evidence.check_prefix_caching(vllm_evidence.vllm_config([], None, metrics)) == []
    off = metrics.replace('enable_prefix_caching="True"', 'enable_prefix_caching="False"')
    assert "enable_prefix_caching=\"False\"" in vllm_evidence.check_prefix_caching(vllm_evidence.vllm_config([], None, off))[0].evidence
    [finding] = vllm_evidence.check_prefix_caching(vllm_evidence.ServerConfig(), {"q": ["llama-server", "--no-cache-prompt"],
                                                                  "r": ["llama-server"]})
    assert finding.evidence.startswith("q: ") and "cache-prompt" in finding.fix


def test_doctor_reports_the_reports_vllm_traps_and_xid_lines_with_exit_1(fake_nvml):
    fake_nvml(FakeNvml(gpus=[FakeGpu(), FakeGpu(pci_bus=0x41)]))
    with FakeVllm(FakeVllmConfig()) as vllm:
        result = doctor("--engine", "openai", "--url", vllm.url, "--vllm-cmdline", REPORT_CMDLINE,
                        "--log-file", str(FIXTURES / "vllm-spec-trap.log"),
                        "--kernel-log", str(FIXTURES / "kernel-xid.log"),
                        "--config-file", str(FIXTURES / "hyperqwen-half.env"))
    assert result.exit_code == 1, result.output
    out = result.output
    assert "ERROR [vllm-dtype] the target runs in dtype half" in out
    assert "ERROR [acceptance-log]" in out and "Drafted throughput: 258.30 tokens/s" in out
    assert "ERROR [vllm-eager]" in out
    assert "ERROR [gpu-xid] GPU0 (PCI 0000:01:00) logged Xid 13" in out and "3 time(s)" in out
    assert "ERROR [gpu-xid] GPU1 (PCI 0000:41:00) logged Xid 79" in out
    assert "WARNING [prefix-cache] prefix caching is off (" in out and "PREFIX_CACHE=0" in out


def test_the_doctor_names_n_gram_drafting_where_vllms_command_line_says_so(fake_nvml, tmp_path):
    fake_nvml(FakeNvml(gpus=[FakeGpu()]))
    (tmp_path / "kernel.log").write_text("")
    with FakeVllm(FakeVllmConfig()) as vllm:
        result = doctor("--engine", "openai", "--url", vllm.url, "--vllm-cmdline", NGRAM_CMDLINE,
                        "--log-file", str(FIXTURES / "vllm-spec-trap.log"), "--kernel-log", str(tmp_path / "kernel.log"))
    out = result.output
    assert "ERROR [acceptance-log]" in out and "this output repeats little of it" in out, out
    assert "[vllm-dtype]" not in out  # --dtype half, but no drafter whose dtype could differ


# --- the llamAmpere fork: a control preset needs spec-type = none (real router, the fork simulated) ---

def fork_bed_ini(tiny_models) -> str:
    return render_presets_ini({
        "ampere-none": {"model": str(tiny_models["target"]), "spec-type": "none"},
        "ampere-plain": {"model": str(tiny_models["target"])},
        "ampere-ngram": {"model": str(tiny_models["target"]), "spec-type": "ngram-simple"},
    })


def test_doctor_flags_a_control_preset_without_spec_type_on_the_fork(router_factory, tiny_models, fake_nvml):
    fake_nvml(FakeNvml())
    router = router_factory(fork_bed_ini(tiny_models))
    result = doctor("--url", router.url, "--build", "llamampere")
    assert result.exit_code == 0, result.output
    [line] = [l for l in result.output.splitlines() if "[fork-control]" in l]
    assert line.startswith("WARNING [fork-control] ampere-plain: the server is the llamAmpere fork (--build llamampere)")
    assert "add `spec-type = none` to the preset ampere-plain" in line
    # the stock build (this router's own /props build_info and binary): nothing to say
    assert "[fork-control]" not in doctor("--url", router.url).output


def test_run_warns_when_its_baseline_is_no_control_on_the_fork(router_factory, tiny_models, tmp_path):
    router = router_factory(fork_bed_ini(tiny_models))
    marker = tmp_path / "active.json"  # what the flake writes on the llm-llamampere specialisation
    marker.write_text('{"specialisation": "llm-llamampere", "package": {"name": "llamampere", "version": "0.5.1"}}\n')
    logs: list[str] = []
    plan = Plan(url=router.url, aliases=("ampere-plain", "ampere-none"), output_dir=tmp_path,
                protocol=Protocol(runs=1, max_tokens=4), checks=Checks(marker=marker))
    records = {r.alias: r for r in load_results(run_plan(plan, logs.append, nvml=Nvml(FakeNvml())).path, PARTS).aliases}
    [said] = [l for l in logs if "fork-control" in l]
    assert said.startswith("!!! WARNING [fork-control] ampere-plain:") and "active.json package llamampere" in said
    assert logs.index(said) < next(i for i, l in enumerate(logs) if l.startswith("Benchmark 1/"))  # before measuring
    assert any(w.startswith("DOCTOR fork-control: ampere-plain:") for w in records["ampere-plain"].warnings)
    assert not any("fork-control" in w for w in records["ampere-none"].warnings)


def test_doctor_reads_xid_events_and_the_pcie_link_from_nvml(router, fake_nvml, tmp_path):
    busy_narrow = FakeGpu(pcie_gen=3, pcie_width=8, utilization_pct=97, pending_xids=[13])
    fake_nvml(FakeNvml(gpus=[busy_narrow, FakeGpu(pci_bus=0x41)]))
    quiet = tmp_path / "kern.log"
    quiet.write_text("2026-11-30T09:00:00,000000+00:00 usb 1-1: new high-speed USB device number 2\n")
    result = doctor("--url", router.url, "--kernel-log", str(quiet))
    assert result.exit_code == 1, result.output
    assert "ERROR [gpu-xid] GPU0 reported critical Xid 13" in result.output
    assert "WARNING [pcie-link] GPU0's PCIe link runs at Gen3 x8 while 97% busy; the card supports Gen4 x16" \
        in result.output
    assert "GPU1" not in result.output.split("[pcie-link]")[1].split("\n")[0]


def test_a_preset_without_prompt_cache_is_flagged_by_doctor_and_by_the_prefix_cache_workload(
        router_factory, tiny_models, fake_nvml, tmp_path):
    fake_nvml(FakeNvml())
    router = router_factory(render_presets_ini({"nocache": {"model": str(tiny_models["target"]), "cache-prompt": False},
                                                "cached": {"model": str(tiny_models["target"])}}))
    result = doctor("--url", router.url)
    assert result.exit_code == 0, result.output  # a warning: it ran, and found no error
    [line] = [l for l in result.output.splitlines() if "[prefix-cache]" in l]
    assert line.startswith("WARNING [prefix-cache] nocache: the preset runs llama-server with --no-cache-prompt")
    plan = Plan(url=router.url, aliases=("nocache",), output_dir=tmp_path, protocol=Protocol(
        runs=1, max_tokens=4, workloads=("prefix-cache",), prefix_prompt_tokens=100, prefix_max_tokens=4))
    [record] = load_results(run_plan(plan, lambda m: None, nvml=Nvml(FakeNvml())).path, PARTS).aliases
    assert any(w.startswith("DOCTOR prefix-cache: nocache:") for w in record.warnings), record.warnings


def test_run_against_vllm_started_with_half_and_a_drafter_warns_before_measuring(tmp_path):
    argv = REPORT_CMDLINE.split(" ")  # as /proc/PID/cmdline holds it: one argument per word
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)", *argv])
    try:
        poll_until(lambda: [l for l in vllm_command_lines() if "--dtype half" in l] or None, timeout=10,
                   interval=0.1)
        logs: list[str] = []
        with FakeVllm(FakeVllmConfig()) as vllm:
            plan = Plan(url=vllm.url, engine="openai", output_dir=tmp_path, protocol=Protocol(runs=1, max_tokens=8))
            [record] = load_results(run_plan(plan, logs.append, nvml=Nvml(FakeNvml())).path, PARTS).aliases
    finally:
        proc.kill()
        proc.wait()
    [said] = [l for l in logs if "[vllm-dtype]" in l]
    assert said.startswith("!!! ERROR [vllm-dtype] the target runs in dtype half")
    assert any(w.startswith("DOCTOR vllm-dtype:") for w in record.warnings)


def test_run_against_vllm_drafting_by_n_gram_blames_the_output_not_a_dtype(tmp_path):
    # the server's log as a journal gives it: nothing before the alias, vLLM's trap line after its requests
    started = tmp_path / "started"
    log = f"if [ -e {started} ]; then cat {FIXTURES / 'vllm-spec-trap.log'}; else touch {started}; fi"
    logs: list[str] = []
    with FakeVllm(FakeVllmConfig(accepted_per_round=0)) as vllm:
        # its command line names the port it serves: another vLLM on this host (a test bed's) says nothing of it
        proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)", *NGRAM_CMDLINE.split(" "),
                                 "--port", str(vllm.port)])
        try:
            poll_until(lambda: [l for l in vllm_command_lines() if f"--port {vllm.port}" in l] or None, timeout=10,
                       interval=0.1)
            plan = Plan(url=vllm.url, engine="openai", output_dir=tmp_path, checks=Checks(log_command=log),
                        protocol=Protocol(runs=1, max_tokens=8))
            [record] = load_results(run_plan(plan, logs.append, nvml=Nvml(FakeNvml())).path, PARTS).aliases
        finally:
            proc.kill()
            proc.wait()
    assert not [l for l in logs if "[vllm-dtype]" in l]  # --dtype half, but no drafter whose dtype could differ
    # the log's line and the run's /metrics counters agree (none accepted): the trap is the record's own, from the
    # counters, blamed on n-gram as the command line (recorded as the record's speculation) says
    assert not [w for w in record.warnings if w.startswith("DOCTOR acceptance-log:")]
    assert record.speculation == "ngram n=4"  # the method from the command line, n from /metrics' 4 positions
    [trap] = [w for w in record.warnings if w.startswith("ACCEPTANCE TRAP")]
    assert "this output repeats little of it" in trap and "dtype" not in trap
