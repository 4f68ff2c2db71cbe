"""The embedded default: a CPU llama-server router with a real small model, measured end to end.

The demo serves SmolLM2-135M-Instruct (downloaded once, see ``testbed.smollm2``) under presets that
show real text, real speculative decoding, KV cache types and a synthetic-acceptance preset that
changes the output, measured for speed and quality; two more presets (a chat template with a tool
path) are measured at context depth and replaying an agent session. It needs no GPU, and leaves
results, the Markdown table, the charts and the HTML report in one folder. The tiny random-weight bed
(``write_demo_bed``) stays for the tests that need no real answers.
"""

from __future__ import annotations

import configparser
from collections.abc import Callable
from dataclasses import dataclass, replace
from importlib import resources
from pathlib import Path

from llm_bench.plan import Plan, Protocol
from llm_bench.report import find_baseline, load_sets, markdown_table, rows_of, summary
from llm_bench.report.chart import draw_chart
from llm_bench.report.html import write_html
from llm_bench.runner import run_plan
from llm_bench.testbed.llama_server import cache_dir, ensure_llama_server
from llm_bench.testbed.presets import render_presets_ini
from llm_bench.testbed.random_drafter import cached_random_drafter
from llm_bench.testbed.router import running_router
from llm_bench.testbed.smollm2 import ensure_smollm2
from llm_bench.testbed.tiny_gguf import TinyModelSpec, write_tiny_model
from llm_bench.workloads.depth import DEPTH
from llm_bench.workloads.quality import QUALITY
from llm_bench.workloads.session import SESSION
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
    agent_results: Path | None = None  # the depth and session workloads on AGENT_PRESETS
    depth_chart: Path | None = None


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
# ChatML with a tool path and a think block that llama-server recognises (see the template's header).
THINK_TEMPLATE = Path(str(resources.files("llm_bench.testbed") / "chatml-think.jinja"))
# Room for the longest recall filler (DEMO_PROTOCOL) and its question; SmolLM2 was trained on 8192.
SMOL_CONTEXT = 4096
Preset = dict[str, str | int | float | bool]


def smollm2_presets(model: Path, drafter: Path) -> dict[str, Preset]:
    """What each preset shows is in the README (The CPU demo)."""
    spec: Preset = {"model": str(model), "spec-type": "draft-simple", "spec-draft-n-max": DRAFT_MAX}
    agent: Preset = {"model": str(model), "jinja": True, "chat-template-file": str(THINK_TEMPLATE),
                     "reasoning-format": "deepseek"}
    return {
        "*": {"ctx-size": SMOL_CONTEXT, "parallel": 1},
        SMOL_BASELINE: {"model": str(model)},
        "smol-self-draft": {**spec, "model-draft": str(model)},
        "smol-kv-q8": {"model": str(model), "cache-type-k": "q8_0", "cache-type-v": "q8_0", "flash-attn": "on"},
        "smol-kv-q4": {"model": str(model), "cache-type-k": "q4_0", "cache-type-v": "q4_0", "flash-attn": "on"},
        "smol-random-draft": {**spec, "model-draft": str(drafter)},
        "smol-synth": {**spec, "model-draft": str(drafter), "spec-synth-len": SYNTH_LEN},
        # The depth and session workloads' presets: a chat template with a tool path (SmolLM2's own renders
        # no tools) and a think block, as an agent's model has; and the same with n-gram drafting, which an
        # agent's repetitive context feeds. (A q8_0 KV cache needs flash attention, whose prompt processing on
        # these CPUs takes twice as long at 3,000 tokens of depth: too slow for the demo's budget.)
        "smol-agent": agent,
        "smol-agent-ngram": {**agent, "spec-type": "ngram-simple"},
    }


def write_smollm2_bed(folder: Path, model: Path, presets: tuple[str, ...] | None = None) -> Path:
    """The SmolLM2 presets INI (all, or the named ones) and a random drafter with SmolLM2's vocabulary."""
    drafter = cached_random_drafter(model, folder / "models" / "smollm2-random-drafter.gguf",
                                    cache_dir() / "random-drafters")
    chosen = smollm2_presets(model, drafter)
    if presets is not None:
        chosen = {name: chosen[name] for name in ("*", *presets)}
    ini = folder / "presets.ini"
    ini.write_text(render_presets_ini(chosen))
    return ini


