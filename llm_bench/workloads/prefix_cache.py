"""A long prompt sent twice: the second time-to-first-token shows whether the server's prefix cache served it."""

from __future__ import annotations

from llm_bench.engines import Engine
from llm_bench.plan import Protocol
from llm_bench.results import AliasRecord
from llm_bench.workloads.common import Log, chat_request, derive, fmt, long_prompt, run_record


def prefix_cache(engine: Engine, alias: str, protocol: Protocol, base: AliasRecord, log: Log) -> list[AliasRecord]:
    record = derive(base, workload="prefix-cache", cold_load_s=None)
    request = chat_request(alias, protocol, long_prompt(protocol.prefix_prompt_tokens, protocol.prefix_chars_per_token),
                           max_tokens=protocol.prefix_max_tokens, prompt_cache=True)  # caching is what it measures
    cold = run_record(engine.stream(request), engine.kind)
    before = engine.prefix_counters(alias)
    warm = run_record(engine.stream(request), engine.kind)
    after = engine.prefix_counters(alias)
    record.runs = [cold, warm]
    record.prefix_cold_ttft_ms = cold.ttft_ms
    record.prefix_warm_ttft_ms = warm.ttft_ms
    if warm.cache_n:
        record.prefix_cached_tokens = warm.cache_n
        record.prefix_evidence = f"server reported {warm.cache_n} of {warm.prompt_tokens} prompt tokens from cache"
    elif before and after and after.minus(before).hits > 0:
        hits = after.minus(before).hits
        record.prefix_cached_tokens = int(hits)
        record.prefix_evidence = f"vllm:prefix_cache_hits_total grew by {hits:.0f} tokens during the repeat"
    else:
        record.warnings.append(
            "prefix cache hit NOT confirmed: the server reported no cached prompt tokens for the repeated prompt "
            "(is prefix caching enabled, e.g. vLLM --enable-prefix-caching or llama.cpp cache_prompt?)"
        )
    log(f"  prefix cache: {cold.prompt_tokens} prompt tokens, TTFT cold {fmt(cold.ttft_ms)} ms, "
        f"repeated {fmt(warm.ttft_ms)} ms; " + (record.prefix_evidence or "hit not confirmed"))
    return [record]
