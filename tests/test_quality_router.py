"""The quality workload on a real llama-server router serving the real SmolLM2-135M-Instruct.

One run measures a plain preset, the model drafting for itself, a random drafter whose drafts are all
rejected and synthetic acceptance with the random drafter; then the report must flag exactly the
synthetic one (KV cache types and the verdicts: test_quality_verdicts_router), and recall and accuracy
must be in the results, the table and the quality table.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from llm_bench.demo import write_smollm2_bed
from llm_bench.plan import Plan, Protocol
from llm_bench.report import find_baseline, load_rows, markdown_table
from llm_bench.results import load_results
from llm_bench.runner import run_plan
from llm_bench.testbed.router import RouterProcess, start_router
from llm_bench.workloads import PARTS
from llm_bench.workloads.quality import QUALITY
from llm_bench.workloads.quality.record import quality_results
from llm_bench.workloads.quality.score import SPECULATION_CHANGED, quality_rows

PRESETS = ("smol-plain", "smol-self-draft", "smol-random-draft", "smol-synth")


@pytest.fixture(scope="module")
def smol_router(llama_server_bin: Path, smollm2: Path, tmp_path_factory: pytest.TempPathFactory
                ) -> Iterator[RouterProcess]:
    folder = tmp_path_factory.mktemp("smol")
    ini = write_smollm2_bed(folder, smollm2, PRESETS)
    router = start_router(llama_server_bin, ini, log_path=folder / "router.log")
    yield router
    router.stop()


@pytest.fixture(scope="module")
def measured(smol_router: RouterProcess, tmp_path_factory: pytest.TempPathFactory) -> Path:
    # a short prompt for the speed runs: the shipped one's ~230 tokens were 6 s of the run here
    protocol = Protocol(max_tokens=8, runs=1, temperature=0.0, workloads=("quality", "standard"), prompt="Count to five.",
                        recall_lengths=(256, 8192), recall_depths=(0.5,), quality_max_tokens=12
                        ).with_settings(QUALITY, {"top_k": 0, "exact_items_per_kind": 0})  # verdicts: elsewhere
    plan = Plan(url=smol_router.url, aliases=PRESETS, label="smol", output_dir=tmp_path_factory.mktemp("results"),
                protocol=protocol)
    return run_plan(plan, lambda _m: None).path


def test_one_run_measures_speed_then_quality_for_every_preset(measured: Path):
    records = load_results(measured, PARTS).aliases
    assert [(r.alias, r.workload) for r in records] == [(a, w) for a in PRESETS for w in ("standard", "quality")]
    for r in records:
        assert not r.errors, (r.alias, r.errors)
        if r.workload == "quality":
            results = quality_results(r)
            assert len(results.outputs) == 3 and len(results.questions) == 4
            assert all(o.text and o.output_tokens for o in results.outputs)
            # 8192 tokens do not fit the presets' context of 4096 (the server's n_ctx): skipped, with the reason
            measured_probe, skipped = results.recall
            assert measured_probe.found is not None and measured_probe.prompt_tokens > 200
            assert skipped.found is None and "4096" in skipped.skipped


def test_the_plain_preset_finds_a_needle_in_the_middle(measured: Path):
    plain = next(r for r in load_results(measured, PARTS).aliases if r.alias == "smol-plain" and r.workload == "quality")
    probe = quality_results(plain).recall[0]
    assert probe.found, probe.answer
    assert probe.expected in probe.answer


def test_synthetic_acceptance_is_flagged_and_lossless_drafting_is_not(measured: Path):
    records = {(r.alias, r.workload): r for r in load_results(measured, PARTS).aliases}
    # the server's own draft counters: the same random drafter is always rejected, unless synthetic
    # acceptance forces its tokens in; the model drafting for itself is accepted
    assert records["smol-random-draft", "standard"].spec.accepted_tokens == 0
    assert records["smol-synth", "standard"].spec.accepted_tokens > 0
    assert records["smol-self-draft", "standard"].spec.acceptance_rate > 0.9

    rows = load_rows([measured])
    qrows = {q.configuration: q for q in quality_rows(rows, find_baseline(rows, "smol-plain"))}
    synth = qrows["smol-synth"]
    assert synth.control == "smol-plain" and synth.flagged is not None
    assert synth.flagged.prefix < 32 and SPECULATION_CHANGED in synth.flag_text()
    for name in ("smol-self-draft", "smol-random-draft"):
        assert qrows[name].control == "smol-plain"
        assert qrows[name].flagged is None and qrows[name].agreement.identical_share == 1.0, name
        assert qrows[name].agreement.unit == "tokens"  # llama-server reported every token id


def test_recall_and_accuracy_appear_in_the_table_and_the_quality_table(measured: Path):
    rows = load_rows([measured])
    text = markdown_table(rows, find_baseline(rows, "smol-plain"))
    main, quality = text.split("### Quality")
    assert " Quality |" in main.splitlines()[0]
    synth_line = next(line for line in main.splitlines() if line.startswith("| smol-synth "))
    assert SPECULATION_CHANGED in synth_line and "recall" in synth_line
    self_line = next(line for line in main.splitlines() if line.startswith("| smol-self-draft "))
    assert "agree 100%" in self_line and SPECULATION_CHANGED not in self_line
    for preset in PRESETS:
        line = next(line for line in quality.splitlines() if line.startswith(f"| {preset} "))
        assert "256: " in line and "/4 |" in line  # recall by length and exact answers per preset
