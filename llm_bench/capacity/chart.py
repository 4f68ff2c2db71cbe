"""The curve behind each answer: per-stream decode t/s (p10 and median) and TTFT (p95 and median) against
the level, with the objective's lines, one row per alias and loop (PNG or SVG).

``curves`` is what is drawn, point for point; every line carries an SVG id (``{prefix}{row}-decode-p10``,
``-decode-median``, ``-decode-objective``, ``-ttft-p95``, ``-ttft-median``, ``-ttft-objective``) so that a
page or a test can find it.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from llm_bench.capacity.records import AliasCapacity, Level, Search
from llm_bench.capacity.settings import Objective
from llm_bench.support.plotting import ChartError, figure

MEETS, BREAKS, UNJUDGED = "#2e7d32", "#c62828", "#9e9e9e"


@dataclass(frozen=True)
class Curve:
    """One search's judged levels in the order of the level, as the chart draws them."""

    alias: str
    loop: str
    levels: list[float]
    decode_p10: list[float | None]  # t/s (or the min where the samples were too few for p10)
    decode_median: list[float | None]
    ttft_p95_s: list[float | None]  # seconds (or the max where the samples were too few for p95)
    ttft_median_s: list[float | None]
    meets: list[bool | None]  # None: not judged
    carried: float | None

    @property
    def xlabel(self) -> str:
        return "concurrent streams (closed loop)" if self.loop == "closed" else "arrivals per minute (open loop)"


def curve(alias: str, search: Search) -> Curve:
    levels = sorted((lv for lv in search.levels if lv.judgement is not None), key=lambda lv: lv.level)
    judged = [lv.judgement for lv in levels if lv.judgement is not None]
    return Curve(alias, search.loop, [lv.level for lv in levels], [_value(lv, "decode_p10") for lv in levels],
                 [j.decode_median for j in judged], [_seconds(_value(lv, "ttft_p95")) for lv in levels],
                 [_seconds(j.ttft_median) for j in judged], [j.meets for j in judged], search.carried)


def curves(aliases: list[AliasCapacity]) -> list[Curve]:
    """Every search with a judged level, alias by alias: the chart's rows."""
    return [curve(a.alias, s) for a in aliases for s in a.searches if any(lv.judgement for lv in s.levels)]


def _colour(meets: bool | None) -> str:
    return UNJUDGED if meets is None else MEETS if meets else BREAKS


def draw_capacity_chart(aliases: list[AliasCapacity], objective: Objective, path: Path, prefix: str = "curve") -> Path:
    rows = curves(aliases)
    if not rows:
        raise ChartError("no level was measured, so there is no curve to draw")
    from matplotlib.ticker import MaxNLocator  # noqa: PLC0415 - charts are optional; keep the CLI quick to start

    with figure(path, nrows=len(rows), ncols=2, squeeze=False, figsize=(11, 3.6 * len(rows))) as (fig, axes):
        for row, (c, (left, right)) in enumerate(zip(rows, axes, strict=True)):
            _panel(left, c, c.decode_p10, c.decode_median, objective.min_stream_tps, f"{prefix}{row}-decode",
                   "per-stream decode t/s", "p10", f"objective >= {objective.min_stream_tps:g} t/s")
            _panel(right, c, c.ttft_p95_s, c.ttft_median_s, objective.max_ttft_s, f"{prefix}{row}-ttft",
                   "TTFT s", "p95", f"objective <= {objective.max_ttft_s:g} s")
            for ax in (left, right):
                ax.set_xlabel(c.xlabel)
                if c.loop == "closed":
                    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
                ax.set_title(f"{c.alias} ({c.loop} loop)", fontsize=10, loc="left")
                if c.carried is not None:
                    ax.axvline(c.carried, color=MEETS, linestyle=":", linewidth=1)
        fig.suptitle(f"Capacity at {objective.describe()} (green: meets, red: breaks, grey: not judged)", fontsize=11)
    return path


def _value(level: Level, name: str) -> float | None:
    tail = getattr(level.judgement, name)
    return None if tail is None else tail.value


def _seconds(ms: float | None) -> float | None:
    return None if ms is None else ms / 1000.0


def _panel(ax, c: Curve, tails, medians, goal, gid, ylabel, tail_name, goal_label) -> None:
    ax.plot(c.levels, tails, "-", color="#1565c0", linewidth=1.2, label=tail_name, gid=f"{gid}-{tail_name}")
    ax.plot(c.levels, medians, "--", color="#90a4ae", linewidth=1.0, label="median", gid=f"{gid}-median")
    for x, y, meets in zip(c.levels, tails, c.meets, strict=True):
        if y is not None:
            ax.scatter([x], [y], color=_colour(meets), zorder=3, s=36)
    ax.axhline(goal, color="#000000", linestyle="-.", linewidth=0.9, label=goal_label, gid=f"{gid}-objective")
    ax.set_ylabel(ylabel)
    ax.set_ylim(bottom=0)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
