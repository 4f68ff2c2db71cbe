"""``llm-bench soak`` from its settings to its results file: the model chosen, the restart and GPU-error
watches set up, the traffic sent with the file rewritten after every request (and on Ctrl-C or a
crash, marked incomplete), and what makes the command fail."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

from llm_bench.diagnostics.gpu_errors import GpuErrorWatch, KernelLog
from llm_bench.diagnostics.restarts import CounterWatch, RestartWatch, RouterInstanceWatch
from llm_bench.diagnostics.server_log import JOURNAL_UNIT, journal_available
from llm_bench.engines import Engine, select_models
from llm_bench.gpu.nvml import Nvml
from llm_bench.provenance import provenance, server_build
from llm_bench.results import reserve_path, results_stem, write_toml
from llm_bench.soak import traffic
from llm_bench.soak.traffic import FORMAT as SOAK_FORMAT
from llm_bench.soak.traffic import SoakResult, SoakSettings

Log = Callable[[str], None]


@dataclass(frozen=True)
class Watching:
    """What counts as a restart or a GPU error besides the router's own model instances."""

    unit: str | None = None  # a systemd unit (default: llama-cpp.service when it is active)
    container: str | None = None  # a container's restart count
    kernel_log: KernelLog = KernelLog()


class SoakInterrupted(KeyboardInterrupt):
    """Ctrl-C during the soak; what was measured is in ``path``, marked incomplete."""

    def __init__(self, path: Path):
        super().__init__(str(path))
        self.path = path


def restart_watches(server: Engine, unit: str | None, container: str | None) -> list[RestartWatch]:
    watches: list[RestartWatch] = []
    if server.capabilities.model_events:
        watches.append(RouterInstanceWatch(server.base_url, server.auth_headers()))
    unit = unit or (JOURNAL_UNIT if journal_available() else None)
    if unit:
        watches.append(CounterWatch.systemd(unit))
    if container:
        watches.append(CounterWatch.container(container))
    return watches


def choose_model(server: Engine, alias: str | None) -> str:
    """The alias asked for, or the first the server lists; a ServerError when the server does not serve it."""
    model = alias or select_models(server, ())[0]
    if alias:
        select_models(server, (alias,))
    return model


def run_soak(server: Engine, model: str, settings: SoakSettings, watching: Watching, output_dir: Path,
             log: Log) -> tuple[SoakResult, Path]:
    """The soak, its results file rewritten after every request; (what was measured, the file)."""
    with Nvml() as nvml:
        meta = provenance(SOAK_FORMAT, nvml, server_build=server_build(server), server_url=server.base_url) | {
            "server_url": server.base_url, "alias": model, "max_tokens": settings.max_tokens, "complete": False}
        meta = {k: v for k, v in meta.items() if v is not None}
        path = reserve_path(output_dir, results_stem(datetime.now(timezone.utc), f"soak-{model}"))
        log(f"Results: {path}")
        result = SoakResult()
        try:
            traffic.soak(server, model, settings, nvml=nvml,
                         restarts=restart_watches(server, watching.unit, watching.container),
                         gpu_errors=GpuErrorWatch(nvml, watching.kernel_log), log=log, result=result,
                         checkpoint=lambda r: write_toml(path, {"meta": meta, "soak": r.to_toml()}))
            meta["complete"] = True
        except KeyboardInterrupt:
            result.stopped_by = "interrupted"
            raise SoakInterrupted(path) from None
        finally:  # Ctrl-C or a crash: what was measured stays on disk, marked incomplete
            write_toml(path, {"meta": meta, "soak": result.to_toml()})
    log(f"Results written to {path}")
    return result, path


def problems(result: SoakResult, max_failures: int) -> list[str]:
    """Why the soak fails: failures above the allowance, any restart, any new GPU error."""
    failed = sum(result.failures.values())
    return ([f"{failed} request(s) failed (allowed: {max_failures})"] if failed > max_failures else []) \
        + ([f"{result.restart_count} server restart(s)"] if result.restart_count else []) \
        + ([f"{result.gpu_error_count} new GPU error(s)"] if result.gpu_error_count else [])
