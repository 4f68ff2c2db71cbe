"""Measured requests process their whole prompt unless a cached prompt is asked for, by the server's own count."""

from __future__ import annotations

import tomllib

from click.testing import CliRunner

from llm_bench.cli import main
from tests.commands import only_file
from tests.fake_vllm import FakeVllm, FakeVllmConfig


def run(router, out, *flags):
    result = CliRunner().invoke(main, ["run", "--url", router.url, "--output-dir", str(out), "--alias", "tiny-plain",
                                       "--runs", "2", "--max-tokens", "8", *flags], catch_exceptions=False)
    assert result.exit_code == 0, result.output
    path = only_file(out, "*.toml")
    return tomllib.loads(path.read_text()), result.output


def test_measured_runs_process_the_whole_prompt_and_caching_only_when_asked(router, tmp_path):
    cold, _ = run(router, tmp_path / "cold")
    assert cold["meta"]["protocol"]["prompt_cache"] is False
    (record,) = cold["aliases"]
    assert len(record["runs"]) == 2
    for r in record["runs"]:
        # timings.cache_n: the server's own count of prompt tokens it reused; 0 means it processed them all
        assert r["cache_n"] == 0
        assert r["prompt_tokens"] > 100
    assert record["warnings"] == []

    # the same prompt again, cache allowed: the server now serves all but the last prompt token from cache
    warm, output = run(router, tmp_path / "warm", "--prompt-cache")
    assert warm["meta"]["protocol"]["prompt_cache"] is True
    (record,) = warm["aliases"]
    for r in record["runs"]:
        assert r["cache_n"] >= r["prompt_tokens"] - 2
    assert "prompt tokens from cache" in output
    assert record["warnings"] == ["prompt cache on (asked for): TTFT and prompt t/s time the server's cache hits"]
    assert "prompt cache on (asked for)" in output  # the table's Notes


def test_openai_engine_salts_every_request_so_vllm_processes_the_prompt(tmp_path):
    config = FakeVllmConfig(cached_tokens_in_usage=True)
    with FakeVllm(config) as vllm:
        cold = CliRunner().invoke(main, ["run", "--engine", "openai", "--url", vllm.url, "--runs", "3",
                                         "--max-tokens", "8", "--output-dir", str(tmp_path / "cold")])
        warm = CliRunner().invoke(main, ["run", "--engine", "openai", "--url", vllm.url, "--runs", "3",
                                         "--max-tokens", "8", "--prompt-cache", "--output-dir", str(tmp_path / "warm")])
    assert cold.exit_code == 0 and warm.exit_code == 0, cold.output + warm.output
    (record,) = tomllib.loads(next((tmp_path / "cold").glob("*.toml")).read_text())["aliases"]
    assert [r["cache_n"] for r in record["runs"]] == [0, 0, 0]  # usage.prompt_tokens_details.cached_tokens
    (record,) = tomllib.loads(next((tmp_path / "warm").glob("*.toml")).read_text())["aliases"]
    assert all(r["cache_n"] == r["prompt_tokens"] for r in record["runs"])


def test_a_server_that_still_reuses_the_prompt_is_flagged(router, tmp_path, monkeypatch):
    # a server that ignores the request not to cache: simulated by dropping cache_prompt from the body
    from llm_bench.engines.client import OpenAIClient

    original = OpenAIClient.stream_chat
    monkeypatch.setattr(OpenAIClient, "stream_chat",
                        lambda self, request, path="/v1/chat/completions", extra=None: original(self, request, path))
    data, output = run(router, tmp_path / "ignored")
    (record,) = data["aliases"]
    assert all(r["cache_n"] > r["prompt_tokens"] / 2 for r in record["runs"])
    assert any("reused" in w and "cold prompts were asked for" in w for w in record["warnings"])
    assert "reused" in output  # the table's Notes carry the warning
