"""The router configured like a real box (issue 52), as the NixOS module runs it: a model cache holding a
Hugging Face download, a preset that uses it (`hf-repo`), idle sleep, metrics on, a drafted preset.

The cache entry is written by the test in the layout llama.cpp's common/hf-cache.cpp reads
(`models--OWNER--REPO/refs/main` naming a 40-hex commit, `snapshots/COMMIT/FILE` a symlink into `blobs/`),
with the bed's tiny model as its file: `/models` then lists `OWNER/REPO:F32` (the tag read from the file
name, common/download.cpp's get_gguf_split_info) with `"source": "cache"` beside the presets
(tools/server/server-models.cpp, load_models). The presets run `offline`, so the one that names the
download loads it from the cache and never asks the network.

One router serves the module; the run is made once and read by several tests.
"""

from __future__ import annotations

import hashlib
import os
import tomllib
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

import httpx
import pytest

from llm_bench.diagnostics.gpu_checks import check_vram
from llm_bench.diagnostics.log_checks import instance_lines
from llm_bench.engines import LlamaCppEngine, select_models
from llm_bench.engines.metrics import LLAMA_CPP_PREFIX, SpecCounters, parse_prometheus, spec_counters
from llm_bench.engines.switch import RouterSide, free_gpu, reload_models
from llm_bench.gpu.nvml import Nvml, VramReading
from llm_bench.gpu.roofline import acceptance_length
from llm_bench.history.points import config_args
from llm_bench.plan import Plan, Protocol
from llm_bench.results import AliasRecord
from llm_bench.runner import run_plan
from llm_bench.support.poll import poll_until
from llm_bench.testbed.presets import PresetError, render_presets_ini
from llm_bench.testbed.router import RouterProcess, start_router
from llm_bench.testbed.tiny_gguf import TinyModelSpec, write_tiny_model
from llm_bench.workloads import PARTS
from tests.commands import invoke, only_file
from tests.fake_nvml import FakeGpu, FakeNvml

REPO = "llm-bench/tiny-GGUF"
CACHED = f"{REPO}:F32"  # the tiny model is all F32 (tiny_gguf: LlamaFileType.ALL_F32)
COMMIT = "0123456789abcdef0123456789abcdef01234567"
SLEEP_S = 2  # idle seconds before an instance sleeps (a box: 300)
DRAFT_MAX = 3
PRESETS = ["tiny-cached", "tiny-draft", "tiny-plain"]


@dataclass
class Box:
    router: RouterProcess
    engine: LlamaCppEngine
    target: Path


def hf_cache_entry(cache: Path, repo: str, commit: str, file: Path, name: str) -> Path:
    """A download as huggingface_hub and llama.cpp lay it out: the file in blobs/ under its hash, the snapshot
    a relative symlink to it, refs/main the commit."""
    folder = cache / ("models--" + repo.replace("/", "--"))
    blob = folder / "blobs" / hashlib.sha256(file.read_bytes()).hexdigest()
    blob.parent.mkdir(parents=True)
    blob.write_bytes(file.read_bytes())
    snapshot = folder / "snapshots" / commit / name
    snapshot.parent.mkdir(parents=True)
    snapshot.symlink_to(os.path.relpath(blob, snapshot.parent))
    (folder / "refs").mkdir()
    (folder / "refs" / "main").write_text(commit)
    return snapshot


