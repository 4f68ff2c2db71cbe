"""Quality verdicts on a real llama.cpp router serving SmolLM2-135M: one run of the quality workload
over KV f16 (the reference), KV q8_0, KV q4_0 and the model drafting for itself. The token
distributions come from the server's own log-probabilities over the reference's greedy answers, the
answers from its own completions of the generated exact-answer items; the verdicts must reach the
main table, the quality table, the summary, the HTML report and JSON/CSV, and tune's quality gate.
Bad input (a text beyond the context, another tokeniser, fewer log-probabilities than asked, a
server without prompt log-probabilities) is named in the record and the report, never scored."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from llm_bench.demo import smollm2_presets
from llm_bench.plan import Plan, Protocol
from llm_bench.report import find_baseline, load_rows, load_sets, markdown_table, summary
from llm_bench.report.export import to_csv, to_json
from llm_bench.report.html import write_html
from llm_bench.results import load_results
from llm_bench.runner import run_plan
from llm_bench.testbed.presets import render_presets_ini
from llm_bench.testbed.router import RouterProcess, start_router
from llm_bench.testbed.tiny_gguf import TinyModelSpec, write_tiny_model
from llm_bench.tune.plan import QualityGate
from llm_bench.tune.search import gate_reasons, score
from llm_bench.workloads import PARTS
from llm_bench.workloads.quality import QUALITY
from llm_bench.workloads.quality.record import quality_results
from llm_bench.workloads.quality.score import (
    LOSSLESS,
    LOSSY,
    NEAR_LOSSLESS,
    distributions,
    quality_rows,
    quality_verdict,
)

PLAIN, Q8, Q4, SELF_DRAFT, SHORT, TINY = ("smol-plain", "smol-kv-q8", "smol-kv-q4", "smol-self-draft", "smol-short",
                                          "tiny")
MEASURED = (PLAIN, Q8, Q4, SELF_DRAFT)
# The reference text: six answers of up to 24 tokens (~140 scored positions, each one request). At 64 tokens q8_0
# measured a mean KLD of 0.0032 [0.0029, 0.0037] and q4_0 0.049 [0.042, 0.058], the near-lossless bound 0.01 between
# them; the figures depend on the model and the build, not on the machine's load. 1 easy exact-answer item of
# each of the 4 families: the paired comparison needs items answered by both sides, not many of them.
TEXT_TOKENS, ITEMS_PER_KIND = 24, 1
ITEMS = 4 * ITEMS_PER_KIND


@pytest.fixture(scope="module")
def bed(llama_server_bin: Path, smollm2: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[RouterProcess]:
    folder = tmp_path_factory.mktemp("verdicts")
    tiny = write_tiny_model(folder / "tiny.gguf", TinyModelSpec(seed=1, name="tiny"))
    demo = smollm2_presets(smollm2, drafter=smollm2)
    presets = {"*": demo["*"], **{name: demo[name] for name in MEASURED},
               SHORT: {"model": str(smollm2), "ctx-size": 256}, TINY: {"model": str(tiny)}}
    (folder / "presets.ini").write_text(render_presets_ini(presets))
    router = start_router(llama_server_bin, folder / "presets.ini", log_path=folder / "router.log")
    yield router
    router.stop()


def protocol(workloads: tuple[str, ...] = ("standard", "quality"), **quality: object) -> Protocol:
    small = {"max_tokens": 8, "recall_lengths": (128,), "recall_depths": (0.5,), **quality}
    # a short prompt: the standard run must fit a context of 256 tokens
    return Protocol(max_tokens=8, runs=1, workloads=workloads, prompt="Count to five.").with_settings(QUALITY, small)


@pytest.fixture(scope="module")
def measured(bed: RouterProcess, tmp_path_factory: pytest.TempPathFactory) -> Path:
    plan = Plan(url=bed.url, aliases=MEASURED, label="smol", output_dir=tmp_path_factory.mktemp("results"),
                protocol=protocol(text_tokens=TEXT_TOKENS, exact_items_per_kind=ITEMS_PER_KIND,
                                  exact_difficulties=("easy",)))
    return run_plan(plan, print).path


def qrows(path: Path) -> dict:
    rows = load_rows([path])
    return {q.configuration: q for q in quality_rows(rows, find_baseline(rows, PLAIN))}


def test_every_configuration_is_forced_over_the_references_own_answers(measured: Path) -> None:
    records = {r.alias: quality_results(r) for r in load_results(measured, PARTS).aliases if r.workload == "quality"}
    text = [(f.segment, f.token_ids, f.first) for f in records[PLAIN].forced]
    assert len(text) == 6 and all(first > 1 for _, _, first in text)  # after the chat template
    for alias in MEASURED:
        assert [(f.segment, f.token_ids, f.first) for f in records[alias].forced] == text
        assert all(len(ids) == records[alias].top_k == 20 for f in records[alias].forced for ids in f.top_ids)
        assert not records[alias].forced_error
        assert len(records[alias].exact_answers) == ITEMS


def test_q8_is_near_lossless_q4_lossy_and_self_drafting_lossless(measured: Path) -> None:
    q = qrows(measured)
    for name in (Q8, Q4, SELF_DRAFT):
        print(f"{name}: {q[name].verdict_text()} | {q[name].distributions.describe()}")
    q8, q4 = q[Q8].distributions.divergence, q[Q4].distributions.divergence
    assert q8.positions >= 5 * TEXT_TOKENS  # an answer or two may end before its last token
    assert 1e-6 < q8.mean_kld.low and q8.mean_kld.high < q4.mean_kld.low  # separated from zero and each other
    assert (q[Q8].verdict, q[Q4].verdict, q[SELF_DRAFT].verdict) == (NEAR_LOSSLESS, LOSSY, LOSSLESS)
    assert q[SELF_DRAFT].distributions.divergence.mean_kld.value == 0.0
    assert q[SELF_DRAFT].answers.lost == q[SELF_DRAFT].answers.gained == 0 and q[SELF_DRAFT].answers.items == ITEMS
    assert q[PLAIN].verdict is None and q[PLAIN].reference == PLAIN
    # speculation is checked against a control; a KV cache type is not speculative: no control
    assert q[SELF_DRAFT].control == PLAIN and q[Q8].control is None and q[Q4].control is None


def test_the_verdicts_reach_the_tables_the_summary_the_html_and_json_csv(measured: Path, tmp_path: Path) -> None:
    rows = load_rows([measured])
    base = find_baseline(rows, PLAIN)
    table = markdown_table(rows, base)
    main, quality = table.split("### Quality")
    print(quality)  # docs/quality.md's worked example comes from this table
    line = {name: next(x for x in main.splitlines() if x.startswith(f"| {name} ")) for name in MEASURED}
    assert "lossless" in line[SELF_DRAFT] and "near-lossless (KLD 0.00" in line[Q8] and "lossy (KLD 0.0" in line[Q4]
    assert "answers within noise (" in line[SELF_DRAFT]
    assert "| Verdict | Mean KLD (95 % CI) |" in quality
    qline = next(x for x in quality.splitlines() if x.startswith(f"| {Q4} "))
    assert "| lossy |" in qline and f"/{ITEMS} vs " in qline
    text = summary(rows, base)
    assert f"Quality verdicts against {PLAIN}" in text and f"{Q4}: lossy (KLD" in text
    data = json.loads(to_json(rows, base))
    by_name = {r["configuration"]: r for r in data["main"]}
    assert by_name[Q4]["quality_verdict"] == LOSSY and by_name[Q4]["mean_kld"] > by_name[Q8]["mean_kld_high"]
    assert by_name[SELF_DRAFT]["quality_verdict"] == LOSSLESS and by_name[SELF_DRAFT]["answers_items"] == ITEMS
    assert "quality_verdict" in to_csv(rows, base).splitlines()[0] and ",near-lossless," in to_csv(rows, base)
    page = write_html(tmp_path / "r.html", load_sets([measured]), PLAIN, rows=rows).read_text()
    assert "near-lossless (KLD" in page and "lossy (KLD" in page and "Quality verdicts against" in page


def test_distributions_over_other_tokens_than_the_references_are_not_scored(measured: Path) -> None:
    records = {r.alias: r for r in load_results(measured, PARTS).aliases if r.workload == "quality"}
    other = records[Q8]
    quality_results(other).forced[2].token_ids[-1] += 1  # e.g. a results file from a run with another reference text
    found = distributions(records[PLAIN], other)
    assert found.divergence is None and "forced over other tokens than the reference smol-plain" in found.problem
    assert quality_verdict(found, None, True) is None


def test_tunes_quality_gate_takes_the_verdict(measured: Path) -> None:
    records = {r.alias: r for r in load_results(measured, PARTS).aliases if r.workload == "quality"}
    scores = {name: score(records[name], records[PLAIN]) for name in (Q8, Q4, SELF_DRAFT)}
    gate = QualityGate()
    assert gate_reasons(scores[SELF_DRAFT], gate) == [] and gate_reasons(scores[Q8], gate) == []
    assert gate_reasons(scores[Q4], gate)[0].startswith("lossy (KLD")
    assert gate_reasons(scores[Q8], QualityGate(accept=LOSSLESS))[0].startswith("near-lossless")
    assert gate_reasons(scores[Q4], QualityGate(accept="any")) == []
    # the agreement threshold stays an option beside the verdict
    strict = gate_reasons(scores[Q4], QualityGate(accept="any", min_agreement=1.0))
    assert bool(strict) == (scores[Q4].identical_share < 1.0)
    assert all(r.startswith("agreement") for r in strict)


@pytest.fixture(scope="module")
def bad_input(bed: RouterProcess, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A text of a few hundred tokens of the user's own, forced through the reference, another model
    (another tokeniser) and the same model with a context of 256 tokens."""
    folder = tmp_path_factory.mktemp("bad")
    text = folder / "mine.py"
    # 315 tokens: beyond SHORT's context of 256, each position one request through PLAIN
    text.write_text("\n".join(f"def square_{n}(x: int) -> int:\n    return x * x + {n}\n" for n in range(14)))
    plan = Plan(url=bed.url, aliases=(PLAIN, TINY, SHORT), label="bad", output_dir=folder,
                protocol=protocol(text_file=text, exact_items_per_kind=0))
    return run_plan(plan, print).path


