"""The report's tables, declared once as data.

The main table is a list of ``Column(name, cell)``; each cell function gives the text a person reads and
the raw values behind it (``Cell.values``, named keys). Markdown, the HTML report and the JSON/CSV
exports all render this one declaration, so they cannot disagree about a figure.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from llm_bench.report.rows import (
    BASELINE,
    PowerSweep,
    Row,
    acceptance_text,
    base_for,
    context_of,
    kv_types,
    notes_of,
    sort_fastest_first,
    speculation,
    speed_rows,
    speedup,
    verdict_of,
)
from llm_bench.report.verdict import Verdict


@dataclass(frozen=True)
class Cell:
    text: str
    values: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Context:
    """What cells need beyond their own row: the baseline and each row's verdict against it."""

    baseline: Row | None
    verdicts: dict[str, Verdict]
    with_roofline: bool
    bases: dict[str, Row] = field(default_factory=dict)  # what each row is compared with (rows.base_for)
    quality: dict[str, Cell] = field(default_factory=dict)  # the quality column (report.quality), by configuration
    thought: bool = False  # some run's answer carried reasoning: the "First answer" column is shown


@dataclass(frozen=True)
class Column:
    name: str
    cell: Callable[[Row, Context], Cell]
    shown: Callable[[Context], bool] = lambda ctx: True


@dataclass(frozen=True)
class Table:
    """A rendered table: its title (None for the main one), column names and cells, row by row."""

    title: str | None
    key: str
    columns: list[str]
    rows: list[list[Cell]]

    def records(self) -> list[dict[str, Any]]:
        """One mapping per row: every column's raw values, keyed (the JSON/CSV export)."""
        return [{k: v for cell in cells for k, v in cell.values.items()} for cells in self.rows]

    def keys(self) -> list[str]:
        seen: dict[str, None] = {}
        for cells in self.rows:
            for cell in cells:
                seen.update(dict.fromkeys(cell.values))
        return list(seen)


def num(value: float | None, digits: int = 1) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def _summary_cell(row: Row, metric: str, key: str, digits: int = 1) -> Cell:
    s = row.record.summary(metric)
    value = None if s is None else s.median
    return Cell(num(value, digits), {key: value})


def _decode(row: Row, _ctx: Context) -> Cell:
    return Cell(num(row.decode_tps), {"decode_tps_median": row.decode_tps, "decode_source": row.record.decode_source})


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
    if v.kind == BASELINE:
        return BASELINE
    if v.low is None or v.high is None:
        return v.kind
    return f"{v.kind} ({v.low:.2f}-{v.high:.2f}x, {v.confidence:.0%})"


def _verdict(row: Row, ctx: Context) -> Cell:
    v = ctx.verdicts.get(row.configuration)
    values = {"verdict": None, "ratio": None, "ratio_low": None, "ratio_high": None, "confidence": None}
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


def _acceptance(row: Row, _ctx: Context) -> Cell:
    spec = row.record.spec
    drafted = spec is not None and bool(spec.draft_tokens)
    return Cell(acceptance_text(row.record), {
        "draft_acceptance": spec.acceptance_rate if drafted else None,
        "mean_acceptance_length": spec.mean_acceptance_length if drafted else None,
    })


def _speculation(row: Row) -> Cell:
    text = speculation(row.record.preset_args)
    return Cell(text, {"speculation": None if text == "-" else text})


def _first_answer(row: Row) -> Cell:
    """A thinking model's first answer token (TTFT is its first generated token, reasoning included)."""
    first, reasoning = row.record.summary("first_answer_ms"), row.record.summary("reasoning_tokens")
    return Cell(num(None if first is None else first.median, 0),
                {"first_answer_ms_median": None if first is None else first.median,
                 "reasoning_tokens_median": None if reasoning is None else reasoning.median})


def thought(rows: Sequence[Row]) -> bool:
    return any(run.reasoning_tokens for row in rows for run in row.record.runs)


def _has_baseline(ctx: Context) -> bool:
    return ctx.baseline is not None


