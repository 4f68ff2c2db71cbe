"""Measured requests process their whole prompt unless a cached prompt is asked for, by the server's own count."""

from __future__ import annotations

import tomllib

from click.testing import CliRunner

from llm_bench.cli import main


def run(router, out, *flags):
    result = CliRunner().invoke(main, ["run", "--url", router.url, "--output-dir", str(out), "--alias", "tiny-plain",
                                       "--runs", "2", "--max-tokens", "8", *flags], catch_exceptions=False)
    assert result.exit_code == 0, result.output
    (path,) = out.glob("*.toml")
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
    assert max(r["ttft_ms"] for r in record["runs"]) < min(r["ttft_ms"] for r in cold["aliases"][0]["runs"])
