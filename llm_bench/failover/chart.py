"""The failover timeline: every request at the moment it ended, its decode speed (top) and TTFT (bottom),
coloured by the backend that answered; failed requests as red crosses; the stop and start commands as
shaded spans; PNG or SVG."""

from __future__ import annotations

from pathlib import Path

from llm_bench.failover.records import Command, FailoverRun
from llm_bench.support.plotting import ChartError, figure

FAILED = "#c62828"
COLOURS = ("#1565c0", "#2e7d32", "#ef6c00", "#6a1b9a", "#00838f")


def _span(ax, command: Command | None, colour: str, label: str) -> None:
    if command is None:
        return
    end = command.ended_s if command.ended_s is not None else command.started_s
    ax.axvline(command.started_s, color=colour, linewidth=1.2, label=label)
    if end > command.started_s:
        ax.axvspan(command.started_s, end, color=colour, alpha=0.15)


def draw_timeline(run: FailoverRun, path: Path) -> Path:
    if not run.requests:
        raise ChartError("no request was sent, so there is no timeline to draw")
    f = run.figures()
    backends = sorted({r.backend for r in run.requests if r.ok and r.backend}, key=lambda b: (b != run.primary, b))
    with figure(path, nrows=2, ncols=1, sharex=True, figsize=(11, 6)) as (fig, (speed, ttft)):
        for n, backend in enumerate(backends):
            answered = [r for r in run.requests if r.ok and r.backend == backend]
            role = "primary" if backend == run.primary else "fallback"
            colour = COLOURS[n % len(COLOURS)]
            speed.plot([r.done_s for r in answered], [r.decode_tps for r in answered], "o", markersize=3,
                       color=colour, label=f"{backend} ({role})")
            ttft.plot([r.done_s for r in answered], [None if r.ttft_ms is None else r.ttft_ms / 1000 for r in answered],
                      "o", markersize=3, color=colour)
        failed = [r for r in run.requests if not r.ok]
        if failed:
            for ax in (speed, ttft):
                ax.plot([r.done_s for r in failed], [0] * len(failed), "x", color=FAILED, markersize=6,
                        label=f"failed ({len(failed)})" if ax is speed else None)
        for ax in (speed, ttft):
            _span(ax, run.stop, "#424242", "stop command" if ax is speed else "")
            _span(ax, run.start, "#8d6e63", "start command" if ax is speed else "")
            ax.grid(alpha=0.3)
        speed.set_ylabel("decode t/s (client)")
        ttft.set_ylabel("TTFT s")
        ttft.set_xlabel("seconds since the start (each request when it ended)")
        speed.legend(fontsize=8, loc="lower left")
        over = "-" if f.failover_s is None else f"{f.failover_s:.1f} s"
        back = "-" if f.return_s is None else f"{f.return_s:.1f} s"
        fig.suptitle(f"Failover of {run.model} through {run.url}: {f.failed} of {f.requests} requests failed; "
                     f"fallback answered {over} after the stop, primary {back} after the start", fontsize=10)
    return path
