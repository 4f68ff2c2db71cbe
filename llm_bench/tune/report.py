"""The tune's report: the ranked table, the summary lines, and speed against quality with the Pareto front."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

from llm_bench.support.numbers import fmt
from llm_bench.support.plotting import ChartError, figure
from llm_bench.tune.grid import Value
from llm_bench.tune.search import Entry, Outcome


def changes(entry: Entry, control: Entry) -> str:
    """What sets a candidate apart from the control (its whole preset for the control itself)."""
    base: Mapping[str, Value] = control.candidate.preset
    mine = entry.candidate.preset
    if entry.control:
        return "control" + (": " + ", ".join(f"{k}={v}" for k, v in mine.items() if k != "model") if mine else "")
    diff = [f"{k}={v}" for k, v in mine.items() if base.get(k) != v]
    diff += [f"-{k}" for k in base if k not in mine]
    return ", ".join(diff) or "-"


def status(entry: Entry, outcome: Outcome) -> str:
    if entry is outcome.winner:
        return "**winner**" + ("" if outcome.separated else " (not separated from every contender)")
    if entry.invalid:
        return f"invalid: {entry.invalid}"
    if entry.rejected:
        return f"rejected for quality: {entry.rejected}"
    if entry.dropped:
        return entry.dropped
    if entry.control:
        return "control"
    if entry.finalist:
        return "finalist"
    return "not screened (budget)" if entry.screen is None else "screened"


def ranked(outcome: Outcome) -> list[Entry]:
    """Winner first, then full-run results by speed, then screen-only by screen speed, then invalid."""
    def key(e: Entry) -> tuple:
        group = 0 if e is outcome.winner else 1 if e.full_runs() else 2 if e.screen_speed() else 3
        return group, -(e.speed() or 0.0)
    return sorted(outcome.entries, key=key)


def acceptance(entry: Entry) -> str:
    record = entry.full or entry.screen
    spec = record.spec if record else None
    if spec is None or not spec.draft_tokens:
        return "-"
    return f"{spec.acceptance_rate:.0%}"


def ttft(entry: Entry) -> str:
    record = entry.full or entry.screen
    s = record.summary("ttft_ms") if record else None
    return "-" if s is None else f"{s.median:.0f}"


def quality_text(entry: Entry) -> str:
    if entry.control:
        return "reference" if entry.quality_record is not None else "-"
    return entry.quality.describe() if entry.quality else "-"


def ranked_table(outcome: Outcome) -> str:
    header = ["#", "Preset", "Differs from the control", "Decode t/s", "Runs", "vs control", "Draft accept",
              "TTFT ms", "Quality", "Status"]
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    for n, e in enumerate(ranked(outcome), 1):
        runs = e.full_runs()
        decode = fmt(e.speed()) + ("" if runs or e.speed() is None else " (screen)")
        cells = [str(n), e.name, changes(e, outcome.control), decode,
                 str(len(runs)) if runs else ("1 short" if e.screen_speed() else "-"),
                 e.verdict.describe() if e.verdict else ("-" if not e.control else "="),
                 acceptance(e), ttft(e), quality_text(e), status(e, outcome)]
        lines.append("| " + " | ".join(c.replace("|", "\\|").replace("\n", " ") for c in cells) + " |")
    return "\n".join(lines) + "\n"


def summary_lines(outcome: Outcome) -> str:
    lines = []
    w = outcome.winner
    if w is None:
        lines.append("- no winner: no candidate passed the quality gate with full runs")
    elif w.control:
        lines.append(f"- winner: the control **{w.name}**, {fmt(w.speed())} t/s: no candidate beat it")
    else:
        lines.append(f"- winner: **{w.name}**, {fmt(w.speed())} t/s; against the control {outcome.control.name} "
                     f"({fmt(outcome.control.speed())} t/s): {w.verdict.describe() if w.verdict else '-'}")
    lines.append(f"- search stopped: {outcome.stop_reason}")
    rejected = [e for e in outcome.entries if e.rejected]
    faster = outcome.rejected_faster()
    for e in rejected:
        tag = "faster than the winner but " if e in faster else ""
        lines.append(f"- rejected for quality: {e.name} ({fmt(e.speed())} t/s), {tag}{e.rejected}")
    invalid = [e for e in outcome.entries if e.invalid]
    for e in invalid:
        lines.append(f"- invalid: {e.name}: {e.invalid}")
    return "\n".join(lines) + "\n"


def pareto_front(points: Sequence[tuple[float, float]]) -> list[int]:
    """Indices of the points no other point beats on both quality (x) and speed (y)."""
    front = []
    for i, (x, y) in enumerate(points):
        dominated = any((x2 >= x and y2 >= y) and (x2 > x or y2 > y) for j, (x2, y2) in enumerate(points) if j != i)
        if not dominated:
            front.append(i)
    return sorted(front, key=lambda i: points[i][0])


def draw_pareto(outcome: Outcome, path: Path) -> Path:
    """Decode t/s against agreement with the control; the Pareto front joined, the winner starred."""
    chosen = [e for e in outcome.entries if e.full_runs() and (e.control or e.quality is not None)]
    if len(chosen) < 2:
        raise ChartError("fewer than two presets have both full runs and a quality score; nothing to chart")
    points = [(1.0 if e.control else e.quality.identical_share, e.speed() or 0.0) for e in chosen]  # type: ignore[union-attr]
    front = pareto_front(points)
    with figure(path, dpi=150, figsize=(8, 5.5)) as (_fig, ax):
        for e, (x, y) in zip(chosen, points, strict=True):
            colour = "#c53030" if e.rejected else "#718096" if e.control else "#2b6cb0"
            ax.scatter([x], [y], color=colour, s=60, zorder=3)
            ax.annotate(e.name, (x, y), textcoords="offset points", xytext=(6, 4), fontsize=8)
        fx, fy = [points[i][0] for i in front], [points[i][1] for i in front]
        ax.plot(fx, fy, "--", color="#2f855a", zorder=2, label="Pareto front")
        ax.scatter(fx, fy, facecolors="none", edgecolors="#2f855a", s=160, zorder=2)
        if outcome.winner is not None and outcome.winner in chosen:
            wx, wy = points[chosen.index(outcome.winner)]
            ax.scatter([wx], [wy], marker="*", color="#d69e2e", s=260, zorder=4, label="winner")
        if outcome.control.speed():
            ax.axhline(outcome.control.speed(), color="#718096", linestyle=":", linewidth=1, label="control")
        ax.set_xlabel("agreement with the control (share of identical greedy outputs)")
        ax.set_ylabel("decode t/s (median of full runs)")
        ax.set_xlim(-0.05, 1.1)
        ax.set_title("Speed against quality (red: rejected by the quality gate)")
        ax.legend(loc="lower left", fontsize=8)
    return path
