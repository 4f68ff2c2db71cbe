"""The acceptance trap: a server that drafts and accepts (nearly) nothing, so speculative decoding only
costs time. Found in a measured record (llama.cpp's and vLLM's counters) and in vLLM's periodic
SpecDecoding log line; blamed on n-gram drafting or on a drafter, as the evidence says how the server
drafts."""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass

from llm_bench.diagnostics.findings import ERROR, INFO, Finding
from llm_bench.diagnostics.vllm_evidence import method_drafts_from_context
from llm_bench.engines.metrics import SpecCounters
from llm_bench.preset_args import drafts_from_context
from llm_bench.results import AliasRecord

# Below this acceptance rate a drafting server is rejecting (nearly) every draft token.
ACCEPTANCE_TRAP_RATE = 0.01


NGRAM_CAUSE = ("N-gram drafting proposes what repeats the context, and this output repeats little of it; it pays "
               "off where answers copy their context (code edits, agents' tool results).")
DTYPE_CAUSE = ("the target runs in a different dtype from the one the drafter was trained with (e.g. vLLM --dtype "
               "half instead of bfloat16: a drafter trained in bfloat16 overflows in float16, vLLM issue #55250); "
               "also check that the drafter belongs to this target model.")
EITHER_CAUSE = (f"Known causes: with a drafter (EAGLE, MTP, a draft model), {DTYPE_CAUSE} With n-gram or suffix "
                "drafting (no drafter), the output repeats little of its context.")
NGRAM_FIX = "turn n-gram drafting off for this workload, or measure it where outputs repeat their context"
DTYPE_FIX = ("serve the target in the dtype its drafter was trained with (bfloat16, not --dtype half), "
             "use a drafter made for this model, or turn speculative decoding off")
EITHER_FIX = f"{DTYPE_FIX}; for n-gram or suffix drafting: {NGRAM_FIX}"


def trap_cause(drafts_from_context: bool | None) -> tuple[str, str]:
    """What an acceptance trap is blamed on, and its fix: n-gram's cause, a drafter's, or both where the
    evidence does not say how the server drafts."""
    if drafts_from_context is None:
        return EITHER_CAUSE, EITHER_FIX
    return (NGRAM_CAUSE, NGRAM_FIX) if drafts_from_context else ("Known cause: " + DTYPE_CAUSE, DTYPE_FIX)


def record_drafts_from_context(record: AliasRecord, server: bool | None = None) -> bool | None:
    """How the record's server drafts: its preset arguments (llama.cpp), else what an OpenAI server said of itself
    (the record's speculation, whose first word is vLLM's method), else ``server`` (the doctor's evidence)."""
    if record.preset_args:
        return drafts_from_context(record.preset_args)
    method = (record.speculation or "").split(" ")[0]
    if method and method != "on":
        return method_drafts_from_context(method)
    return server


def check_acceptance_trap(record: AliasRecord, log: Callable[[str], None], server: bool | None = None) -> None:
    """A drafting server that accepts (nearly) nothing: a warning on the record, and said at once. ``server``:
    how the server drafts as other evidence says, where the record does not."""
    spec = record.spec
    if spec is None or not spec.draft_tokens or (spec.acceptance_rate or 0.0) >= ACCEPTANCE_TRAP_RATE:
        return
    length = spec.mean_acceptance_length
    message = (
        f"ACCEPTANCE TRAP: the server drafted {spec.draft_tokens:.0f} tokens and accepted "
        f"{spec.accepted_tokens:.0f} ({spec.acceptance_rate:.1%}"
        + (f", mean acceptance length {length:.2f}" if length is not None else "")
        + "): speculative decoding only costs time here. "
        + trap_cause(record_drafts_from_context(record, server))[0]
    )
    record.warnings.append(message)
    log("  !!! " + message)


def check_acceptance(record: AliasRecord, server: bool | None = None) -> list[Finding]:
    """The workloads' acceptance-trap check, turned into a finding (``server``: as check_acceptance_trap)."""
    before = len(record.warnings)
    check_acceptance_trap(record, lambda message: None, server)
    fix = trap_cause(record_drafts_from_context(record, server))[1]
    return [Finding("acceptance", ERROR, w.removeprefix("ACCEPTANCE TRAP: "), fix) for w in record.warnings[before:]]


# vllm/v1/spec_decode/metrics.py SpecDecodingLogging.log(): "SpecDecoding metrics: Mean acceptance length: %.2f,
# Accepted throughput: %.2f tokens/s, Drafted throughput: %.2f tokens/s, Accepted: %d tokens, Drafted: %d tokens, ..."
# Each line sums the drafts since the line before it: one logging interval (VLLM_LOG_STATS_INTERVAL, 10 s by
# default), logged at the first tick after the interval ends, and only where something was drafted.
VLLM_SPEC_LOG = re.compile(r"Mean acceptance length: ([\d.]+), Accepted throughput: ([\d.]+) tokens/s, "
                           r"Drafted throughput: ([\d.]+) tokens/s(?:, Accepted: (\d+) tokens, Drafted: (\d+) tokens)?")
