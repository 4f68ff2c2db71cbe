"""A long prompt sent twice: the second time-to-first-token shows whether the server's prefix cache served it."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any, ClassVar

from llm_bench.engines import Engine
from llm_bench.engines.errors import ServerError
from llm_bench.results import AliasRecord, known, run_record
from llm_bench.support.numbers import fmt as figure
from llm_bench.tables import Cell, Row, Table, notes_of
from llm_bench.validation import check_fields
from llm_bench.workloads.base import Flag, Keep, Log, RunParameters, Workload
from llm_bench.workloads.common import SUMMARY, WorkloadInterrupted, chat_request, derive, fmt, long_prompt
from llm_bench.workloads.depth import DepthSettings, calibrate


@dataclass
class PrefixCacheHit:
    """The prefix-cache workload's part of a record (``[aliases.prefix-cache]``): the long prompt's TTFT
    cold and repeated, and what says the repeat was served from the cache (the server's count, or vLLM's
    counter), absent when nothing confirmed it."""

    cold_ttft_ms: float | None = None
    warm_ttft_ms: float | None = None
    cached_tokens: int | None = None
    evidence: str | None = None
    tails: ClassVar[bool] = False

    @property
    def distinction(self) -> str:
        return PREFIX_CACHE.record_name

    def to_toml(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_toml(cls, data: dict[str, Any]) -> PrefixCacheHit:
        return cls(**known(cls, data))

    @staticmethod
    def legacy(record: dict[str, Any]) -> dict[str, Any]:
        """Files written before the part was the workload's kept ``prefix_cold_ttft_ms``, ... in the record."""
        return {k.removeprefix("prefix_"): v for k, v in record.items()
                if k in ("prefix_cold_ttft_ms", "prefix_warm_ttft_ms", "prefix_cached_tokens", "prefix_evidence")}


def hit_of(record: AliasRecord) -> PrefixCacheHit:
    """The record's prefix-cache figures (all absent for another workload's record)."""
    return record.part if isinstance(record.part, PrefixCacheHit) else PrefixCacheHit()


@dataclass(frozen=True)
class PrefixCacheSettings:
    prompt_tokens: int = field(default=11000, metadata={"min": 1})
    chars_per_token: float = field(default=4.0, metadata={"above": 0.0})  # the prompt's length is set in characters
    max_tokens: int = field(default=32, metadata={"min": 2})

    def __post_init__(self) -> None:
        check_fields(self)


# Tokens left free beside the sized prompt: its unique first line (a UUID is some 25 tokens), and the rounding of a
# character count.
HEADROOM = 64


def prompt_size(engine: Engine, alias: str, protocol: RunParameters, settings: PrefixCacheSettings,
                record: AliasRecord, log: Log) -> tuple[int, float]:
    """The prompt's tokens and characters per token: as set, or, where that could overrun the model's context
    (a tokeniser may take fewer characters per token than set), measured by the server's own count and cut to
    fit, the cut said on the record. The context is what the server reports (vLLM: max_model_len in /v1/models)."""
    n_ctx = engine.context_length(alias)
    if n_ctx is None or 2 * settings.prompt_tokens + settings.max_tokens <= n_ctx:
        return settings.prompt_tokens, settings.chars_per_token
    question = chat_request(alias, protocol, "\n\n" + SUMMARY, max_tokens=1, prompt_cache=False)
    try:
        cal = calibrate(engine, question, DepthSettings(chars_per_token=settings.chars_per_token))
    except ServerError as e:
        raise WorkloadInterrupted(e) from e
    room = n_ctx - settings.max_tokens - cal.prompt_tokens - HEADROOM
    if room < 1:
        raise WorkloadInterrupted(ServerError(
            f"prefix-cache: the model's context of {n_ctx} tokens leaves no room for a prompt beside "
            f"{settings.max_tokens} tokens to generate; lower [protocol.prefix-cache] max_tokens"))
    if settings.prompt_tokens <= room:
        return settings.prompt_tokens, cal.chars_per_token
    record.warnings.append(
        f"prefix-cache prompt cut from {settings.prompt_tokens} to about {room + cal.prompt_tokens} tokens to fit the "
        f"model's context of {n_ctx} (reported by the server) with {settings.max_tokens} tokens to generate")
    log(f"  prefix cache: {record.warnings[-1]}")
    return room, cal.chars_per_token


