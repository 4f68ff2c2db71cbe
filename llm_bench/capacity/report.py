"""A capacity results file read back for ``llm-bench report``: its answers and levels (Markdown), its curve
(a chart file), and its section of the HTML report (the answers, the curve as inline SVG, each search's
levels), registered as the report's capacity source. Every level is judged again from its requests, so
what is shown is what the requests say.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from dataclasses import dataclass
from html import escape
from pathlib import Path
from typing import Any

from llm_bench.capacity.answer import levels_table, markdown
from llm_bench.capacity.chart import draw_capacity_chart
from llm_bench.capacity.records import AliasCapacity
from llm_bench.capacity.session import FORMAT
from llm_bench.capacity.settings import Objective
from llm_bench.report.html import inline_svg, table_html
from llm_bench.report.sources import Shown, Source, numbered
from llm_bench.results import ResultsFileError
from llm_bench.validation import PlanError


@dataclass(frozen=True)
class CapacityResults:
    path: Path
    meta: dict[str, Any]
    objective: Objective
    aliases: list[AliasCapacity]

    @property
    def name(self) -> str:
        return self.meta.get("label") or self.path.name

    def markdown(self) -> str:
        return markdown(self.aliases, self.objective)


def capacity_of(path: Path, data: dict[str, Any]) -> CapacityResults:
    """A capacity results file, as ``results.read_toml`` read it."""
    meta = data.get("meta")
    if not isinstance(meta, dict) or meta.get("format") != FORMAT:
        raise ResultsFileError(f"{path} is not an llm-bench capacity results file (no meta.format = {FORMAT!r})")
    goal = meta.get("objective") or {}
    try:
        objective = Objective(float(goal["min_stream_tps"]), float(goal["max_ttft_s"]))
        aliases = [AliasCapacity.from_toml(a, objective) for a in data.get("aliases", [])]
    except (PlanError, KeyError, TypeError, ValueError) as e:
        raise ResultsFileError(f"{path}: a capacity results file with a damaged objective or level ({e})") from e
    return CapacityResults(path, meta, objective, aliases)


def _e(value: Any) -> str:
    return escape(str(value), quote=True)


def capacity_html(results: Sequence[CapacityResults]) -> str:
    """The capacity section of the HTML report: per file, the answers, the curve and each search's levels."""
    parts = ['<section id="capacity">', "<h2>Capacity</h2>"]
    for n, result in enumerate(results):
        objective = result.objective
        if len(results) > 1:
            parts.append(f"<h3>{_e(result.name)}</h3>")
        parts.append(f'<p class="note">Objective: every stream {_e(objective.describe())} (p10 of the requests\' '
                     "decode t/s, p95 of their TTFT, over each level's window).</p>")
        answers = [s.answer for a in result.aliases for s in a.searches] + \
                  [f"{a.alias}: {e}" for a in result.aliases for e in a.errors]
        parts.append(f'<ul class="capacity-answers">{"".join(f"<li>{_e(t)}</li>" for t in answers)}</ul>')
        svg = inline_svg(functools.partial(draw_capacity_chart, result.aliases, objective,
                                           prefix=f"capacity{n}-curve"), "capacity curve")
        if svg:
            caption = (f"Per-stream decode t/s (p10, median) and TTFT (p95, median) against the level; dash-dot: "
                       f"the objective (>= {objective.min_stream_tps:g} t/s, <= {objective.max_ttft_s:g} s); "
                       "dotted: the level carried; green: meets, red: breaks, grey: not judged.")
            parts.append(f'<figure id="capacity{n}-chart"><div class="scroll">{svg}</div>'
                         f"<figcaption>{_e(caption)}</figcaption></figure>")
        for a, alias in enumerate(result.aliases):
            for search in alias.searches:
                unit = "streams" if search.loop == "closed" else "requests/min"
                parts.append(f"<h3>{_e(alias.alias)}: {search.loop} loop (level = {unit}, in the order measured)</h3>")
                parts.append(table_html(levels_table(search, objective), f"capacity{n}-{a}-{search.loop}"))
    parts.append("</section>")
    return "\n".join(parts)


def capacity_provenance(results: Sequence[CapacityResults]) -> list[dict[str, Any]]:
    """Each file's meta for the report's provenance, labelled as a capacity run."""
    return [dict(r.meta, label=f"capacity {r.name}") for r in results]


def show(results: Sequence[CapacityResults]) -> Shown:
    return Shown(markdown="\n".join(r.markdown() for r in results),
                 sections=(capacity_html(results),) if results else (),
                 provenance=tuple(capacity_provenance(results)))


def charts(results: Sequence[CapacityResults], path: Path) -> list[Path]:
    """Each capacity file's curve: to ``path`` for one file, else ``path`` with the file's number."""
    return [draw_capacity_chart(r.aliases, r.objective, numbered(path, n, len(results)))
            for n, r in enumerate(results, 1)]


SOURCE = Source("capacity", FORMAT, "capacity", load=capacity_of, show=show, charts=charts)
