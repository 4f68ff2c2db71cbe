"""The depth workload in the report: one table row per configuration and depth, and the chart of
decode t/s against depth, one line per configuration (``llm_bench.workloads.depth``)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from llm_bench.report.rows import Row, notes_of
from llm_bench.report.table import Cell, Table, num
from llm_bench.support.plotting import ChartError, figure


def depth_rows(rows: Sequence[Row]) -> list[Row]:
    chosen = [r for r in rows if r.record.workload == "depth" and r.record.depth is not None]
    return sorted(chosen, key=lambda r: (configuration_of(r), r.record.depth.tokens))  # type: ignore[union-attr]


def configuration_of(row: Row) -> str:
    """The configuration a depth row belongs to (its name without `` [depth N]``)."""
    assert row.record.depth is not None
    return row.configuration.removesuffix(f" [depth {row.record.depth.tokens}]")


def _median(row: Row, metric: str) -> float | None:
    s = row.record.summary(metric)
    return None if s is None else s.median


def _shallowest(rows: Sequence[Row]) -> dict[str, Row]:
    """Per configuration, its measured row of the smallest depth: what the others are compared with."""
    first: dict[str, Row] = {}
    for row in rows:
        if row.decode_tps is not None:
            first.setdefault(configuration_of(row), row)
    return first


def depth_table(rows: Sequence[Row]) -> Table | None:
    chosen = depth_rows(rows)
    if not chosen:
        return None
    first = _shallowest(chosen)
    header = ["Configuration", "Depth", "Context tokens", "Decode t/s", "min-max", "vs shallowest", "Prompt t/s",
              "TTFT ms", "Runs", "Reused tokens", "Notes"]
    lines = []
    for row in chosen:
        point, record = row.record.depth, row.record
        assert point is not None
        name = configuration_of(row)
        decode = record.summary(row.decode_metric)
        base = first.get(name)
        ratio = row.decode_tps / base.decode_tps if base is not None and row.decode_tps and base.decode_tps else None
        context = _median(row, "prompt_tokens")
        reused = [r.cache_n for r in record.runs if r.cache_n is not None]
        notes = (f"skipped: {point.skipped}" if point.skipped else notes_of(record))
        lines.append([
            Cell(name, {"configuration": name}),
            Cell(str(point.tokens), {"depth": point.tokens}),
            Cell(num(context, 0), {"context_tokens": None if context is None else int(context)}),
            Cell(num(row.decode_tps), {"decode_tps_median": row.decode_tps, "decode_source": record.decode_source}),
            Cell("-" if decode is None else f"{decode.min:.1f}-{decode.max:.1f}",
                 {"decode_tps_min": None if decode is None else decode.min,
                  "decode_tps_max": None if decode is None else decode.max}),
            Cell("-" if ratio is None else f"{ratio:.2f}x", {"decode_vs_shallowest": ratio}),
            Cell(num(_median(row, "prompt_tps")), {"prompt_tps_median": _median(row, "prompt_tps")}),
            Cell(num(_median(row, "ttft_ms"), 0), {"ttft_ms_median": _median(row, "ttft_ms")}),
            Cell(str(len(record.runs)), {"runs": len(record.runs)}),
            Cell("-" if not reused else str(max(reused)), {"reused_tokens_max": max(reused) if reused else None}),
            Cell(notes, {"skipped": point.skipped, "errors": list(record.errors), "warnings": list(record.warnings)}),
        ])
    return Table("Speed at context depth", "depth", header, lines)


def draw_depth_chart(rows: Sequence[Row], path: Path, title: str | None = None) -> Path:
    """Decode t/s (median, min-max whiskers) against depth, one line per configuration."""
    lines: dict[str, list[Row]] = {}
    for row in depth_rows(rows):
        if row.decode_tps is not None:
            lines.setdefault(configuration_of(row), []).append(row)
    if not lines:
        raise ChartError("no configuration has a decode rate at any depth to draw")
    with figure(path, dpi=150, figsize=(9, 5)) as (_fig, ax):
        for name, points in lines.items():
            xs = [p.record.depth.tokens for p in points]  # type: ignore[union-attr]
            ys = [p.decode_tps for p in points]
            spans = [p.record.summary(p.decode_metric) for p in points]
            low = [y - s.min if s else 0.0 for y, s in zip(ys, spans)]
            high = [s.max - y if s else 0.0 for y, s in zip(ys, spans)]
            ax.errorbar(xs, ys, yerr=[low, high], marker="o", capsize=3, linewidth=1.5, label=name)
        ax.set_xlabel("context depth (tokens of filler before the prompt)")
        ax.set_ylabel("decode tokens/s (median; whiskers: min-max)")
        ax.set_ylim(bottom=0)
        ax.grid(True, alpha=0.3)
        ax.legend(loc="best", fontsize=9)
        ax.set_title(title or "Decode speed at context depth")
        ax.spines[["top", "right"]].set_visible(False)
    return path


def depth_chart_path(chart: Path) -> Path:
    """Where ``--chart X.png`` puts the depth chart: ``X-depth.png`` beside it."""
    return chart.with_name(f"{chart.stem}-depth{chart.suffix}")
