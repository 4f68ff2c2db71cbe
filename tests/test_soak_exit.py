"""``llm-bench soak``'s exit code, decided both ways in a real ``llm-bench`` process against a real router:
0 when clean; 1 on more failed requests than allowed (and 0 at exactly the number allowed), on a restart of a
model instance, on a new Xid line in the kernel log, on a critical Xid from NVML (the test double); 130 on a
real SIGINT, with what was measured saved. Each fault happens while the soak runs, after its first request."""

from __future__ import annotations

import os
import signal
import tomllib
from datetime import datetime, timezone
from pathlib import Path

import httpx
import pytest

from tests.cli_process import LlmBench
from tests.commands import instance_pid, only_file
from tests.fake_nvml import FakeGpu, FakeNvml, use_in_subprocesses, write_state

FIXTURES = Path(__file__).parent / "fixtures"
XID = "NVRM: Xid (PCI:0000:01:00): 79, pid=4242, name=llama-server, GPU has fallen off the bus."


class Soak(LlmBench):
    """One ``llm-bench soak`` process writing into ``out``."""

    def __init__(self, url: str, out: Path, *args: str):
        out.mkdir(parents=True, exist_ok=True)
        self.out = out
        super().__init__("soak", "--url", url, "--output-dir", str(out), *args, stdout=out / "stdout.txt")

    def saved(self) -> dict:
        path = only_file(self.out, "*soak*.toml")
        return tomllib.loads(path.read_text())


@pytest.fixture
def watched(tmp_path, monkeypatch):
    """GPU errors watched from both sources: a kernel log file holding only old Xid lines, and the NVML double."""
    kernel_log = tmp_path / "kern.log"
    kernel_log.write_text((FIXTURES / "kernel-xid.log").read_text())

    def watch(*pending_xids: int) -> Path:
        """The kernel log file; NVML's driver reports ``pending_xids`` once the soak watches for events."""
        state = write_state(tmp_path / "nvml.json", FakeNvml(gpus=[FakeGpu(pending_xids=list(pending_xids))]))
        use_in_subprocesses(monkeypatch, state)
        return kernel_log
    return watch


def common(kernel_log: Path, *more: str) -> tuple[str, ...]:
    return ("--alias", "tiny-plain", "--max-tokens", "8", "--kernel-log", str(kernel_log), *more)


def test_a_clean_soak_exits_0(router, watched, tmp_path):
    soak = Soak(router.url, tmp_path / "out", *common(watched(), "--duration", "120", "--max-requests", "3",
                                                       "--mix", "prose"))
    assert soak.finish() == 0, soak.stderr
    data = soak.saved()["soak"]
    assert data["requests_failed"] == 0 and data["restarts"] == 0 and data["new_gpu_errors"] == 0
    assert not any(u.startswith("GPU errors") for u in data["unwatched"]), data["unwatched"]  # both were watched


def test_failures_up_to_the_number_allowed_exit_0_and_one_more_exits_1(router, watched, tmp_path):
    # The tiny random model answers a tool request in prose: one failed request out of two, every time.
    args = common(watched(), "--duration", "120", "--max-requests", "2", "--mix", "prose=1,tool=1")
    allowed = Soak(router.url, tmp_path / "allowed", *args, "--max-failures", "1")
    assert allowed.finish() == 0, allowed.stderr
    assert allowed.saved()["soak"]["requests_failed"] == 1
    strict = Soak(router.url, tmp_path / "strict", *args, "--max-failures", "0")
    assert strict.finish() == 1, strict.stderr
    assert "1 request(s) failed (allowed: 0)" in strict.stderr
    assert strict.saved()["soak"]["failures_by_kind"] == {"tool": {"no-tool-call": 1}}




def test_a_model_instance_that_restarts_during_the_soak_exits_1(router_factory, tiny_models, watched, tmp_path):
    router = router_factory(f"[tiny-plain]\nmodel = {tiny_models['target']}\n")
    # Failures are allowed here, so that only the restart can decide: a request sent while the instance dies
    # may fail.
    soak = Soak(router.url, tmp_path / "out", *common(watched(), "--duration", "8", "--max-requests", "100000",
                                                       "--mix", "prose", "--max-failures", "100000"))
    soak.wait_for("] prose")  # the first request is answered: the instance is up
    os.kill(instance_pid(router, "tiny-plain"), signal.SIGKILL)
    assert soak.finish() == 1, soak.stderr
    assert "1 server restart(s)" in soak.stderr and "request(s) failed" not in soak.stderr
    data = soak.saved()["soak"]
    assert data["restarts"] == 1 and data["new_gpu_errors"] == 0 and data["stopped_by"] == "duration"
    assert "tiny-plain exited with code" in data["restart_sources"][0]["evidence"]
    assert httpx.get(f"{router.url}/models", timeout=10).status_code == 200


def test_a_new_xid_line_in_the_kernel_log_exits_1(router, watched, tmp_path):
    kernel_log = watched()
    soak = Soak(router.url, tmp_path / "out", *common(kernel_log, "--duration", "4", "--max-requests", "100000",
                                                       "--mix", "prose"))
    soak.wait_for("] prose")
    with kernel_log.open("a") as f:
        f.write(f"{datetime.now(timezone.utc).isoformat()} {XID}\n")
    assert soak.finish() == 1, soak.stderr
    assert "1 new GPU error(s)" in soak.stderr and "restart(s)" not in soak.stderr
    data = soak.saved()["soak"]
    assert data["new_gpu_errors"] == 1 and data["requests_failed"] == 0
    [line] = data["gpu_errors"]
    assert "logged Xid 79" in line and "fallen off the bus" in line


def test_a_critical_xid_from_nvml_exits_1(router, watched, tmp_path):
    soak = Soak(router.url, tmp_path / "out", *common(watched(13), "--duration", "120", "--max-requests", "2",
                                                       "--mix", "prose"))
    assert soak.finish() == 1, soak.stderr
    assert "1 new GPU error(s)" in soak.stderr
    data = soak.saved()["soak"]
    assert data["new_gpu_errors"] == 1 and data["requests_failed"] == 0 and data["restarts"] == 0
    assert "GPU0 reported critical Xid 13" in data["gpu_errors"][0]


def test_ctrl_c_exits_130_with_what_was_measured_saved(router, watched, tmp_path):
    soak = Soak(router.url, tmp_path / "out", *common(watched(), "--duration", "300", "--max-requests", "100000",
                                                       "--mix", "prose"))
    soak.wait_for("] prose")
    soak.wait_for("Results: ")
    soak.interrupt()
    assert soak.finish(60) == 130, soak.stderr
    assert "interrupted; what was measured is in " in soak.stderr and "Traceback" not in soak.stderr
    saved = soak.saved()
    assert saved["meta"]["complete"] is False and saved["soak"]["stopped_by"] == "interrupted"
    assert saved["soak"]["requests_total"] >= 1