# Sized for 2 cores: under 10 minutes for every preset after the one-time build and download (docs/development.md says
# where the time goes). 3 runs: the fewest with which a verdict can be reached (3 against 3 give the exact
# interval 90 %; 2 against 2, 67 %). One recall probe of 2,560 tokens: at 1,536 SmolLM2 finds the needle at one
# depth or the other by chance, preset to preset. The depth and session workloads run on their own two presets
# (AGENT_PRESETS), with depths that fit n_ctx 4096 and the session's first two turns (its third, at 3,300
# tokens of context, would take about 20 s more on each preset, warm and cold). N-gram drafting is measured there only:
# on the standard prompts it drafts nothing.
DEMO_PROTOCOL = Protocol(max_tokens=96, runs=3, workloads=(STANDARD.name, QUALITY.name)).with_settings(
    QUALITY, {"max_tokens": 64, "recall_lengths": (2560,), "recall_depths": (0.5,),
              # token distributions over about 380 positions and 24 exact-answer items: about 20 s a preset
              "text_tokens": 64, "exact_items_per_kind": 2}).with_settings(
    DEPTH, {"depths": (0, 1024, 2048)}).with_settings(SESSION, {"max_tokens": 32, "max_context": 2800})
AGENT_PRESETS = ("smol-agent", "smol-agent-ngram")
AGENT_WORKLOADS = (DEPTH.name, SESSION.name)


def served_presets(ini: Path) -> list[str]:
    parser = configparser.ConfigParser(interpolation=None)
    parser.read_string(ini.read_text())
    return [name for name in parser.sections() if name != "*"]


def run_demo(folder: Path, protocol: Protocol, log: Callable[[str], None],
             presets: tuple[str, ...] | None = None) -> DemoOutput:
    """The demo: every SmolLM2 preset, or only ``presets`` (the baseline among them for the comparison): the
    protocol's workloads on all but AGENT_PRESETS, the depth and session workloads on those."""
    folder = folder.resolve()
    folder.mkdir(parents=True, exist_ok=True)
    log("llm-bench demo: a CPU llama-server router serving SmolLM2-135M-Instruct, speed and quality")
    binary = ensure_llama_server(log)
    log(f"llama-server: {binary}")
    model = ensure_smollm2(log)
    ini = write_smollm2_bed(folder, model, presets)
    log(f"presets: {ini}")
    names = served_presets(ini)
    agents = tuple(name for name in names if name in AGENT_PRESETS)
    with running_router(binary, ini, log_path=folder / "llama-server.log") as router:
        log(f"router listening on {router.url} (log: {folder / 'llama-server.log'})")
        plan = Plan(url=router.url, aliases=tuple(n for n in names if n not in agents), label="demo-cpu",
                    output_dir=folder, protocol=protocol)
        writer = run_plan(plan, log)
        agent_writer = None
        if agents:
            log(f"speed at context depth and a replayed agent session: {', '.join(agents)}")
            agent_writer = run_plan(replace(plan, aliases=agents, protocol=replace(protocol, workloads=AGENT_WORKLOADS)),
                                    log)
    sets = load_sets([writer.path] + ([agent_writer.path] if agent_writer else []))
    rows = rows_of(sets)
    baseline = find_baseline(rows, SMOL_BASELINE)
    table = folder / "report.md"
    table.write_text(summary(rows, baseline) + "\n" + markdown_table(rows, baseline))
    title = "llm-bench demo: SmolLM2-135M on 2 CPU cores (decode t/s, faster is better)"
    chart = draw_chart(rows, folder / "chart.png", baseline, title=title)
    html = write_html(folder / "report.html", sets, SMOL_BASELINE, title=title, rows=rows)
    depth_chart = DEPTH.chart.draw(rows, DEPTH.chart.path_beside(chart)) if DEPTH.chart and DEPTH.chart.wanted(rows) \
        else None
    return DemoOutput(writer.path, table, chart, html, agent_writer.path if agent_writer else None, depth_chart)
