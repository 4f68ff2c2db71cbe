"""The exit-code table (docs/report.md, Exit codes) at the command line: 3 when the server goes away partway, with what
was measured on disk (the other codes are asserted where each failure is tested)."""

from __future__ import annotations

import importlib

from click.testing import CliRunner

from llm_bench.cli import main
from llm_bench.cli.exits import ABORTED, COULD_NOT_RUN, INTERRUPTED
from llm_bench.results import load_results
from llm_bench.testbed.router import free_port
from llm_bench.workloads import PARTS
from tests.cli_process import LlmBench
from tests.commands import only_file

# The module, not the command of the same name that llm_bench.cli exports.
run_command = importlib.import_module("llm_bench.cli.run")


def test_server_going_away_partway_exits_3_with_the_measured_alias_saved(router_factory, bed, tmp_path,
                                                                          monkeypatch):
    router = router_factory(bed)
    measure = run_command.run_plan

    def stop_before_the_second_alias(plan, log):
        def watching(message: str) -> None:
            log(message)
            if message.startswith("Benchmark 2/"):
                router.stop()
        return measure(plan, watching)

    monkeypatch.setattr(run_command, "run_plan", stop_before_the_second_alias)
    result = CliRunner().invoke(main, ["run", "--url", router.url, "--alias", "tiny-plain,tiny-ngram", "--runs", "1",
                                       "--max-tokens", "16", "--output-dir", str(tmp_path)])
    assert result.exit_code == ABORTED == 3, result.output
    assert "results so far are in" in result.output
    path = only_file(tmp_path, "*.toml")
    first = load_results(path, PARTS).aliases[0]
    assert first.alias == "tiny-plain" and first.runs


def test_could_not_run_exits_2_without_a_results_file(tmp_path):
    # 'ran, some configurations failed' (exit 1) is proven on a real load failure in test_run_router.py
    unreachable = CliRunner().invoke(main, ["run", "--url", f"http://127.0.0.1:{free_port()}",
                                            "--output-dir", str(tmp_path)])
    assert unreachable.exit_code == COULD_NOT_RUN == 2
    assert not list(tmp_path.glob("*.toml"))  # nothing was measured, so no results file


def test_ctrl_c_exits_130_with_the_finished_alias_saved(router_factory, bed, tmp_path):
    router = router_factory(bed)
    run = LlmBench("run", "--url", router.url, "--alias", "tiny-plain,tiny-ngram", "--runs", "3", "--max-tokens",
                   "256", "--output-dir", str(tmp_path))
    run.wait_for("Benchmark 2/2")  # the first alias is measured and on disk
    run.interrupt()
    assert run.finish(120) == INTERRUPTED == 130, run.stderr
    assert "interrupted" in run.stderr and "Traceback" not in run.stderr
    path = only_file(tmp_path, "*.toml")
    saved = load_results(path, PARTS)
    assert saved.meta["complete"] is False
    first = saved.aliases[0]
    assert first.alias == "tiny-plain" and len(first.runs) == 3 and all(r.decode_tps > 0 for r in first.runs)
