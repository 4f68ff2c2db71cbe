"""The report's figure: one horizontal bar per configuration, fastest at the top."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from llm_bench.report.rows import (
    base_for,
    sort_fastest_first,
    speed_rows,
    speedup,
    verdict_of,
)
from llm_bench.report.verdict import FASTER, SLOWER, WITHIN_NOISE
from llm_bench.support.plotting import ChartError, check_chart_path, figure
from llm_bench.tables import Row
from llm_bench.workloads import REGISTRY


def draw_chart(rows: Sequence[Row], path: Path, baseline: Row | None = None, title: str | None = None,
               min_effect: float | None = None) -> Path:
    check_chart_path(path)
    measured = [r for r in sort_fastest_first(speed_rows(rows)) if r.decode_tps is not None]
    values = [r.decode_tps or 0.0 for r in measured]  # every one is measured
    if not measured:
        why = ("every alias failed" if speed_rows(rows) else
               "no speed workload (standard, categories) was measured; the chart draws decode rates")
        raise ChartError(f"no configuration has a decode rate to draw: {why}")

    height = max(2.5, 0.55 * len(measured) + 1.4)
    with figure(path, dpi=150, figsize=(10, height)) as (fig, ax):
        positions = list(range(len(measured)))[::-1]  # fastest at the top
        colours = ["#2b6cb0" if r.record.comparable and not r.record.errors else "#a0aec0" for r in measured]
        bars = ax.barh(positions, values, color=colours, height=0.7)
        verdicts = {} if baseline is None else {
            r.configuration: verdict_of(r, base_for(r, measured, baseline), min_effect).kind for r in measured}
        for bar, r in zip(bars, measured, strict=True):  # hatched: not distinguishable from the baseline
            if verdicts.get(r.configuration) == WITHIN_NOISE:
                bar.set_hatch("///")
                bar.set_edgecolor("white")
        for r, pos in zip(measured, positions, strict=True):
            s = r.record.summary("decode_tps")
            if s is not None and s.max > s.min:
                ax.errorbar(s.median, pos, xerr=[[s.median - s.min], [s.max - s.median]],
                            fmt="none", ecolor="#1a202c", capsize=3, linewidth=1)
        ax.set_yticks(positions, [r.configuration for r in measured])
        ax.set_xlabel("decode tokens/s (median; whiskers: min-max)")
        top = max(values)
        # Whiskers can reach past the fastest median; the axis (and the labels beyond them) must hold them.
        span = max([top] + [s.max for s in (r.record.summary("decode_tps") for r in measured) if s is not None])
        edge = span * 1.3
        ax.set_xlim(0, edge)

        marks = {name: mark for w in REGISTRY if w.marks for name, mark in w.marks(rows, baseline).items()}
        for label in ax.get_yticklabels():  # a configuration whose answers differ from the reference's: red
            if label.get_text() in marks:
                label.set_color("#c53030")
        for bar, r in zip(bars, measured, strict=True):
            y = bar.get_y() + bar.get_height() / 2
            value = f"{r.decode_tps or 0.0:.1f} t/s"
            inside = bar.get_width() > top * 0.25
            if inside:  # the figure inside the bar, the comparison beyond the whisker
                ax.text(bar.get_width() - top * 0.01, y, value, va="center", ha="right", fontsize=9,
                        color="white", fontweight="bold")
            s = r.record.summary("decode_tps")
            right = max(bar.get_width(), s.max if s else 0.0) + top * 0.015
            notes = [] if inside else [value]
            if baseline is not None:
                ratio = speedup(r, base_for(r, measured, baseline))
                if ratio is not None:
                    notes.append(f"{ratio:.2f}x")
                kind = verdicts.get(r.configuration)
                if kind in (FASTER, SLOWER, WITHIN_NOISE):
                    notes.append("≈ within noise" if kind == WITHIN_NOISE else kind)
            if not r.record.comparable:
                notes.append("not comparable")
            if any(w.startswith("ACCEPTANCE TRAP") for w in r.record.warnings):
                notes.append("acceptance trap")
            if r.configuration in marks:
                notes.append("!! " + marks[r.configuration])
            ax.text(right, y, "  ".join(notes), va="center", ha="left", fontsize=9,
                    color="#c53030" if r.configuration in marks else "black")

        marked = False
        for r, pos in zip(measured, positions, strict=True):  # the memory-bandwidth roofline of each configuration
            bound = r.record.roofline_tps
            if not bound:
                continue
            if bound <= edge:
                ax.plot([bound], [pos], marker="D", color="#dd6b20", markersize=6, linestyle="none",
                        label=None if marked else "memory-bandwidth roofline")
                marked = True
            else:  # far beyond the axis: say so at the edge instead of stretching every bar to nothing
                ax.annotate(f"roofline {bound:,.0f} t/s >", (edge, pos), xytext=(-2, -9), textcoords="offset points",
                            ha="right", va="center", fontsize=7, color="#dd6b20")

        if marked and (baseline is None or not baseline.decode_tps):
            ax.legend(loc="best", fontsize=9)
        if baseline is not None and baseline.decode_tps:
            ax.axvline(baseline.decode_tps, color="#c53030", linestyle="--", linewidth=1.2,
                       label=f"baseline: {baseline.configuration} ({baseline.decode_tps:.1f} t/s)")
            ax.legend(loc="best", fontsize=9)

        ax.set_title(title or "Decode speed by configuration (faster is better)")
        ax.spines[["top", "right"]].set_visible(False)
    return path
