"""Serve the candidates: a temporary router on a free loopback port, with the machine's router freed first.

The machine's router (``main_url``) has its loaded models unloaded so the GPU is free, and on the way
out (normally, on a failure, on Ctrl-C) the temporary router is stopped and those models are loaded
again, so the machine is as it was. The temporary router runs the same llama-server binary the
machine uses: ``--llama-server``, else ``llama-server`` on PATH, else the one in llama-cpp.service's
ExecStart.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from pathlib import Path

from llm_bench.engines.errors import ServerError
from llm_bench.engines.switch import RouterSide, RouterState, SwitchError, free_gpu, reload_models
from llm_bench.support.poll import poll_until
from llm_bench.testbed.presets import PresetError, render_presets_ini
from llm_bench.testbed.router import RouterProcess, RouterStartError, start_router
from llm_bench.tune.grid import Value

Log = Callable[[str], None]
UNIT = "llama-cpp.service"


class ServeError(RuntimeError):
    pass


def render_ini(presets: Mapping[str, Mapping[str, Value]]) -> str:
    """The presets INI (the one renderer, :func:`render_presets_ini`); what it cannot hold is a ServeError."""
    try:
        return render_presets_ini(presets)
    except PresetError as e:
        raise ServeError(str(e)) from e


def unit_binary(unit: str = UNIT) -> Path | None:
    """The llama-server of a systemd unit's ExecStart (``{ path=/nix/store/...-llama-server ; ... }``)."""
    if shutil.which("systemctl") is None:
        return None
    try:
        shown = subprocess.run(["systemctl", "show", "-p", "ExecStart", "--value", unit],
                               capture_output=True, text=True, timeout=10).stdout
    except (OSError, subprocess.TimeoutExpired):
        return None
    found = re.search(r"path=(\S+)", shown)
    return Path(found.group(1)) if found else None


def find_llama_server(given: Path | None) -> Path:
    if given is not None:
        if not given.is_file():
            raise ServeError(f"--llama-server {given}: no such file")
        return given
    on_path = shutil.which("llama-server")
    if on_path:
        return Path(on_path)
    from_unit = unit_binary()
    if from_unit is not None and from_unit.is_file():
        return from_unit
    raise ServeError("no llama-server found: not on PATH and not in llama-cpp.service's ExecStart; "
                     "give the machine's binary with --llama-server PATH")


@dataclass
class MainRouter:
    """What was done to the machine's router, so that exactly that is undone."""

    side: RouterSide | None  # None: the machine's router is left alone
    state: RouterState | None = None

    @property
    def unloaded(self) -> list[str]:
        return self.state.unloaded if self.state else []


def free_main(url: str | None, log: Log, api_key: str | None = None, unload_timeout: float = 120.0) -> MainRouter:
    """Unload every loaded (or loading) model of the machine's router, sending its API key if it has one."""
    if not url:
        return MainRouter(None)
    side = RouterSide(url=url, mode="unload", api_key=api_key, unload_timeout_s=unload_timeout, reload=True)
    try:
        return MainRouter(side, free_gpu(side, log))
    except (ServerError, SwitchError) as e:
        raise ServeError(f"could not free the GPU: unloading the models of {url} failed: {e}") from e


def restore_main(main: MainRouter, log: Log, timeout: float = 900.0, api_key: str | None = None) -> None:
    """Load again what was unloaded, and wait until the router says it is loaded."""
    if main.side is None or main.state is None or not main.unloaded:
        return
    reload_models(replace(main.side, load_timeout_s=timeout, api_key=api_key or main.side.api_key), main.state, log)


@dataclass
class Served:
    """The router the candidates are measured on, and (when we started it) its log."""

    url: str
    process: RouterProcess | None = None
    api_key: str | None = field(default=None, repr=False)  # the key of a --url router; ours needs none
    _offset: int = 0

    def new_log(self) -> str:
        """What the router logged since the last call (empty for a router we did not start)."""
        if self.process is None or not self.process.log_path.exists():
            return ""
        with self.process.log_path.open("rb") as f:
            f.seek(self._offset)
            data = f.read()
        self._offset += len(data)
        return data.decode(errors="replace")


def load_errors(log_text: str, limit: int = 3) -> list[str]:
    """The error lines a model instance printed (``[pid] ... E ...: message``), deduplicated."""
    found: list[str] = []
    for line in log_text.splitlines():
        match = re.search(r"\sE\s+(.*)$", line)
        if match:
            message = match.group(1).strip()
            if message not in found:
                found.append(message)
    return found[:limit]


def _alive(pid: int) -> bool:
    """Running, not merely a zombie waiting for its parent to collect it."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def stop_leftover(pid_file: Path, ini: Path, log: Log) -> None:
    """Stop the temporary router a killed tune (SIGKILL: no chance to clean up) left running."""
    try:
        pid = int(pid_file.read_text())
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except (OSError, ValueError):
        return
    if str(ini.resolve()) not in cmdline:
        return  # the pid was reused by something else
    log(f"stopping the temporary router (pid {pid}) that an earlier, killed tune left running")
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(pid, sig)
        except ProcessLookupError:
            return
        if poll_until(lambda: True if not _alive(pid) else None, timeout=10, interval=0.2):
            return


@contextmanager
def serving(presets: Mapping[str, Mapping[str, Value]], binary: Path, folder: Path, main_url: str | None,
            log: Log, extra_args: tuple[str, ...] = (), main_key: str | None = None) -> Iterator[Served]:
    """A temporary router serving ``presets`` while the machine's router is freed; both restored on exit."""
    folder.mkdir(parents=True, exist_ok=True)
    ini = folder / "tune-presets.ini"
    pid_file = folder / "tune-router.pid"
    stop_leftover(pid_file, ini, log)
    ini.write_text(render_ini(presets))
    main = free_main(main_url, log, api_key=main_key)
    try:
        try:
            process = start_router(binary, ini, log_path=folder / "tune-router.log", extra_args=extra_args)
        except RouterStartError as e:
            raise ServeError(f"the temporary router did not start: {e}") from e
        pid_file.write_text(str(process.process.pid))
        log(f"temporary router {process.url} ({binary}), presets {ini}, log {process.log_path}")
        try:
            yield Served(process.url, process)
        finally:
            process.stop()
            pid_file.unlink(missing_ok=True)
            log("temporary router stopped")
    finally:
        restore_main(main, log, api_key=main_key)
