"""The report's tables, declared once as data.

The main table is a list of ``Column(name, cell)``; each cell function gives the text a person reads and
the raw values behind it (``Cell.values``, named keys). Markdown, the HTML report and the JSON/CSV
exports all render this one declaration, so they cannot disagree about a figure.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from llm_bench.preset_args import kv_types, speculation
from llm_bench.report.rows import (
    BASELINE,
    base_for,
    context_of,
    sort_fastest_first,
    speed_rows,
    speedup,
    verdict_of,
)
from llm_bench.report.verdict import Verdict
from llm_bench.support.numbers import fmt
from llm_bench.tables import Cell, Column, Row, Table, acceptance_cell, markdown, notes_of
from llm_bench.workloads import REGISTRY
from llm_bench.workloads.base import MainColumn

ADDED_COLUMNS = [w.column for w in REGISTRY if w.column is not None]


@dataclass(frozen=True)
class Context:
    """What cells need beyond their own row: the baseline and each row's verdict against it."""

    baseline: Row | None
    verdicts: dict[str, Verdict]
    with_roofline: bool
    bases: dict[str, Row] = field(default_factory=dict)  # what each row is compared with (rows.base_for)
    # the columns workloads add (quality's), by name: each one's cells by configuration
    added: dict[str, dict[str, Cell]] = field(default_factory=dict)
    thought: bool = False  # some run's answer carried reasoning: the "First answer ms" column is shown


def _summary_cell(row: Row, metric: str, key: str, digits: int = 1) -> Cell:
    s = row.record.summary(metric)
    value = None if s is None else s.median
    return Cell(fmt(value, digits), {key: value})


def _decode(row: Row, _ctx: Context) -> Cell:
    return Cell(fmt(row.decode_tps), {"decode_tps_median": row.decode_tps, "decode_source": row.record.decode_source})


def _spread(row: Row, _ctx: Context) -> Cell:
    s = row.record.summary(row.decode_metric)
    if s is None:
        return Cell("-", {"decode_tps_min": None, "decode_tps_max": None})
    return Cell(f"{s.min:.1f}-{s.max:.1f}", {"decode_tps_min": s.min, "decode_tps_max": s.max})


def _runs(row: Row, _ctx: Context) -> Cell:
    n = len(row.record.runs)
    reached = row.record.precision_reached
    text = str(n) + (f" (±{reached:.1%})" if reached is not None else "")
    return Cell(text, {"runs": n, "precision_reached": reached})


def _versus(row: Row, ctx: Context) -> Cell:
    base = ctx.bases.get(row.configuration, ctx.baseline)
    value = None if base is None else speedup(row, base)
    return Cell("-" if value is None else f"{value:.2f}x", {"speedup": value})


def verdict_text(v: Verdict | None) -> str:
    if v is None:
        return "-"
    return _verdict_words(v) + (f"; {v.drift}" if v.drift else "")


def _verdict_words(v: Verdict) -> str:
    if v.kind == BASELINE:
        return BASELINE
    if v.reason is not None:
        return f"{v.kind}: {v.reason}"
    if v.low is None or v.high is None:
        return v.kind
    return f"{v.kind} ({v.low:.2f}-{v.high:.2f}x, {v.confidence:.0%})"


def _verdict(row: Row, ctx: Context) -> Cell:
    v = ctx.verdicts.get(row.configuration)
    values: dict[str, Any] = {"verdict": None, "ratio": None, "ratio_low": None, "ratio_high": None,
                              "confidence": None}
    if v is not None:
        values = {"verdict": v.kind, "ratio": v.ratio, "ratio_low": v.low, "ratio_high": v.high,
                  "confidence": v.confidence}
    return Cell(verdict_text(v), values)


def _roofline(row: Row, _ctx: Context) -> Cell:
    bound = row.record.roofline_tps
    if not bound:
        return Cell("-", {"roofline_tps": None})
    text = f"{bound:.1f} ({row.decode_tps / bound:.0%})" if row.decode_tps else f"{bound:.1f}"
    return Cell(text, {"roofline_tps": bound})


def _speculation(row: Row) -> Cell:
    # an OpenAI server has no preset arguments: what it said of itself (record.speculation)
    text = speculation(row.record.preset_args) if row.record.preset_args else row.record.speculation or "-"
    return Cell(text, {"speculation": None if text == "-" else text})


def _has_baseline(ctx: Context) -> bool:
    return ctx.baseline is not None


MAIN_COLUMNS: list[Column[Context]] = [
    Column("Configuration", lambda row, ctx: Cell(row.configuration, {"configuration": row.configuration}), text=True),
    Column("Engine", lambda row, ctx: Cell(
        f"{row.engine} ({'server' if row.record.decode_source == 'server timings' else 'stream'})",
        {"engine": row.engine}), text=True),
    Column("Speculation", lambda row, ctx: _speculation(row), text=True),
    Column("KV", lambda row, ctx: Cell(kv_types(row.record.preset_args) if row.record.preset_args else "-",
                                       {"kv_types": kv_types(row.record.preset_args)
                                        if row.record.preset_args else None}), text=True),
    Column("Draft accept", lambda row, ctx: acceptance_cell(row.record)),
    Column("Decode t/s", _decode),
    Column("min-max", _spread),
    Column("vs baseline", _versus, _has_baseline),
    Column("Verdict", _verdict, _has_baseline, text=True),
    Column("Runs", _runs),
    Column("Client t/s", lambda row, ctx: _summary_cell(row, "client_decode_tps", "client_decode_tps_median")),
    Column("Roofline t/s (reached)", _roofline, lambda ctx: ctx.with_roofline),
    Column("TTFT ms", lambda row, ctx: _summary_cell(row, "ttft_ms", "ttft_ms_median", 0)),
    Column("First answer ms", lambda row, ctx: _first_answer(row), lambda ctx: ctx.thought),
    Column("Cold load s", lambda row, ctx: Cell(fmt(row.record.cold_load_s, 2), {"cold_load_s": row.record.cold_load_s})),
    Column("Context", lambda row, ctx: Cell(context_of(row.record), {
        "context": None if context_of(row.record) == "-" else context_of(row.record)}), text=True),
    Column("Notes", lambda row, ctx: Cell(notes_of(row.record), {
        "comparable": row.record.comparable, "not_comparable_reason": row.record.not_comparable_reason,
        "errors": list(row.record.errors), "warnings": list(row.record.warnings)}), text=True),
]


