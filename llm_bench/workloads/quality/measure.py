"""Quality beside speed: the shipped quality set (``llm_bench/prompts/quality.toml``), sent greedily.

Every request is greedy (temperature 0, the plan's seed), with the prompt cache off, and ends where
the model ends (no ignore_eos). The record keeps what was answered; scoring that needs no other
configuration (exact answers, recall) happens here, agreement with a reference configuration at
report time (``llm_bench.workloads.quality.score``).
"""

from __future__ import annotations

import re
import tomllib
from dataclasses import dataclass
from importlib import resources
from typing import Any

from llm_bench.engines import Engine
from llm_bench.engines.completion import CompletionRequest
from llm_bench.engines.errors import ServerError
from llm_bench.results import AliasRecord
from llm_bench.support.progress import Steps
from llm_bench.tables import Cell
from llm_bench.workloads.base import Flag, Keep, Log, MainColumn, RunParameters, Workload
from llm_bench.workloads.common import derive
from llm_bench.workloads.quality.forced import (
    carry_reference,
    measure_distributions,
    measure_exact_items,
)
from llm_bench.workloads.quality.record import (
    QUALITY_RECORDS,
    QualityOutput,
    QualityResults,
    QuestionResult,
    RecallProbe,
)
from llm_bench.workloads.quality.score import (
    quality_cells,
    quality_marks,
    quality_summary,
    quality_tables,
)
from llm_bench.workloads.quality.settings import QualitySettings

QUESTION_MAX_TOKENS = 16
RECALL_MAX_TOKENS = 24
# Tokens of a recall prompt besides the filler (needle, question, chat template) and of its answer:
# a length is skipped when filler + this does not fit the model's context.
RECALL_OVERHEAD_TOKENS = 96


@dataclass(frozen=True)
class AgreementPrompt:
    id: str
    prompt: str
    max_tokens: int


@dataclass(frozen=True)
class Question:
    id: str
    kind: str
    prompt: str
    answer: str


@dataclass(frozen=True)
class RecallSet:
    needle: str  # with {code}
    question: str
    codes: tuple[str, ...]
    filler: str


@dataclass(frozen=True)
class QualitySet:
    agreement: tuple[AgreementPrompt, ...]
    questions: tuple[Question, ...]
    answer_system: str
    answer_examples: tuple[tuple[str, str], ...]
    recall: RecallSet


def load_quality_set(name: str = "quality") -> QualitySet:
    data: dict[str, Any] = tomllib.loads((resources.files("llm_bench") / "prompts" / f"{name}.toml").read_text())
    fmt = data.get("answer_format", {})
    recall = data["recall"]
    return QualitySet(
        agreement=tuple(AgreementPrompt(a["id"], a["prompt"], int(a["max_tokens"])) for a in data["agreement"]),
        questions=tuple(Question(q["id"], q["kind"], q["prompt"], str(q["answer"])) for q in data["questions"]),
        answer_system=fmt.get("system", ""),
        answer_examples=tuple((q, a) for q, a in fmt.get("examples", [])),
        recall=RecallSet(recall["needle"], recall["question"], tuple(recall["codes"]), recall["filler"]),
    )


def trim_answer(text: str) -> str:
    """Whitespace, wrapping quotes or backticks and one final full stop go; nothing else is forgiven."""
    text = text.strip()
    for _ in range(2):
        text = text.strip("`").strip()
        if len(text) >= 2 and text[0] == text[-1] and text[0] in "\"'":
            text = text[1:-1].strip()
    return text[:-1].rstrip() if text.endswith(".") else text


def is_correct(answer: str, expected: str) -> bool:
    return trim_answer(answer) == expected


def code_found(answer: str, code: str) -> bool:
    """The code appears as a whole number: "2533" counts, "253." or "25334" does not."""
    return re.search(rf"(?<!\d){re.escape(code)}(?!\d)", answer) is not None


def recall_prompt(recall: RecallSet, filler_chars: int, depth: float, code: str) -> str:
    """Filler of about ``filler_chars`` characters with the needle at ``depth``, then the question.

    The needle goes in at the sentence boundary nearest below the depth, so it is never spliced into a word."""
    text = ""
    while len(text) < filler_chars:
        text += recall.filler + "\n\n"
    text = text[:filler_chars]
    at = int(len(text) * depth)
    boundary = text.rfind(". ", 0, at)
    at = boundary + 2 if boundary >= 0 and at > 0 else 0
    needle = recall.needle.format(code=code)
    return f"{text[:at]}{needle} {text[at:]}\n\n{recall.question}"


def question_request(alias: str, qset: QualitySet, question: Question, seed: int,
                     thinking: str = "server") -> CompletionRequest:
    messages: list[tuple[str, str]] = [("system", qset.answer_system)] if qset.answer_system else []
    for asked, answered in qset.answer_examples:
        messages += [("user", asked), ("assistant", answered)]
    messages.append(("user", question.prompt))
    return CompletionRequest(alias, tuple(messages), QUESTION_MAX_TOKENS, seed, thinking)


