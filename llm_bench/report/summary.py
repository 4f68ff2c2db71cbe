"""The few lines a person wants first: the winner per engine, what is within noise, and what not to trust.

``summary_sections`` gives plain-text sections (untrusted names included as they are); ``summary``
renders them as Markdown and the HTML report escapes and renders the same sections.
"""

from __future__ import annotations

from collections.abc import Sequence

from llm_bench.interference.window import disturbance
from llm_bench.report.rows import (
    base_for,
    sort_fastest_first,
    speed_rows,
    speedup_text,
    verdict_of,
)
from llm_bench.report.table import verdict_text
from llm_bench.report.verdict import FASTER, SLOWER, TOO_FEW_RUNS, WITHIN_NOISE
from llm_bench.support.numbers import fmt
from llm_bench.tables import Row, Section
from llm_bench.workloads import REGISTRY


def _against(rows: Sequence[Row], baseline: Row, min_effect: float | None) -> dict[str, list[str]]:
    by_kind: dict[str, list[str]] = {}
    for row in speed_rows(rows):
        if row.configuration == baseline.configuration or row.decode_tps is None:
            continue
        base = base_for(row, rows, baseline)
        v = verdict_of(row, base, min_effect)
        versus = "" if base is baseline else f" of {base.configuration}"
        by_kind.setdefault(v.kind, []).append(f"{row.configuration} ({speedup_text(row, base)}{versus})")
    return by_kind


def summary_sections(rows: Sequence[Row], baseline: Row | None, failures: dict[str, str] | None = None,
                     min_effect: float | None = None) -> list[Section]:
    head: list[str] = []
    # a disturbed window is never the fastest (llm_bench.interference)
    measured = [r for r in speed_rows(rows) if r.decode_tps is not None and not r.record.errors
                and disturbance(r.record) is None]
    by_engine: dict[str, Row] = {}
    for row in sort_fastest_first(measured):
        by_engine.setdefault(row.engine, row)
    for engine, row in by_engine.items():
        versus = ""
        if baseline is not None and row.configuration != baseline.configuration:
            base = base_for(row, rows, baseline)
            v = verdict_of(row, base, min_effect)
            versus = (f", {speedup_text(row, base)} the baseline {base.configuration}: "
                      f"{verdict_text(v)}")
        elif baseline is not None:
            versus = " (the baseline)"
        head.append(f"fastest on {engine}: {row.configuration}, {row.decode_tps:.1f} t/s{versus}")
    if baseline is not None:
        head.append(f"baseline: {baseline.configuration}, {fmt(baseline.decode_tps)} t/s")
    sections = [Section(None, head)]
    if baseline is not None:
        kinds = _against(rows, baseline, min_effect)
        for kind, heading in ((FASTER, "Faster than the baseline"), (SLOWER, "Slower than the baseline"),
                              (WITHIN_NOISE, "Within noise of the baseline"),
                              (TOO_FEW_RUNS, "Too few runs to tell")):
            if kinds.get(kind):
                sections.append(Section(heading, [", ".join(kinds[kind])]))
    suspect = [r for r in rows if not r.record.comparable]
    if suspect:
        sections.append(Section("Not comparable",
                                [f"{r.configuration}: {r.record.not_comparable_reason}" for r in suspect]))
    warned = [f"{r.configuration}: {w}" for r in rows for w in r.record.warnings]
    if warned:
        sections.append(Section("Warnings", warned))
    sections += [section for w in REGISTRY if w.summary for section in w.summary(rows, baseline)]
    failed = [f"{r.configuration}: {'; '.join(r.record.errors)}" for r in rows if r.record.errors]
    failed += [f"target {name}: {message}" for name, message in (failures or {}).items()]
    if failed:
        sections.append(Section("Failed", failed))
    return sections


def summary(rows: Sequence[Row], baseline: Row | None, failures: dict[str, str] | None = None,
            min_effect: float | None = None) -> str:
    lines = ["## Summary", ""]
    for section in summary_sections(rows, baseline, failures, min_effect):
        if section.heading:
            lines += ["", f"{section.heading}:"]
        lines += [f"- {item}" for item in section.items]
    return "\n".join(lines) + "\n"

