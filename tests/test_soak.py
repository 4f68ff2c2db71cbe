"""llm-bench soak against the real llama-server (loopback only): bounds, kinds, failures, drift."""

from __future__ import annotations

import os
import signal
import tomllib
from datetime import datetime, timezone
from pathlib import Path

import httpx
import pytest
from click.testing import CliRunner

from llm_bench.cli import main
from llm_bench.diagnostics.gpu_errors import GpuErrorWatch, KernelLog
from llm_bench.diagnostics.restarts import CounterWatch, Restart, RouterInstanceWatch
from llm_bench.engines import LlamaCppEngine, open_engine
from llm_bench.gpu.nvml import Nvml
from llm_bench.soak.report import markdown
from llm_bench.soak.traffic import (
    SoakRequest,
    SoakResult,
    SoakSettings,
    analyse,
    parse_mix,
    schedule,
    trend,
)
from llm_bench.soak.traffic import soak as run_soak
from llm_bench.support.poll import poll_until
from llm_bench.testbed.router import free_port
from tests.commands import instance_pid
from tests.fake_nvml import FakeNvml

PLAIN_KINDS = ("prose", "code", "json", "long", "concurrent")
FIXTURES = Path(__file__).parent / "fixtures"


def soak(*args: str):
    return CliRunner().invoke(main, ["soak", *args], catch_exceptions=False)


def test_bounded_by_request_count_with_the_plain_kinds(router, tmp_path):
    chart = tmp_path / "soak.png"
    result = soak("--url", router.url, "--alias", "tiny-plain", "--duration", "120", "--max-requests", "9",
                  "--max-tokens", "16", "--burst", "2", "--long-tokens", "300", "--mix", ",".join(PLAIN_KINDS),
                  "--output-dir", str(tmp_path), "--chart", str(chart))
    assert result.exit_code == 0, result.output
    data = tomllib.loads(next(tmp_path.glob("*soak*.toml")).read_text())["soak"]
    assert data["requests_total"] == 9 and data["requests_failed"] == 0 and data["stopped_by"] == "max-requests"
    assert {r["kind"] for r in data["requests"]} == set(PLAIN_KINDS)
    assert sum(r["kind"] == "concurrent" for r in data["requests"]) == 2
    # 9 requests: p50, and the max in place of p90/p99 (support.stats.min_samples)
    assert data["ttft_ms"]["p50"] > 0 and data["decode_tps"]["max"] > 0 and data["decode_tps"]["n"] == 9
    assert "p90" not in data["decode_tps"] and "p99" not in data["ttft_ms"]
    assert {t["metric"] for t in data["trends"]} >= {"decode_tps", "ttft_ms"}
    assert "| TTFT ms |" in result.output and chart.read_bytes()[:4] == b"\x89PNG"


def test_bounded_by_duration(router, tmp_path):
    result = soak("--url", router.url, "--alias", "tiny-plain", "--duration", "2", "--max-requests", "100000",
                  "--max-tokens", "8", "--long-tokens", "200", "--mix", "prose,code", "--output-dir", str(tmp_path))
    assert result.exit_code == 0, result.output
    data = tomllib.loads(next(tmp_path.glob("*soak*.toml")).read_text())["soak"]
    assert data["stopped_by"] == "duration" and data["duration_s"] < 20


def test_failures_are_counted_by_kind(tmp_path, router):
    dead = f"http://127.0.0.1:{free_port()}"
    result = soak("--url", router.url, "--alias", "tiny-plain", "--duration", "30", "--max-requests", "2",
                  "--max-tokens", "8", "--mix", "prose", "--output-dir", str(tmp_path))
    assert result.exit_code == 0
    engine = open_engine("llama-cpp", dead, timeout=5)
    try:
        outcome = run_soak(engine, "tiny-plain", SoakSettings(30, 10, max_tokens=8, mix={"prose": 1}))
    finally:
        engine.close()
    assert outcome.failures == {"unreachable": 3} and outcome.stopped_by == "server unreachable"
    engine = open_engine("llama-cpp", router.url, timeout=30)
    try:
        outcome = run_soak(engine, "no-such-model", SoakSettings(30, 2, max_tokens=8, mix={"prose": 1}))
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


def test_the_mix_is_weighted_and_checked():
    assert schedule(parse_mix("prose=2,code,tool=1")) == ["prose", "code", "tool", "prose"]
    assert schedule(parse_mix("image=0,json=1")) == ["json"]
    for bad, said in (("prose,video", "unknown request kind 'video'"), ("prose=x", "whole number"),
                      ("prose=0", "sends nothing")):
        with pytest.raises(ValueError, match=said):
            parse_mix(bad)
    result = soak("--url", "http://127.0.0.1:9", "--duration", "5", "--max-requests", "1", "--mix", "prose,video")
    assert result.exit_code == 2 and "unknown request kind 'video'" in result.output