def prefix_cache(engine: Engine, alias: str, protocol: RunParameters, base: AliasRecord, log: Log, keep: Keep) -> None:
    settings = PREFIX_CACHE.settings_in(protocol)
    hit = PrefixCacheHit()
    record = derive(base, workload=PREFIX_CACHE.record_name, cold_load_s=None, part=hit)
    try:
        tokens, chars_per_token = prompt_size(engine, alias, protocol, settings, record, log)
    except WorkloadInterrupted as e:
        record.errors.append(str(e))
        keep(record)
        raise
    request = chat_request(alias, protocol, long_prompt(tokens, chars_per_token),
                           max_tokens=settings.max_tokens, prompt_cache=True)  # caching is what it measures
    cold = run_record(engine.stream(request), engine)
    before = engine.prefix_counters(alias)
    warm = run_record(engine.stream(request), engine)
    after = engine.prefix_counters(alias)
    record.runs = [cold, warm]
    hit.cold_ttft_ms = cold.ttft_ms
    hit.warm_ttft_ms = warm.ttft_ms
    if warm.cache_n:
        hit.cached_tokens = warm.cache_n
        hit.evidence = f"server reported {warm.cache_n} of {warm.prompt_tokens} prompt tokens from cache"
    elif before and after and after.minus(before).hits > 0:
        hits = after.minus(before).hits
        hit.cached_tokens = int(hits)
        hit.evidence = f"vllm:prefix_cache_hits_total grew by {hits:.0f} tokens during the repeat"
    else:
        record.warnings.append(
            "prefix cache hit NOT confirmed: the server reported no cached prompt tokens for the repeated prompt "
            "(is prefix caching enabled, e.g. vLLM --enable-prefix-caching or llama.cpp cache_prompt?)"
        )
    log(f"  prefix cache: {cold.prompt_tokens} prompt tokens, TTFT cold {fmt(cold.ttft_ms)} ms, "
        f"repeated {fmt(warm.ttft_ms)} ms; " + (hit.evidence or "hit not confirmed"))
    keep(record)


def prefix_cache_tables(rows: Sequence[Row], _baseline: Row | None = None) -> list[Table]:
    chosen = [r for r in rows if r.record.workload == PREFIX_CACHE.record_name]
    if not chosen:
        return []
    header = ["Configuration", "Prompt tokens", "TTFT cold ms", "TTFT repeated ms", "Speed-up", "Cache evidence",
              "Notes"]
    lines = []
    for row in chosen:
        r, hit = row.record, hit_of(row.record)
        cold, warm = hit.cold_ttft_ms, hit.warm_ttft_ms
        ratio = cold / warm if cold and warm else None
        prompt = r.runs[0].prompt_tokens if r.runs and r.runs[0].prompt_tokens else None
        lines.append([Cell(row.configuration, {"configuration": row.configuration}),
                      Cell("-" if prompt is None else str(prompt), {"prompt_tokens": prompt}),
                      Cell(figure(cold, 0), {"prefix_cold_ttft_ms": cold}),
                      Cell(figure(warm, 0), {"prefix_warm_ttft_ms": warm}),
                      Cell("-" if ratio is None else f"{ratio:.1f}x", {"prefix_speedup": ratio}),
                      Cell(hit.evidence or "-", {"prefix_evidence": hit.evidence}),
                      Cell(notes_of(r), {"errors": list(r.errors)})])
    return [Table("Prefix caching", "prefix_cache", header, lines,
                  frozenset({"Configuration", "Cache evidence", "Notes"}))]


PREFIX_CACHE: Workload[PrefixCacheSettings] = Workload(
    "prefix-cache", PrefixCacheSettings, prefix_cache,
    legacy={"prefix_prompt_tokens": "prompt_tokens", "prefix_chars_per_token": "chars_per_token",
            "prefix_max_tokens": "max_tokens"},
    flags=(Flag("--prefix-tokens", "prompt_tokens", "Approximate prompt tokens for the prefix-cache workload",
                item=int),),
    needs_prompt_cache=True, tables=prefix_cache_tables, part=PrefixCacheHit)
