"""Cold prompts through an OpenAI-compatible API that ignores every cache switch: a real llama-server router
driven through `--engine openai` (its /v1 API ignores cache_salt and caches prompts by default). By the
server's own count (timings.cache_n) every measured run processes its whole prompt; and a server that does
reuse the prompt gets one warning with the count, not one per run."""

from __future__ import annotations

import tomllib

from click.testing import CliRunner

from llm_bench.cli import main
from llm_bench.engines.openai import OpenAIEngine

# The chat template's opening ("<|im_start|>user\n", "Request ") is the same in every request and may be
# reused, and a random nonce can share its first character or two with the previous one by chance; all else
# (hundreds of tokens) must be processed. Without the nonce the server reuses all but the last token.
REUSED_AT_MOST = 0.05


def run(*args: str):
    result = CliRunner().invoke(main, ["run", "--alias", "tiny-plain", "--max-tokens", "8", *args],
                                catch_exceptions=False)
    assert result.exit_code == 0, result.output
    return result


def test_openai_engine_runs_are_cold_on_a_server_that_ignores_cache_salt(router, tmp_path):
    run("--engine", "openai", "--url", router.url, "--runs", "3", "--output-dir", str(tmp_path))
    data = tomllib.loads(next(tmp_path.glob("*.toml")).read_text())
    assert data["meta"]["protocol"]["cold_prompt"] == OpenAIEngine.cold_prompt
    (record,) = data["aliases"]
    assert len(record["runs"]) == 3
    for r in record["runs"]:
        assert r["prompt_tokens"] > 100
        # the server's own count of prompt tokens it took from its cache (timings.cache_n on llama-server)
        assert r["cache_n"] <= REUSED_AT_MOST * r["prompt_tokens"], r
    assert record["warnings"] == []


def test_a_server_reusing_the_prompt_gets_one_warning_with_the_count(router, tmp_path, monkeypatch):
    # a server that ignores the request not to cache: simulated by dropping cache_prompt from the body
    from llm_bench.engines.client import OpenAIClient

    original = OpenAIClient.stream_chat
    monkeypatch.setattr(OpenAIClient, "stream_chat",
                        lambda self, request, path="/v1/chat/completions", extra=None: original(self, request, path))
    result = run("--url", router.url, "--runs", "3", "--output-dir", str(tmp_path))
    (record,) = tomllib.loads(next(tmp_path.glob("*.toml")).read_text())["aliases"]
    assert all(r["cache_n"] > r["prompt_tokens"] / 2 for r in record["runs"])
    (warning,) = record["warnings"]
    most = max(r["cache_n"] for r in record["runs"])
    assert warning.startswith(f"3 of 3 measured requests: the server reused up to {most} of "
                              f"{record['prompt_tokens']} prompt tokens from its cache although cold prompts were "
                              "asked for")
    (row,) = [line for line in result.output.splitlines() if line.startswith("| tiny-plain |")]
    assert row.count("cold prompts were asked for") == 1  # the Notes cell says it once
