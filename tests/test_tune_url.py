"""llm-bench tune --url: compare presets an existing router already serves (the demo bed's tiny models)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from llm_bench.results import load_results
from llm_bench.tune.search import SCREEN, TUNE
from llm_bench.workloads import PARTS
from tests.commands import small_quality_plan

REPO = Path(__file__).resolve().parents[1]


def test_existing_presets_are_compared_without_serving_anything(router, tmp_path: Path) -> None:
    out = tmp_path / "out"
    # the quality gate's workload sized down: the comparison is what is checked here
    plan = small_quality_plan(tmp_path / "plan.toml")
    proc = subprocess.run(
        [sys.executable, "-m", "llm_bench", "tune", "--url", router.url, "--preset", "tiny-plain,tiny-ngram",
         "--runs", "3", "--max-tokens", "16", "--screen-tokens", "8", "--max-rounds", "1", "--plan", str(plan),
         "--output-dir", str(out)],
        text=True, capture_output=True, timeout=600, env={**os.environ, "PYTHONPATH": str(REPO)})
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "temporary router" not in proc.stderr  # nothing was started
    assert "Search cost: 2 presets (1 candidates and the control)" in proc.stderr
    result = load_results(next(out.glob("llm-bench-*-tune-tune.toml")), PARTS)
    tune = result.meta["tune"]
    assert tune["control"] == "tiny-plain" and tune["mode"] == "existing router"
    assert sorted(a.alias for a in result.aliases if a.target == SCREEN) == ["tiny-ngram", "tiny-plain"]
    full = {a.alias: a for a in result.aliases if a.target == TUNE and a.workload == "standard"}
    assert {len(a.runs) for a in full.values()} == {3}
    quality = {a.alias for a in result.aliases if a.target == TUNE and a.workload == "quality"}
    assert quality == {"tiny-plain", "tiny-ngram"}
    winner = tune["outcome"]["winner"]
    assert winner in ("tiny-plain", "tiny-ngram")
    # The router already serves the winner: no Nix snippet, the command that measures it again.
    assert "```nix" not in proc.stdout
    assert f"llm-bench run --url {router.url} --alias {winner}" in proc.stdout
