"""The quality gate's evidence: greedy answers of a candidate compared with the control's.

MINIMAL ADAPTER until issue 10's quality workload (llm_bench/workloads/quality.py) and agreement
(llm_bench/report/quality.py) land: a few greedy completions (the shipped prompts) and a
long-context recall probe, compared by exact text. The tune keeps the outputs in its results
file's ``meta.tune.quality`` table.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass

from llm_bench.engines.client import OpenAIClient, error_message
from llm_bench.engines.errors import ServerError
from llm_bench.plan import shipped_prompt

AGREEMENT_PROMPTS = ("code", "prose", "json")
AGREEMENT_MAX_TOKENS = 32
RECALL_DEPTHS = (0.25, 0.75)
RECALL_FILLER_CHARS = 1600
NEEDLE = "The secret code is {code}."
CODES = ("4817", "2533")


@dataclass(frozen=True)
class QualityScore:
    agreement: float  # share of prompts whose greedy output is identical to the control's
    recall: float | None  # share of hidden facts found
    control_recall: float | None
    first_difference: str  # where the first differing prompt departs from the control's output, or ""

    def describe(self) -> str:
        text = f"agreement {self.agreement:.0%}"
        if self.recall is not None:
            text += f", recall {self.recall:.0%}"
            if self.control_recall is not None:
                text += f" (control {self.control_recall:.0%})"
        return text


def recall_prompt(depth: float, code: str) -> str:
    filler = (shipped_prompt("prose") + "\n") * (RECALL_FILLER_CHARS // len(shipped_prompt("prose")) + 1)
    filler = filler[:RECALL_FILLER_CHARS]
    at = int(len(filler) * depth)
    return (filler[:at] + "\n" + NEEDLE.format(code=code) + "\n" + filler[at:]
            + "\n\nWhat is the secret code? Answer with the number only.")


def _greedy(client: OpenAIClient, alias: str, prompt: str, max_tokens: int, seed: int) -> str:
    response = client.http.post("/v1/chat/completions", json={
        "model": alias, "messages": [{"role": "user", "content": prompt}], "max_tokens": max_tokens,
        "temperature": 0.0, "seed": seed, "cache_prompt": False, "stream": False,
    })
    if response.status_code != 200:
        raise ServerError(f"quality prompt: {error_message(response)}")
    return str(response.json()["choices"][0]["message"].get("content") or "")


def measure_quality(client: OpenAIClient, alias: str, seed: int) -> dict[str, str]:
    """Greedy outputs, prompt name -> text; the recall answers under ``recall-DEPTH``."""
    outputs = {name: _greedy(client, alias, shipped_prompt(name), AGREEMENT_MAX_TOKENS, seed)
               for name in AGREEMENT_PROMPTS}
    for depth, code in zip(RECALL_DEPTHS, CODES):
        outputs[f"recall-{depth:g}"] = _greedy(client, alias, recall_prompt(depth, code), 12, seed)
    return outputs


def recall_of(outputs: Mapping[str, str]) -> float | None:
    answers = [(outputs.get(f"recall-{d:g}"), c) for d, c in zip(RECALL_DEPTHS, CODES)]
    present = [(a, c) for a, c in answers if a is not None]
    if not present:
        return None
    return sum(1 for a, c in present if re.search(rf"\b{c}\b", a)) / len(present)


def score(candidate: Mapping[str, str], control: Mapping[str, str]) -> QualityScore:
    shared = [p for p in AGREEMENT_PROMPTS if p in candidate and p in control]
    same = [p for p in shared if candidate[p] == control[p]]
    first = ""
    for p in shared:
        if candidate[p] != control[p]:
            a, b = candidate[p], control[p]
            at = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
            first = f"{p} prompt differs from the control's at character {at}"
            break
    return QualityScore(len(same) / len(shared) if shared else 0.0, recall_of(candidate), recall_of(control), first)