MAIN_COLUMNS: list[Column] = [
    Column("Configuration", lambda row, ctx: Cell(row.configuration, {"configuration": row.configuration})),
    Column("Engine", lambda row, ctx: Cell(
        f"{row.engine} ({'server' if row.record.decode_source == 'server timings' else 'stream'})",
        {"engine": row.engine})),
    Column("Speculation", lambda row, ctx: _speculation(row)),
    Column("KV", lambda row, ctx: Cell(kv_types(row.record.preset_args) if row.record.preset_args else "-",
                                       {"kv_types": kv_types(row.record.preset_args)
                                        if row.record.preset_args else None})),
    Column("Draft accept", _acceptance),
    Column("Decode t/s", _decode),
    Column("min-max", _spread),
    Column("vs baseline", _versus, _has_baseline),
    Column("Verdict", _verdict, _has_baseline),
    Column("Runs", _runs),
    Column("Client t/s", lambda row, ctx: _summary_cell(row, "client_decode_tps", "client_decode_tps_median")),
    Column("Roofline t/s (reached)", _roofline, lambda ctx: ctx.with_roofline),
    Column("TTFT ms", lambda row, ctx: _summary_cell(row, "ttft_ms", "ttft_ms_median", 0)),
    Column("First answer ms", lambda row, ctx: _first_answer(row), lambda ctx: ctx.thought),
    Column("Cold load s", lambda row, ctx: Cell(num(row.record.cold_load_s, 2), {"cold_load_s": row.record.cold_load_s})),
    Column("Context", lambda row, ctx: Cell(context_of(row.record), {
        "context": None if context_of(row.record) == "-" else context_of(row.record)})),
    Column("Quality", lambda row, ctx: ctx.quality.get(row.configuration, Cell("-", {"agreement": None})),
           lambda ctx: bool(ctx.quality)),
    Column("Notes", lambda row, ctx: Cell(notes_of(row.record), {
        "comparable": row.record.comparable, "not_comparable_reason": row.record.not_comparable_reason,
        "errors": list(row.record.errors), "warnings": list(row.record.warnings)})),
]


def context_for(rows: Sequence[Row], baseline: Row | None, min_effect: float | None = None) -> Context:
    chosen = speed_rows(rows)
    bases = {} if baseline is None else {r.configuration: base_for(r, chosen, baseline) for r in chosen}
    verdicts = {name: verdict_of(r, bases[name], min_effect) for r in chosen for name in [r.configuration]
                if name in bases}
    from llm_bench.report.quality import quality_cells  # it renders with this module's Cell and Table

    return Context(baseline, verdicts, any(r.record.roofline_tps for r in chosen), bases,
                   quality_cells(rows, baseline), thought(chosen))


def main_table(rows: Sequence[Row], baseline: Row | None = None, min_effect: float | None = None) -> Table:
    """The comparison of one-stream configurations, fastest first."""
    ctx = context_for(rows, baseline, min_effect)
    columns = [c for c in MAIN_COLUMNS if c.shown(ctx)]
    name_of = {"vs baseline": f"vs {baseline.configuration}"} if baseline is not None else {}
    cells = [[c.cell(row, ctx) for c in columns] for row in sort_fastest_first(speed_rows(rows))]
    return Table(None, "main", [name_of.get(c.name, c.name) for c in columns], cells)


def _tail_cell(record, metric: str, q: int) -> Cell:
    tail = record.tail(metric, q)
    if tail is None:
        return Cell("-", {f"{metric}_p{q}": None})
    if tail.label == "max":
        return Cell(f"max {tail.value:.0f} (n={tail.samples})", {f"{metric}_p{q}": None})
    return Cell(f"{tail.value:.0f}", {f"{metric}_p{q}": tail.value})


def concurrency_table(rows: Sequence[Row]) -> Table | None:
    chosen = sorted((r for r in rows if r.record.workload == "concurrency"),
                    key=lambda r: (r.label, r.record.alias, r.record.concurrency or 0))
    if not chosen:
        return None
    # p90/p99 only where the samples are enough for them (results.min_samples); else the max, labelled
    header = ["Configuration", "Concurrent", "Total t/s", "Per-request t/s p50", "TTFT ms p50", "TTFT ms p90",
              "TTFT ms p99", "Draft accept", "Notes"]
    lines = []
    for row in chosen:
        r = row.record
        values = [r.total_tps, r.percentile("decode_tps", 50), r.percentile("ttft_ms", 50)]
        keys = ["total_tps", "decode_tps_p50", "ttft_ms_p50"]
        digits = [1, 1, 0]
        lines.append([Cell(row.configuration, {"configuration": row.configuration}),
                      Cell(str(r.concurrency), {"concurrency": r.concurrency})]
                     + [Cell(num(v, d), {k: v}) for v, k, d in zip(values, keys, digits)]
                     + [_tail_cell(r, "ttft_ms", 90), _tail_cell(r, "ttft_ms", 99)]
                     + [_acceptance(row, None), Cell(notes_of(r), {"errors": list(r.errors)})])  # type: ignore[arg-type]
    return Table("Concurrency", "concurrency", header, lines)


def prefix_cache_table(rows: Sequence[Row]) -> Table | None:
    chosen = [r for r in rows if r.record.workload == "prefix-cache"]
    if not chosen:
        return None
    header = ["Configuration", "Prompt tokens", "TTFT cold ms", "TTFT repeated ms", "Speed-up", "Cache evidence",
              "Notes"]
    lines = []
    for row in chosen:
        r = row.record
        cold, warm = r.prefix_cold_ttft_ms, r.prefix_warm_ttft_ms
        ratio = cold / warm if cold and warm else None
        prompt = r.runs[0].prompt_tokens if r.runs and r.runs[0].prompt_tokens else None
        lines.append([Cell(row.configuration, {"configuration": row.configuration}),
                      Cell("-" if prompt is None else str(prompt), {"prompt_tokens": prompt}),
                      Cell(num(cold, 0), {"prefix_cold_ttft_ms": cold}),
                      Cell(num(warm, 0), {"prefix_warm_ttft_ms": warm}),
                      Cell("-" if ratio is None else f"{ratio:.1f}x", {"prefix_speedup": ratio}),
                      Cell(r.prefix_evidence or "-", {"prefix_evidence": r.prefix_evidence}),
                      Cell(notes_of(r), {"errors": list(r.errors)})])
    return Table("Prefix caching", "prefix_cache", header, lines)


