"""The embedded default: a CPU llama-server router with tiny models, measured end to end.

It needs no GPU and no download beyond the one-time llama-server build, and leaves results,
the Markdown table and the chart in one folder.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from llm_bench.report.chart import draw_chart
from llm_bench.plan import Plan, Protocol
from llm_bench.runner import run_plan
from llm_bench.report import find_baseline, load_sets, markdown_table, rows_of, summary
from llm_bench.report.html import write_html
from llm_bench.testbed.llama_server import ensure_llama_server
from llm_bench.testbed.presets import render_presets_ini
from llm_bench.testbed.router import running_router
from llm_bench.testbed.tiny_gguf import TinyModelSpec, write_tiny_model

BASELINE = "tiny-plain"
DRAFT_MAX = 4
# Synthetic acceptance (benchmarking only): mean acceptance length L with DRAFT_MAX drafted
# tokens means an expected acceptance of (L - 1) / DRAFT_MAX.
SYNTH_LEN = 3.0


@dataclass(frozen=True)
class DemoOutput:
    results: Path
    table: Path
    chart: Path
    html: Path


def demo_presets(target: Path, draft: Path) -> dict[str, dict[str, str | int | float | bool]]:
    return {
        "*": {"ctx-size": 2048, "parallel": 1},
        BASELINE: {"model": str(target)},
        "tiny-draft": {"model": str(target), "spec-type": "draft-simple", "model-draft": str(draft),
                       "spec-draft-n-max": DRAFT_MAX},
        "tiny-draft-synth": {"model": str(target), "spec-type": "draft-simple", "model-draft": str(draft),
                             "spec-draft-n-max": DRAFT_MAX, "spec-synth-len": SYNTH_LEN},
        "tiny-ngram": {"model": str(target), "spec-type": "ngram-simple"},
    }


def write_demo_bed(folder: Path) -> Path:
    """Tiny target and draft models plus the presets INI; returns the INI's path."""
    models = folder / "models"
    target = write_tiny_model(models / "tiny-target.gguf", TinyModelSpec(seed=1, name="tiny-target"))
    draft = write_tiny_model(models / "tiny-draft.gguf",
                             TinyModelSpec(seed=2, n_embd=32, n_layer=1, name="tiny-draft"))
    ini = folder / "presets.ini"
    ini.write_text(render_presets_ini(demo_presets(target, draft)))
    return ini


def run_demo(folder: Path, protocol: Protocol, log: Callable[[str], None]) -> DemoOutput:
    folder = folder.resolve()
    folder.mkdir(parents=True, exist_ok=True)
    log("llm-bench demo: a CPU llama-server router with tiny random-weight models")
    binary = ensure_llama_server(log)
    log(f"llama-server: {binary}")
    ini = write_demo_bed(folder)
    log(f"presets: {ini}")
    with running_router(binary, ini, log_path=folder / "llama-server.log") as router:
        log(f"router listening on {router.url} (log: {folder / 'llama-server.log'})")
        plan = Plan(url=router.url, label="demo-cpu", output_dir=folder, protocol=protocol)
        writer = run_plan(plan, log)
    sets = load_sets([writer.path])
    rows = rows_of(sets)
    baseline = find_baseline(rows, BASELINE)
    table = folder / "report.md"
    table.write_text(summary(rows, baseline) + "\n" + markdown_table(rows, baseline))
    title = "llm-bench demo: tiny CPU models (decode t/s, faster is better)"
    chart = draw_chart(rows, folder / "chart.png", baseline, title=title)
    html = write_html(folder / "report.html", sets, BASELINE, title=title, rows=rows)
    return DemoOutput(writer.path, table, chart, html)
