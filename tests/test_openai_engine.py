"""The OpenAI engine and the workloads: against the real llama-server's /v1 routes, where its own
timings are the truth, and against a local server speaking vLLM's wire format."""

from __future__ import annotations

import tomllib
from pathlib import Path

import pytest

from llm_bench.engines.metrics import parse_prometheus, prefix_cache_counters, spec_counters
from llm_bench.plan import ApiKeySource, Plan, PlanError, Protocol
from llm_bench.results import load_results
from llm_bench.runner import run_plan
from llm_bench.testbed.presets import render_presets_ini
from llm_bench.workloads import PARTS
from llm_bench.workloads.categories import category_of
from llm_bench.workloads.concurrency import level_of
from llm_bench.workloads.prefix_cache import hit_of
from tests.commands import invoke, only_file
from tests.fake_vllm import FakeVllm, FakeVllmConfig

FIXTURES = Path(__file__).parent / "fixtures"



def only_results(folder: Path) -> dict:
    path = only_file(folder, "*.toml")
    return tomllib.loads(path.read_text())


# --- the metrics parser, on vLLM's exposition format -------------------------------------------

def test_parser_reads_vllm_counters_exactly():
    samples = parse_prometheus((FIXTURES / "vllm-metrics.txt").read_text())
    spec = spec_counters(samples, "Qwen/Qwen3.8-27B")
    # the *_created gauges share the counters' prefix and must not be added in
    assert spec.drafts == 312044 and spec.draft_tokens == 1248176 and spec.accepted_tokens == 735508
    assert spec.accepted_per_position == (268358, 205373, 152941, 108836)
    assert spec.acceptance_rate == pytest.approx(735508 / 1248176)
    assert spec.mean_acceptance_length == pytest.approx(1 + 735508 / 312044)
    assert spec.per_position_rates[0] == pytest.approx(268358 / 312044)
    assert prefix_cache_counters(samples).hits == 110880
    assert spec_counters(samples, "another-model") is None


def test_deltas_between_scrapes():
    text = (FIXTURES / "vllm-metrics.txt").read_text()
    before = spec_counters(parse_prometheus(text))
    after = spec_counters(parse_prometheus(text.replace("312044.0", "312144.0").replace("735508.0", "735708.0")
                                           .replace("1.248176e+06", "1248576.0")))
    delta = after.minus(before)
    assert (delta.drafts, delta.draft_tokens, delta.accepted_tokens) == (100, 400, 200)
    assert delta.mean_acceptance_length == pytest.approx(3.0)


# --- against the real llama-server, through /v1 ------------------------------------------------

def test_stream_measurement_agrees_with_the_servers_timings(router, tmp_path):
    result = invoke("run", "--engine", "openai", "--url", router.url, "--alias", "tiny-plain",
                    "--alias", "tiny-draft-synth", "--max-tokens", "256", "--runs", "3",
                    "--output-dir", str(tmp_path), "--label", "llama-v1")
    assert result.exit_code == 0, result.output
    data = only_results(tmp_path)
    assert data["meta"]["engine"] == "openai"
    records = {a["alias"]: a for a in data["aliases"]}
    for record in records.values():
        assert record["decode_source"] == "stream"
        assert "cold_load_s" not in record  # an OpenAI server cannot be unloaded: no cold load to time
        assert record["output_tokens"] == 256  # from usage, not from counting chunks
        assert all(run["decode_tps"] == run["client_decode_tps"] for run in record["runs"])
        # The stream measurement and llama.cpp's own timings measure the same decode; medians, because
        # one run delayed by another process on these two cores arrives as a burst.
        server = sorted(run["server_decode_tps"] for run in record["runs"])[1]
        assert record["decode_tps_median"] == pytest.approx(server, rel=0.25)
    # no vLLM metrics here: the acceptance record is filled from llama.cpp's timings
    assert records["tiny-draft-synth"]["draft_acceptance"] == pytest.approx(0.5, abs=0.1)


