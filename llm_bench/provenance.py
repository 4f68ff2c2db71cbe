"""Where a results file's figures come from, in one place for every command that writes one (run, tune,
sweep, power, soak): the file's format, llm-bench's version, when and on which host, the GPUs and
their driver (or why NVML could not say), the server's build, and the build-and-rig fingerprint
(``llm_bench.fingerprint``: read here, once, before the command loads a model)."""

from __future__ import annotations

import platform
from datetime import datetime, timezone
from typing import Any

from llm_bench import __version__
from llm_bench.engines import Engine
from llm_bench.engines.errors import ServerError
from llm_bench.fingerprint import Sources, fingerprint
from llm_bench.gpu.nvml import Nvml


def provenance(format: str, nvml: Nvml, started_at: datetime | None = None, *, sources: Sources | None = None,
               server_build: str | None = None, server_url: str | None = None) -> dict[str, Any]:
    """The facts every results file starts with; a command adds its own (label, server, protocol...).
    ``sources``: where the fingerprint's facts are read (the real paths by default)."""
    return {
        "format": format,
        "llm_bench_version": __version__,
        "started_at": (started_at or datetime.now(timezone.utc)).isoformat(timespec="seconds"),
        "host": platform.node(),
        "gpu_driver": nvml.driver_version(),
        "gpus": nvml.details(),
        "nvml_unavailable": None if nvml.available else nvml.unavailable,
        "fingerprint": fingerprint(nvml, sources, server_build, server_url),
    }


def server_build(engine: Engine) -> str | None:
    """The server's build (llama.cpp's /props build_info), where it says; a server that cannot is no error."""
    try:
        return engine.server_build()
    except ServerError:
        return None