def test_soak_with_the_real_small_model_every_kind_a_restart_and_a_gpu_error(router_factory, smollm2, tmp_path):
    """SmolLM2-135M through llama.cpp: plain kinds answer; its chat template declares no tool calls and it
    answers the tool request in prose (recorded as a failure, not hidden); it has no thinking and no
    vision (skipped, with /props as the reason). Its instance is killed mid-soak: one restart. A Xid line
    reaches the kernel log and NVML reports the Xid: one new GPU error."""
    router = router_factory(f"[smol]\nmodel = {smollm2}\nctx-size = 2048\n")
    kernel_log = tmp_path / "kern.log"
    kernel_log.write_text((FIXTURES / "kernel-xid.log").read_text())  # old Xids: not new
    fake = FakeNvml()
    xid = "NVRM: Xid (PCI:0000:01:00): 13, pid=4242, name=llama-server, Graphics SM Warp Exception on " \
          "(GPC 0, TPC 0, SM 0): Out Of Range Address"
    lines: list[str] = []

    def log(line: str) -> None:
        lines.append(line)
        if sum("] " in l for l in lines) == 3 and "] json" in line:  # after the third request: the faults
            os.kill(instance_pid(router, "smol"), signal.SIGKILL)
            # a crash between requests: the router has noticed it before the next request is sent
            assert poll_until(lambda: httpx.get(f"{router.url}/models").json()["data"][0]["status"].get("failed"),
                              timeout=30, interval=0.1)
            with kernel_log.open("a") as f:
                f.write(f"{datetime.now(timezone.utc).isoformat()} {xid}\n")
            fake.raise_xid(0, 13)

    engine = open_engine("llama-cpp", router.url, timeout=120)
    try:
        with Nvml(fake) as nvml:
            result = run_soak(engine, "smol", SoakSettings(300, 8, max_tokens=4, concurrency=2, long_tokens=60),
                              nvml=nvml, restarts=[RouterInstanceWatch(router.url)],
                              gpu_errors=GpuErrorWatch(nvml, KernelLog(file=kernel_log)), log=log)
    finally:
        engine.close()
    assert result.stopped_by == "max-requests" and len(result.requests) == 8
    assert [r.kind for r in result.requests[:7]] == ["prose", "code", "json", "long", "concurrent", "concurrent",
                                                     "tool"]
    assert all(r.ok for r in result.requests if r.kind != "tool"), markdown(result)  # the reload after the kill
    assert result.failures_by_kind == {"tool": {"no-tool-call": 1}}
    [tool] = [r for r in result.requests if r.kind == "tool"]
    assert "supports_tool_calls = false" in tool.message
    assert set(result.skipped) == {"thinking", "image"}
    assert "modalities.vision = false" in result.skipped["image"] and "<think>" in result.skipped["thinking"]
    [restart] = result.restarts
    assert restart.count == 1 and "smol exited with code" in restart.evidence
    assert result.gpu_error_count == 1 and len(result.gpu_errors) == 2  # the kernel line and NVML's event
    assert "GPU0 (PCI 0000:01:00) logged Xid 13" in result.gpu_errors[0]
    text = markdown(result)
    assert text.startswith("Soak: 8 mixed requests (prose, code, JSON, long prompts, concurrent generation and "
                           "tool calls) in ")
    assert "with 1 failure, 1 restart and 1 new GPU error; " in text  # then the drift beyond noise, or "no drift ..."
    assert "Failures by kind: tool 1 (no-tool-call 1)" in text and "Skipped image:" in text


def test_cli_headline_skips_and_counts(router, tmp_path):
    result = soak("--url", router.url, "--alias", "tiny-plain", "--duration", "60", "--max-requests", "2",
                  "--max-tokens", "4", "--mix", "prose,image,thinking", "--output-dir", str(tmp_path))
    assert result.exit_code == 0, result.output
    assert "Soak: 2 mixed requests (prose) in " in result.output
    assert "0 failures, 0 restarts and 0 new GPU errors" in result.output
    assert "Restarts, llama.cpp router (/models/sse): 0 (no instance exited)" in result.output
    data = tomllib.loads(next(tmp_path.glob("*soak*.toml")).read_text())["soak"]
    assert set(data["skipped"]) == {"image", "thinking"} and data["restarts"] == 0 and data["new_gpu_errors"] == 0
    assert data["mix"] == {"prose": 1, "image": 1, "thinking": 1}
    meta = tomllib.loads(next(tmp_path.glob("*soak*.toml")).read_text())["meta"]
    assert meta["complete"] is True


