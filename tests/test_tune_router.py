"""llm-bench tune end to end on the real CPU llama-server with the real SmolLM2 model.

One tune of four presets (the control, the model drafting for itself, KV q4_0 with flash
attention, and KV q4_0 without it, which llama.cpp refuses to load) runs through the command line twice: the first is
interrupted with SIGINT once two presets are screened, the second resumes. A "machine's router"
(a second real router with a loaded preset) must be freed during the tune and as it was after
each. The winner's Nix snippet goes through the project's NixOS module and the rendered INI is
loaded by the real router.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import tomllib
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from llm_bench.engines.client import RouterClient
from llm_bench.results import load_results
from llm_bench.support.poll import poll_until
from llm_bench.tune.search import SCREEN, TUNE
from llm_bench.workloads import PARTS
from llm_bench.workloads.quality.record import quality_results

REPO = Path(__file__).resolve().parents[1]


def cli(*args: str) -> list[str]:
    return [sys.executable, "-m", "llm_bench", *args]


def statuses(url: str) -> dict[str, str]:
    return {m["id"]: m["status"]["value"] for m in httpx.get(f"{url}/models", timeout=10).json()["data"]}


def wait_loaded(url: str, alias: str, timeout: float = 120.0) -> None:
    client = RouterClient(url)
    client.load(alias)
    client.wait_for_status(alias, "loaded", timeout)


def screened(folder: Path) -> int:
    count = 0
    for path in folder.glob("llm-bench-*-tune-*.toml"):
        try:
            data = tomllib.loads(path.read_text())
        except (tomllib.TOMLDecodeError, OSError):
            continue
        count = max(count, sum(1 for a in data.get("aliases", []) if a.get("target") == SCREEN))
    return count


def run_to_end(argv: list[str], cwd: Path, env: dict[str, str], timeout: float = 2400) -> subprocess.CompletedProcess:
    """Run the tune; past the timeout interrupt it (as a user would), so it still restores what it changed."""
    process = subprocess.Popen(argv, cwd=cwd, env=env, text=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        out, err = process.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        process.send_signal(signal.SIGINT)
        out, err = process.communicate(timeout=120)
        pytest.fail(f"the tune did not finish within {timeout:.0f} s:\n{err[-3000:]}")
    return subprocess.CompletedProcess(argv, process.returncode, out, err)


@dataclass
class Tuned:
    folder: Path
    first: subprocess.CompletedProcess
    second: subprocess.CompletedProcess
    main_url: str
    results: Path


@pytest.fixture(scope="module")
def tuned(tmp_path_factory, llama_server_bin: Path, smollm2: Path, tiny_models) -> Tuned:
    from llm_bench.testbed.router import start_router

    folder = tmp_path_factory.mktemp("tune")
    main_ini = folder / "main.ini"
    main_ini.write_text(f"[main-plain]\nmodel = {tiny_models['target']}\nctx-size = 512\n")
    main = start_router(llama_server_bin, main_ini, log_path=folder / "main.log")
    try:
        wait_loaded(main.url, "main-plain")
        # a short prompt: the shipped one's ~230 tokens were a third of the tune's time here
        (folder / "prompt.txt").write_text("Count to five.")
        plan = folder / "tune.toml"
        plan.write_text(f"""
name = "sm"
output_dir = "out"
main_url = "{main.url}"
llama_server = "{llama_server_bin}"
finalists = 2
screen_max_tokens = 8

[base]
model = "{smollm2}"
ctx-size = 2048
parallel = 1

[axes]
variant = [{{ name = "plain", spec-type = "none", cache-type-k = "f16", cache-type-v = "f16", flash-attn = "on" }},
           {{ name = "self", spec-type = "draft-simple", model-draft = "{smollm2}", spec-draft-n-max = 2, cache-type-k = "f16", cache-type-v = "f16", flash-attn = "on" }},
           {{ name = "q4", spec-type = "none", cache-type-k = "q4_0", cache-type-v = "q4_0", flash-attn = "on" }},
           {{ name = "q4-nofa", spec-type = "none", cache-type-k = "q4_0", cache-type-v = "q4_0", flash-attn = "off" }}]

[budget]
max_rounds = 1

[protocol]
runs = 3
max_tokens = 16
prompt_file = "prompt.txt"
recall_lengths = [128]
recall_depths = [0.5]
quality_max_tokens = 24

