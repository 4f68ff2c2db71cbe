"""Results files merged into rows (one per configuration) and the facts each row shows; speed-up and verdict per row."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path

from llm_bench.interference.window import disturbance
from llm_bench.preset_args import preset_facts
from llm_bench.report.backends import split_by_backend
from llm_bench.report.verdict import FASTER, SLOWER, Verdict, verdict
from llm_bench.results import AliasRecord, ResultSet, load_results
from llm_bench.tables import Row
from llm_bench.workloads import PARTS, REGISTRY
from llm_bench.workloads.categories import category_of
from llm_bench.workloads.standard import STANDARD

# The records the headline table, the chart and the verdicts compare: one stream at a time.
SPEED_RECORDS = {w.record_name for w in REGISTRY if w.speed}


def load_rows(paths: Sequence[Path]) -> list[Row]:
    return rows_of(load_sets(paths))


def load_sets(paths: Sequence[Path]) -> list[ResultSet]:
    return [load_results(p, PARTS) for p in paths]


def rows_of(sets: Sequence[ResultSet]) -> list[Row]:
    """Rows of several results files; configurations are named ``label / alias`` when labels differ."""
    labels = {r.target or s.meta.get("label", "") for s in sets for r in s.aliases}
    return rows_from_sets(sets, qualify=len(labels) > 1)


def rows_from_sets(sets: Sequence[ResultSet], qualify: bool) -> list[Row]:
    """One row per configuration; a later measurement of the same configuration replaces an earlier one."""
    rows: dict[str, Row] = {}
    for result_set in sets:
        for record in result_set.aliases:
            label = record.target or result_set.meta.get("label", "")
            prefix = f"{label} / " if qualify and label else ""
            for backend, part in split_by_backend(record):
                at = "" if backend is None else f" @ {backend}"
                named = f"{prefix}{record.configuration}{at}"
                group = f"{prefix}{record.alias}{at}"
                rows[named] = Row(named, part, label, record.engine or result_set.meta.get("engine", ""), group)
    return list(rows.values())


def speed_rows(rows: Sequence[Row]) -> list[Row]:
    """The rows the headline table and the chart compare: one stream at a time."""
    return [r for r in rows if r.record.workload in SPEED_RECORDS]


def sort_fastest_first(rows: Sequence[Row]) -> list[Row]:
    return sorted(rows, key=lambda r: (r.decode_tps is None, -(r.decode_tps or 0.0)))


def find_baseline(rows: Sequence[Row], baseline: str | None) -> Row | None:
    if baseline is None:
        return None
    candidates = speed_rows(rows)
    for row in candidates:
        if baseline == row.configuration:
            return row
    for row in candidates:
        if baseline == row.record.alias and row.record.workload == STANDARD.record_name:
            return row
    # measured with the quality workload only: its quality record is the reference the quality table needs
    for row in rows:
        if row.record.workload == "quality" and baseline in (row.configuration, row.record.alias):
            return row
    names = ", ".join(r.configuration for r in [*candidates, *(r for r in rows if r.record.workload == "quality")])
    raise ValueError(f"baseline {baseline!r} is not among the configurations: {names}")


def context_of(record: AliasRecord) -> str:
    """The preset's context, else the one an OpenAI server reported (vLLM's max_model_len)."""
    return preset_facts(record.preset_args).get("ctx") or (str(record.context) if record.context else "-")


def base_for(row: Row, rows: Sequence[Row], baseline: Row) -> Row:
    """What a row is compared with: the baseline, or for a prompt category the baseline's own record of that
    category when it was measured (code against code: drafting accepts far more on code than on prose)."""
    category = category_of(row.record)
    if category and category_of(baseline.record) != category:
        for other in rows:
            if (category_of(other.record) == category and other.record.alias == baseline.record.alias
                    and other.label == baseline.label):
                return other
    return baseline


def speedup(row: Row, baseline: Row) -> float | None:
    """Ratio of the medians, as the chart's bars show it."""
    if row.decode_tps is None or not baseline.decode_tps:
        return None
    return row.decode_tps / baseline.decode_tps


def speedup_text(row: Row, baseline: Row) -> str:
    value = speedup(row, baseline)
    return "-" if value is None else f"{value:.2f}x"


BASELINE = "baseline"
NOT_COMPARABLE = "not comparable"


def verdict_of(row: Row, baseline: Row, min_effect: float | None = None) -> Verdict:
    """The row's decode runs against the baseline's (llm_bench.report.verdict); a row that failed or is
    not comparable keeps its figures but is called so, and the baseline is called the baseline."""
    kwargs = {} if min_effect is None else {"min_effect": min_effect}
    v = verdict(row.decode_values(), baseline.decode_values(), **kwargs)
    drift = drift_note(row.record) or drift_note(baseline.record)
    if row is baseline or row.configuration == baseline.configuration:
        return Verdict(BASELINE, 1.0, None, None, None, v.n_candidate, v.n_baseline, drift=drift)
    if row.record.errors or not row.record.comparable or not baseline.record.comparable:
        return Verdict(NOT_COMPARABLE, v.ratio, v.low, v.high, v.confidence, v.n_candidate, v.n_baseline,
                       reason=disturbed_reason(row, baseline), drift=drift)
    return replace(v, drift=drift)


def drift_note(record: AliasRecord) -> str | None:
    """What the run's drift check says when its first alias's decode rates at the end disagree with its start beyond
    noise (the same verdict as between two configurations), or when the end could not be measured cleanly."""
    drift = record.drift
    if not drift:
        return None
    if drift.get("end_not_comparable"):
        return f"drift unknown: {drift['alias']} re-measured at the end was {drift['end_not_comparable']}"
    v = verdict(drift.get("end", []), drift.get("start", []))
    if v.kind not in (FASTER, SLOWER):
        return None
    return (f"the machine drifted during this run: {drift['alias']} measured again at its end was {v.kind} than at "
            f"its start ({v.ratio:.2f}x, {v.low:.2f}-{v.high:.2f} at {v.confidence:.0%})")


def disturbed_reason(row: Row, baseline: Row) -> str | None:
    """``disturbed by ...`` when the row's measured window, or the baseline's, had something else running."""
    own = disturbance(row.record)
    if own is not None:
        return own
    base = disturbance(baseline.record)
    return None if base is None else f"the baseline {baseline.configuration} was {base}"
