"""tune's two decisions on a real router, each on presets where the wrong decision names another winner: the
leader is the fastest preset that passes the quality gate, and the gate refuses a faster preset whose answers
differ from the control's. Both with the gate of greedy answers (``--accept off``: no token distributions or
exact-answer items are measured; the verdict gate is decided in tests/test_tune_rounds.py and, on SmolLM2, in
tests/test_tune_router.py).

The presets: ``slow``, a random model with about 200 times the tiny model's weights, and ``fast``, the tiny model,
whose greedy answers share nothing with ``slow``'s. How much slower ``slow`` decodes depends on the machine: the
tiny model's rate is bound by each token's fixed cost, which a busy machine raises (5-20 times on the CPU bed, as
low as 4.8 seen in a whole-suite run), so the bed's own check asks for twice, far beyond the noise of three runs.
Both run one thread at realtime priority, so that the other processes on two cores blur it less.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner

from llm_bench.cli import main
from llm_bench.results import load_results
from llm_bench.testbed.presets import render_presets_ini
from llm_bench.testbed.router import start_router
from llm_bench.tune.search import TUNE
from llm_bench.workloads import PARTS
from llm_bench.workloads.quality.record import quality_results
from tests.commands import only_file


@pytest.fixture(scope="module")
def two_speeds(llama_server_bin, tiny_models, larger_model, tmp_path_factory):
    folder = tmp_path_factory.mktemp("tune-decisions")
    ini = folder / "presets.ini"
    ini.write_text(render_presets_ini({
        "*": {"ctx-size": 1024, "parallel": 1, "threads": 1, "threads-batch": 1, "prio": 3, "prio-batch": 3},
        "slow": {"model": str(larger_model)},
        "fast": {"model": str(tiny_models["target"])},
    }))
    router = start_router(llama_server_bin, ini, log_path=folder / "router.log")
    yield router
    router.stop()


def tune(url: str, out: Path, *flags: str):
    result = CliRunner().invoke(main, ["tune", "--url", url, "--preset", "slow,fast", "--runs", "3",
                                       "--max-tokens", "32", "--screen-tokens", "8", "--max-rounds", "1",
                                       "--output-dir", str(out), "--accept", "off", *flags], catch_exceptions=False)
    path = only_file(out, "llm-bench-*-tune-*.toml")
    return result, load_results(path, PARTS)


def medians(result_set) -> dict[str, float]:
    import statistics

    return {a.alias: statistics.median(r.decode_tps for r in a.runs) for a in result_set.aliases
            if a.target == TUNE and a.workload == "standard"}


def test_a_control_that_is_slower_loses(two_speeds, tmp_path):
    # The gate is opened (0 % agreement passes): only speed decides, and the control is the slow one.
    result, measured = tune(two_speeds.url, tmp_path, "--min-agreement", "0")
    assert result.exit_code == 0, result.output
    outcome = measured.meta["tune"]["outcome"]
    speeds = medians(measured)
    assert speeds["fast"] > 2 * speeds["slow"]  # the bed is what the test needs
    assert outcome["winner"] == "fast"
    assert outcome["separated"] is True
    assert outcome["verdict"].startswith("faster (")  # against the control, with its interval
    assert outcome["rejected_for_quality"] == []
    assert outcome["stop_reason"] == "the leader is faster than every other contender beyond noise after round 1"
    [round_1] = measured.meta["tune"]["rounds"]
    assert round_1["leader"] == "fast" and round_1["verdicts"]["slow"].startswith("faster (")
    assert "- winner: **fast**, " in result.output


def test_the_faster_preset_whose_answers_differ_is_refused_and_the_control_wins(two_speeds, tmp_path):
    result, measured = tune(two_speeds.url, tmp_path)  # --accept off: 75 % identical answers
    assert result.exit_code == 0, result.output
    outcome = measured.meta["tune"]["outcome"]
    speeds = medians(measured)
    assert speeds["fast"] > 2 * speeds["slow"]
    assert outcome["winner"] == "slow"
    [rejected] = outcome["rejected_for_quality"]
    assert rejected["name"] == "fast" and rejected["reason"].startswith("agreement 0% < 75% (0/3 identical")
    assert outcome["stop_reason"].startswith("no other contender is left after round 1")
    quality = {a.alias: a for a in measured.aliases if a.target == TUNE and a.workload == "quality"}
    assert [o.token_ids for o in quality_results(quality["fast"]).outputs] != \
        [o.token_ids for o in quality_results(quality["slow"]).outputs]
    assert "- winner: the control **slow**, " in result.output and "rejected for quality: fast" in result.output