# vLLM's v0 engine: "SpecDecoding metrics: Draft acceptance rate: %.1f%%, Accepted: %d tokens, Drafted: %d tokens"
VLLM_SPEC_LOG_V0 = re.compile(r"SpecDecoding metrics: Draft acceptance rate: ([\d.]+)%, Accepted: (\d+) tokens, "
                              r"Drafted: (\d+) tokens")
# vLLM's log prefix: "(APIServer pid=13671) INFO 12-07 17:30:01 [metrics.py:...]"
LOG_TIME = re.compile(r"\b(\d\d-\d\d \d\d:\d\d:\d\d)\b")
INTERVAL = "each covers one logging interval, VLLM_LOG_STATS_INTERVAL (10 s by default), logged after it ends"


@dataclass(frozen=True)
class SpecLogLine:
    text: str
    bad: bool  # drafted and accepted none
    accepted: int | None  # the line's counts, where it gives them
    drafted: int | None


def spec_log_lines(log_text: str) -> list[SpecLogLine]:
    lines = []
    for line in log_text.splitlines():
        m = VLLM_SPEC_LOG.search(line)
        if m:
            length, drafted = float(m[1]), float(m[3])
            bad = drafted > 0 and length <= 1.01
            counts = (int(m[4]), int(m[5])) if m[4] is not None else (None, None)
            lines.append(SpecLogLine(line.strip(), bad, *counts))
            continue
        m = VLLM_SPEC_LOG_V0.search(line)
        if m:
            bad = int(m[3]) > 0 and float(m[1]) < 1.0
            lines.append(SpecLogLine(line.strip(), bad, int(m[2]), int(m[3])))
    return lines


def _window(lines: list[SpecLogLine]) -> str:
    times = [m[1] for m in (LOG_TIME.search(line.text) for line in lines) if m]
    when = f", logged {times[0]} to {times[-1]}" if len(times) > 1 else (f", logged {times[0]}" if times else "")
    return f"{len(lines)} SpecDecoding line(s){when}; {INTERVAL}"


def _sums(lines: list[SpecLogLine]) -> tuple[int, int] | None:
    if any(line.accepted is None or line.drafted is None for line in lines):
        return None
    return sum(line.accepted or 0 for line in lines), sum(line.drafted or 0 for line in lines)


def check_acceptance_log(log_text: str, source: str = "the server log", drafts_from_context: bool | None = None,
                         counters: SpecCounters | None = None, span: str = "") -> list[Finding]:
    """vLLM's periodic SpecDecoding lines: drafting while accepting nothing is the trap.
    ``drafts_from_context``: how the server drafts, where its configuration says (the line does not).
    ``counters``: the /metrics counters of the same requests (a run's), which outrank the lines: the lines'
    intervals need not match the requests, so where the two disagree the finding says so and why, and only the
    counters can raise the trap. ``span``: which part of the log was read (a run's part, the whole log)."""
    lines = spec_log_lines(log_text)
    if not lines:
        return []
    sums = _sums(lines)
    window = _window(lines) + (f"; {span}" if span else "")
    if counters is not None and counters.draft_tokens:
        rate = counters.acceptance_rate or 0.0
        # the same span on both sides: the lines' sums where they give counts
        log_trapped = (sums[1] > 0 and sums[0] == 0) if sums else lines[-1].bad
        said = (f"{sums[0]} of {sums[1]} drafted tokens accepted" if sums
                else f"latest \"{_quote(lines[-1].text)}\"")
        metrics = (f"the run's /metrics counters (its measured requests only): {counters.accepted_tokens:.0f} of "
                   f"{counters.draft_tokens:.0f} drafted tokens accepted ({rate:.1%})")
        if log_trapped == (rate < ACCEPTANCE_TRAP_RATE):
            return []  # they agree: the trap, if any, is the record's own warning, from the counters
        return [Finding(
            "acceptance-log", INFO,
            f"vLLM's SpecDecoding lines in {source} and /metrics disagree: the lines say {said} ({window}), "
            f"{metrics}. The lines' intervals began before and end after the run's requests (warm-up, other "
            "clients, an interval not yet logged), the counters cover exactly the run's requests: the counters are "
            "the run's figure.",
            "nothing to fix; to compare the two, read the lines logged while only this run's requests were served")]
    if not lines[-1].bad:  # the latest line decides: a server that recovered is not trapped
        return []
    trapped = sum(line.bad for line in lines)
    total = f"; all {len(lines)} together: {sums[0]} of {sums[1]} drafted tokens accepted" if sums else ""
    cause, fix = trap_cause(drafts_from_context)
    return [Finding(
        "acceptance-log", ERROR,
        f"vLLM drafts tokens and accepts none ({source}, latest of {trapped} such line(s): "
        f"\"{_quote(lines[-1].text)}\"{total}; {window}). " + cause, fix)]


def _quote(line: str, limit: int = 600) -> str:
    """A log line as it is, from its first character; cut only at the end, and said to be cut."""
    return line if len(line) <= limit else line[:limit] + "... (cut)"
