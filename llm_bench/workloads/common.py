"""What every workload shares: turning a streamed answer into a run record, the checks on each run,
and the measured-runs loop with its hyperfine-style summary."""

from __future__ import annotations

import copy
import uuid
from dataclasses import replace

from llm_bench.diagnostics.acceptance import check_acceptance_trap
from llm_bench.engines import Engine
from llm_bench.engines.errors import ServerError
from llm_bench.engines.metrics import SpecCounters
from llm_bench.engines.stream import ChatRequest
from llm_bench.gpu.telemetry import recording
from llm_bench.prompts import shipped_prompt
from llm_bench.results import AliasRecord, RunRecord, run_record, spec_from_runs
from llm_bench.support import numbers
from llm_bench.support.stats import relative_precision
from llm_bench.workloads.base import Keep, Log, RunParameters


def derive(base: AliasRecord, **changes) -> AliasRecord:
    """A fresh record carrying the base's provenance; nothing mutable is shared."""
    return replace(copy.deepcopy(base), **changes)


# A run whose server reused more than this share of the prompt from its cache timed a cache hit.
REUSED_PROMPT_SHARE = 0.5


class WorkloadInterrupted(Exception):
    """A workload stopped on a server error (``cause``). What it measured before is already kept: every
    record goes to the workload's ``keep`` (base.Keep) as it finishes or is cut short, never up inside
    this exception."""

    def __init__(self, cause: Exception):
        super().__init__(str(cause))
        self.cause = cause


def chat_request(alias: str, protocol: RunParameters, prompt: str, max_tokens: int | None = None,
                 prompt_cache: bool | None = None) -> ChatRequest:
    """``prompt_cache`` None: as the protocol says (by default every prompt is processed whole)."""
    return ChatRequest(alias, prompt, max_tokens or protocol.max_tokens, protocol.temperature, protocol.seed,
                       prompt_cache=protocol.prompt_cache if prompt_cache is None else prompt_cache,
                       thinking=protocol.thinking)


def reused_prompt(run: RunRecord) -> bool:
    """The server served most of this run's prompt from its cache (its own count, cache_n/cached_tokens)."""
    return bool(run.cache_n and run.prompt_tokens and run.cache_n > REUSED_PROMPT_SHARE * run.prompt_tokens)


PROMPT_CACHE_NOTE = "prompt cache on (asked for): TTFT and prompt t/s time the server's cache hits"


# What marks the cold-prompt warning, so a later run updates it instead of adding another.
COLD_REUSE = "from its cache although cold prompts were asked for"


def check_prompt_reuse(record: AliasRecord, request: ChatRequest) -> None:
    """Runs that timed a cache hit say so in the record (and so in the table's Notes), once however many did:
    a warning with their count when cold prompts were asked for, a note when the cache was."""
    reused = [run for run in record.runs if reused_prompt(run)]
    if not reused:
        return
    if request.prompt_cache:
        if PROMPT_CACHE_NOTE not in record.warnings:
            record.warnings.append(PROMPT_CACHE_NOTE)
        return
    most = max(reused, key=lambda run: run.cache_n or 0)
    record.warnings[:] = [w for w in record.warnings if COLD_REUSE not in w]
    record.warnings.append(
        f"{len(reused)} of {len(record.runs)} measured requests: the server reused up to {most.cache_n} of "
        f"{most.prompt_tokens} prompt tokens {COLD_REUSE}, so their TTFT and prompt t/s time a cache hit "
        "(does the server ignore cache_prompt / cache_salt?)")


def check_thinking(record: AliasRecord, thinking: str, runs: list[RunRecord], log: Log) -> None:
    """What the server did with the protocol's ``thinking`` shows in the answers: thinking asked for and
    no reasoning in any answer (or the reverse) means the server or its chat template ignored the request."""
    if thinking == "server" or not runs:
        return
    thought = [r for r in runs if r.reasoning_tokens]
    if thinking == "on" and not thought:
        message = ("thinking = \"on\" was asked (protocol setting thinking) but no answer carried any reasoning: "
                   "the server ignored chat_template_kwargs.enable_thinking (llama-server needs --jinja, a chat "
                   "template that opens a think block, and a --reasoning-format other than none)")
    elif thinking == "off" and thought:
        message = (f"thinking = \"off\" was asked (protocol setting thinking) but {len(thought)} of {len(runs)} "
                   "answers carried reasoning: the server ignored chat_template_kwargs.enable_thinking = false, "
                   "so these runs' output tokens include reasoning")
    else:
        return
    if message not in record.warnings:
        record.warnings.append(message)
        log("  !!! " + message)


def fmt(value: float | None) -> str:
    return numbers.fmt(value, missing="n/a")


def describe_run(run: RunRecord) -> str:
    text = (f"{fmt(run.decode_tps)} t/s decode, {fmt(run.client_decode_tps)} t/s client, "
            f"TTFT {fmt(run.ttft_ms)} ms, {run.output_tokens} tokens")
    if run.cache_n:
        text += f", {run.cache_n} of {run.prompt_tokens} prompt tokens from cache"
    if run.draft_n:
        text += f", drafted {run.draft_n} accepted {run.draft_n_accepted}"
    if run.reasoning_tokens:
        text += (f", {run.reasoning_tokens} reasoning tokens ({run.reasoning_source}), "
                 f"first answer token at {fmt(run.first_answer_ms)} ms")
    return text


