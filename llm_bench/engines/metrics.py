"""Speculative-decoding and prefix-cache counters from a Prometheus ``/metrics`` page (vLLM, llama.cpp).

vLLM exposes cumulative counters; a run's figures are the difference between a scrape
before and a scrape after it. llama.cpp (from b11434, PR #26389) has the same four speculative families
under ``llamacpp:`` (tools/server/server-task.cpp, ``to_metrics``), counted per instance when a request ends. Families such as ``..._created`` (a Unix timestamp) share a
prefix with the counters, so names are matched exactly, never by substring.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from itertools import zip_longest

DRAFTS = "vllm:spec_decode_num_drafts_total"
DRAFT_TOKENS = "vllm:spec_decode_num_draft_tokens_total"
ACCEPTED = "vllm:spec_decode_num_accepted_tokens_total"
ACCEPTED_PER_POS = "vllm:spec_decode_num_accepted_tokens_per_pos_total"
# llama.cpp's families: the same names under its own prefix; "drafts" are its verification steps.
LLAMA_CPP_PREFIX = "llamacpp:"
PREFIX_QUERIES = "vllm:prefix_cache_queries_total"
PREFIX_HITS = "vllm:prefix_cache_hits_total"

_SAMPLE = re.compile(r"^(?P<name>[A-Za-z_:][A-Za-z0-9_:]*)(?:\{(?P<labels>.*)\})?\s+(?P<value>\S+)")
_LABEL = re.compile(r'([A-Za-z_][A-Za-z0-9_]*)="((?:[^"\\]|\\.)*)"')


@dataclass(frozen=True)
class Sample:
    name: str
    labels: dict[str, str]
    value: float


def parse_prometheus(text: str) -> list[Sample]:
    samples = []
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        match = _SAMPLE.match(line)
        if not match:
            continue
        try:
            value = float(match["value"])
        except ValueError:
            continue
        samples.append(Sample(match["name"], dict(_LABEL.findall(match["labels"] or "")), value))
    return samples


def _sum(samples: list[Sample], name: str, model: str | None) -> float | None:
    values = [s.value for s in samples if s.name == name and _model_matches(s, model)]
    return sum(values) if values else None


def _model_matches(sample: Sample, model: str | None) -> bool:
    return model is None or "model_name" not in sample.labels or sample.labels["model_name"] == model


@dataclass(frozen=True)
class SpecCounters:
    """Cumulative (or, after ``minus``, per-run) speculative-decoding counts."""

    draft_tokens: float
    accepted_tokens: float
    drafts: float | None = None  # draft rounds (verification steps); None from per-request timings
    accepted_per_position: tuple[float, ...] = field(default=())

    def minus(self, before: SpecCounters) -> SpecCounters:
        # a position first counted during the run (llama.cpp lists its positions once one was drafted) was 0 before
        per_pos = tuple(a - b for a, b in zip_longest(self.accepted_per_position, before.accepted_per_position,
                                                      fillvalue=0.0))
        drafts = None if self.drafts is None or before.drafts is None else self.drafts - before.drafts
        return SpecCounters(self.draft_tokens - before.draft_tokens,
                            self.accepted_tokens - before.accepted_tokens, drafts, per_pos)

    @property
    def acceptance_rate(self) -> float | None:
        return self.accepted_tokens / self.draft_tokens if self.draft_tokens else None

    @property
    def mean_acceptance_length(self) -> float | None:
        """1 + accepted / drafts: tokens produced per target forward pass, as vLLM logs it."""
        return 1.0 + self.accepted_tokens / self.drafts if self.drafts else None

    @property
    def per_position_rates(self) -> tuple[float, ...]:
        if not self.drafts:
            return ()
        return tuple(a / self.drafts for a in self.accepted_per_position)


def _named(name: str, prefix: str) -> str:
    return prefix + name.removeprefix("vllm:")


def spec_counters(samples: list[Sample], model: str | None = None, prefix: str = "vllm:") -> SpecCounters | None:
    """``prefix``: the server's metric prefix, ``vllm:`` or ``llamacpp:`` (LLAMA_CPP_PREFIX)."""
    draft_tokens = _sum(samples, _named(DRAFT_TOKENS, prefix), model)
    accepted = _sum(samples, _named(ACCEPTED, prefix), model)
    if draft_tokens is None or accepted is None:
        return None
    positions: dict[int, float] = {}
    for s in samples:
        if s.name == _named(ACCEPTED_PER_POS, prefix) and "position" in s.labels and _model_matches(s, model):
            pos = int(s.labels["position"])
            positions[pos] = positions.get(pos, 0.0) + s.value
    per_pos = tuple(positions.get(i, 0.0) for i in range(max(positions) + 1)) if positions else ()
    return SpecCounters(draft_tokens, accepted, _sum(samples, _named(DRAFTS, prefix), model), per_pos)


@dataclass(frozen=True)
class PrefixCacheCounters:
    queries: float
    hits: float

    def minus(self, before: PrefixCacheCounters) -> PrefixCacheCounters:
        return PrefixCacheCounters(self.queries - before.queries, self.hits - before.hits)


def prefix_cache_counters(samples: list[Sample], model: str | None = None) -> PrefixCacheCounters | None:
    queries = _sum(samples, PREFIX_QUERIES, model)
    hits = _sum(samples, PREFIX_HITS, model)
    if queries is None or hits is None:
        return None
    return PrefixCacheCounters(queries, hits)
