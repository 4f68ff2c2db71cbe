"""Start and stop a real llama-server in router mode on a free loopback port."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import httpx

from llm_bench.support.poll import poll_until


class RouterStartError(RuntimeError):
    pass


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class ServerProcess:
    """A server this package started in a process group of its own, with its log file."""

    url: str
    port: int
    process: subprocess.Popen
    log_path: Path

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def stop(self, timeout: float = 15.0) -> None:
        """SIGTERM the process group, so what the server spawned (model instances, workers) goes too. A leader
        that already died (a test killed it) leaves its group behind: vLLM's engine core and worker (3 GB each)
        outlived a killed api_server, so the group is killed then too."""
        pgid = self.process.pid  # start_new_session: the leader's pid is the group's id
        if self.process.poll() is not None:
            try:
                os.killpg(pgid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            return
        os.killpg(pgid, signal.SIGTERM)
        try:
            self.process.wait(timeout)
        except subprocess.TimeoutExpired:
            os.killpg(pgid, signal.SIGKILL)
            self.process.wait()
        try:  # what the server spawned may outlive it by a moment
            os.killpg(pgid, signal.SIGKILL)
        except ProcessLookupError:
            pass


class RouterProcess(ServerProcess):
    """A llama-server in router mode."""


def router_command(binary: Path, presets_ini: Path, port: int, extra_args: Sequence[str]) -> list[str]:
    return [
        str(binary), "--models-preset", str(presets_ini),
        "--host", "127.0.0.1", "--port", str(port),
        "--models-max", "1", "--no-webui",
        *extra_args,
    ]


def spawn_logged(command: Sequence[str], log_path: Path, cwd: Path, env: dict[str, str] | None) -> subprocess.Popen:
    """Start a server in a process group of its own (so stop() takes what it spawns), its output appended
    to log_path."""
    with log_path.open("ab") as log_file:
        return subprocess.Popen(
            command, stdout=log_file, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
            cwd=cwd, env={**os.environ, **(env or {})}, start_new_session=True,
        )


def wait_answering(process: subprocess.Popen, probe_url: str, log_path: Path, name: str, starting: str,
                   error: type[RuntimeError], timeout: float, interval: float, tail: int) -> bool:
    """Poll probe_url until it answers 200 or 401 (up, and guarded by a key); False after timeout. A process
    that exits meanwhile raises ``error`` with the end of its log."""

    def answering() -> bool | None:
        if process.poll() is not None:
            raise error(
                f"{name} exited with code {process.returncode} {starting}; its log "
                f"({log_path}) ends with:\n{log_path.read_text(errors='replace')[-tail:]}"
            )
        try:
            return httpx.get(probe_url, timeout=2).status_code in (200, 401) or None
        except httpx.TransportError:
            return None

    return bool(poll_until(answering, timeout=timeout, interval=interval))


def start_router(
    binary: Path,
    presets_ini: Path,
    *,
    log_path: Path,
    port: int | None = None,
    extra_args: Sequence[str] = (),
    env: dict[str, str] | None = None,
    timeout: float = 60.0,
) -> RouterProcess:
    port = port or free_port()
    presets_ini, log_path = presets_ini.resolve(), log_path.resolve()
    process = spawn_logged(router_command(binary, presets_ini, port, extra_args), log_path, presets_ini.parent, env)
    router = RouterProcess(f"http://127.0.0.1:{port}", port, process, log_path)
    # 401: up, and guarded by --api-key
    if wait_answering(process, f"{router.url}/models", log_path, "llama-server", "while starting", RouterStartError,
                      timeout, interval=0.02, tail=2000):
        return router
    router.stop()
    raise RouterStartError(f"llama-server did not answer on {router.url} within {timeout:.0f} s; see {log_path}")


@contextmanager
def running_router(binary: Path, presets_ini: Path, **kwargs) -> Iterator[RouterProcess]:
    router = start_router(binary, presets_ini, **kwargs)
    try:
        yield router
    finally:
        router.stop()
