"""The easy exact-answer items are within reach of the demo's model: SmolLM2-135M on a real router,
greedy, gets most of them right, and a self-drafting preset (greedy speculative decoding, lossless)
answers them identically, which the paired verdict reports as within noise with no item lost."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

from llm_bench.demo import smollm2_presets
from llm_bench.engines import LlamaCppEngine
from llm_bench.engines.completion import CompletionRequest
from llm_bench.quality.exact_items import FAMILIES, generate_items, is_correct
from llm_bench.quality.paired import WITHIN_NOISE, paired_verdict
from llm_bench.testbed.presets import render_presets_ini
from tests.conftest import StartRouter

PLAIN, SELF_DRAFT = "smol-plain", "smol-self-draft"
MAX_TOKENS = 16


def test_smollm2_gets_most_easy_items_right_and_self_drafting_answers_the_same(
        router_factory: StartRouter, smollm2: Path) -> None:
    demo = smollm2_presets(smollm2, drafter=smollm2)
    router = router_factory(render_presets_ini({"*": demo["*"], PLAIN: demo[PLAIN], SELF_DRAFT: demo[SELF_DRAFT]}))
    items = generate_items(seed=0, difficulties=("easy",))
    engine = LlamaCppEngine(router.url, timeout=120)
    try:
        answers = {alias: [engine.complete(CompletionRequest(alias, item.messages(), MAX_TOKENS)).text
                           for item in items]
                   for alias in (PLAIN, SELF_DRAFT)}
    finally:
        engine.close()
    right = {alias: [is_correct(item, text) for item, text in zip(items, texts)] for alias, texts in answers.items()}
    by_family = Counter(item.family for item, ok in zip(items, right[PLAIN]) if ok)
    print(f"SmolLM2 easy: {sum(right[PLAIN])}/{len(items)} right; "
          + ", ".join(f"{family} {by_family[family]}/{len(items) // len(FAMILIES)}" for family in FAMILIES))

    assert sum(right[PLAIN]) >= 0.6 * len(items)  # measured: 67 of 80
    assert all(by_family[family] >= 5 for family in FAMILIES)
    verdict = paired_verdict(right[PLAIN], right[SELF_DRAFT])
    assert answers[SELF_DRAFT] == answers[PLAIN]
    assert (verdict.kind, verdict.lost, verdict.gained) == (WITHIN_NOISE, 0, 0)