def test_what_a_soak_measured_is_kept_when_it_is_cut_short(router):
    class Cut(Exception):
        pass

    saved: list[int] = []

    def checkpoint(result: SoakResult) -> None:
        saved.append(len(result.requests))
        if len(saved) == 2:
            raise Cut  # Ctrl-C, or the machine going down

    engine = open_engine("llama-cpp", router.url, timeout=30)
    kept = SoakResult()
    try:
        with pytest.raises(Cut):
            run_soak(engine, "tiny-plain", SoakSettings(60, 10, max_tokens=4, mix={"prose": 1}), result=kept,
                     checkpoint=checkpoint)
    finally:
        engine.close()
    assert saved == [1, 2] and len(kept.requests) == 2 and all(r.ok for r in kept.requests)


def test_a_router_restarted_on_the_same_port_counts_once(router_factory, tiny_models):
    ini = f"[tiny]\nmodel = {tiny_models['target']}\n"
    first = router_factory(ini)
    watch = RouterInstanceWatch(first.url)
    watch.start()
    first.stop()
    router_factory(ini, port=first.port)  # systemd's Restart=always, by hand
    assert poll_until(lambda: watch.router_restarts or None, timeout=30, interval=0.2)
    [counted] = [watch.stop()]
    assert counted.count == 1 and "event stream broke and came back" in counted.evidence


def test_the_router_watch_stops_when_asked_not_at_the_next_event(router):
    # The event stream is idle: the router sends nothing until a model's status changes. A watch whose
    # thread outlived stop() held every soak's end for its join timeout.
    watch = RouterInstanceWatch(router.url)
    watch.start()
    assert watch.stop() == Restart("llama.cpp router (/models/sse)", 0, "no instance exited")
    assert watch._thread is not None and not watch._thread.is_alive()


def test_restart_counters_read_by_command(tmp_path):
    counter = tmp_path / "NRestarts"
    counter.write_text("2\n")
    watch = CounterWatch("llama-cpp.service (systemd NRestarts)", ["cat", str(counter)])
    watch.start()
    counter.write_text("3\n")
    assert watch.stop() == Restart("llama-cpp.service (systemd NRestarts)", 1, "2 -> 3")
    assert CounterWatch.systemd("llama-cpp.service").command == [
        "systemctl", "show", "-p", "NRestarts", "--value", "llama-cpp.service"]
    assert CounterWatch.container("hyperqwen-single-1").command[:2] == ["docker", "inspect"]
    missing = CounterWatch("x", ["cat", str(tmp_path / "absent")])
    missing.start()
    assert missing.stop() is None and "gave no count" in missing.unavailable


def test_what_a_tool_call_or_thinking_answer_must_hold():
    from llm_bench.soak.requests import judge

    def answer(**message):
        return {"choices": [{"finish_reason": "tool_calls", "message": {"role": "assistant", **message}}]}

    call = {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}
    assert judge("tool", answer(content=None, tool_calls=[call])) == (None, None)
    broken = {**call, "function": {"name": "get_weather", "arguments": '{"city": "Par'}}
    assert judge("tool", answer(tool_calls=[broken]))[0] == "bad-tool-arguments"
    assert judge("tool", answer(tool_calls=[{**call, "function": {"name": "x", "arguments": "[1]"}}]))[0] \
        == "bad-tool-arguments"
    assert judge("tool", answer(content="It is sunny."))[0] == "no-tool-call"
    assert judge("thinking", answer(content="85 minutes", reasoning_content="9:40 to 11:05 ...")) == (None, None)
    assert judge("thinking", answer(content="85 minutes", reasoning="9:40 to 11:05 ...")) == (None, None)  # vLLM
    assert judge("thinking", answer(content="85 minutes"))[0] == "no-reasoning"
    assert judge("image", answer(content="red and blue")) == (None, None)


def test_the_image_sent_is_a_real_png():
    import base64
    import io

    from matplotlib import image

    from llm_bench.soak.requests import body

    content = body("image", "m", 8, 1.0, 1)["messages"][0]["content"]
    url = content[1]["image_url"]["url"]
    assert url.startswith("data:image/png;base64,")
    pixels = image.imread(io.BytesIO(base64.b64decode(url.split(",", 1)[1])), format="png")
    assert pixels.shape[:2] == (32, 32) and pixels[0, 0, 0] == 1.0 and pixels[0, 31, 2] == 1.0


def _ok(t_s: float, ttft: float) -> SoakRequest:
    return SoakRequest(t_s, "prose", True, ttft_ms=ttft, decode_tps=10.0 + t_s, wall_s=1.0)


