"""A vLLM killed mid-run, against the real vLLM 0.32 (CPU build) of the test bed: a module of its own, so that its
server never runs beside tests/test_vllm_real.py's (two on two cores took twice as long)."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import httpx

from llm_bench.diagnostics.settings import Checks
from llm_bench.diagnostics.vllm_evidence import vllm_command_lines, vllm_config
from llm_bench.engines.metrics import parse_prometheus, spec_counters
from llm_bench.gpu.nvml import Nvml
from llm_bench.plan import Plan, Protocol
from llm_bench.results import load_results
from llm_bench.runner import RunAborted, run_plan
from llm_bench.testbed.vllm_server import start_vllm
from llm_bench.workloads import PARTS
from tests.fake_nvml import FakeNvml


def test_a_drafting_vllm_killed_mid_run_ends_it_clearly_and_keeps_the_finished_runs(
        vllm_python: Path, vllm_model: Path, tmp_path: Path) -> None:
    """Its own server, drafting with a draft model (SmolLM2 drafts for itself: CPU vLLM runs one), spelled with
    the shorthands --spec-model and --spec-tokens, and --enforce-eager: read as such (the method from the log's
    config line, which names what the command line leaves to vLLM), acceptance per position from /metrics,
    then killed while the standard workload runs: the run ends with a clear error, and the results file holds
    the runs finished before."""
    server = start_vllm(vllm_python, vllm_model, log_path=tmp_path / "killed.log",
                        args=["--spec-model", str(vllm_model), "--spec-tokens", "2", "--enforce-eager",
                              "--max-model-len", "512"])
    try:
        [line] = [line for line in vllm_command_lines() if f"--port {server.port}" in line]
        config = vllm_config([line], None, None, server.log())
        assert config.speculation == "draft_model n=2" and config.drafts_from_context is False
        assert config.eager and config.eager.startswith("--enforce-eager")
        assert vllm_config([line]).speculation == "on n=2"  # the command line alone names no method
        plan = Plan(url=server.url, engine="openai", output_dir=tmp_path / "out",
                    checks=Checks(log_file=server.log_path), protocol=Protocol(runs=50, max_tokens=24))
        outcome: dict[str, BaseException | None] = {}

        def run() -> None:
            try:
                run_plan(plan, lambda m: None, nvml=Nvml(FakeNvml()))
                outcome["error"] = None
            except BaseException as e:  # noqa: BLE001 - handed to the test's thread
                outcome["error"] = e

        thread = threading.Thread(target=run)
        thread.start()
        deadline = time.monotonic() + 120

        def answered() -> float:  # the warm-up and the runs vLLM has finished
            text = httpx.get(f"{server.url}/metrics").text
            return sum(s.value for s in parse_prometheus(text) if s.name == "vllm:request_success_total")

        while answered() < 3 and time.monotonic() < deadline:
            time.sleep(0.2)
        assert answered() >= 3
        drafted = spec_counters(parse_prometheus(httpx.get(f"{server.url}/metrics").text), "smol")
        assert drafted is not None and drafted.drafts and len(drafted.accepted_per_position) == 2
        assert drafted.accepted_tokens == sum(drafted.accepted_per_position)  # each accepted token has a position
        server.process.kill()  # the API server only: its engine goes with it
        thread.join(120)
    finally:
        server.stop()
    # The API server killed mid-stream breaks the stream (the alias ends with that error, and the run with it); killed
    # between two requests, the next finds no server (the run is aborted, naming its results file). Either way the
    # runs finished before are in the file, beside a clear error.
    error = outcome.get("error")
    assert error is None or (isinstance(error, RunAborted) and "results so far are in" in str(error)), error
    [path] = (tmp_path / "out").glob("*.toml")
    [record] = load_results(path, PARTS).aliases
    assert len(record.runs) >= 2 and record.errors, record
    assert any(word in record.errors[-1] for word in ("stream", "connect", "reach")), record.errors
    assert (record.speculation, record.context) == ("draft_model n=2", 512)
