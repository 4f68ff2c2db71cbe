"""GPU telemetry through the NVML test double: units, errors, sampling during real runs, energy, charts."""

from __future__ import annotations

import tomllib
from pathlib import Path

import pynvml
import pytest
from click.testing import CliRunner

from llm_bench.cli import main
from llm_bench.gpu.nvml import GpuSample, Nvml, memory_bandwidth_gbs
from llm_bench.gpu.telemetry import COUNTER, INTEGRATION, summarise
from llm_bench.plan import Plan, Protocol
from llm_bench.results import load_results
from llm_bench.runner import run_plan
from llm_bench.workloads import PARTS
from tests.fake_nvml import FakeGpu, FakeNvml

ENERGY = "nvmlDeviceGetTotalEnergyConsumption"


def test_double_follows_pynvml_units_and_errors():
    fake = FakeNvml(gpus=[FakeGpu(fail={ENERGY: pynvml.NVML_ERROR_NOT_SUPPORTED})])
    fake.nvmlInit()
    h = fake.nvmlDeviceGetHandleByIndex(0)
    assert fake.nvmlDeviceGetPowerManagementLimit(h) == 350000  # milliwatts
    assert fake.nvmlDeviceGetPowerManagementLimitConstraints(h) == [100000, 400000]
    assert fake.nvmlDeviceGetClockInfo(h, pynvml.NVML_CLOCK_MEM) == 9501
    assert fake.nvmlDeviceGetMaxClockInfo(h, pynvml.NVML_CLOCK_MEM) == 9751
    assert fake.nvmlDeviceGetTemperature(h, pynvml.NVML_TEMPERATURE_GPU) == 62
    with pytest.raises(pynvml.NVMLError_NotSupported):
        fake.nvmlDeviceGetTotalEnergyConsumption(h)
    with pytest.raises(pynvml.NVMLError_NoPermission):
        fake.nvmlDeviceSetPowerManagementLimit(h, 250000)
    fake.root = True
    assert fake.nvmlDeviceSetPowerManagementLimit(h, 250000) is None
    assert fake.nvmlDeviceGetPowerUsage(h) == 250000  # drawing 280 W, capped by the new limit
    with pytest.raises(pynvml.NVMLError_InvalidArgument):
        fake.nvmlDeviceSetPowerManagementLimit(h, 50000)


def test_sample_converts_units_and_leaves_unsupported_out():
    fake = FakeNvml(gpus=[FakeGpu(), FakeGpu(used_mib=5000, fail={ENERGY: pynvml.NVML_ERROR_NOT_SUPPORTED,
                                                                  "nvmlDeviceGetTemperature": pynvml.NVML_ERROR_NOT_SUPPORTED})])
    with Nvml(fake) as nvml:
        first, second = nvml.sample()
        details = nvml.details()
    assert first.power_w == 280.0 and first.energy_j >= 1000.0 and first.temperature_c == 62.0
    assert first.sm_clock_mhz == 1695.0 and first.mem_clock_mhz == 9501.0
    assert second.vram_used_mib == 5000.0 and second.energy_j is None and second.temperature_c is None
    assert details[0]["power_limit_w"] == 350.0 and details[0]["power_min_w"] == 100.0
    assert details[0]["memory_bandwidth_gbs"] == pytest.approx(936.1, abs=0.1)
    assert memory_bandwidth_gbs(None, 384) is None


