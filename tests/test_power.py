"""Power-limit sweeps through the NVML test double, against the real llama-server: every exit path restores."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
from click.testing import CliRunner

from llm_bench.cli import main
from llm_bench.gpu.nvml import Nvml, PowerLimitError
from llm_bench.power.limits import LimitResult, restore_leftover, state_path, sweep
from llm_bench.support.poll import poll_until
from tests.fake_nvml import FakeGpu, FakeNvml, read_state, use_in_subprocesses, write_state

REPO = Path(__file__).resolve().parents[1]
LLM_BENCH = [sys.executable, "-m", "llm_bench"]


@pytest.fixture
def fake_env(tmp_path, monkeypatch):
    """A file-backed NVML double with two RTX 3090s (run as root) and a private state folder."""
    state = write_state(tmp_path / "nvml.json", FakeNvml(gpus=[FakeGpu(), FakeGpu(power_limit_mw=300000)], root=True))
    use_in_subprocesses(monkeypatch, state)
    monkeypatch.setenv("LLM_BENCH_STATE_DIR", str(tmp_path / "state"))
    monkeypatch.setenv("PYTHONPATH", str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    return state


def limits(state: Path) -> list[int]:
    return [g.power_limit_mw for g in read_state(state).gpus]


def test_sweep_measures_each_limit_and_restores(router, fake_env, tmp_path):
    chart = tmp_path / "power.png"
    result = CliRunner().invoke(main, [
        "power", "--url", router.url, "--alias", "tiny-plain", "--limits", "200,250,300", "--runs", "2",
        "--max-tokens", "32", "--settle", "0", "--output-dir", str(tmp_path / "out"), "--chart", str(chart)],
        catch_exceptions=False)
    assert result.exit_code == 0, result.output
    assert limits(fake_env) == [350000, 300000]  # back to the originals
    assert not state_path().exists()
    for w in ("| 200 |", "| 250 |", "| 300 |"):
        assert w in result.output
    data = tomllib.loads(next((tmp_path / "out").glob("*power*.toml")).read_text())
    rows = data["limits"]
    assert [r["limit_w"] for r in rows] == [200.0, 250.0, 300.0]
    for r in rows:
        assert r["decode_tps"] > 0 and r["output_tokens"] == 64 and r["energy_source"] == "energy counter"
        assert r["tokens_per_joule"] > 0 and r["max_temperature_c"] == 62.0
        # two GPUs drawing min(280 W, limit) each
        assert r["mean_power_w"] == pytest.approx(2 * min(280.0, r["limit_w"]))
    assert chart.read_bytes()[:4] == b"\x89PNG"

    # The report takes the sweep file too: a power-limit section in the HTML page and the JSON export.
    sweep_file = next((tmp_path / "out").glob("*power*.toml"))
    page = tmp_path / "report.html"
    shown = CliRunner().invoke(main, ["report", str(sweep_file), "--html", str(page), "--format", "json"])
    assert shown.exit_code == 0, shown.output
    exported = json.loads(shown.output[:shown.output.rindex("}") + 1])
    assert [r["limit_w"] for r in exported["power"]] == [200.0, 250.0, 300.0]
    assert [r["decode_tps"] for r in exported["power"]] == [r["decode_tps"] for r in rows]
    html = page.read_text()
    assert '<table id="power">' in html and html.count("<tr><td>tiny-plain</td>") == 3


def test_without_root_nothing_changes_and_the_error_says_so(router, fake_env, tmp_path):
    fake = read_state(fake_env)
    fake.root = False
    write_state(fake_env, fake)
    result = CliRunner().invoke(main, ["power", "--url", router.url, "--alias", "tiny-plain", "--limits", "250",
                                       "--runs", "1", "--max-tokens", "8", "--settle", "0",
                                       "--output-dir", str(tmp_path)])
    assert result.exit_code == 2 and "needs root" in result.output
    assert limits(fake_env) == [350000, 300000] and not state_path().exists()


def test_limit_outside_the_range_is_refused_before_any_change(router, fake_env, tmp_path):
    result = CliRunner().invoke(main, ["power", "--url", router.url, "--limits", "250,450", "--runs", "1",
                                       "--settle", "0", "--output-dir", str(tmp_path)])
    assert result.exit_code == 2 and "100 to 400 W" in result.output
    assert limits(fake_env) == [350000, 300000] and not state_path().exists()


@pytest.mark.parametrize("failure", [RuntimeError("measurement broke"), KeyboardInterrupt()])
def test_error_and_ctrl_c_restore(tmp_path, failure):
    fake = FakeNvml(gpus=[FakeGpu(), FakeGpu()], root=True)
    path = tmp_path / "restore.json"
    seen = []

    def measure(limit):
        seen.append(limits_now(fake))
        if len(seen) == 2:
            raise failure
        return LimitResult(limit, decode_tps=10.0)

    with Nvml(fake) as nvml, pytest.raises(type(failure)):
        sweep(nvml, [0, 1], [200, 250, 300], measure, lambda m: None, settle_s=0, path=path)
    assert seen == [[200000, 200000], [250000, 250000]]
    assert limits_now(fake) == [350000, 350000] and not path.exists()


def limits_now(fake: FakeNvml) -> list[int]:
    return [g.power_limit_mw for g in fake.gpus]


def test_originals_are_on_disk_before_the_first_change(tmp_path):
    fake = FakeNvml(root=True)
    path = tmp_path / "restore.json"

    def measure(limit):
        saved = json.loads(path.read_text())
        assert saved["limits_w"] == {"0": 350.0} and saved["pid"] == os.getpid()
        return LimitResult(limit)

    with Nvml(fake) as nvml:
        sweep(nvml, [0], [200], measure, lambda m: None, settle_s=0, path=path)
    assert fake.calls == [("nvmlDeviceSetPowerManagementLimit", 0, 200000),
                          ("nvmlDeviceSetPowerManagementLimit", 0, 350000)]


def start_sweep(router, tmp_path) -> subprocess.Popen:
    return subprocess.Popen(
        [*LLM_BENCH, "power", "--url", router.url, "--alias", "tiny-plain", "--limits", "200,250,300,350",
         "--runs", "1", "--max-tokens", "16", "--settle", "3", "--output-dir", str(tmp_path / "out")],
        cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=os.environ.copy())


def wait_for_change(state: Path, proc: subprocess.Popen, timeout: float = 60.0) -> None:
    def changed() -> bool | None:
        if limits(state) == [200000, 200000]:
            return True
        if proc.poll() is not None:
            raise AssertionError(f"sweep ended early: {proc.stdout.read().decode()}")
        return None

    if poll_until(changed, timeout=timeout, interval=0.05) is None:
        proc.kill()
        raise AssertionError("the sweep never changed the limit")


def test_sigterm_before_the_first_limit_is_measured_restores_and_exits_130(router, fake_env, tmp_path):
    proc = start_sweep(router, tmp_path)
    wait_for_change(fake_env, proc)  # set to 200 W, settling: nothing measured yet
    proc.send_signal(signal.SIGTERM)
    out = proc.communicate(timeout=30)[0].decode()
    assert proc.returncode == 130, out  # docs/report.md, Exit codes: interrupted
    assert "GPU0: power limit restored to 350 W" in out and "GPU1: power limit restored to 300 W" in out
    assert "interrupted; the original power limits are restored and no limit was measured yet" in out
    assert limits(fake_env) == [350000, 300000] and not state_path().exists()
    assert list((tmp_path / "out").glob("*.toml")) == []  # no empty results file left behind


def test_sigterm_after_a_limit_keeps_it_in_the_results_file(router, fake_env, tmp_path):
    proc = start_sweep(router, tmp_path)

    def measured() -> Path | None:
        if proc.poll() is not None:
            raise AssertionError(f"sweep ended early: {proc.stdout.read().decode()}")
        files = list((tmp_path / "out").glob("*.toml"))
        return files[0] if files and files[0].stat().st_size else None

    path = poll_until(measured, timeout=60, interval=0.05)
    assert path is not None, "no limit was written"
    proc.send_signal(signal.SIGTERM)
    out = proc.communicate(timeout=30)[0].decode()
    assert proc.returncode == 130, out
    assert f"interrupted; the original power limits are restored and every limit measured is in {path}" in out
    assert limits(fake_env) == [350000, 300000] and not state_path().exists()
    kept = tomllib.loads(path.read_text())
    assert kept["limits"][0]["limit_w"] == 200.0 and kept["limits"][0]["decode_tps"] > 0
    assert len(kept["limits"]) < 4 and kept["meta"]["limits_w"] == [200.0, 250.0, 300.0, 350.0]


def test_killed_sweep_is_restored_by_the_next_start(router, fake_env, tmp_path):
    proc = start_sweep(router, tmp_path)
    wait_for_change(fake_env, proc)
    proc.kill()  # SIGKILL: no handler, no finally
    proc.wait(10)
    assert limits(fake_env) == [200000, 200000]  # left behind at the sweep's limit
    assert json.loads(state_path().read_text())["limits_w"] == {"0": 350.0, "1": 300.0}

    # the next start of any llm-bench command restores them and says so
    nxt = subprocess.run([*LLM_BENCH, "report", str(tmp_path / "missing.toml")], capture_output=True, text=True,
                         cwd=tmp_path, timeout=60)
    assert "ended without restoring the GPU power limits; restoring them now" in nxt.stderr
    assert "GPU0: power limit restored to 350 W" in nxt.stderr
    assert limits(fake_env) == [350000, 300000] and not state_path().exists()
    again = subprocess.run([*LLM_BENCH, "power", "--show"], capture_output=True, text=True, cwd=tmp_path, timeout=60)
    assert "restoring" not in again.stderr and "GPU0: limit 350 W" in again.stdout


def test_a_running_sweep_is_left_alone(fake_env, tmp_path):
    path = state_path()
    path.parent.mkdir(parents=True)
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)", "llm-bench"])
    try:
        # until the child has exec'd: /proc shows the new command line only then
        assert poll_until(lambda: b"llm-bench" in Path(f"/proc/{proc.pid}/cmdline").read_bytes() or None,
                          timeout=10, interval=0.01)
        path.write_text(json.dumps({"pid": proc.pid, "limits_w": {"0": 350.0}}))
        assert restore_leftover(lambda m: None) is False and path.exists()
    finally:
        proc.kill()
        proc.wait()
    assert restore_leftover(lambda m: None) is True and not path.exists()


def test_restore_failure_keeps_the_file(tmp_path):
    path = tmp_path / "restore.json"
    path.write_text(json.dumps({"pid": 0, "limits_w": {"0": 350.0}}))
    logs = []
    assert restore_leftover(logs.append, Nvml(FakeNvml(gpus=[FakeGpu(power_limit_mw=200000)], root=False)), path) is False
    assert path.exists() and any("needs root" in m for m in logs)
    with pytest.raises(PowerLimitError):
        with Nvml(FakeNvml(root=False)) as nvml:
            nvml.set_power_limit(0, 250)
