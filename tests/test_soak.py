"""llm-bench soak against the real llama-server (loopback only): bounds, kinds, failures, drift."""

from __future__ import annotations

import tomllib

import pytest
from click.testing import CliRunner

from llm_bench.cli import main
from llm_bench.diagnostics.soak import KINDS, SoakRequest, SoakResult, analyse, trend
from llm_bench.testbed.router import free_port


def soak(*args: str):
    return CliRunner().invoke(main, ["soak", *args], catch_exceptions=False)


def test_bounded_by_request_count_with_every_kind(router, tmp_path):
    chart = tmp_path / "soak.png"
    result = soak("--url", router.url, "--alias", "tiny-plain", "--duration", "120", "--max-requests", "9",
                  "--max-tokens", "16", "--burst", "2", "--long-tokens", "300",
                  "--output-dir", str(tmp_path), "--chart", str(chart))
    assert result.exit_code == 0, result.output
    data = tomllib.loads(next(tmp_path.glob("*soak*.toml")).read_text())["soak"]
    assert data["requests_total"] == 9 and data["requests_failed"] == 0 and data["stopped_by"] == "max-requests"
    assert {r["kind"] for r in data["requests"]} == set(KINDS)
    assert sum(r["kind"] == "concurrent" for r in data["requests"]) == 2
    assert data["ttft_ms"]["p50"] > 0 and data["decode_tps"]["p90"] > 0
    assert {t["metric"] for t in data["trends"]} >= {"decode_tps", "ttft_ms"}
    assert "| TTFT ms |" in result.output and chart.read_bytes()[:4] == b"\x89PNG"


def test_bounded_by_duration(router, tmp_path):
    result = soak("--url", router.url, "--alias", "tiny-plain", "--duration", "2", "--max-requests", "100000",
                  "--max-tokens", "8", "--long-tokens", "200", "--output-dir", str(tmp_path))
    assert result.exit_code == 0, result.output
    data = tomllib.loads(next(tmp_path.glob("*soak*.toml")).read_text())["soak"]
    assert data["stopped_by"] == "duration" and data["duration_s"] < 20


def test_failures_are_counted_by_kind(tmp_path, router):
    dead = f"http://127.0.0.1:{free_port()}"
    result = soak("--url", router.url, "--alias", "tiny-plain", "--duration", "30", "--max-requests", "2",
                  "--max-tokens", "8", "--output-dir", str(tmp_path))
    assert result.exit_code == 0
    from llm_bench.engines import open_engine
    from llm_bench.diagnostics.soak import soak as run_soak

    engine = open_engine("llama-cpp", dead, timeout=5)
    try:
        outcome = run_soak(engine, "tiny-plain", duration_s=30, max_requests=10, max_tokens=8)
    finally:
        engine.close()
    assert outcome.failures == {"unreachable": 3} and outcome.stopped_by == "server unreachable"
    engine = open_engine("llama-cpp", router.url, timeout=30)
    try:
        outcome = run_soak(engine, "no-such-model", duration_s=30, max_requests=2, max_tokens=8)
    finally:
        engine.close()
    assert outcome.failures == {"http": 2}


def test_steady_vram_growth_is_flagged_as_a_leak():
    result = SoakResult(requests=[SoakRequest(float(t), "prose", True, 100.0, 50.0, vram_mib=1000.0 + 5.0 * t)
                                  for t in range(0, 300, 10)])
    analyse(result)
    [leak] = [w for w in result.warnings if "POSSIBLE LEAK" in w]
    assert "grew steadily by 145 MiB" not in leak  # 5 MiB/s over 290 s = 1450 MiB
    assert "1450 MiB" in leak and "300.0 MiB/min" in leak
    flat = SoakResult(requests=[SoakRequest(float(t), "prose", True, 100.0, 50.0, vram_mib=1000.0 + (t % 20))
                                for t in range(0, 300, 10)])
    analyse(flat)
    assert not flat.warnings
    assert trend("x", [(0.0, 1.0), (60.0, 2.0), (120.0, 3.0)]).slope_per_min == pytest.approx(1.0)
