"""`llm-bench run --engine openai` through the real LiteLLM proxy (1.100.1) in front of two real llama-server
routers that share one model group: every run names the backend that answered (checked against each
router's own log of the requests it served), the report splits the configuration per backend, and every
prompt is processed whole on whichever backend it reached (the routers' own prompt counts)."""

from __future__ import annotations

import json
import re
import tomllib
from pathlib import Path

from click.testing import CliRunner

from llm_bench.cli import main

ALIAS = "tiny-plain"
RUNS = 12  # shuffled over two backends: all on one has odds 2 in 4096
REUSED_AT_MOST = 0.05  # as tests/test_cold_prompts_openai.py: the template's opening may be reused
PROMPT_EVAL = re.compile(r"task (\d+) \| prompt eval time = +[\d.]+ ms / +(\d+) tokens")


def shared_group(path: Path, *urls: str) -> Path:
    path.write_text(json.dumps({"model_list": [
        {"model_name": "tiny", "model_info": {"id": f"tiny@box{n}"},
         "litellm_params": {"model": f"openai/{ALIAS}", "api_base": f"{url}/v1", "api_key": "no-key"}}
        for n, url in enumerate(urls, 1)]}))
    return path


def prompts_processed(log: Path) -> list[int]:
    """The prompt tokens the router processed for each request it served (its own timings, not cached)."""
    return [int(m.group(2)) for m in PROMPT_EVAL.finditer(log.read_text(errors="replace"))]


def test_runs_through_the_proxy_name_their_backend_and_stay_cold(router_factory, proxy_factory, bed, tmp_path):
    box1, box2 = router_factory(bed), router_factory(bed)
    proxy = proxy_factory(shared_group(tmp_path / "config.json", box1.url, box2.url))
    result = CliRunner().invoke(main, ["run", "--engine", "openai", "--url", proxy.url, "--alias", "tiny",
                                       "--runs", str(RUNS), "--max-tokens", "8", "--output-dir", str(tmp_path / "out")],
                                catch_exceptions=False)
    assert result.exit_code == 0, result.output
    (record,) = tomllib.loads(next((tmp_path / "out").glob("*.toml")).read_text())["aliases"]
    runs = record["runs"]
    assert len(runs) == RUNS

    served = {f"{box.url}/v1": prompts_processed(box.log_path) for box in (box1, box2)}
    mine = {backend: sum(1 for r in runs if r["backend"] == backend) for backend in served}
    assert sum(mine.values()) == RUNS  # every run names one of the two
    # Each router's own count: its runs, plus the one warm-up request if the proxy sent it there.
    assert sum(len(p) for p in served.values()) == RUNS + 1
    for backend, processed in served.items():
        assert len(processed) - mine[backend] in (0, 1), (backend, mine, served)
    # Cold through the proxy: LiteLLM forwards the request as llm-bench sends it, and each router processed
    # (nearly) the whole prompt of every request by its own timings; the proxy passes on the routers' own
    # count of cached tokens (usage.prompt_tokens_details.cached_tokens), which the runs keep as cache_n.
    for processed in served.values():
        assert all(n >= (1 - REUSED_AT_MOST) * record["prompt_tokens"] for n in processed), processed
    assert all(r["cache_n"] <= REUSED_AT_MOST * r["prompt_tokens"] for r in runs)
    assert record["warnings"] == []

    # The report: one row per backend, each with its own runs.
    rows = [line for line in result.output.splitlines() if line.startswith("| tiny @ ")]
    assert sorted(row.split(" | ")[0] for row in rows) == sorted(
        f"| tiny @ 127.0.0.1:{box.port}" for box in (box1, box2) if mine[f"{box.url}/v1"])
    for box in (box1, box2):
        if mine[f"{box.url}/v1"]:
            (row,) = [r for r in rows if r.startswith(f"| tiny @ 127.0.0.1:{box.port} |")]
            assert f"{mine[f'{box.url}/v1']} of {RUNS} requests, answered by {box.url}/v1" in row
    exported = CliRunner().invoke(main, ["report", "--format", "json", *map(str, (tmp_path / "out").glob("*.toml"))])
    assert exported.exit_code == 0, exported.output
    names = {r["configuration"] for r in json.loads(exported.output)["main"]}
    assert names == {f"tiny @ 127.0.0.1:{box.port}" for box in (box1, box2) if mine[f"{box.url}/v1"]}
