"""The quality workload's measurements with statistical power: the configuration's top-k next-token
log-probabilities over the reference text (teacher-forced through the server, ``engines.logprobs``),
and its answers to the generated exact-answer items (``quality.exact_items``). Both are compared
with the reference configuration's at report time (``score.py``).

The reference text is made once, by the first configuration measured: its greedy answers to the
shipped ``[[divergence]]`` prompts after its chat template (or the user's own file, ``text_file``).
The runner hands it on to every later configuration through ``carry_reference``, so all of them are
forced over the same text, token for token.
"""

from __future__ import annotations

import time
import tomllib
from collections.abc import Sequence
from dataclasses import replace
from importlib import resources
from pathlib import Path

from llm_bench.engines import Engine
from llm_bench.engines.completion import CompletionRequest
from llm_bench.engines.errors import ServerError, ServerUnreachable
from llm_bench.engines.logprobs import (
    LogprobSource,
    MissingLogprobs,
    TeacherForcingError,
    check_same_tokens,
    teacher_force,
)
from llm_bench.quality.exact_items import generate_items, is_correct
from llm_bench.results import AliasRecord
from llm_bench.workloads.quality.record import ExactAnswer, ForcedText, QualityResults, quality_results
from llm_bench.workloads.quality.settings import QualitySettings, ReferenceText

EXACT_MAX_TOKENS = 16


def divergence_prompts() -> list[tuple[str, str]]:
    data = tomllib.loads((resources.files("llm_bench") / "prompts" / "quality.toml").read_text())
    return [(d["id"], d["prompt"]) for d in data["divergence"]]


def make_reference(engine: Engine, source: LogprobSource, alias: str, settings: QualitySettings,
                   seed: int) -> tuple[ReferenceText, ...]:
    """The reference text, made by this configuration."""
    if settings.text_file is not None:
        text = Path(settings.text_file).read_text()
        return (ReferenceText(Path(settings.text_file).name, text, "", tuple(source.tokenize(alias, text)), alias),)
    made = []
    for segment, prompt in divergence_prompts():
        templated = source.template(alias, prompt)  # first: a server without the route fails before it generates
        answer = engine.complete(CompletionRequest.of(alias, prompt, settings.text_tokens, seed)).text
        made.append(ReferenceText(segment, templated + answer, templated,
                                  tuple(source.tokenize(alias, templated + answer)), alias))
    return tuple(made)


def force(source: LogprobSource, alias: str, reference: Sequence[ReferenceText], k: int) -> list[ForcedText]:
    """The configuration's top-k at every scored position of each segment; a bad input raises the
    ``TeacherForcingError`` that names it."""
    forced = []
    for ref in reference:
        ids = source.tokenize(alias, ref.text)
        if len(ids) < 2:
            raise MissingLogprobs(f"{alias!r}: the server tokenised the text into {len(ids)} token(s), so there "
                                  "is no position to ask log-probabilities for; is its /tokenize route the "
                                  "one this engine expects?")
        check_same_tokens(ref.made_by, ref.token_ids, alias, ids)
        first = max(1, len(source.tokenize(alias, ref.prompt))) if ref.prompt else 1
        got = teacher_force(source, alias, ids, first, k)
        ranked = [sorted(top.items(), key=lambda e: -e[1]) for top in got.top]
        forced.append(ForcedText(ref.segment, ref.text, ref.prompt, got.first, list(ids),
                                 [[t for t, _ in r] for r in ranked], [[lp for _, lp in r] for r in ranked]))
    return forced


def measure_distributions(engine: Engine, alias: str, settings: QualitySettings, seed: int,
                          results: QualityResults) -> str:
    """Fills the results' ``forced`` (or names why not in ``forced_error``); returns a line for the log."""
    source = engine.logprobs() if engine.capabilities.top_logprobs else None
    if source is None:
        results.forced_error = (f"the {engine.kind} engine cannot list the top-k log-probabilities of a given "
                                "text's tokens, so its token distributions were not compared")
        return f"token distributions: NOT SCORED: {results.forced_error}"
    started = time.perf_counter()
    try:
        reference = settings.reference_text or make_reference(engine, source, alias, settings, seed)
        results.top_k = settings.top_k
        results.forced = force(source, alias, reference, settings.top_k)
    except TeacherForcingError as e:
        results.forced, results.forced_error = [], str(e)
        return f"token distributions: NOT SCORED: {e}"
    except ServerUnreachable:
        raise
    except ServerError as e:  # e.g. a server without the tokenise or template route: the rest of the record stays
        results.forced, results.forced_error = [], f"a request for log-probabilities failed: {e}"
        return f"token distributions: NOT SCORED: {results.forced_error}"
    results.forced_seconds = time.perf_counter() - started
    positions = sum(len(f.top_ids) for f in results.forced)
    return (f"token distributions: top {settings.top_k} at {positions} positions in {results.forced_seconds:.1f} s"
            + ("" if settings.reference_text else " (this configuration made the reference text)"))


def carry_reference(settings: QualitySettings, records: Sequence[AliasRecord]) -> QualitySettings:
    """The settings for the configurations measured after ``records``: the reference text once one of
    them has been forced over it (the first such configuration's text stays the reference)."""
    if settings.reference_text:
        return settings
    made = next(((r.alias, forced) for r in records if (forced := quality_results(r).forced)), None)
    if made is None:
        return settings
    alias, forced = made
    return replace(settings, reference_text=tuple(
        ReferenceText(f.segment, f.text, f.prompt, tuple(f.token_ids), alias) for f in forced))


def measure_exact_items(engine: Engine, alias: str, settings: QualitySettings, seed: int,
                        results: QualityResults) -> str:
    items = generate_items(seed=seed, per_cell=settings.exact_items_per_kind, difficulties=settings.exact_difficulties)
    for item in items:
        answer = engine.complete(CompletionRequest(alias, item.messages(), EXACT_MAX_TOKENS, seed)).text
        results.exact_answers.append(ExactAnswer(item.id, answer, is_correct(item, answer)))
    return f"exact-answer items: {sum(a.correct for a in results.exact_answers)}/{len(items)} right"