def quality(engine: Engine, alias: str, protocol: RunParameters, base: AliasRecord, log: Log, keep: Keep) -> None:
    qset = load_quality_set()
    settings = QUALITY.settings_in(protocol)
    results = QualityResults()
    record = derive(base, workload=QUALITY.record_name, cold_load_s=None, part=results)
    seed = protocol.seed
    probes = len(settings.recall_lengths) * len(settings.recall_depths)

    # its requests take minutes on a slow machine: a live bar on a terminal, a line per request otherwise
    with Steps("Quality", len(qset.agreement) + len(qset.questions) + probes, log) as steps:
        for item in qset.agreement:
            steps.step(f"agreement {item.id}")
            max_tokens = min(item.max_tokens, settings.max_tokens or item.max_tokens)
            answer = engine.complete(CompletionRequest.of(alias, item.prompt, max_tokens, seed, protocol.thinking))
            results.outputs.append(QualityOutput(item.id, answer.text, answer.output_tokens, answer.token_ids,
                                                 answer.finish_reason))
        with_ids = all(o.token_ids is not None for o in results.outputs)
        results.comparison = "tokens" if with_ids and results.outputs else "characters"

        for question in qset.questions:
            steps.step(f"question {question.id}")
            answer = engine.complete(question_request(alias, qset, question, seed, protocol.thinking))
            results.questions.append(QuestionResult(question.id, question.kind, question.answer, answer.text,
                                                    is_correct(answer.text, question.answer)))

        results.recall = recall_probes(engine, alias, settings, seed, qset.recall, record, steps,
                                       protocol.thinking)
    log("  " + describe_quality(results))
    if settings.top_k:
        log("  " + measure_distributions(engine, alias, settings, seed, results))
    if settings.exact_items_per_kind:
        log("  " + measure_exact_items(engine, alias, settings, seed, results))
    keep(record)


def recall_probes(engine: Engine, alias: str, settings: QualitySettings, seed: int, recall: RecallSet,
                  record: AliasRecord, steps: Steps, thinking: str = "server") -> list[RecallProbe]:
    log = steps.log
    n_ctx = engine.context_length(alias)
    probes = []
    n = 0
    for length in settings.recall_lengths:
        for depth in settings.recall_depths:
            code = recall.codes[n % len(recall.codes)]
            n += 1
            probe = RecallProbe(length_tokens=length, depth=depth, expected=code)
            probes.append(probe)
            steps.step(f"recall {length} tokens at depth {depth:g}")
            if n_ctx is not None and length + RECALL_OVERHEAD_TOKENS > n_ctx:
                probe.skipped = (f"{length} tokens of filler do not fit the model's context of {n_ctx} tokens "
                                 "(n_ctx reported by the server)")
                continue
            prompt = recall_prompt(recall, int(length * settings.chars_per_token), depth, code)
            try:
                answer = engine.complete(CompletionRequest.of(alias, prompt, RECALL_MAX_TOKENS, seed, thinking))
            except ServerError as e:  # e.g. a context the server could not report but refuses
                probe.skipped = f"the server refused it: {e}"
                record.errors.append(f"recall {length} tokens at depth {depth:g}: {e}")
                log(f"  recall {length} tokens at depth {depth:g}: FAILED: {e}")
                continue
            probe.prompt_tokens = answer.prompt_tokens
            probe.answer = answer.text
            probe.found = code_found(answer.text, code)
    skipped = sorted({p.length_tokens for p in probes if p.skipped and p.found is None})
    if skipped:
        log(f"  recall: skipped {', '.join(map(str, skipped))} tokens (beyond the model's context of {n_ctx})")
    return probes


def describe_quality(results: QualityResults) -> str:
    parts = [f"quality: {len(results.outputs)} greedy answers ({results.comparison} kept)"]
    if results.questions:
        parts.append(f"exact answers {sum(q.correct for q in results.questions)}/{len(results.questions)}")
    for length in dict.fromkeys(p.length_tokens for p in results.recall):
        found = [p.found for p in results.recall if p.length_tokens == length and p.found is not None]
        parts.append(f"recall {length} tok " + (f"{sum(found)}/{len(found)}" if found else "skipped"))
    return ", ".join(parts)


QUALITY: Workload[QualitySettings] = Workload(
    "quality", QualitySettings, quality, record=QUALITY_RECORDS, part=QualityResults,
    legacy={"recall_lengths": "recall_lengths", "recall_depths": "recall_depths", "quality_max_tokens": "max_tokens",
            "prefix_chars_per_token": "chars_per_token"},
    flags=(Flag("--quality-text", "text_file", "A text file (e.g. code of your own) whose token distributions "
                "the quality workload compares, instead of the first configuration's answers", example="src/main.py"),),
    carry=carry_reference, last=True, tables=quality_tables, column=MainColumn("Quality", quality_cells, Cell("-", {"agreement": None})),
    marks=quality_marks, summary=quality_summary)
