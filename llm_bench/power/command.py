"""``llm-bench power`` from its settings to its results file: the model chosen and warmed up, the sweep
measured at each limit (the original limits restored on every exit path), the file rewritten after each
limit so that an interrupted sweep keeps what it measured, the table."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from llm_bench.engines import Engine, select_models
from llm_bench.engines.stream import ChatRequest
from llm_bench.gpu.nvml import Nvml
from llm_bench.power import limits
from llm_bench.power.limits import LimitResult
from llm_bench.power.measure import measurer
from llm_bench.power.sweeps import FORMAT, PowerSweep, power_table
from llm_bench.prompts import shipped_prompt
from llm_bench.provenance import provenance, server_build
from llm_bench.results import reserve_path, results_stem, write_toml
from llm_bench.tables import markdown

Log = Callable[[str], None]


@dataclass(frozen=True)
class PowerSettings:
    limits_w: tuple[float, ...]
    gpus: tuple[int, ...] = ()  # empty: every GPU
    alias: str | None = None  # None: the first model the server lists
    runs: int = 3
    max_tokens: int = 512
    prompt_name: str = "code"
    settle_s: float = 5.0


class PowerInterrupted(KeyboardInterrupt):
    """Ctrl-C or SIGTERM during the sweep, after the original limits were restored; ``path`` holds every
    limit measured, or is None when none was."""

    def __init__(self, path: Path | None):
        super().__init__()
        self.path = path


@dataclass(frozen=True)
class PowerRun:
    model: str
    results: list[LimitResult]
    path: Path
    table: str  # Markdown


def show_limits(nvml: Nvml) -> list[str]:
    """Each GPU's power limit and the range it accepts; nothing is changed."""
    lines = []
    for i in range(nvml.count()):
        lim = nvml.power_limits(i)
        lines.append(f"GPU{i}: " + ("no power limit reported" if lim is None else
                     f"limit {lim.current_w:.0f} W (default {lim.default_w or 0:.0f} W, "
                     f"range {lim.min_w or 0:.0f}-{lim.max_w or 0:.0f} W)"))
    return lines


def run_power(server: Engine, nvml: Nvml, settings: PowerSettings, output_dir: Path, log: Log,
              chart: Path | None = None) -> PowerRun:
    model = settings.alias or select_models(server, ())[0]
    if settings.alias:
        select_models(server, (settings.alias,))
    chosen = list(settings.gpus) or list(range(nvml.count()))
    request = ChatRequest(model, shipped_prompt(settings.prompt_name), settings.max_tokens, 1.0, 42)
    # the fingerprint before the warm-up loads the model: the memory in use is the rig's, not the model's
    meta = provenance(FORMAT, nvml, server_build=server_build(server), server_url=server.base_url) | {
        "server_url": server.base_url, "alias": model, "gpus_limited": chosen, "limits_w": list(settings.limits_w),
        "runs": settings.runs, "max_tokens": settings.max_tokens, "settle_s": settings.settle_s}
    log(f"Warming up {model} ...")
    server.stream(request)
    path = reserve_path(output_dir, results_stem(datetime.now(timezone.utc), f"power-{model}"))
    measured: list[LimitResult] = []

    def keep(result: LimitResult) -> None:
        measured.append(result)
        write_toml(path, power_data(meta, measured))

    try:
        results = limits.sweep(nvml, chosen, settings.limits_w,
                               measurer(server, request, settings.runs, nvml, log), log,
                               settle_s=settings.settle_s, on_result=keep)
    except KeyboardInterrupt:
        if not measured:
            path.unlink(missing_ok=True)
        raise PowerInterrupted(path if measured else None) from None
    data = power_data(meta, results)
    write_toml(path, data)
    log(f"Results written to {path}")
    if chart is not None:
        limits.draw_power_chart(results, chart, f"Power sweep: {model}")
        log(f"Chart written to {chart}")
    return PowerRun(model, results, path, table(path, data["meta"], [r.to_toml() for r in results]))


def power_data(meta: dict[str, Any], results: Sequence[LimitResult]) -> dict[str, Any]:
    return {"meta": {k: v for k, v in meta.items() if v is not None}, "limits": [r.to_toml() for r in results]}


def table(path: Path, meta: dict, rows: Sequence[dict]) -> str:
    """The power table the report shows for the same file."""
    sweep_table = power_table([PowerSweep(path, meta, list(rows))])
    return markdown(sweep_table) if sweep_table else ""