[protocol.quality]
text_tokens = 16
exact_items_per_kind = 0
""")
        env = {**os.environ, "PYTHONPATH": str(REPO)}
        first = subprocess.Popen(cli("tune", "--plan", str(plan)), cwd=folder, env=env, text=True,
                                 stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        assert poll_until(lambda: (screened(folder / "out") >= 2 or first.poll() is not None) or None,
                          timeout=300, interval=0.2), "the first tune screened nothing in 300 s"
        during = statuses(main.url)["main-plain"]
        first.send_signal(signal.SIGINT)
        out, err = first.communicate(timeout=120)
        first_done = subprocess.CompletedProcess(first.args, first.returncode, out, err)
        assert first.returncode == 130, err
        assert during == "unloaded", "the machine's router kept its model during the tune"
        assert statuses(main.url)["main-plain"] == "loaded", "the machine's router was not restored"
        second = run_to_end(cli("tune", "--plan", str(plan)), folder, env)
        assert second.returncode == 0, second.stderr[-3000:]
        assert statuses(main.url)["main-plain"] == "loaded"
        results = Path(re.search(r"results: (\S+\.toml)", second.stderr).group(1))
        return Tuned(folder, first_done, second, main.url, folder / results if not results.is_absolute() else results)
    finally:
        main.stop()


def test_interrupted_tune_keeps_measurements_and_resumes(tuned: Tuned) -> None:
    assert "interrupted" in tuned.first.stderr and "resume" in tuned.first.stderr
    assert "Search cost: 4 presets" in tuned.first.stderr and "Estimated time:" in tuned.first.stderr
    interrupted = [p for p in (tuned.folder / "out").glob("llm-bench-*-tune-sm*.toml") if p != tuned.results]
    assert interrupted, "the interrupted tune left no results file"
    kept = load_results(interrupted[0], PARTS)
    assert kept.meta["complete"] is False and len([a for a in kept.aliases if a.target == SCREEN]) >= 2
    # The second run measured none of those again.
    m = re.search(r"resuming: (\d+) preset\(s\) already screened", tuned.second.stderr)
    assert m and int(m.group(1)) >= 2, tuned.second.stderr[:2000]
    final = load_results(tuned.results, PARTS)
    names = [a.alias for a in final.aliases if a.target == SCREEN]
    assert sorted(names) == sorted(set(names)) and len(names) == 4, names
    # The temporary router is gone: its port no longer answers.
    port = re.search(r"temporary router http://127.0.0.1:(\d+)", tuned.second.stderr).group(1)
    with pytest.raises(httpx.TransportError):
        httpx.get(f"http://127.0.0.1:{port}/models", timeout=2)


def test_invalid_combinations_are_recorded_with_the_servers_message(tuned: Tuned) -> None:
    final = load_results(tuned.results, PARTS)
    bad = {a.alias: a for a in final.aliases if a.target == SCREEN and a.errors}
    assert set(bad) == {"sm-q4-nofa"}, bad.keys()
    for record in bad.values():
        assert "quantized V cache requires flash_attn" in " ".join(record.errors)
    outcome = final.meta["tune"]["outcome"]
    assert {i["name"] for i in outcome["invalid"]} == set(bad)
    assert "invalid: sm-q4-nofa" in tuned.second.stdout


def test_winner_has_a_verdict_and_passed_the_quality_gate(tuned: Tuned) -> None:
    final = load_results(tuned.results, PARTS)
    tune = final.meta["tune"]
    outcome = tune["outcome"]
    winner = outcome["winner"]
    assert winner in {c["name"] for c in tune["candidates"]}
    assert "winner: " in tuned.second.stdout and winner in tuned.second.stdout
    if winner != tune["control"]:
        assert re.match(r"(faster|slower|within noise|too few runs)", outcome["verdict"])
        assert outcome["verdict"] in tuned.second.stdout
    # The quality workload ran on the control and each finalist, in the results file like any record.
    quality = {a.alias: a for a in final.aliases if a.target == TUNE and a.workload == "quality"}
    control = [o.text for o in quality_results(quality[tune["control"]]).outputs]
    assert control and winner in quality
    # Speculative decoding is lossless: the model drafting for itself gives the control's greedy outputs.
    if "sm-self" in quality:
        assert [o.text for o in quality_results(quality["sm-self"]).outputs] == control
    # Whatever the gate rejected has outputs that differ from the control's, and did not win.
    for rejected in outcome["rejected_for_quality"]:
        assert rejected["name"] != winner
        assert re.match(r"(lossy|near-lossless|quality not scored|agreement|recall)", rejected["reason"])
        if rejected["reason"].startswith("agreement"):
            assert [o.text for o in quality_results(quality[rejected["name"]]).outputs] != control
        assert f"rejected for quality: {rejected['name']}" in tuned.second.stdout
    # Full runs of the rounds: every contender has runs measured by the server's own timings.
    full = {a.alias: a for a in final.aliases if a.target == TUNE and a.workload == "standard"}
    assert winner in full and all(r.server_decode_tps for r in full[winner].runs)
    assert len(full[tune["control"]].runs) == 3


def test_outputs_report_chart_and_the_report_command(tuned: Tuned) -> None:
    out = tuned.folder / "out"
    assert (out / "tune-sm.md").read_text() in tuned.second.stdout
    assert (out / "tune-sm-pareto.png").stat().st_size > 1000
    assert "sm-plain" in (out / "tune-sm.html").read_text()  # the shared HTML report, the control as baseline
    assert "| # | Preset |" in tuned.second.stdout
    report = subprocess.run(cli("report", str(tuned.results)), text=True, capture_output=True,
                            env={**os.environ, "PYTHONPATH": str(REPO)}, timeout=120)
    assert report.returncode == 0, report.stderr
    assert "sm-plain" in report.stdout
    assert "llm-bench run --url" in tuned.second.stdout


def snippet_of(stdout: str) -> str:
    return re.search(r"```nix\n(.*?)```", stdout, re.S).group(1)


def test_the_snippet_is_accepted_by_the_module_and_the_real_router(tuned: Tuned, router_factory) -> None:
    from tests.nix.helpers import nix_eval
    from tests.test_nix_modules import ALL, LLAMAMPERE_SRC, NVIDIA, harness

    snippet = snippet_of(tuned.second.stdout)
    winner = load_results(tuned.results, PARTS).meta["tune"]["outcome"]["winner"]
    config = nix_eval(f"{harness()}.summary [ {ALL} {LLAMAMPERE_SRC} {NVIDIA} {{ {snippet} }} ]")
    assert config["failedAssertions"] == []
    ini = config["presetsIni"]
    assert f"[{winner}]" in ini
    router = router_factory(ini)
    models = statuses(router.url)
    assert winner in models
    answer = httpx.post(f"{router.url}/v1/chat/completions", timeout=300, json={
        "model": winner, "messages": [{"role": "user", "content": "What is the capital of France?"}],
        "max_tokens": 8, "temperature": 0})
    assert answer.status_code == 200, answer.text
    assert answer.json()["choices"][0]["message"]["content"]
