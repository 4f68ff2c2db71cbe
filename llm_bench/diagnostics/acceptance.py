"""The acceptance trap: a server that drafts and accepts (nearly) nothing, so speculative decoding only
costs time. Found in a measured record (llama.cpp's and vLLM's counters) and in vLLM's periodic
SpecDecoding log line; blamed on n-gram drafting or on a drafter, as the evidence says how the server
drafts."""

from __future__ import annotations

import re
from collections.abc import Callable

from llm_bench.diagnostics.findings import ERROR, Finding
from llm_bench.preset_args import drafts_from_context
from llm_bench.results import AliasRecord

# Below this acceptance rate a drafting server is rejecting (nearly) every draft token.
ACCEPTANCE_TRAP_RATE = 0.01


NGRAM_CAUSE = ("N-gram drafting proposes what repeats the context, and this output repeats little of it; it pays "
               "off where answers copy their context (code edits, agents' tool results).")
DTYPE_CAUSE = ("the target runs in a different dtype from the one the drafter was trained with "
               "(e.g. vLLM --dtype half instead of bfloat16); also check that the drafter belongs to this target model.")
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


def check_acceptance_trap(record: AliasRecord, log: Callable[[str], None]) -> None:
    """A drafting server that accepts (nearly) nothing: a warning on the record, and said at once."""
    spec = record.spec
    if spec is None or not spec.draft_tokens or (spec.acceptance_rate or 0.0) >= ACCEPTANCE_TRAP_RATE:
        return
    length = spec.mean_acceptance_length
    message = (
        f"ACCEPTANCE TRAP: the server drafted {spec.draft_tokens:.0f} tokens and accepted "
        f"{spec.accepted_tokens:.0f} ({spec.acceptance_rate:.1%}"
        + (f", mean acceptance length {length:.2f}" if length is not None else "")
        + "): speculative decoding only costs time here. "
        + trap_cause(drafts_from_context(record.preset_args))[0]
    )
    record.warnings.append(message)
    log("  !!! " + message)


def check_acceptance(record: AliasRecord) -> list[Finding]:
    """The workloads' acceptance-trap check, turned into a finding."""
    before = len(record.warnings)
    check_acceptance_trap(record, lambda message: None)
    fix = trap_cause(drafts_from_context(record.preset_args))[1]
    return [Finding("acceptance", ERROR, w.removeprefix("ACCEPTANCE TRAP: "), fix) for w in record.warnings[before:]]


# vllm/v1/spec_decode/metrics.py SpecDecodingLogging.log(): "SpecDecoding metrics: Mean acceptance length: %.2f,
# Accepted throughput: %.2f tokens/s, Drafted throughput: %.2f tokens/s, Accepted: %d tokens, Drafted: %d tokens, ..."
VLLM_SPEC_LOG = re.compile(r"Mean acceptance length: ([\d.]+), Accepted throughput: ([\d.]+) tokens/s, "
                           r"Drafted throughput: ([\d.]+) tokens/s(?:, Accepted: (\d+) tokens, Drafted: (\d+) tokens)?")
# vLLM's v0 engine: "SpecDecoding metrics: Draft acceptance rate: %.1f%%, Accepted: %d tokens, Drafted: %d tokens"
VLLM_SPEC_LOG_V0 = re.compile(r"SpecDecoding metrics: Draft acceptance rate: ([\d.]+)%, Accepted: (\d+) tokens, "
                              r"Drafted: (\d+) tokens")


def check_acceptance_log(log_text: str, source: str = "the server log",
                         drafts_from_context: bool | None = None) -> list[Finding]:
    """vLLM's periodic SpecDecoding line: drafting at a rate while accepting nothing is the trap.
    ``drafts_from_context``: how the server drafts, where its configuration says (the line does not)."""
    latest = None
    trapped = 0
    for line in log_text.splitlines():
        m = VLLM_SPEC_LOG.search(line)
        if m:
            length, drafted = float(m[1]), float(m[3])
            bad = drafted > 0 and length <= 1.01
        else:
            m = VLLM_SPEC_LOG_V0.search(line)
            if not m:
                continue
            bad = int(m[3]) > 0 and float(m[1]) < 1.0
        trapped += bad
        latest = (line.strip(), bad)
    if latest is None or not latest[1]:
        return []
    cause, fix = trap_cause(drafts_from_context)
    return [Finding(
        "acceptance-log", ERROR,
        f"vLLM drafts tokens and accepts none ({source}, latest of {trapped} such line(s): \"{latest[0][-300:]}\"). "
        + cause, fix)]