def test_tail_percentiles_follow_the_minimum_sample_rule():
    few = SoakResult(requests=[_ok(i, 100.0 + i) for i in range(9)])
    assert few.percentiles("ttft_ms") == {"p50": 104.0, "max": 108.0, "n": 9}
    assert "| TTFT ms | 104.00 | max 108.00 (n=9) | max 108.00 (n=9) |" in markdown(few)
    ten = SoakResult(requests=[_ok(i, 100.0 + i) for i in range(10)])
    p = ten.percentiles("ttft_ms")
    assert set(p) == {"p50", "p90", "max", "n"} and p["p90"] == pytest.approx(108.1)
    assert "| TTFT ms | 104.50 | 108.10 | max 109.00 (n=10) |" in markdown(ten)
    hundred = SoakResult(requests=[_ok(i, float(i)) for i in range(100)])
    assert set(hundred.percentiles("ttft_ms")) == {"p50", "p90", "p99", "max", "n"}
    assert SoakResult().percentiles("ttft_ms") == {}


class _Broken:
    """An engine whose every request raises something other than ServerError."""

    kind = "llama-cpp"
    capabilities = LlamaCppEngine.capabilities
    base_url = "http://127.0.0.1:1"

    def stream(self, request):
        raise RuntimeError("client bug")

    def chat(self, payload):
        raise ValueError("bad payload")

    def models(self):
        return ["m"]

    def server_build(self):  # the results file's fingerprint asks before the first request
        return None

    def auth_headers(self):
        return {}

    def close(self):
        pass


def test_an_unexpected_error_is_that_requests_failure_not_the_soaks_end():
    from llm_bench.soak import traffic as s

    outcome = run_soak(_Broken(), "m", SoakSettings(30, 4, mix={"prose": 1, "concurrent": 1}))
    assert len(outcome.requests) == 4 and outcome.stopped_by == "max-requests"
    assert {(r.failure, r.message) for r in outcome.requests} == {("other", "RuntimeError: client bug")}
    special = s._special(_Broken(), "m", "tool", SoakSettings(30, 1), 1, None)
    assert not special.ok and special.failure == "other" and special.message == "ValueError: bad payload"


def test_burst_sizes_the_pool_and_must_be_positive(monkeypatch, tmp_path):
    from llm_bench.cli import options

    seen = {}

    def fake_open_engine(kind, url, **kw):
        seen.update(kw)
        return _Broken()

    monkeypatch.setattr(options, "open_engine", fake_open_engine)
    result = soak("--url", "http://127.0.0.1:1", "--alias", "nope", "--duration", "5", "--max-requests", "1",
                  "--burst", "64", "--output-dir", str(tmp_path))
    assert seen["streams"] == 64
    assert result.exit_code == 2 and "nope" in result.output  # an unknown alias: could not run
    result = soak("--url", "http://127.0.0.1:1", "--duration", "5", "--max-requests", "1", "--burst", "0")
    assert result.exit_code == 2 and "--burst must be at least 1" in result.output


def test_an_unreachable_server_could_not_run(tmp_path):
    result = soak("--url", f"http://127.0.0.1:{free_port()}", "--duration", "5", "--max-requests", "1",
                  "--output-dir", str(tmp_path))
    assert result.exit_code == 2, result.output
    assert not list(tmp_path.glob("*.toml"))


def test_ctrl_c_exits_130_with_what_was_measured_saved(monkeypatch, tmp_path):
    import llm_bench.soak.traffic as s
    from llm_bench.cli import options

    monkeypatch.setattr(options, "open_engine", lambda kind, url, **kw: _Broken())

    def interrupted(engine, model, settings, *, result, checkpoint, **kw):
        result.requests.append(_ok(0.0, 50.0))
        checkpoint(result)
        raise KeyboardInterrupt

    monkeypatch.setattr(s, "soak", interrupted)
    result = soak("--url", "http://127.0.0.1:1", "--duration", "5", "--max-requests", "3", "--output-dir", str(tmp_path))
    assert result.exit_code == 130, result.output
    saved = tomllib.loads(next(tmp_path.glob("*soak*.toml")).read_text())
    assert saved["meta"]["complete"] is False and saved["soak"]["requests_total"] == 1
    assert saved["soak"]["stopped_by"] == "interrupted"


def test_timeout_help_names_its_default():
    from llm_bench.plan import Protocol

    out = CliRunner().invoke(main, ["soak", "--help"]).output
    assert "Seconds before one request counts as failed" in out
    assert f"{Protocol().request_timeout_s:g}" in out
