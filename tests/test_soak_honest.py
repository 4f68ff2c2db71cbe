"""The soak says what it did not measure, and calls drift only what stands out of the noise.

- GPU errors that no source could be read for are "not watched", never "0 new GPU errors" (and the results file
  leaves the count out);
- a drift is reported with its 95 % interval, and only when that interval excludes 0; otherwise "no drift beyond
  noise". The interval is checked against values worked out by hand below.
"""

from __future__ import annotations

import tomllib

import pynvml
import pytest
from click.testing import CliRunner

from llm_bench.cli import main
from llm_bench.diagnostics.gpu_errors import GpuErrorWatch, KernelLog
from llm_bench.engines import open_engine
from llm_bench.gpu.nvml import Nvml
from llm_bench.soak.report import headline, markdown
from llm_bench.soak.traffic import SoakRequest, SoakResult, SoakSettings, analyse, trend
from llm_bench.soak.traffic import soak as run_soak
from llm_bench.support.stats import t_quantile
from tests.fake_nvml import FakeNvml


def test_gpu_errors_nobody_could_watch_are_not_counted_as_zero(router, tmp_path):
    """No NVML (the driver is not loaded) and a kernel log that cannot be read: nothing was watched."""
    engine = open_engine("llama-cpp", router.url, timeout=120)
    try:
        with Nvml(FakeNvml(init_error=pynvml.NVML_ERROR_DRIVER_NOT_LOADED)) as nvml:
            result = run_soak(engine, "tiny-plain", SoakSettings(60, 2, max_tokens=4, mix={"prose": 1}), nvml=nvml,
                              gpu_errors=GpuErrorWatch(nvml, KernelLog(command="echo 'no kernel log here' >&2; exit 3")))
    finally:
        engine.close()
    assert len(result.requests) == 2 and all(r.ok for r in result.requests)
    assert result.gpu_errors_watched is False
    text = markdown(result)
    assert "GPU errors not watched" in headline(result)
    assert "new GPU error" not in text  # neither "0 new GPU errors" in the headline nor anywhere else
    assert "Not watched: GPU errors: kernel log `echo 'no kernel log here' >&2; exit 3`" in text
    assert "Not watched: GPU errors: NVML Xid events: NVML is not available" in text
    assert "new_gpu_errors" not in result.to_toml()  # TOML has no null: left out, not 0


def test_one_source_read_is_enough_to_count(router, tmp_path):
    kernel_log = tmp_path / "kern.log"
    kernel_log.write_text("")
    engine = open_engine("llama-cpp", router.url, timeout=120)
    try:
        with Nvml(FakeNvml(init_error=pynvml.NVML_ERROR_DRIVER_NOT_LOADED)) as nvml:
            result = run_soak(engine, "tiny-plain", SoakSettings(60, 1, max_tokens=4, mix={"prose": 1}), nvml=nvml,
                              gpu_errors=GpuErrorWatch(nvml, KernelLog(file=kernel_log)))
    finally:
        engine.close()
    assert result.gpu_errors_watched is True
    assert "and 0 new GPU errors" in headline(result)
    assert result.to_toml()["new_gpu_errors"] == 0


def test_the_cli_says_not_watched_too(router, tmp_path, monkeypatch):
    result = CliRunner().invoke(main, ["soak", "--url", router.url, "--alias", "tiny-plain", "--duration", "60",
                                       "--max-requests", "1", "--max-tokens", "4", "--mix", "prose",
                                       "--kernel-log-command", "exit 3", "--output-dir", str(tmp_path)],
                                catch_exceptions=False)
    assert result.exit_code == 0, result.output
    data = tomllib.loads(next(tmp_path.glob("*soak*.toml")).read_text())["soak"]
    if any(u.startswith("GPU errors: NVML") for u in data["unwatched"]):  # no NVML here (no driver, no GPU)
        assert "GPU errors not watched" in result.output and "new GPU error" not in result.output
        assert "new_gpu_errors" not in data
    else:  # a machine with a GPU: NVML watched
        assert "and 0 new GPU errors" in result.output and data["new_gpu_errors"] == 0


