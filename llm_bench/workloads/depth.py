"""Speed at context depth: the protocol's prompt after N tokens of filler, for each depth.

Each depth is measured like the standard workload (the protocol's runs, each a cold prompt, the
server's own timings), with ``depths`` tokens of filler text before the prompt. Depth 0 is the
standard workload's request. A depth is set in tokens by the server's own count: before the runs, the
filler's characters per token are measured with two one-token requests (the prompt alone, and the
prompt after a sample of the filler). A depth that does not fit the model's context is skipped with
the reason; a server that reuses any cached prompt token at a depth is named in a warning.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from llm_bench.engines import Engine
from llm_bench.engines.errors import ServerError, ServerUnreachable
from llm_bench.engines.stream import ChatRequest
from llm_bench.plan import DepthSettings, Protocol, shipped_prompt
from llm_bench.results import AliasRecord, DepthPoint
from llm_bench.workloads.common import Log, WorkloadInterrupted, chat_request, derive, measured_runs, reused_prompt

WORKLOAD = "depth"
FILLER_HEADING = "Background notes (context for later; the task follows after them):\n\n"
# Characters of filler whose tokens are counted to measure the filler's characters per token.
SAMPLE_CHARS = 2000


def filler(chars: int) -> str:
    """About ``chars`` characters of numbered prose sections, cut at a word boundary."""
    if chars <= 0:
        return ""
    prose = shipped_prompt("prose").strip()
    parts, n, total = [FILLER_HEADING], 1, len(FILLER_HEADING)
    while total < chars:
        section = f"Section {n}. {prose}\n\n"
        parts.append(section)
        total += len(section)
        n += 1
    text = "".join(parts)[:chars]
    cut = text.rfind(" ")
    return (text[:cut] if cut > len(FILLER_HEADING) else text) + "\n\n"


def depth_prompt(prompt: str, filler_chars: int) -> str:
    return filler(filler_chars) + prompt


@dataclass(frozen=True)
class Calibration:
    """The server's own token counts: the prompt alone (with the chat template), and the filler's
    characters per token."""

    prompt_tokens: int
    chars_per_token: float


def _prompt_tokens(engine: Engine, request: ChatRequest, prompt: str) -> int:
    """The server's count of the whole prompt, from a one-token answer (usage.prompt_tokens)."""
    body: dict[str, Any] = replace(request, prompt=prompt, max_tokens=1).body()
    body.pop("stream_options", None)
    body["stream"] = False
    answer = engine.chat(body)
    tokens = (answer.get("usage") or {}).get("prompt_tokens")
    if not isinstance(tokens, int):
        raise ServerError(f"the server did not report usage.prompt_tokens for {request.model!r}, so context depth "
                          "cannot be set in tokens")
    return tokens


def calibrate(engine: Engine, request: ChatRequest, settings: DepthSettings) -> Calibration:
    base = _prompt_tokens(engine, request, request.prompt)
    sample = filler(SAMPLE_CHARS)
    with_sample = _prompt_tokens(engine, request, sample + request.prompt)
    measured = len(sample) / (with_sample - base) if with_sample > base else settings.chars_per_token
    return Calibration(base, measured)


def depth(engine: Engine, alias: str, protocol: Protocol, base: AliasRecord, log: Log) -> list[AliasRecord]:
    settings = protocol.depth
    request = chat_request(alias, protocol, protocol.prompt, prompt_cache=False)
    needs_filler = any(d > 0 for d in settings.depths)
    cal = calibrate(engine, request, settings) if needs_filler else None
    n_ctx = engine.context_length(alias)
    if cal is not None:
        log(f"  depth: the filler takes {cal.chars_per_token:.2f} characters per token, the prompt "
            f"{cal.prompt_tokens} tokens (the server's count)" + (f"; context {n_ctx} tokens" if n_ctx else ""))
    records: list[AliasRecord] = []
    for tokens in settings.depths:
        cpt = cal.chars_per_token if cal is not None else settings.chars_per_token
        point = DepthPoint(tokens, filler_chars=int(tokens * cpt) if tokens else 0,
                           chars_per_token=None if cal is None or not tokens else cpt)
        record = derive(base, workload=WORKLOAD, cold_load_s=None, depth=point)
        records.append(record)
        needed = tokens + (cal.prompt_tokens if cal else 0) + request.max_tokens
        if n_ctx is not None and needed > n_ctx:
            point.skipped = (f"{tokens} tokens of filler, the prompt and {request.max_tokens} tokens to generate "
                             f"need {needed} tokens; the model's context is {n_ctx} (n_ctx reported by the server)")
            log(f"  depth {tokens}: skipped ({point.skipped})")
            continue
        at_depth = replace(request, prompt=depth_prompt(request.prompt, point.filler_chars or 0))
        try:
            measured_runs(engine, at_depth, protocol.runs, record, log, label=f"Depth {tokens} run")
        except WorkloadInterrupted as e:
            if isinstance(e.cause, ServerUnreachable):
                raise WorkloadInterrupted(e.cause, records) from e.cause
            log(f"  depth {tokens}: FAILED: {e}")  # the error is in the record; the next depth is still measured
            continue
        check_cold(record, tokens)
    if all(r.depth is not None and r.depth.skipped for r in records):
        records[0].errors.append(
            f"no depth of [protocol.depth] depths = {list(settings.depths)} fits the model's context of {n_ctx} "
            "tokens; choose depths below it")
        log(f"  FAILED: {records[0].errors[-1]}")
    return records


def check_cold(record: AliasRecord, tokens: int) -> None:
    """Every run at a depth must have processed its whole prompt, by the server's own cache counter."""
    # a run that reused most of its prompt already has measured_runs' warning
    reused = [(i, r) for i, r in enumerate(record.runs, 1) if r.cache_n and not reused_prompt(r)]
    for i, run in reused:
        record.warnings.append(f"depth {tokens} run {i}: the server reused {run.cache_n} of {run.prompt_tokens} "
                               "prompt tokens from its cache although the prompt cache was off")
    if record.runs and all(r.cache_n is None for r in record.runs):
        record.warnings.append(f"depth {tokens}: the server reports no cache counter (cache_n / cached_tokens), so "
                               "that every prompt was processed whole is not confirmed")