def test_api_key_from_file_is_used_and_never_written(llama_server_bin, bed, router_factory, tmp_path):
    secret = "sk-test-9f8e7d6c5b4a"
    router = router_factory(bed, extra_args=["--api-key", secret])
    key_file = tmp_path / "key"
    key_file.write_text(secret + "\n")
    ok = invoke("run", "--engine", "openai", "--url", router.url, "--alias", "tiny-plain", "--runs", "1",
                "--max-tokens", "16", "--api-key-file", str(key_file), "--output-dir", str(tmp_path / "ok"))
    assert ok.exit_code == 0, ok.output
    assert secret not in ok.output
    path = only_file((tmp_path / "ok"), "*.toml")
    text = path.read_text()
    assert secret not in text
    assert f"file {key_file}" in text  # where the key came from is provenance

    denied = invoke("run", "--engine", "openai", "--url", router.url, "--output-dir", str(tmp_path / "denied"))
    assert denied.exit_code == 2  # could not run: the server refused the listing
    assert "401" in denied.output

    from_env = invoke("run", "--engine", "openai", "--url", router.url, "--alias", "tiny-plain", "--runs", "1",
                      "--max-tokens", "16", "--api-key-env", "BENCH_KEY", "--output-dir", str(tmp_path / "env"),
                      env={"BENCH_KEY": secret})
    assert from_env.exit_code == 0, from_env.output


def test_missing_api_key_sources_are_clear_errors(tmp_path, monkeypatch):
    monkeypatch.delenv("NOPE_KEY", raising=False)
    with pytest.raises(PlanError, match="NOPE_KEY"):
        ApiKeySource(env="NOPE_KEY").read()
    with pytest.raises(PlanError, match="cannot read the API key file"):
        ApiKeySource(file=tmp_path / "missing").read()


def test_workloads_on_the_real_router(llama_server_bin, bed, router_factory, tmp_path):
    target = bed.parent / "models" / "tiny-target.gguf"
    router = router_factory(render_presets_ini({"tiny-par2": {"model": str(target), "ctx-size": 4096,
                                                              "parallel": 2}}))
    plan = Plan(url=router.url, output_dir=tmp_path, label="workloads",
                protocol=Protocol(max_tokens=64, runs=2, concurrency=(1, 2), prefix_prompt_tokens=1200,
                                  prefix_chars_per_token=1.0,  # the tiny models' vocabulary: one byte, one token
                                  workloads=("standard", "categories", "concurrency", "prefix-cache")))
    records = load_results(run_plan(plan, lambda m: None).path, PARTS).aliases
    by_workload: dict[str, list] = {}
    for r in records:
        by_workload.setdefault(r.workload, []).append(r)
    assert [category_of(r) for r in by_workload["category"]] == ["prose", "code", "json"]
    assert all(len(r.runs) == 2 and not r.errors for r in by_workload["category"])
    levels = {level_of(r).streams: r for r in by_workload["concurrency"]}
    assert set(levels) == {1, 2}
    # runs = 2 batches of 2 simultaneous streams
    assert len(levels[2].runs) == 2 * 2 and [r.batch for r in levels[2].runs] == [1, 1, 2, 2]
    assert level_of(levels[2]).total_tps > 0
    # cold prompts in every measured workload; the prefix-cache workload caches on purpose
    assert all(run.cache_n == 0 for r in records if r.workload != "prefix-cache" for run in r.runs)
    (prefix,) = by_workload["prefix-cache"]
    assert prefix.runs[0].prompt_tokens > 1000
    assert hit_of(prefix).cached_tokens and hit_of(prefix).cached_tokens > 1000  # confirmed by timings.cache_n
    assert "from cache" in hit_of(prefix).evidence
    assert all(r.unloaded_after for r in records)

    report = invoke("report", *map(str, tmp_path.glob("*.toml")))
    assert "### Concurrency" in report.output and "### Prefix caching" in report.output
    assert "tiny-par2 [prose]" in report.output and "tiny-par2 [x2]" in report.output


# --- against a server speaking vLLM's wire format ----------------------------------------------

