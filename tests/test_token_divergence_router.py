"""Token distributions teacher-forced through a real llama.cpp router serving SmolLM2-135M: what the
server returns, checked against its own accounting (one prompt token evaluated per request, the full
distribution it reports), and each bad input named. The measured check of the method (KV q8_0 and
q4_0 in that order of KL divergence, separated from each other and from zero; a self-drafting preset
lossless) runs through the quality workload in tests/test_quality_verdicts_router.py."""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from llm_bench.demo import smollm2_presets
from llm_bench.engines import LlamaCppEngine
from llm_bench.engines.client import OpenAIClient
from llm_bench.engines.completion import CompletionRequest
from llm_bench.engines.logprobs import (
    LlamaServerLogprobs,
    MissingLogprobs,
    TeacherForced,
    TextTooLong,
    TokenizerDiffers,
    check_tokenisation,
    teacher_force,
)
from llm_bench.quality.divergence import position_kld
from llm_bench.testbed.presets import render_presets_ini
from llm_bench.testbed.router import RouterProcess, start_router
from llm_bench.testbed.tiny_gguf import TinyModelSpec, write_tiny_model

PLAIN, Q4, SHORT, TINY = "smol-plain", "smol-kv-q4", "smol-short", "tiny"
K = 20
SMOLLM2_VOCAB = 49152
# The reference text: SmolLM2's greedy answers to these, after the chat template (up to 288 scored tokens; with
# their prompts more than the short preset's context of 256).
PROMPTS = ("Write a Python function that checks whether a number is prime, and explain how it works.",
           "Explain in a few paragraphs why the sky is blue.",
           "Describe how a bicycle works, part by part.")
ANSWER_TOKENS = 96


@pytest.fixture(scope="module")
def bed(llama_server_bin: Path, smollm2: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[RouterProcess]:
    folder = tmp_path_factory.mktemp("divergence")
    tiny = write_tiny_model(folder / "tiny.gguf", TinyModelSpec(seed=1, name="tiny"))
    demo = smollm2_presets(smollm2, drafter=smollm2)
    presets = {"*": demo["*"], **{name: demo[name] for name in (PLAIN, Q4)},
               SHORT: {"model": str(smollm2), "ctx-size": 128}, TINY: {"model": str(tiny)}}
    ini = folder / "presets.ini"
    ini.write_text(render_presets_ini(presets))
    router = start_router(llama_server_bin, ini, log_path=folder / "router.log")
    yield router
    router.stop()


@pytest.fixture(scope="module")
def source(bed: RouterProcess) -> Iterator[LlamaServerLogprobs]:
    with OpenAIClient(bed.url, timeout=300) as client:
        yield LlamaServerLogprobs(client)


@dataclass(frozen=True)
class Text:
    text: str
    ids: list[int]
    first: int  # the first token of the answer


@pytest.fixture(scope="module")
def texts(bed: RouterProcess, source: LlamaServerLogprobs) -> list[Text]:
    """The plain preset's greedy answers, each after its chat-templated prompt; only the answer is scored."""
    engine = LlamaCppEngine(bed.url, timeout=300)
    found = []
    try:
        for prompt in PROMPTS:
            answer = engine.complete(CompletionRequest.of(PLAIN, prompt, ANSWER_TOKENS)).text
            templated = source.client.post_json("/apply-template", {
                "model": PLAIN, "messages": [{"role": "user", "content": prompt}]})["prompt"]
            ids = source.tokenize(PLAIN, templated + answer)
            first = len(source.tokenize(PLAIN, templated))
            assert ids[:first] == source.tokenize(PLAIN, templated)
            found.append(Text(templated + answer, ids, first))
    finally:
        engine.close()
    return found


def forced(source: LlamaServerLogprobs, model: str, texts: list[Text], k: int = K) -> list[TeacherForced]:
    return [teacher_force(source, model, t.ids, t.first, k) for t in texts]


@pytest.fixture(scope="module")
def reference(source: LlamaServerLogprobs, texts: list[Text]) -> list[TeacherForced]:
    return forced(source, PLAIN, texts)


def pooled(runs: list[TeacherForced]) -> list[dict[int, float]]:
    return [top for run in runs for top in run.top]


def test_each_request_evaluates_one_new_token_and_lists_k_pre_sampling_log_probabilities(
        reference: list[TeacherForced]) -> None:
    for run in reference:
        assert run.processed is not None
        assert set(run.processed[1:]) == {1}  # timings.prompt_n: the prompt cache served the rest
        assert all(len(top) == K for top in run.top)
    tops = [max(math.exp(lp) for lp in top.values()) for top in pooled(reference)]
    # before sampling: a greedy request's post-sampling list would be a single token at probability 1
    assert sum(p < 0.99 for p in tops) > len(tops) / 4
    assert all(sum(math.exp(lp) for lp in top.values()) <= 1.0 + 1e-4 for top in pooled(reference))


def test_the_top_k_divergence_is_close_to_the_full_vocabulary_divergence_the_server_reports(
        source: LlamaServerLogprobs, texts: list[Text]) -> None:
    """At 4 positions, both presets' complete distributions (n_probs = the vocabulary, about 1 s a position
    here): the divergence over the top 20 and the rest-bucket is within 15 % of the exact one (measured: 0.98 of
    it over the first 4, 6, 8 and 12)."""
    text = texts[0]
    window = text.ids[: text.first + 4]
    full_ref = teacher_force(source, PLAIN, window, text.first, SMOLLM2_VOCAB).top
    full_q4 = teacher_force(source, Q4, window, text.first, SMOLLM2_VOCAB).top
    exact, estimated = [], []
    for ref, cfg in zip(full_ref, full_q4):
        assert sum(math.exp(lp) for lp in ref.values()) == pytest.approx(1.0, abs=1e-3)
        p = {t: math.exp(lp) for t, lp in ref.items()}
        exact.append(sum(pt * (ref[t] - cfg[t]) for t, pt in p.items() if pt > 0))
        top = lambda d: dict(sorted(d.items(), key=lambda e: -e[1])[:K])  # noqa: E731
        estimated.append(position_kld(top(ref), top(cfg)))
    assert sum(estimated) == pytest.approx(sum(exact), rel=0.15)


def test_a_text_longer_than_the_context_is_named_before_any_request(source: LlamaServerLogprobs,
                                                                     texts: list[Text]) -> None:
    ids = [t for text in texts for t in text.ids]
    # ctx-size 128, which llama.cpp rounds up to a multiple of 256
    with pytest.raises(TextTooLong, match=rf"{len(ids)} tokens.*'smol-short'.*server reports 256"):
        teacher_force(source, SHORT, ids, 1, K)


def test_another_models_tokeniser_is_named(source: LlamaServerLogprobs, texts: list[Text]) -> None:
    with pytest.raises(TokenizerDiffers, match="'tiny' tokenises the reference text differently from 'smol-plain'"):
        check_tokenisation(source, TINY, texts[0].text, PLAIN, texts[0].ids)
    check_tokenisation(source, Q4, texts[0].text, PLAIN, texts[0].ids)  # same model, same tokens


def test_fewer_log_probabilities_than_asked_are_named(source: LlamaServerLogprobs) -> None:
    ids = source.tokenize(TINY, "a short text for the tiny model")
    with pytest.raises(MissingLogprobs, match=r"'tiny', position 1: the server listed \d+ log-probabilities where 300"):
        teacher_force(source, TINY, ids, 1, 300)  # its byte-level vocabulary has fewer than 300 tokens
