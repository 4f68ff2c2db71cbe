"""Ctrl-C in the middle of an alias, as a user presses it: a real SIGINT to a real `llm-bench run` process
measuring a real router. Exit 130, and the alias's finished runs are in the results file with the figures
the run printed, marked interrupted."""

from __future__ import annotations

import os
import queue
import re
import signal
import subprocess
import sys
import threading
import time
import tomllib
from pathlib import Path

import pytest

from llm_bench.cli.exits import INTERRUPTED

REPO = Path(__file__).resolve().parents[1]


class Lines:
    """A process's stderr, line by line, read on a thread so a wait can have a deadline."""

    def __init__(self, stream):
        self.seen: list[str] = []
        self._queue: queue.Queue[str | None] = queue.Queue()
        threading.Thread(target=self._read, args=(stream,), daemon=True).start()

    def _read(self, stream) -> None:
        for line in stream:
            self._queue.put(line)
        self._queue.put(None)

    def wait_for(self, pattern: str, timeout: float) -> str:
        deadline = time.monotonic() + timeout
        while True:
            left = deadline - time.monotonic()
            assert left > 0, f"no line matching {pattern!r} within {timeout:.0f} s:\n{''.join(self.seen)}"
            try:
                line = self._queue.get(timeout=left)
            except queue.Empty:
                continue
            assert line is not None, f"the process ended before {pattern!r}:\n{''.join(self.seen)}"
            self.seen.append(line)
            if re.search(pattern, line):
                return line

    def rest(self, timeout: float) -> str:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                line = self._queue.get(timeout=max(deadline - time.monotonic(), 0.01))
            except queue.Empty:
                continue
            if line is None:
                break
            self.seen.append(line)
        return "".join(self.seen)


def test_ctrl_c_after_run_2_of_3_keeps_both_finished_runs(router, tmp_path):
    out = tmp_path / "out"
    process = subprocess.Popen(
        [sys.executable, "-m", "llm_bench", "run", "--url", router.url, "--alias", "tiny-plain", "--runs", "3",
         "--max-tokens", "1024", "--output-dir", str(out)],
        cwd=tmp_path, env={**os.environ, "PYTHONPATH": str(REPO)}, text=True,
        stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        stderr = Lines(process.stderr)
        first = stderr.wait_for(r"Run 1/3: ", timeout=300)
        second = stderr.wait_for(r"Run 2/3: ", timeout=300)
        process.send_signal(signal.SIGINT)  # run 3 is streaming now
        stdout = process.stdout.read()
        code = process.wait(timeout=120)
    finally:
        if process.poll() is None:
            process.kill()
    text = stderr.rest(timeout=5)
    assert code == INTERRUPTED == 130, text
    assert "Traceback" not in text

    (path,) = out.glob("*.toml")
    data = tomllib.loads(path.read_text())
    assert data["meta"]["complete"] is False
    assert [a["alias"] for a in data["aliases"]] == ["tiny-plain"]
    (record,) = data["aliases"]
    runs = record["runs"]
    assert len(runs) == 2, runs
    # the figures the run printed as it went are the ones kept
    for line, run in zip((first, second), runs):
        decode = float(re.search(r": ([\d.]+) t/s decode", line).group(1))
        assert run["decode_tps"] == pytest.approx(decode, abs=0.05)
        assert run["output_tokens"] == 1024 and run["finish_reason"] == "length"
    assert record["decode_tps_median"] > 0 and record["ttft_ms_median"] > 0
    assert record["errors"] == ["interrupted (Ctrl-C) with 2 of 3 runs finished"]
    assert f"interrupted; everything measured, with the finished runs of the alias it was on, is in {path}" in text
    # the table printed on the way out shows the alias, with its two runs and the interruption
    assert "| tiny-plain |" in stdout and "interrupted (Ctrl-C)" in stdout