def test_energy_from_counter_else_power_integration():
    counter = [GpuSample(0, t, 1000.0 + t, 200.0, 5000.0 + 200.0 * t) for t in (0.0, 0.5, 1.0, 2.0)]
    summary = summarise(counter, output_tokens=100, t0=0.0)
    assert summary["energy_source"] == COUNTER
    assert summary["energy_j"] == pytest.approx(400.0)
    assert summary["joules_per_token"] == pytest.approx(4.0)
    assert summary["tokens_per_joule"] == pytest.approx(0.25)
    assert summary["peak_vram_mib"] == [1002.0]
    no_counter = [GpuSample(0, t, 1000.0, 100.0 + 100.0 * t) for t in (0.0, 1.0, 2.0)]
    summary = summarise(no_counter, output_tokens=50, t0=0.0)
    assert summary["energy_source"] == INTEGRATION
    assert summary["energy_j"] == pytest.approx(400.0)  # trapezoid of 100 -> 300 W over 2 s
    assert summary["mean_power_w"] == [200.0]
    nothing = summarise([GpuSample(0, 0.0, 1000.0)], output_tokens=5, t0=0.0)
    assert "energy_j" not in nothing and "energy_unavailable" in nothing


def measure(router, tmp_path, fake, aliases=("tiny-plain",)) -> Path:
    plan = Plan(url=router.url, aliases=aliases, output_dir=tmp_path, label="telemetry",
                protocol=Protocol(runs=2, max_tokens=64))
    return run_plan(plan, lambda m: None, nvml=Nvml(fake)).path


def test_run_samples_telemetry_during_the_measured_runs(router, bed, tmp_path):
    path = measure(router, tmp_path, FakeNvml(gpus=[FakeGpu(), FakeGpu(used_mib=900)]),
                   aliases=("tiny-plain", "tiny-draft-synth"))
    records = load_results(path, PARTS).aliases
    data = tomllib.loads(path.read_text())
    for record in records:
        t = record.telemetry
        assert t["energy_source"] == COUNTER, t
        assert t["gpus"] == [0, 1] and t["peak_vram_mib"] == [300.0, 900.0]
        assert t["output_tokens"] == 128 and t["energy_j"] > 0
        assert t["joules_per_token"] == pytest.approx(t["energy_j"] / 128)
        # two GPUs at 280 W over the span: the counter delta matches power x time
        assert t["energy_j"] == pytest.approx(2 * 280.0 * t["duration_s"], rel=0.05, abs=0.2)
        assert {s["gpu"] for s in t["samples"]} == {0, 1} and len(t["samples"]) >= 4
        assert all(0.0 <= s["t"] <= t["duration_s"] + 0.01 for s in t["samples"])
    assert "telemetry" in data["aliases"][0]


def test_power_integration_when_the_counter_is_not_supported(router, tmp_path):
    fake = FakeNvml(fail={ENERGY: pynvml.NVML_ERROR_NOT_SUPPORTED})
    record = load_results(measure(router, tmp_path, fake), PARTS).aliases[0]
    assert record.telemetry["energy_source"] == INTEGRATION
    assert record.telemetry["energy_j"] == pytest.approx(280.0 * record.telemetry["duration_s"], rel=0.05)


def test_no_nvml_means_no_telemetry_not_zero(router, tmp_path):
    record = load_results(measure(router, tmp_path, FakeNvml(init_error=pynvml.NVML_ERROR_DRIVER_NOT_LOADED)), PARTS).aliases[0]
    assert record.telemetry is None and record.roofline_tps is None and record.runs


def test_telemetry_command_prints_summary_and_draws_chart(router, tmp_path):
    path = measure(router, tmp_path, FakeNvml(), aliases=("tiny-plain", "tiny-ngram"))
    chart = tmp_path / "telemetry.png"
    result = CliRunner().invoke(main, ["telemetry", str(path), "--chart", str(chart)], catch_exceptions=False)
    assert result.exit_code == 0, result.output
    assert "| tiny-plain |" in result.output and "energy counter" in result.output
    assert chart.stat().st_size > 10_000 and chart.read_bytes()[:4] == b"\x89PNG"


def test_telemetry_command_without_telemetry_fails_clearly(router, tmp_path):
    path = measure(router, tmp_path, FakeNvml(init_error=pynvml.NVML_ERROR_DRIVER_NOT_LOADED))
    result = CliRunner().invoke(main, ["telemetry", str(path)])
    assert result.exit_code == 2 and "no record carries telemetry" in result.output
