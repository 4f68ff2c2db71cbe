"""A failover results file read back for ``llm-bench report``: the summary the command printed, the
timeline chart, and an HTML section with both (the figures computed again from the requests)."""

from __future__ import annotations

import functools
from collections.abc import Sequence
from dataclasses import dataclass
from html import escape
from pathlib import Path
from typing import Any

from llm_bench.failover.chart import draw_timeline
from llm_bench.failover.records import FORMAT, FailoverRun
from llm_bench.failover.summary import summary
from llm_bench.report.html import inline_svg
from llm_bench.report.sources import Shown, Source, numbered
from llm_bench.results import ResultsFileError


@dataclass(frozen=True)
class FailoverFile:
    path: Path
    meta: dict[str, Any]
    run: FailoverRun


def failover_of(path: Path, data: dict[str, Any]) -> FailoverFile:
    """A failover results file, as ``results.read_toml`` read it."""
    meta = data.get("meta")
    if not isinstance(meta, dict) or meta.get("format") != FORMAT:
        raise ResultsFileError(f"{path} is not an llm-bench failover results file (no meta.format = {FORMAT!r})")
    try:
        return FailoverFile(path, meta, FailoverRun.from_toml(data))
    except (KeyError, TypeError, ValueError) as e:
        raise ResultsFileError(f"{path}: a failover results file with a damaged request or command ({e})") from e


def markdown(file: FailoverFile) -> str:
    return f"# Failover through {file.run.url} ({file.run.model})\n\n{summary(file.run)}\n"


def show(files: Sequence[FailoverFile]) -> Shown:
    return Shown(markdown="\n".join(markdown(f) for f in files), sections=(failover_html(files),) if files else (),
                 provenance=tuple(dict(f.meta, label=f"failover {f.path.name}") for f in files))


def failover_html(files: Sequence[FailoverFile]) -> str:
    parts = ['<section id="failover">', "<h2>Failover</h2>"]
    for n, file in enumerate(files):
        parts.append(f"<h3>{escape(file.run.url)} ({escape(file.run.model)})</h3>")
        svg = inline_svg(functools.partial(draw_timeline, file.run), "failover timeline")
        if svg:
            parts.append(f'<figure id="failover{n}-chart"><div class="scroll">{svg}</div></figure>')
        parts.append(f"<pre>{escape(summary(file.run))}</pre>")
    parts.append("</section>")
    return "\n".join(parts)


def charts(files: Sequence[FailoverFile], path: Path) -> list[Path]:
    return [draw_timeline(f.run, numbered(path, n, len(files))) for n, f in enumerate(files, 1)]


SOURCE = Source("failover", FORMAT, "failover", load=failover_of, show=show, charts=charts)
