"""The history as a self-contained HTML page (the report's page and table styles): the regressions and refusals,
the chart inline, the table, and each build's fingerprint."""

from __future__ import annotations

from datetime import UTC, datetime
from html import escape
from pathlib import Path

from llm_bench import __version__
from llm_bench.history.chart import draw_history_chart
from llm_bench.history.points import Inputs
from llm_bench.history.steps import History
from llm_bench.history.table import history_table, lines
from llm_bench.report.html import PAGE, inline_svg, table_html


def history_section(history: History, inputs: Inputs, title: str | None = None) -> str:
    """The history's section: what to read first, the chart, the table, the builds' fingerprints."""
    parts = ['<section id="history">', "<h2>History</h2>"]
    notes = lines(history, inputs)
    if notes:
        warning = ' class="warning"'
        parts.append("<ul>" + "".join(f'<li{warning if n.startswith("REGRESSION") else ""}>{escape(n)}</li>'
                                      for n in notes) + "</ul>")
    svg = inline_svg(lambda path: draw_history_chart(history, path, title), "history chart") if history.steps else None
    if svg:
        parts.append(f'<figure id="history-chart"><div class="scroll">{svg}</div>'
                     "<figcaption>Decode t/s and TTFT per result; band: the median's 95 % interval (min-max where "
                     "the runs are too few); red cross: a regression; grey ring: a rig change.</figcaption></figure>")
    parts.append(table_html(history_table(history), "history-table"))
    builds: dict[str, list[tuple[str, str]]] = {}
    for step in history.steps:
        builds.setdefault(step.point.build.describe(), step.point.fingerprint)
    for name, facts in builds.items():
        items = "".join(f"<dt>{escape(k)}</dt><dd>{escape(v)}</dd>" for k, v in facts)
        parts.append(f'<details><summary>{escape(name)}</summary><dl class="kv">{items}</dl></details>')
    parts.append("</section>")
    return "\n".join(parts)


def write_history_html(path: Path, history: History, inputs: Inputs, title: str | None = None) -> Path:
    page_title = title or "llm-bench history"
    n = len({s.point.series for s in history.steps})
    subtitle = f"{len(history.steps)} results of {n} configuration{'s' if n != 1 else ''}"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(PAGE.substitute(title=escape(page_title), subtitle=escape(subtitle),
                                    body=history_section(history, inputs, title), version=escape(__version__),
                                    generated=datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC")))
    return path