def _first_answer(row: Row) -> Cell:
    """A thinking model's first answer token (TTFT is its first generated token, reasoning included)."""
    first, reasoning = row.record.summary("first_answer_ms"), row.record.summary("reasoning_tokens")
    return Cell(fmt(None if first is None else first.median, 0),
                {"first_answer_ms_median": None if first is None else first.median,
                 "reasoning_tokens_median": None if reasoning is None else reasoning.median})


def thought(rows: Sequence[Row]) -> bool:
    return any(run.reasoning_tokens for row in rows for run in row.record.runs)


def context_for(rows: Sequence[Row], baseline: Row | None, min_effect: float | None = None) -> Context:
    chosen = speed_rows(rows)
    bases = {} if baseline is None else {r.configuration: base_for(r, chosen, baseline) for r in chosen}
    verdicts = {name: verdict_of(r, bases[name], min_effect) for r in chosen for name in [r.configuration]
                if name in bases}
    return Context(baseline, verdicts, any(r.record.roofline_tps for r in chosen), bases,
                   {c.name: c.cells(rows, baseline) for c in ADDED_COLUMNS}, thought(chosen))


def _added(column: MainColumn) -> Column[Context]:
    return Column(column.name, lambda row, ctx: ctx.added[column.name].get(row.configuration, column.missing),
                  lambda ctx: bool(ctx.added[column.name]), column.text)


def main_columns() -> list[Column[Context]]:
    """The main table's own columns, then those the workloads add, before Notes."""
    *own, notes = MAIN_COLUMNS
    return [*own, *(_added(c) for c in ADDED_COLUMNS), notes]


def main_table(rows: Sequence[Row], baseline: Row | None = None, min_effect: float | None = None) -> Table:
    """The comparison of one-stream configurations, fastest first."""
    ctx = context_for(rows, baseline, min_effect)
    columns = [c for c in main_columns() if c.shown(ctx)]
    name_of = {"vs baseline": f"vs {baseline.configuration}"} if baseline is not None else {}
    cells = [[c.cell(row, ctx) for c in columns] for row in sort_fastest_first(speed_rows(rows))]
    return Table(None, "main", [name_of.get(c.name, c.name) for c in columns], cells,
                 frozenset(name_of.get(c.name, c.name) for c in columns if c.text))


def telemetry_table(rows: Sequence[Row]) -> Table | None:
    """GPU telemetry and energy of the measured span of each record (llm_bench.gpu.telemetry)."""
    chosen = [r for r in rows if r.record.telemetry]
    if not chosen:
        return None
    header = ["Configuration", "Peak VRAM MiB", "Mean power W", "Max temp C", "J/token", "Tokens/J", "Energy from"]
    # one figure per GPU becomes the peak, or the sum of power over GPUs
    fields: list[tuple[str, Callable[[list[float]], float] | None, int]] = [
        ("peak_vram_mib", max, 0), ("mean_power_w", sum, 1), ("max_temperature_c", max, 0),
        ("joules_per_token", None, 3), ("tokens_per_joule", None, 3)]
    lines = []
    for row in chosen:
        t = row.record.telemetry or {}
        cells = [Cell(row.configuration, {"configuration": row.configuration})]
        for key, reduce, digits in fields:
            value = t.get(key)
            if isinstance(value, list):
                value = reduce(value) if value and reduce else None
            cells.append(Cell(fmt(value, digits), {key: value}))
        cells.append(Cell(str(t.get("energy_source", "-")), {"energy_source": t.get("energy_source")}))
        lines.append(cells)
    return Table("GPU telemetry and energy", "telemetry", header, lines,
                 frozenset({"Configuration", "Energy from"}))


def all_tables(rows: Sequence[Row], baseline: Row | None = None, min_effect: float | None = None) -> list[Table]:
    """The main table (when there is anything to compare), then one per extra workload measured."""
    main = main_table(rows, baseline, min_effect)
    return ([main] if main.rows else []) + workload_tables(rows, baseline)


def workload_tables(rows: Sequence[Row], baseline: Row | None) -> list[Table]:
    """Each workload's own tables, in the registry's order."""
    return [t for w in REGISTRY for t in w.tables(rows, baseline)]


def section_tables(rows: Sequence[Row], baseline: Row | None = None, extra: Sequence[Table] = ()) -> list[Table]:
    """The tables after the main one that the HTML report shows: extra workloads (quality against the baseline),
    GPU telemetry, then those of other results files (a power sweep's: report.sources)."""
    return workload_tables(rows, baseline) + [t for t in (telemetry_table(rows),) if t is not None] + list(extra)


def markdown_table(rows: Sequence[Row], baseline: Row | None = None, min_effect: float | None = None) -> str:
    """The report's comparison table, then one table per extra workload that was measured."""
    return "\n".join(markdown(t) for t in all_tables(rows, baseline, min_effect))
