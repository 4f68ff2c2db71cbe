"""The embedded default: a CPU llama-server router with a real small model, measured end to end.

The demo serves SmolLM2-135M-Instruct (downloaded once, see ``testbed.smollm2``) under presets that
show real text, real speculative decoding, KV cache types and a synthetic-acceptance preset that
changes the output, measured for speed and quality. It needs no GPU, and leaves results, the
Markdown table, the chart and the HTML report in one folder. The tiny random-weight bed
(``write_demo_bed``) stays for the tests that need no real answers.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from llm_bench.plan import Plan, Protocol
from llm_bench.report import find_baseline, load_sets, markdown_table, rows_of, summary
from llm_bench.report.chart import draw_chart
from llm_bench.report.html import write_html
from llm_bench.runner import run_plan
from llm_bench.testbed.llama_server import ensure_llama_server
from llm_bench.testbed.presets import render_presets_ini
from llm_bench.testbed.random_drafter import write_random_drafter
from llm_bench.testbed.router import running_router
from llm_bench.testbed.smollm2 import ensure_smollm2
from llm_bench.testbed.tiny_gguf import TinyModelSpec, write_tiny_model
from llm_bench.workloads.quality import QUALITY
from llm_bench.workloads.standard import STANDARD

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


SMOL_BASELINE = "smol-plain"
# Room for the longest recall filler (DEMO_PROTOCOL) and its question; SmolLM2 was trained on 8192.
SMOL_CONTEXT = 4096
Preset = dict[str, str | int | float | bool]


def smollm2_presets(model: Path, drafter: Path) -> dict[str, Preset]:
    """What each preset shows is in the README (Quick start)."""
    spec: Preset = {"model": str(model), "spec-type": "draft-simple", "spec-draft-n-max": DRAFT_MAX}
    return {
        "*": {"ctx-size": SMOL_CONTEXT, "parallel": 1},
        SMOL_BASELINE: {"model": str(model)},
        "smol-self-draft": {**spec, "model-draft": str(model)},
        "smol-ngram": {"model": str(model), "spec-type": "ngram-simple"},
        "smol-kv-q8": {"model": str(model), "cache-type-k": "q8_0", "cache-type-v": "q8_0", "flash-attn": "on"},
        "smol-kv-q4": {"model": str(model), "cache-type-k": "q4_0", "cache-type-v": "q4_0", "flash-attn": "on"},
        "smol-random-draft": {**spec, "model-draft": str(drafter)},
        "smol-synth": {**spec, "model-draft": str(drafter), "spec-synth-len": SYNTH_LEN},
    }


def write_smollm2_bed(folder: Path, model: Path, presets: tuple[str, ...] | None = None) -> Path:
    """The SmolLM2 presets INI (all, or the named ones) and a random drafter with SmolLM2's vocabulary."""
    drafter = write_random_drafter(model, folder / "models" / "smollm2-random-drafter.gguf")
    chosen = smollm2_presets(model, drafter)
    if presets is not None:
        chosen = {name: chosen[name] for name in ("*", *presets)}
    ini = folder / "presets.ini"
    ini.write_text(render_presets_ini(chosen))
    return ini


# Sized for 2 cores: a few minutes for every preset after the one-time build and download. 3 runs: the
# fewest with which a verdict can be reached (3 against 3 give the exact interval 90 %; 2 against 2, 67 %).
DEMO_PROTOCOL = Protocol(max_tokens=128, runs=3, workloads=(STANDARD.name, QUALITY.name)).with_settings(
    QUALITY, {"max_tokens": 64, "recall_lengths": (1536, 2560), "recall_depths": (0.1, 0.5),
              # token distributions over about 380 positions and 24 exact-answer items: about 15 s a preset
              "text_tokens": 64, "exact_items_per_kind": 2})


def run_demo(folder: Path, protocol: Protocol, log: Callable[[str], None],
             presets: tuple[str, ...] | None = None) -> DemoOutput:
    """The demo: every SmolLM2 preset, or only ``presets`` (the baseline among them for the comparison)."""
    folder = folder.resolve()
    folder.mkdir(parents=True, exist_ok=True)
    log("llm-bench demo: a CPU llama-server router serving SmolLM2-135M-Instruct, speed and quality")
    binary = ensure_llama_server(log)
    log(f"llama-server: {binary}")
    model = ensure_smollm2(log)
    ini = write_smollm2_bed(folder, model, presets)
    log(f"presets: {ini}")
    with running_router(binary, ini, log_path=folder / "llama-server.log") as router:
        log(f"router listening on {router.url} (log: {folder / 'llama-server.log'})")
        plan = Plan(url=router.url, label="demo-cpu", output_dir=folder, protocol=protocol)
        writer = run_plan(plan, log)
    sets = load_sets([writer.path])
    rows = rows_of(sets)
    baseline = find_baseline(rows, SMOL_BASELINE)
    table = folder / "report.md"
    table.write_text(summary(rows, baseline) + "\n" + markdown_table(rows, baseline))
    title = "llm-bench demo: SmolLM2-135M on 2 CPU cores (decode t/s, faster is better)"
    chart = draw_chart(rows, folder / "chart.png", baseline, title=title)
    html = write_html(folder / "report.html", sets, SMOL_BASELINE, title=title, rows=rows)
    return DemoOutput(writer.path, table, chart, html)