def spec_delta(before: SpecCounters | None, after: SpecCounters | None,
               runs: list[RunRecord]) -> SpecCounters | None:
    """Drafting during the runs: the server's counters grew by this much where it has counters
    (vLLM's /metrics), else the runs' own timings (llama.cpp)."""
    return after.minus(before) if before and after else spec_from_runs(runs)


def check_length(record: AliasRecord, run: RunRecord, wanted: int) -> None:
    if run.finish_reason != "length":
        record.comparable = False
        record.not_comparable_reason = (
            f"a run stopped on {run.finish_reason!r} after {run.output_tokens} tokens instead of generating "
            f"all {wanted}: the server did not honour ignore_eos"
        )


def measured_runs(engine: Engine, request: ChatRequest, runs: int, record: AliasRecord, log: Log, keep: Keep,
                  label: str = "Run", precision: float | None = None, max_runs: int | None = None) -> None:
    """``runs`` requests one after another into ``record``; with a ``precision``, more (up to ``max_runs``)
    until the median decode rate is known that well (``precision_reached``). Cut short, by a server error
    (then WorkloadInterrupted) or Ctrl-C (marked interrupted, the KeyboardInterrupt goes on), the record is
    kept with the runs finished so far beside the error; a finished record the caller keeps."""
    cap = runs if precision is None else max(runs, max_runs or runs)
    shown = str(runs) if precision is None else f"{runs}..{cap}"
    try:
        _runs(engine, request, runs, cap, shown, record, log, label, precision)
    except KeyboardInterrupt:
        record.errors.append(f"interrupted (Ctrl-C) with {len(record.runs)} of {shown} {label.lower()}s finished")
        record.spec = spec_from_runs(record.runs)
        keep(record)
        raise
    except WorkloadInterrupted:
        keep(record)
        raise


def _runs(engine: Engine, request: ChatRequest, runs: int, cap: int, shown: str, record: AliasRecord, log: Log,
          label: str, precision: float | None) -> None:
    before = engine.spec_counters(request.model)
    with recording(record):
        for i in range(cap):
            try:
                run = run_record(engine.stream(request), engine)
            except ServerError as e:
                record.errors.append(f"{label.lower()} {i + 1} of {shown} failed ({i} finished): {e}")
                record.spec = spec_from_runs(record.runs)
                raise WorkloadInterrupted(e) from e
            record.runs.append(run)
            log(f"  {label} {i + 1}/{shown}: {describe_run(run)}")
            check_length(record, run, request.max_tokens)
            check_prompt_reuse(record, request)
            if precision is not None and i + 1 >= runs and precision_met(record, precision, i + 1 == cap, log):
                break
    after = engine.spec_counters(request.model)
    record.spec = spec_delta(before, after, record.runs)
    log("  " + describe_summary(record))
    check_acceptance_trap(record, log)
    check_thinking(record, request.thinking, record.runs, log)


def precision_met(record: AliasRecord, precision: float, last: bool, log: Log) -> bool:
    """The stopping rule of adaptive run counts: records the precision reached so far and whether the
    target was met ("precision") or the cap was reached first ("max_runs")."""
    values = [r.decode_tps if r.decode_tps is not None else r.client_decode_tps for r in record.runs]
    reached = relative_precision(values)
    record.precision_target = precision
    record.precision_reached = reached
    met = reached is not None and reached <= precision
    if met or last:
        record.stopped_by = "precision" if met else "max_runs"
        known = "not yet estimable" if reached is None else f"±{reached:.2%}"
        log(f"  Precision of the median decode rate: {known} after {len(record.runs)} runs (target ±{precision:.2%})"
            + ("" if met else ": stopped at the cap (max_runs)"))
    return met


def describe_summary(record: AliasRecord) -> str:
    """hyperfine-style: the median, then the spread, of what the table will show."""
    decode, ttft = record.summary("decode_tps"), record.summary("ttft_ms")
    if decode is None:
        return "no decode rate measured"
    text = f"Decode: {decode.median:.1f} t/s median [min {decode.min:.1f}, max {decode.max:.1f}]"
    if ttft is not None:
        text += f", TTFT {ttft.median:.0f} ms median [min {ttft.min:.0f}, max {ttft.max:.0f}]"
    if record.spec is not None and record.spec.acceptance_rate is not None:
        text += f", draft acceptance {record.spec.acceptance_rate:.1%}"
    return text


SUMMARY = "Summarise the document above in three sentences."  # what a long prompt asks after its document


def long_prompt(target_tokens: int, chars_per_token: float) -> str:
    """A long document with a unique first line, so its first sending cannot hit any cache."""
    base = shipped_prompt("prose")
    nonce = f"Reference document {uuid.uuid4()}.\n\n"
    wanted = int(target_tokens * chars_per_token)
    parts = [nonce]
    n = 1
    while sum(map(len, parts)) < wanted:
        parts.append(f"Section {n}. {base}\n")
        n += 1
    return "".join(parts)[:wanted] + "\n\n" + SUMMARY
