"""Ctrl-C in the middle of an alias, as a user presses it: a real SIGINT to a real `llm-bench run` process
measuring a real router. Exit 130, and the alias's finished runs are in the results file with the figures
the run printed, marked interrupted."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from llm_bench.cli.exits import INTERRUPTED
from tests.commands import only_file
from tests.lines import Lines

REPO = Path(__file__).resolve().parents[1]


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
        code = process.wait(timeout=120)  # a hang fails here instead of holding the suite (its output is small)
        stdout = process.stdout.read()
    finally:
        if process.poll() is None:
            process.kill()
    text = stderr.rest(timeout=5)
    assert code == INTERRUPTED == 130, text
    assert "Traceback" not in text

    path = only_file(out, "*.toml")
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