@pytest.fixture(scope="module")
def box(llama_server_bin: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Box]:
    root = tmp_path_factory.mktemp("box")
    target = write_tiny_model(root / "models" / "tiny-target.gguf", TinyModelSpec(seed=1, name="tiny-target"))
    draft = write_tiny_model(root / "models" / "tiny-draft.gguf",
                             TinyModelSpec(seed=2, n_embd=32, n_layer=1, name="tiny-draft"))
    cache = root / "llama-cpp"  # the module's LLAMA_CACHE: /var/lib/llama-cpp
    hf_cache_entry(cache, REPO, COMMIT, target, "tiny-target-F32.gguf")
    ini = root / "presets.ini"
    ini.write_text(render_presets_ini({
        "*": {"ctx-size": 1024, "parallel": 1, "sleep-idle-seconds": SLEEP_S, "metrics": True, "offline": True},
        "tiny-plain": {"model": str(target)},
        "tiny-draft": {"model": str(target), "spec-type": "draft-simple", "model-draft": str(draft),
                       "spec-draft-n-max": DRAFT_MAX},
        "tiny-cached": {"hf-repo": CACHED},
    }))
    router = start_router(llama_server_bin, ini, log_path=root / "router.log", env={"LLAMA_CACHE": str(cache)})
    engine = LlamaCppEngine(router.url, timeout=120)
    try:
        yield Box(router, engine, target)
    finally:
        engine.close()
        router.stop()


@pytest.fixture(scope="module")
def run(box: Box, tmp_path_factory: pytest.TempPathFactory) -> tuple[dict, str]:
    """One `llm-bench run` naming no alias: what it measures and what it says it left out."""
    out = tmp_path_factory.mktemp("results")
    result = invoke("run", "--url", box.router.url, "--output-dir", str(out), "--runs", "2", "--max-tokens", "24",
                    "--temperature", "0")
    assert result.exit_code == 0, result.output
    return tomllib.loads(only_file(out).read_text()), result.output


def test_the_router_lists_its_cache_beside_the_presets(box: Box) -> None:
    assert box.engine.sources() == {"tiny-plain": "preset", "tiny-draft": "preset", "tiny-cached": "preset",
                                    CACHED: "cache"}


def test_a_run_measures_the_presets_and_says_what_it_left_out(box: Box, run: tuple[dict, str]) -> None:
    data, output = run
    assert sorted(a["alias"] for a in data["aliases"]) == PRESETS
    assert all(a["errors"] == [] for a in data["aliases"]), [a["errors"] for a in data["aliases"]]
    assert (f"Not measured: {CACHED} (a download in the router's model cache (LLAMA_CACHE), listed under no "
            f"preset's settings); name it (--alias {CACHED}) to measure it") in output
    # the preset that uses the download loaded it from the cache
    cached = next(a for a in data["aliases"] if a["alias"] == "tiny-cached")
    assert f"--hf-repo {CACHED}" in " ".join(cached["preset_args"]) and len(cached["runs"]) == 2


def test_a_cache_entry_is_measured_when_named(box: Box) -> None:
    assert select_models(box.engine, (CACHED,)) == [CACHED]
    said: list[str] = []
    assert sorted(select_models(box.engine, (), said.append)) == PRESETS and len(said) == 1


def test_llama_cpp_counts_draft_rounds_and_per_position_acceptance(box: Box, run: tuple[dict, str]) -> None:
    """From /metrics?model=ALIAS (metrics on): the run's draft rounds and per-position acceptance, which agree
    with the draft_n / draft_n_accepted of every response's timings."""
    data, _ = run
    drafted = next(a for a in data["aliases"] if a["alias"] == "tiny-draft")
    runs = drafted["runs"]
    assert drafted["draft_n"] == sum(r["draft_n"] for r in runs) > 0
    assert drafted["draft_n_accepted"] == sum(r["draft_n_accepted"] for r in runs)
    rounds = drafted["draft_rounds"]
    # each round drafts at most DRAFT_MAX tokens; every round counts once
    assert drafted["draft_n"] / DRAFT_MAX <= rounds <= drafted["draft_n"]
    assert drafted["mean_acceptance_length"] == pytest.approx(1 + drafted["draft_n_accepted"] / rounds)
    per_position = drafted["acceptance_per_position"]
    assert len(per_position) == DRAFT_MAX
    # a draft token is accepted only after the ones before it: the rates fall with position, and sum to
    # accepted / rounds
    assert per_position == sorted(per_position, reverse=True)
    assert sum(per_position) == pytest.approx(drafted["draft_n_accepted"] / rounds)
    plain = next(a for a in data["aliases"] if a["alias"] == "tiny-plain")
    assert "draft_rounds" not in plain
    # the roofline multiplies by the measured length (here every round drafts all DRAFT_MAX tokens, so its
    # 1 + rate x N estimate would agree; with a drafter that stops early it is higher)
    assert acceptance_length(AliasRecord.from_toml(drafted, PARTS)) == pytest.approx(drafted["mean_acceptance_length"])