def test_vllm_stream_and_metrics(tmp_path):
    with FakeVllm(FakeVllmConfig(tokens_per_chunk=3, accepted_per_round=2)) as vllm:
        result = invoke("run", "--engine", "openai", "--url", vllm.url, "--runs", "2", "--max-tokens", "90",
                        "--output-dir", str(tmp_path), "--workload", "standard", "--workload", "prefix-cache",
                        "--prefix-tokens", "2000")
    assert result.exit_code == 0, result.output
    assert "Decode: " in result.output and "t/s median [min " in result.output  # each alias summed up as it ends
    records = {a["workload"]: a for a in only_results(tmp_path)["aliases"]}
    proto = records["standard"]
    assert proto["output_tokens"] == 90  # usage, although only 30 chunks carried tokens
    assert all(run["token_chunks"] == 30 for run in proto["runs"])
    # 90 tokens in rounds of 1 + 2 accepted: 30 rounds x 4 drafted, 60 accepted, per run
    assert proto["draft_rounds"] == 60 and proto["draft_n"] == 240 and proto["draft_n_accepted"] == 120
    assert proto["draft_acceptance"] == pytest.approx(0.5)
    assert proto["mean_acceptance_length"] == pytest.approx(3.0)
    assert proto["acceptance_per_position"] == [1.0, 1.0, 0.0, 0.0]
    assert proto["ttft_ms_median"] > 0
    prefix = records["prefix-cache"]["prefix-cache"]  # the workload's part, under [aliases.prefix-cache]
    assert "vllm:prefix_cache_hits_total grew" in prefix["evidence"]
    assert prefix["warm_ttft_ms"] < prefix["cold_ttft_ms"]


def test_stream_cut_in_the_middle_is_recorded(tmp_path):
    with FakeVllm(FakeVllmConfig(cut_after_chunks=4)) as vllm:
        result = invoke("run", "--engine", "openai", "--url", vllm.url, "--runs", "1", "--max-tokens", "60",
                        "--output-dir", str(tmp_path))
    assert result.exit_code == 1
    (record,) = only_results(tmp_path)["aliases"]
    assert "without a finish reason" in record["errors"][0]


def test_concurrency_against_vllm_format(tmp_path):
    with FakeVllm() as vllm:
        plan = Plan(url=vllm.url, engine="openai", output_dir=tmp_path,
                    protocol=Protocol(max_tokens=30, runs=1, workloads=("concurrency",), concurrency=(1, 4)))
        records = load_results(run_plan(plan, lambda m: None).path, PARTS).aliases
    x4 = next(r for r in records if level_of(r).streams == 4)
    assert len(x4.runs) == 4 and level_of(x4).total_tps > 0
    assert x4.spec is not None and x4.spec.draft_tokens > 0


def test_llama_and_openai_results_side_by_side(router, tmp_path):
    llama = invoke("run", "--url", router.url, "--alias", "tiny-plain", "--runs", "1", "--max-tokens", "32",
                   "--label", "router", "--output-dir", str(tmp_path))
    # the same router through its /v1 routes, as any OpenAI-compatible server
    openai = invoke("run", "--engine", "openai", "--url", router.url, "--alias", "tiny-ngram", "--runs", "1",
                    "--max-tokens", "30", "--label", "hyperqwen", "--output-dir", str(tmp_path))
    assert llama.exit_code == 0 and openai.exit_code == 0
    files = sorted(map(str, tmp_path.glob("*.toml")))
    report = invoke("report", *files, "--baseline", "router / tiny-plain", "--chart", str(tmp_path / "c.png"))
    assert report.exit_code == 0, report.output
    assert "router / tiny-plain | llama-cpp (server)" in report.output
    assert "hyperqwen / tiny-ngram | openai (stream)" in report.output
    assert (tmp_path / "c.png").stat().st_size > 1000


def test_a_request_dropped_before_any_answer_is_sent_again(tmp_path):
    with FakeVllm(FakeVllmConfig(drop_requests=1)) as vllm:
        ok = invoke("run", "--engine", "openai", "--url", vllm.url, "--runs", "1", "--max-tokens", "30",
                    "--output-dir", str(tmp_path / "once"))
    assert ok.exit_code == 0, ok.output
    with FakeVllm(FakeVllmConfig(drop_requests=100)) as vllm:
        failed = invoke("run", "--engine", "openai", "--url", vllm.url, "--runs", "1", "--max-tokens", "30",
                        "--output-dir", str(tmp_path / "always"))
    assert failed.exit_code == 1
    (record,) = only_results(tmp_path / "always")["aliases"]
    assert "closed the connection twice without answering" in record["errors"][0]
