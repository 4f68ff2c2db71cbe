"""The curve behind each answer: per-stream decode t/s (p10 and median) and TTFT (p95 and median) against
the level, with the objective's lines, one row per alias and loop (PNG or SVG)."""

from __future__ import annotations

from pathlib import Path

from llm_bench.capacity.records import AliasCapacity, Level
from llm_bench.capacity.settings import Objective
from llm_bench.support.plotting import ChartError, figure

MEETS, BREAKS, UNJUDGED = "#2e7d32", "#c62828", "#9e9e9e"


def _colour(level: Level) -> str:
    j = level.judgement
    if j is None or j.meets is None:
        return UNJUDGED
    return MEETS if j.meets else BREAKS


def draw_capacity_chart(aliases: list[AliasCapacity], objective: Objective, path: Path) -> Path:
    rows = [(a.alias, s) for a in aliases for s in a.searches if any(lv.judgement for lv in s.levels)]
    if not rows:
        raise ChartError("no level was measured, so there is no curve to draw")
    from matplotlib.ticker import MaxNLocator  # noqa: PLC0415 - charts are optional; keep the CLI quick to start

    with figure(path, nrows=len(rows), ncols=2, squeeze=False, figsize=(11, 3.6 * len(rows))) as (fig, axes):
        for (alias, search), (left, right) in zip(rows, axes, strict=True):
            levels = sorted((lv for lv in search.levels if lv.judgement is not None), key=lambda lv: lv.level)
            xs = [lv.level for lv in levels]
            xlabel = "concurrent streams (closed loop)" if search.loop == "closed" else "arrivals per minute (open loop)"
            _panel(left, xs, levels, [_value(lv, "decode_p10") for lv in levels],
                   [lv.judgement.decode_median for lv in levels], objective.min_stream_tps,  # type: ignore[union-attr]
                   "per-stream decode t/s", "p10", f"objective >= {objective.min_stream_tps:g} t/s")
            _panel(right, xs, levels, [_seconds(_value(lv, "ttft_p95")) for lv in levels],
                   [_seconds(lv.judgement.ttft_median) for lv in levels], objective.max_ttft_s,  # type: ignore[union-attr]
                   "TTFT s", "p95", f"objective <= {objective.max_ttft_s:g} s")
            for ax in (left, right):
                ax.set_xlabel(xlabel)
                if search.loop == "closed":
                    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
                ax.set_title(f"{alias} ({search.loop} loop)", fontsize=10, loc="left")
                if search.carried is not None:
                    ax.axvline(search.carried, color=MEETS, linestyle=":", linewidth=1)
        fig.suptitle(f"Capacity at {objective.describe()} (green: meets, red: breaks, grey: not judged)", fontsize=11)
    return path


def _value(level: Level, name: str) -> float | None:
    tail = getattr(level.judgement, name)
    return None if tail is None else tail.value


def _seconds(ms: float | None) -> float | None:
    return None if ms is None else ms / 1000.0


def _panel(ax, xs, levels, tails, medians, goal, ylabel, tail_name, goal_label) -> None:
    ax.plot(xs, tails, "-", color="#1565c0", linewidth=1.2, label=tail_name)
    ax.plot(xs, medians, "--", color="#90a4ae", linewidth=1.0, label="median")
    for x, y, level in zip(xs, tails, levels, strict=True):
        if y is not None:
            ax.scatter([x], [y], color=_colour(level), zorder=3, s=36)
    ax.axhline(goal, color="#000000", linestyle="-.", linewidth=0.9, label=goal_label)
    ax.set_ylabel(ylabel)
    ax.set_ylim(bottom=0)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