def test_the_metrics_page_names_the_families(box: Box) -> None:
    """What the parser reads is what b11434 prints (tools/server/server-task.cpp, to_metrics)."""
    box.engine.chat({"model": "tiny-draft", "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 8,
                     "temperature": 0})
    text = box.engine.client.metrics("tiny-draft")
    assert text is not None
    for family in ("num_drafts_total", "num_draft_tokens_total", "num_accepted_tokens_total",
                   "num_accepted_tokens_per_pos_total{position=\"0\"}"):
        assert f"{LLAMA_CPP_PREFIX}spec_decode_{family}" in text, text
    counters = spec_counters(parse_prometheus(text), prefix=LLAMA_CPP_PREFIX)
    assert counters is not None and counters.drafts and len(counters.accepted_per_position) == DRAFT_MAX


def test_the_speculation_in_effect_is_read_from_the_slots(box: Box) -> None:
    """/slots names the speculation each instance runs ("speculative", params["speculative.types"]); /props does
    not: its default_generation_settings say "none" for the drafted preset too (b11434's get_res_props copies
    the sampling settings only)."""
    for alias, types in (("tiny-draft", "draft-simple"), ("tiny-plain", "none")):
        box.engine.chat({"model": alias, "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2})
        assert box.engine.speculation(alias) == types
        props = box.engine.client.props(alias)["default_generation_settings"]["params"]
        assert props["speculative.types"] == "none"


def wait_asleep(engine: LlamaCppEngine, alias: str) -> None:
    asleep = poll_until(lambda: engine.client.model(alias).status == "sleeping" or None,
                        timeout=SLEEP_S * 10, interval=0.1)
    assert asleep, f"{alias} did not fall asleep within {SLEEP_S * 10} s: {engine.client.model(alias)}"


def test_sleeping_is_neither_loaded_nor_unloaded(box: Box) -> None:
    engine = box.engine
    engine.chat({"model": "tiny-plain", "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2})
    wait_asleep(engine, "tiny-plain")
    assert "tiny-plain" not in engine.loaded_models() and engine.sleeping_models() == ["tiny-plain"]
    # still a process: its own /props answers, and says so
    assert httpx.get(f"{box.router.url}/props", params={"model": "tiny-plain", "autoload": "false"}).json()[
        "is_sleeping"] is True
    # the doctor says what a sleeping instance keeps (its GPU context), not that another process holds memory
    busy = check_vram(VramReading((4096.0,)), 2048, engine.loaded_models(), engine.sleeping_models())
    assert "tiny-plain asleep" in busy[0].evidence and "keeps its GPU context" in busy[0].evidence

    # freeing the GPU stops a sleeping instance too (a request would reload it onto the GPU), and does not
    # load it again afterwards
    state = free_gpu(RouterSide(box.router.url, mode="unload", reload=True))
    assert state.unloaded_sleeping == ["tiny-plain"] and state.unloaded == []
    assert engine.client.model("tiny-plain").status == "unloaded"
    reload_models(RouterSide(box.router.url, mode="unload", reload=True), state)
    assert engine.client.model("tiny-plain").status == "unloaded"

    # a cold load starts from unloaded, not from a wake-up (a reload inside a running process)
    engine.chat({"model": "tiny-plain", "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2})
    wait_asleep(engine, "tiny-plain")
    assert engine.make_cold("tiny-plain") and engine.client.model("tiny-plain").status == "unloaded"


def test_memory_busy_before_a_load_names_the_sleeping_instances(box: Box, tmp_path: Path) -> None:
    """Before a cold load, VRAM over the threshold with another preset asleep: the reason names it (the NVML
    double reports the memory: no GPU here)."""
    box.engine.chat({"model": "tiny-draft", "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2})
    wait_asleep(box.engine, "tiny-draft")
    plan = Plan(url=box.router.url, aliases=("tiny-plain",), output_dir=tmp_path,
                protocol=Protocol(runs=1, max_tokens=4))
    nvml = Nvml(FakeNvml(gpus=[FakeGpu(used_mib=4096)]))
    writer = run_plan(plan, lambda m: None, nvml=nvml)
    writer.finish(datetime.now(timezone.utc))
    [record] = tomllib.loads(writer.path.read_text())["aliases"]
    assert record["comparable"] is False
    assert "(the router has tiny-draft asleep: a process each, keeping its GPU context" in \
        record["not_comparable_reason"]


def test_log_colors_is_not_the_configuration(box: Box, run: tuple[dict, str]) -> None:
    """The router gives each instance --log-colors (on in a terminal, off here): history must not split on it."""
    data, _ = run
    args = next(a for a in data["aliases"] if a["alias"] == "tiny-plain")["preset_args"]
    assert "--log-colors" in args
    assert "--log-colors" not in config_args(args)


def test_instance_lines_are_read_whatever_the_port_width(box: Box, run: tuple[dict, str]) -> None:
    """The router prints "[%5d] " before an instance's lines (server-models.cpp): "[ 8080] " below 10000. The
    module's run loaded tiny-plain, so its instance has lines in the log whatever order the tests run in."""
    log = box.router.log()
    wide = instance_lines(log)
    assert "tiny-plain" in wide
    port = next(line for line in log.splitlines() if "spawning server instance with name=tiny-plain" in line)
    number = port.rsplit(" ", 1)[1]
    padded = log.replace(f"[{number}]", "[ 8080]").replace(f"on port {number}", "on port 8080")
    assert instance_lines(padded)["tiny-plain"] == [line.replace(f"[{number}]", "[ 8080]")
                                                    for line in wide["tiny-plain"]]


def test_a_colon_in_a_preset_name_is_refused(router_factory, box: Box) -> None:
    """The router reads what follows ':' in a section name as a quantisation tag (common/preset.cpp)."""
    listed = router_factory(f"[tiny:fast]\nmodel = {box.target}\n")
    names = [m["id"] for m in httpx.get(f"{listed.url}/models").json()["data"]]
    assert names == ["tiny:FAST"]
    with pytest.raises(PresetError, match=r"'tiny:fast' holds ':'.*as 'tiny:FAST'.*use '-' instead \('tiny-fast'\)"):
        render_presets_ini({"tiny:fast": {"model": str(box.target)}})


def test_a_cold_load_is_split_by_stage(run: tuple[dict, str]) -> None:
    """/models/sse names each load stage (text model, then the drafter): the cold load is split by them."""
    data, output = run
    stages = {a["alias"]: a.get("load_stages_s") for a in data["aliases"]}
    assert set(stages["tiny-plain"]) == {"text_model"}
    assert set(stages["tiny-draft"]) == {"text_model", "spec_model"}
    for alias in ("tiny-plain", "tiny-draft"):
        cold = next(a["cold_load_s"] for a in data["aliases"] if a["alias"] == alias)
        assert 0 <= sum(stages[alias].values()) < cold
    assert "; of it text_model " in output


def test_a_draft_position_first_counted_during_the_runs_is_kept() -> None:
    """llama.cpp lists its per-position family only once a round was drafted: a scrape before the first one
    has none, and the run's difference keeps every position the scrape after has."""
    before = SpecCounters(0.0, 0.0, 0.0, ())
    after = SpecCounters(9.0, 4.0, 3.0, (3.0, 1.0, 0.0))
    assert after.minus(before).accepted_per_position == (3.0, 1.0, 0.0)
