"""The soak's report: its headline, the Markdown (failures, restarts, percentiles, drift) and the chart; and a
soak results file read back for ``llm-bench report`` (its source: the same Markdown, chart and an HTML section)."""

from __future__ import annotations

import functools
import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from html import escape
from pathlib import Path
from typing import Any

from llm_bench.report.html import inline_svg
from llm_bench.report.sources import Shown, Source, numbered
from llm_bench.results import ResultsFileError
from llm_bench.soak.traffic import FORMAT, KINDS, SoakResult
from llm_bench.support.plotting import figure
from llm_bench.support.stats import Tail


def tail_cell(tail: Tail) -> str:
    return f"{tail.value:.2f}" if tail.label != "max" else f"max {tail.value:.2f} (n={tail.samples})"


KIND_WORDS = {"prose": "prose", "code": "code", "json": "JSON", "long": "long prompts",
              "concurrent": "concurrent generation", "tool": "tool calls", "thinking": "thinking",
              "image": "image input"}


DRIFT_WORDS = {"decode_tps": ("decode", "t/s"), "ttft_ms": ("TTFT", "ms"), "vram_mib": ("VRAM", "MiB")}


def _plural(n: int, word: str) -> str:
    return f"{n:,} {word}" + ("" if n == 1 else "s")


def drift_text(result: SoakResult) -> str:
    """The drift beyond noise, each slope with its interval; "no drift beyond noise" when none is."""
    drifting = [t for t in result.trends if t.beyond_noise]
    if not result.trends:
        return ""
    if not drifting:
        return "no drift beyond noise"
    words = DRIFT_WORDS
    return "drift: " + ", ".join(
        f"{words[t.metric][0]} {t.slope_per_min:+.2f} {words[t.metric][1]} per min "
        f"(95 % CI {t.slope_low_per_min:+.2f} to {t.slope_high_per_min:+.2f})" for t in drifting)


def headline(result: SoakResult) -> str:
    """The report's sentence: requests and their kinds, failures, restarts, new GPU errors, drift; what
    was not watched is said so, never counted as 0."""
    kinds = [KIND_WORDS[k] for k in KINDS if result.counts_by_kind().get(k)]
    kinds_text = (", ".join(kinds[:-1]) + " and " + kinds[-1]) if len(kinds) > 1 else "".join(kinds)
    failed = sum(result.failures.values())
    restarts = str(result.restart_count) if result.restarts else "uncounted"
    gpu = (f"{result.gpu_error_count} new GPU error{'' if result.gpu_error_count == 1 else 's'}"
           if result.gpu_errors_watched else "GPU errors not watched")
    drift = drift_text(result)
    return (f"{_plural(len(result.requests), 'mixed request')} ({kinds_text}) in {result.duration_s:.0f} s with "
            f"{_plural(failed, 'failure')}, {restarts} restart{'' if restarts == '1' else 's'} and {gpu}"
            + (f"; {drift}" if drift else "") + f" (stopped by {result.stopped_by}).")


def markdown(result: SoakResult) -> str:
    lines = [f"Soak: {headline(result)}", ""]
    if result.failures_by_kind:
        lines.append("Failures by kind: " + "; ".join(
            f"{kind} {sum(per.values())} (" + ", ".join(f"{k} {v}" for k, v in sorted(per.items())) + ")"
            for kind, per in sorted(result.failures_by_kind.items())))
        examples = {}
        for r in result.requests:
            if not r.ok and r.kind not in examples:
                examples[r.kind] = r.message
        lines += [f"- {kind}: {message}" for kind, message in examples.items()]
    for kind, reason in result.skipped.items():
        lines.append(f"Skipped {kind}: {reason}")
    for restart in result.restarts:
        lines.append(f"Restarts, {restart.source}: {restart.count} ({restart.evidence})")
    lines += [f"New GPU error: {e}" for e in result.gpu_errors]
    lines += [f"Not watched: {u}" for u in result.unwatched]
    lines += ["", "| Metric | p50 | p90 | p99 |", "|---|---|---|---|"]
    for metric, label in (("ttft_ms", "TTFT ms"), ("decode_tps", "Decode t/s"), ("wall_s", "Latency s")):
        p = result.tails(metric)
        if p:
            lines.append(f"| {label} | " + " | ".join(tail_cell(p[q]) for q in (50, 90, 99)) + " |")
    if result.trends:
        lines += ["", "| Drift | slope per min | 95 % CI | beyond noise | R^2 | first | last |",
                  "|---|---|---|---|---|---|---|"]
        lines += [f"| {t.metric} | {t.slope_per_min:+.3f} | {t.slope_low_per_min:+.3f} to "
                  f"{t.slope_high_per_min:+.3f} | {'yes' if t.beyond_noise else 'no'} | {t.r2:.2f} | {t.first:.1f} | "
                  f"{t.last:.1f} |"
                  for t in result.trends]
    if result.warnings:
        lines += [""] + [f"- {w}" for w in result.warnings]
    return "\n".join(lines) + "\n"


