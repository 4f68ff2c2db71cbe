"""Teacher forcing through vLLM's prompt_logprobs, against a double that follows vLLM's API with known true
values (the real vLLM 0.32 answers it in tests/test_vllm_real.py): every position from one request, the top k
kept and the prompt's own token left out when it ranks lower, and each way a comparison cannot be made
named."""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import pytest

from llm_bench.engines.client import OpenAIClient
from llm_bench.engines.logprobs import (
    MissingLogprobs,
    TextTooLong,
    TokenizerDiffers,
    VllmLogprobs,
    check_tokenisation,
    teacher_force,
)
from llm_bench.quality.divergence import compare
from tests.fake_vllm_logprobs import FakeModel, FakeVllmLogprobs, FakeVllmLogprobsConfig, logprobs_after

TEXT = " ".join(f"word{i % 17} thing{i % 5}" for i in range(60))  # 120 words and a BOS: 121 tokens


@pytest.fixture
def fake() -> Iterator[FakeVllmLogprobs]:
    config = FakeVllmLogprobsConfig(models={"base": FakeModel(), "lossy": FakeModel(noise=0.4),
                                            "other": FakeModel(vocab_shift=5)})
    with FakeVllmLogprobs(config) as server:
        yield server


@pytest.fixture
def source(fake: FakeVllmLogprobs) -> Iterator[VllmLogprobs]:
    client = OpenAIClient(fake.url, timeout=10)
    yield VllmLogprobs(client)
    client.close()


def test_every_position_comes_from_one_request_with_the_servers_own_values(
        fake: FakeVllmLogprobs, source: VllmLogprobs) -> None:
    ids = source.tokenize("base", TEXT)
    forced = teacher_force(source, "base", ids, first=1, k=8)
    completions = [body for path, body in fake.requests if path == "/v1/completions"]
    assert len(completions) == 1
    assert completions[0]["prompt"] == ids and completions[0]["prompt_logprobs"] == 8
    assert completions[0]["max_tokens"] == 1 and completions[0]["cache_salt"]
    assert len(forced.top) == len(ids) - 1
    for j, listed in enumerate(forced.top):
        position = 1 + j
        truth = logprobs_after(ids[position - 1], position, FakeModel())
        top8 = {int(t) for t in np.argsort(-truth)[:8]}
        assert set(listed) == top8  # the prompt's own token, when ranked lower, is left out
        assert all(listed[t] == pytest.approx(truth[t]) for t in listed)
    ranked_out = sum(ids[1 + j] not in listed for j, listed in enumerate(forced.top))
    assert ranked_out > 0  # the text does have tokens outside the top 8, so the leaving-out was exercised


def test_scoring_from_a_later_position_keeps_only_those(source: VllmLogprobs) -> None:
    ids = source.tokenize("base", TEXT)
    forced = teacher_force(source, "base", ids, first=50, k=5)
    assert len(forced.top) == len(ids) - 50 and forced.first == 50
    truth = logprobs_after(ids[49], 50, FakeModel())
    assert max(forced.top[0], key=forced.top[0].get) == int(np.argmax(truth))


def test_the_same_model_diverges_by_zero_and_a_perturbed_one_does_not(source: VllmLogprobs) -> None:
    ids = source.tokenize("base", TEXT)
    check_tokenisation(source, "lossy", TEXT, "base", ids)
    reference = teacher_force(source, "base", ids, first=1, k=10)
    same = compare(reference.top, teacher_force(source, "base", ids, first=1, k=10).top, replicates=200)
    lossy = compare(reference.top, teacher_force(source, "lossy", ids, first=1, k=10).top, replicates=200)
    assert same.mean_kld.value == 0.0 and same.same_top.value == 1.0
    assert lossy.mean_kld.low > 0.0 and lossy.same_top.value < 1.0


def test_more_log_probabilities_than_the_server_allows_names_max_logprobs(source: VllmLogprobs) -> None:
    ids = source.tokenize("base", TEXT)
    with pytest.raises(MissingLogprobs, match=r"refused 40 .*greater than max allowed: 20.*--max-logprobs"):
        teacher_force(source, "base", ids, first=1, k=40)


def test_a_server_without_prompt_logprobs_is_named() -> None:
    with FakeVllmLogprobs(FakeVllmLogprobsConfig(omit_prompt_logprobs=True)) as fake, \
            OpenAIClient(fake.url, timeout=10) as client:
        source = VllmLogprobs(client)
        with pytest.raises(MissingLogprobs, match="returned none; does this server support vLLM's prompt_logprobs"):
            teacher_force(source, "base", source.tokenize("base", TEXT), first=1, k=5)


def test_fewer_log_probabilities_than_asked_are_named() -> None:
    with FakeVllmLogprobs(FakeVllmLogprobsConfig(short_lists=True)) as fake, \
            OpenAIClient(fake.url, timeout=10) as client:
        source = VllmLogprobs(client)
        with pytest.raises(MissingLogprobs, match="position 1: the server listed 4 log-probabilities where 5"):
            teacher_force(source, "base", source.tokenize("base", TEXT), first=1, k=5)


def test_a_text_longer_than_the_context_is_refused_before_any_request() -> None:
    with FakeVllmLogprobs(FakeVllmLogprobsConfig(max_model_len=100)) as fake, \
            OpenAIClient(fake.url, timeout=10) as client:
        source = VllmLogprobs(client)
        ids = source.tokenize("base", TEXT)
        with pytest.raises(TextTooLong, match=r"121 tokens.*takes 122 tokens of context where the server reports 100"):
            teacher_force(source, "base", ids, first=1, k=5)
        assert not [path for path, _ in fake.requests if path == "/v1/completions"]
        # without /tokenize's figure, the model list's max_model_len serves
        fresh = VllmLogprobs(client)
        with pytest.raises(TextTooLong):
            teacher_force(fresh, "base", ids, first=1, k=5)


def test_a_model_that_tokenises_the_text_differently_is_not_compared(source: VllmLogprobs) -> None:
    ids = source.tokenize("base", TEXT)
    with pytest.raises(TokenizerDiffers, match=r"'other' tokenises the reference text differently from 'base'.*"
                                               r"first difference at token 1"):
        check_tokenisation(source, "other", TEXT, "base", ids)