def requests(points: list[tuple[float, float]]) -> list[SoakRequest]:
    return [SoakRequest(t, "prose", True, ttft_ms=100.0, decode_tps=v, vram_mib=1000.0) for t, v in points]


def test_a_slope_within_its_noise_is_no_drift():
    # (0, 1), (60, 3), (120, 2), (180, 4) t/s. By hand: mean x 90, mean y 2.5; Sxx = 18000, Sxy = 240, so the
    # slope is 240 / 18000 = 1/75 t/s per s = 0.8 per min; Syy = 5, the line explains 3.2 of it (R^2 0.64), the
    # residuals 1.8; standard error sqrt(1.8 / 2 / 18000) = sqrt(5e-5) per s; t(0.975, 2 df) = 4.302653.
    result = SoakResult(requests=requests([(0.0, 1.0), (60.0, 3.0), (120.0, 2.0), (180.0, 4.0)]))
    analyse(result)
    decode = next(t for t in result.trends if t.metric == "decode_tps")
    half = 4.302652729749752 * (5e-5 ** 0.5) * 60.0
    assert decode.slope_per_min == pytest.approx(0.8)
    assert decode.r2 == pytest.approx(0.64)
    assert decode.slope_low_per_min == pytest.approx(0.8 - half) and decode.slope_high_per_min == pytest.approx(0.8 + half)
    assert decode.slope_low_per_min < 0 < decode.slope_high_per_min and not decode.beyond_noise
    text = headline(result)
    assert "no drift beyond noise" in text
    assert "drift:" not in text and "+0.80" not in text
    assert "| decode_tps | +0.800 | -1.025 to +2.625 | no |" in markdown(result)
    assert not result.warnings


def test_a_steady_slope_is_drift_with_its_interval():
    # decode falls 1 t/s per minute with a little scatter: -1.0 per min, well outside its interval's reach of 0
    wobble = [0.05, -0.05, 0.02, -0.02, 0.04, -0.04, 0.0, 0.01, -0.01, 0.03]
    result = SoakResult(requests=requests([(60.0 * i, 50.0 - i + w) for i, w in enumerate(wobble)]))
    analyse(result)
    decode = next(t for t in result.trends if t.metric == "decode_tps")
    assert decode.beyond_noise and decode.slope_high_per_min < 0
    assert decode.slope_per_min == pytest.approx(-1.0, abs=0.02)
    text = headline(result)
    assert (f"; drift: decode {decode.slope_per_min:+.2f} t/s per min (95 % CI {decode.slope_low_per_min:+.2f} to "
            f"{decode.slope_high_per_min:+.2f})") in text
    # TTFT and VRAM did not move: not in the drift
    assert "TTFT" not in text and "VRAM" not in text
    assert any("decode slowed steadily" in w for w in result.warnings)


def test_flags_need_drift_beyond_noise():
    # VRAM up 900 MiB over the run with R^2 0.8, but on 3 points only: its interval still reaches below 0
    result = SoakResult(requests=[SoakRequest(t, "prose", True, 100.0, 50.0, vram_mib=v)
                                  for t, v in ((0.0, 1000.0), (60.0, 1000.0), (120.0, 1900.0))])
    analyse(result)
    vram = next(t for t in result.trends if t.metric == "vram_mib")
    assert vram.r2 >= 0.75 and vram.change >= 256 and not vram.beyond_noise
    assert not any("POSSIBLE LEAK" in w for w in result.warnings)


def test_t_quantiles_match_the_tables():
    # two-sided 95 % critical values of Student's t (any statistics table)
    for df, value in ((1, 12.7062), (2, 4.3027), (3, 3.1824), (5, 2.5706), (10, 2.2281), (30, 2.0423),
                      (120, 1.9799)):
        assert t_quantile(0.975, df) == pytest.approx(value, abs=5e-5)
    assert t_quantile(0.025, 4) == pytest.approx(-2.7764, abs=5e-5)
    assert trend("x", [(0.0, 1.0), (60.0, 2.0), (120.0, 3.0)]).beyond_noise  # a perfect line: no scatter at all