def draw_soak_chart(result: SoakResult, path: Path, title: str | None = None) -> Path:
    """Decode t/s, TTFT and VRAM over the soak, with the fitted drift lines."""

    metrics = [("decode_tps", "decode t/s"), ("ttft_ms", "TTFT ms"), ("vram_mib", "VRAM MiB (all GPUs)")]
    with figure(path, dpi=110, nrows=len(metrics), ncols=1, figsize=(9, 7), sharex=True) as (fig, axes):
        trends = {t.metric: t for t in result.trends}
        for ax, (metric, label) in zip(axes, metrics, strict=True):
            pts = [(r.t_s, getattr(r, metric)) for r in result.requests if getattr(r, metric) is not None]
            bad = [r.t_s for r in result.requests if not r.ok]
            if pts:
                ax.plot([p[0] for p in pts], [p[1] for p in pts], ".", color="#2b6cb0", markersize=4)
            t = trends.get(metric)
            if t is not None and pts:
                x0, x1 = pts[0][0], pts[-1][0]
                slope = t.slope_per_min / 60.0
                mx = statistics.fmean(p[0] for p in pts)
                my = statistics.fmean(p[1] for p in pts)
                ax.plot([x0, x1], [my + slope * (x0 - mx), my + slope * (x1 - mx)], "--", color="#c53030",
                        label=f"slope {t.slope_per_min:+.2f}/min (95 % CI {t.slope_low_per_min:+.2f} to "
                              f"{t.slope_high_per_min:+.2f}{'' if t.beyond_noise else ': within noise'})")
                ax.legend(loc="upper right", fontsize=8)
            for x in bad:
                ax.axvline(x, color="#e53e3e", alpha=0.3, linewidth=1)
            ax.set_ylabel(label)
            ax.spines[["top", "right"]].set_visible(False)
        axes[-1].set_xlabel("seconds since the start of the soak (red lines: failed requests)")
        fig.suptitle(title or f"Soak: {len(result.requests)} requests, {sum(result.failures.values())} failed")
    return path


@dataclass(frozen=True)
class SoakFile:
    """One soak results file read back."""

    path: Path
    meta: dict[str, Any]
    result: SoakResult


def soak_of(path: Path, data: dict[str, Any]) -> SoakFile:
    """A soak results file, as ``results.read_toml`` read it."""
    meta, soak = data.get("meta"), data.get("soak")
    if not isinstance(meta, dict) or meta.get("format") != FORMAT:
        raise ResultsFileError(f"{path} is not an llm-bench soak results file (no meta.format = {FORMAT!r})")
    if not isinstance(soak, dict):
        raise ResultsFileError(f"{path}: a soak results file without its [soak] table (was it cut short "
                               "before the first request?)")
    try:
        return SoakFile(path, meta, SoakResult.from_toml(soak))
    except (KeyError, TypeError, ValueError) as e:
        raise ResultsFileError(f"{path}: a soak results file with a damaged request or trend ({e})") from e


def _title(file: SoakFile) -> str:
    return f"Soak of {file.meta.get('alias', file.path.name)}"


def show(files: Sequence[SoakFile]) -> Shown:
    return Shown(markdown="\n".join(markdown(f.result) for f in files),
                 sections=(soak_html(files),) if files else (),
                 provenance=tuple(dict(f.meta, label=f"soak {f.path.name}") for f in files))


def soak_html(files: Sequence[SoakFile]) -> str:
    """The soak section of the HTML report: per file, its headline, its chart and its Markdown as text."""
    parts = ['<section id="soak">', "<h2>Soak</h2>"]
    for n, file in enumerate(files):
        parts.append(f"<h3>{escape(_title(file))}</h3>")
        parts.append(f"<p>{escape(headline(file.result))}</p>")
        svg = inline_svg(functools.partial(draw_soak_chart, file.result, title=_title(file)), "soak chart")
        if svg:
            parts.append(f'<figure id="soak{n}-chart"><div class="scroll">{svg}</div></figure>')
        parts.append(f"<pre>{escape(markdown(file.result))}</pre>")
    parts.append("</section>")
    return "\n".join(parts)


def charts(files: Sequence[SoakFile], path: Path) -> list[Path]:
    return [draw_soak_chart(f.result, numbered(path, n, len(files)), _title(f)) for n, f in enumerate(files, 1)]


SOURCE = Source("soak", FORMAT, "soak", load=soak_of, show=show, charts=charts)
