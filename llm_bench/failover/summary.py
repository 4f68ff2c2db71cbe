"""The failover run in words and a small table, as the command prints it."""

from __future__ import annotations

from llm_bench.failover.records import FailoverRun


def _s(value: float | None, unit: str = " s", digits: int = 1) -> str:
    return "-" if value is None else f"{value:.{digits}f}{unit}"


def summary(run: FailoverRun) -> str:
    f = run.figures()
    lines = [
        f"requests: {f.requests}, failed: {f.failed}",
        f"fallback answered {_s(f.failover_s)} after the stop command started"
        + ("" if run.stop is None else f" (the command took {_s(run.stop.duration_s)})"),
        f"primary answered {_s(f.return_s)} after the start command started"
        + ("" if run.start is None else f" (the command took {_s(run.start.duration_s)})"),
        "",
        "| phase | answered | failed | by backend | decode t/s (median) | TTFT ms (median) | answered/s |",
        "|---|---|---|---|---|---|---|",
    ]
    for p in f.phases:
        backends = ", ".join(f"{b}: {n}" for b, n in sorted(p.by_backend.items())) or "-"
        lines.append(f"| {p.name} | {p.answered} | {p.failed} | {backends} | {_s(p.decode_tps_median, '')} | "
                     f"{_s(p.ttft_ms_median, '', 0)} | {_s(p.answered_per_s, '', 2)} |")
    for message, count in f.errors.items():
        lines.append(f"failed x{count}: {message}")
    for problem in run.problems:
        lines.append(f"PROBLEM: {problem}")
    return "\n".join(lines)