def test_a_text_beyond_the_context_and_another_tokeniser_are_named_not_scored(bad_input: Path) -> None:
    records = {r.alias: quality_results(r) for r in load_results(bad_input, PARTS).aliases if r.workload == "quality"}
    assert records[PLAIN].forced and records[PLAIN].forced[0].first == 1 and not records[PLAIN].forced_error
    assert "'tiny' tokenises the reference text differently from 'smol-plain'" in records[TINY].forced_error
    assert "takes" in records[SHORT].forced_error and "server reports 256" in records[SHORT].forced_error
    assert not records[TINY].forced and not records[SHORT].forced
    assert records[SHORT].outputs  # the rest of the quality workload was measured
    rows = load_rows([bad_input])
    q = {r.configuration: r for r in quality_rows(rows, find_baseline(rows, PLAIN))}
    assert q[TINY].verdict is None and q[SHORT].verdict is None
    table = markdown_table(rows, find_baseline(rows, PLAIN))
    assert "not scored: 'tiny' tokenises the reference text differently" in table
    assert "token distributions not scored: the reference text is" in table
    assert f"{SHORT}: not scored: the reference text is" in summary(rows, find_baseline(rows, PLAIN))


def test_fewer_log_probabilities_than_asked_and_a_server_without_prompt_logprobs_are_named(
        bed: RouterProcess, tmp_path: Path) -> None:
    text = tmp_path / "short.txt"
    text.write_text("a short text for the tiny model")
    few = Plan(url=bed.url, aliases=(TINY,), label="few", output_dir=tmp_path,
               protocol=protocol(("quality",), text_file=text, exact_items_per_kind=0, top_k=300))
    record = next(quality_results(r) for r in load_results(run_plan(few, print).path, PARTS).aliases
                  if r.workload == "quality")
    assert "'tiny', position 1: the server listed" in record.forced_error and "where 300 were asked" in record.forced_error
    # llama-server through the OpenAI engine: /v1/completions has no prompt_logprobs
    none = Plan(url=bed.url, aliases=(TINY,), label="none", output_dir=tmp_path, engine="openai",
                protocol=protocol(("quality",), text_file=text, exact_items_per_kind=0))
    record = next(quality_results(r) for r in load_results(run_plan(none, print).path, PARTS).aliases
                  if r.workload == "quality")
    assert "no position to ask log-probabilities for" in record.forced_error and not record.forced
