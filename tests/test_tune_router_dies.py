"""The router serving a tune's presets dies partway: `llm-bench tune` stops with exit 3 and a message, what it
measured before stays in its results file, and no traceback reaches the user."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from llm_bench.cli.exits import ABORTED
from llm_bench.results import load_results
from llm_bench.tune.search import SCREEN
from llm_bench.workloads import PARTS
from tests.commands import only_file
from tests.lines import Lines

REPO = Path(__file__).resolve().parents[1]


def test_router_dying_mid_tune_exits_3_with_the_screen_kept(router_factory, bed, tmp_path):
    router = router_factory(bed)
    out = tmp_path / "out"
    process = subprocess.Popen(
        [sys.executable, "-m", "llm_bench", "tune", "--url", router.url,
         "--preset", "tiny-plain,tiny-ngram,tiny-draft", "--runs", "1", "--max-tokens", "16",
         "--screen-tokens", "8", "--max-rounds", "1", "--output-dir", str(out)],
        cwd=tmp_path, env={**os.environ, "PYTHONPATH": str(REPO)}, text=True,
        stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        stderr = Lines(process.stderr)
        stderr.wait_for(r"Screen 2/3: ", timeout=300)
        router.stop()  # SIGTERM to the router and its model instances, then wait for them to go
        process.stdout.read()
        code = process.wait(timeout=120)
    finally:
        if process.poll() is None:
            process.kill()
    text = stderr.rest(timeout=5)
    assert code == ABORTED == 3, text
    assert "Traceback" not in text
    assert "the router serving the candidates went away while " in text
    assert "run the same command again to resume" in text

    path = only_file(out, "llm-bench-*-tune-*.toml")
    result = load_results(path, PARTS)
    assert result.meta["complete"] is False
    control = [a for a in result.aliases if a.target == SCREEN and a.alias == "tiny-plain"]
    assert len(control) == 1 and control[0].runs and not control[0].errors  # screened before: kept
    assert control[0].runs[0].decode_tps > 0