def telemetry_table(rows: Sequence[Row]) -> Table | None:
    """GPU telemetry and energy of the measured span of each record (llm_bench.gpu.telemetry)."""
    chosen = [r for r in rows if r.record.telemetry]
    if not chosen:
        return None
    header = ["Configuration", "Peak VRAM MiB", "Mean power W", "Max temp C", "J/token", "Tokens/J", "Energy from"]
    fields = [("peak_vram_mib", max, 0), ("mean_power_w", sum, 1), ("max_temperature_c", max, 0),
              ("joules_per_token", None, 3), ("tokens_per_joule", None, 3)]
    lines = []
    for row in chosen:
        t = row.record.telemetry or {}
        cells = [Cell(row.configuration, {"configuration": row.configuration})]
        for key, reduce, digits in fields:
            value = t.get(key)
            if isinstance(value, list):  # one figure per GPU: the peak, or the sum of power over GPUs
                value = reduce(value) if value and reduce else None
            cells.append(Cell(num(value, digits), {key: value}))
        cells.append(Cell(str(t.get("energy_source", "-")), {"energy_source": t.get("energy_source")}))
        lines.append(cells)
    return Table("GPU telemetry and energy", "telemetry", header, lines)


def power_table(sweeps: Sequence[PowerSweep]) -> Table | None:
    """``llm-bench power`` sweeps: decode rate, energy and heat at each power limit."""
    if not sweeps:
        return None
    header = ["Configuration", "Limit W", "Decode t/s", "Tokens/J", "Mean power W", "Max temp C", "SM clock MHz",
              "Notes"]
    fields = [("limit_w", 0), ("decode_tps", 1), ("tokens_per_joule", 3), ("mean_power_w", 1),
              ("max_temperature_c", 0), ("mean_sm_clock_mhz", 0)]
    lines = []
    for sweep in sweeps:
        name = str(sweep.meta.get("alias", sweep.path.name))
        for limit in sweep.limits:
            cells = [Cell(name, {"configuration": name})]
            for key, digits in fields:
                value = limit.get(key)
                value = value if isinstance(value, (int, float)) and not isinstance(value, bool) else None
                cells.append(Cell(num(value, digits), {key: value}))
            errors = [str(e) for e in limit.get("errors", [])]
            cells.append(Cell("FAILED: " + "; ".join(errors) if errors else "", {"errors": errors}))
            lines.append(cells)
    return Table("Power limits", "power", header, lines)


def all_tables(rows: Sequence[Row], baseline: Row | None = None, min_effect: float | None = None) -> list[Table]:
    """The main table (when there is anything to compare), then one per extra workload measured."""
    main = main_table(rows, baseline, min_effect)
    tables = [main] if main.rows else []
    from llm_bench.report.quality import quality_table

    return tables + [t for t in (concurrency_table(rows), prefix_cache_table(rows), *agent_tables(rows),
                                 quality_table(rows, baseline)) if t is not None]


def agent_tables(rows: Sequence[Row]) -> list[Table | None]:
    """The depth and session workloads' tables (report.depth, report.session; they render with this module)."""
    from llm_bench.report.depth import depth_table
    from llm_bench.report.session import session_table, session_turns_table

    return [depth_table(rows), session_table(rows), session_turns_table(rows)]


def section_tables(rows: Sequence[Row], power: Sequence[PowerSweep] = (), baseline: Row | None = None) -> list[Table]:
    """The tables after the main one that the HTML report shows: extra workloads (quality against the baseline),
    GPU telemetry, power sweeps."""
    from llm_bench.report.quality import quality_table  # it renders with this module's Cell and Table

    return [t for t in (concurrency_table(rows), prefix_cache_table(rows), *agent_tables(rows),
                        quality_table(rows, baseline), telemetry_table(rows), power_table(power)) if t is not None]


def _md_cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def markdown(table: Table) -> str:
    out = ["| " + " | ".join(_md_cell(c) for c in table.columns) + " |",
           "|" + "|".join("---" for _ in table.columns) + "|"]
    out.extend("| " + " | ".join(_md_cell(c.text) for c in cells) + " |" for cells in table.rows)
    text = "\n".join(out) + "\n"
    return f"### {table.title}\n\n{text}" if table.title else text


def markdown_table(rows: Sequence[Row], baseline: Row | None = None, min_effect: float | None = None) -> str:
    """The report's comparison table, then one table per extra workload that was measured."""
    return "\n".join(markdown(t) for t in all_tables(rows, baseline, min_effect))
