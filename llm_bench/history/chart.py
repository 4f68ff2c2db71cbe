"""The history chart: decode t/s (top) and TTFT (bottom) of each configuration over its results, one line per
configuration, the band each point's runs give (the median's exact 95 % interval, or min-max where the runs
are too few for it), regressions marked with a red cross, rig changes with a grey ring, builds on the x axis."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from llm_bench.history.steps import REGRESSION, RIG_CHANGE, History, Step
from llm_bench.support.plotting import ChartError, check_chart_path, figure
from llm_bench.support.stats import clean, median_interval


def band(values: Sequence[float | None]) -> tuple[float, float, float] | None:
    """(median, low, high): the exact interval where the runs reach it, else their range."""
    xs = sorted(clean(values))
    if not xs:
        return None
    mid = xs[len(xs) // 2] if len(xs) % 2 else (xs[len(xs) // 2 - 1] + xs[len(xs) // 2]) / 2
    interval = median_interval(xs)
    low, high = (interval[0], interval[1]) if interval else (xs[0], xs[-1])
    return mid, low, high


def _series(history: History) -> dict[tuple[str, ...], list[Step]]:
    out: dict[tuple[str, ...], list[Step]] = {}
    for step in history.steps:
        out.setdefault(step.point.series, []).append(step)
    return out


def draw_history_chart(history: History, path: Path, title: str | None = None) -> Path:
    check_chart_path(path)
    series = _series(history)
    if not series:
        raise ChartError("no results to draw: the history holds no measured configuration")
    # one x axis for every configuration: each moment a result was measured, in time order
    moments = sorted({s.point.started_at for s in history.steps})
    first_at = {m: next(s for s in history.steps if s.point.started_at == m) for m in moments}
    # to the minute, unless two results share one (the bed's, minutes apart at most)
    stamp = "%m-%d %H:%M" if len({m.strftime("%Y%m%d%H%M") for m in moments}) == len(moments) else "%m-%d %H:%M:%S"
    ticks = [f"{m.strftime(stamp)}\n{_short(first_at[m])}" for m in moments]
    with figure(path, dpi=150, figsize=(max(8.0, 1.1 * len(moments) + 3), 7), nrows=2) as (fig, (decode_ax, ttft_ax)):
        # the series' name without the label: one series may hold results labelled "before" and "after"
        names = [steps[0].point.configuration for steps in series.values()]
        for n, steps in enumerate(series.values()):
            # one name, several series (another protocol, model or preset): numbered, never merged
            name = names[n] if names.count(names[n]) == 1 else f"{names[n]} #{names[:n + 1].count(names[n])}"
            x = [moments.index(s.point.started_at) for s in steps]
            for ax, values_of, label in ((decode_ax, lambda s: s.point.decode_values(s.metric), "decode"),
                                         (ttft_ax, lambda s: s.point.ttft_values(), "ttft")):
                bands = [band(values_of(s)) for s in steps]
                xs = [i for i, b in zip(x, bands, strict=True) if b is not None]
                got = [b for b in bands if b is not None]
                if not got:
                    continue
                line, = ax.plot(xs, [b[0] for b in got], marker="o", label=name, gid=f"history-{label}-{name}")
                ax.fill_between(xs, [b[1] for b in got], [b[2] for b in got], alpha=0.2, color=line.get_color())
                for i, s, b in zip(x, steps, bands, strict=True):
                    if b is None:
                        continue
                    if s.kind == REGRESSION:
                        ax.plot([i], [b[0]], marker="X", markersize=13, color="#c53030", linestyle="none",
                                gid=f"regression-{label}-{i}")
                        if label == "decode":
                            ax.annotate("regression", (i, b[0]), textcoords="offset points", xytext=(6, -14),
                                        color="#c53030", fontsize=8)
                    elif s.kind == RIG_CHANGE:
                        ax.plot([i], [b[0]], marker="o", markersize=12, markerfacecolor="none", color="#718096",
                                linestyle="none")
                        if label == "decode":
                            ax.annotate("rig change", (i, b[0]), textcoords="offset points", xytext=(6, 6),
                                        color="#4a5568", fontsize=8)
        for ax in (decode_ax, ttft_ax):
            ax.set_xticks(list(range(len(moments))), ticks, fontsize=7)
        decode_ax.set_ylabel("decode t/s (median, 95% band)")
        ttft_ax.set_ylabel("TTFT ms (median, 95% band)")
        decode_ax.set_ylim(bottom=0)
        ttft_ax.set_ylim(bottom=0)
        decode_ax.legend(fontsize=8, loc="lower left")
        decode_ax.set_title(title or "llm-bench history: decode and TTFT over builds")
    return path


def _short(step: Step) -> str:
    build = step.point.build
    for text in (build.version, build.package_path, build.server_build):
        if not text.startswith("not available"):
            return text.rsplit("/", 1)[-1][:28]
    return "?"
