"""The real LiteLLM proxy for the fleet's test bed: installed once per machine into its own
virtual environment, and started from a config file on a free loopback port.

LiteLLM is pinned to the release nixpkgs ships (1.100.1: what a NixOS fleet runs; 1.104.9 and later
need `litellm-proxy-extras` post-releases or a `litellm-proxy` distribution that the package registry
here does not have) and kept out of llm-bench's own environment: `litellm[proxy]`
brings about 500 MB of pinned dependencies. The environment lives in the same cache as the
llama-server build (``~/.cache/llm-bench/litellm-<version>``), so checkouts and CI runs share
it; a stamp file written after a complete install makes ``ensure_litellm`` idempotent. The
proxy answers about 6 s after its start on the 2-core bed (1.100.1; 1.80.0 took 3 s).
"""

from __future__ import annotations

import fcntl
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from llm_bench.testbed.llama_server import cache_dir
from llm_bench.testbed.router import ServerProcess, free_port, spawn_logged, wait_answering

LITELLM_VERSION = "1.100.1"
REQUIREMENT = f"litellm[proxy]=={LITELLM_VERSION}"

# Offline start: the bundled model cost map instead of a download; no telemetry.
OFFLINE_ENV = {
    "LITELLM_LOCAL_MODEL_COST_MAP": "True",
    "SCARF_NO_ANALYTICS": "True",
    "DO_NOT_TRACK": "True",
    "ANONYMIZED_TELEMETRY": "False",
}


class LiteLLMNotFound(RuntimeError):
    pass


class ProxyStartError(RuntimeError):
    pass


def venv_dir() -> Path:
    return cache_dir() / f"litellm-{LITELLM_VERSION}"


def _stamp(venv: Path) -> Path:
    return venv / ".llm-bench-installed"


def find_litellm() -> Path | None:
    """LITELLM (a `litellm` executable), then this machine's cached environment."""
    explicit = os.environ.get("LITELLM")
    if explicit:
        path = Path(explicit)
        if not (path.is_file() and os.access(path, os.X_OK)):
            raise LiteLLMNotFound(f"LITELLM={explicit} is not an executable file; unset it or point it at `litellm`")
        return path
    venv = venv_dir()
    stamp = _stamp(venv)
    if stamp.is_file() and stamp.read_text().strip() == REQUIREMENT:
        return venv / "bin" / "litellm"
    return None


def install_litellm(log: Callable[[str], None] = print) -> Path:
    """Create the environment and pip-install the pinned proxy (about a minute, 500 MB)."""
    venv = venv_dir()
    venv.parent.mkdir(parents=True, exist_ok=True)
    # Concurrent installers (./dev test in several checkouts) wait for the first.
    with open(venv.parent / f"litellm-{LITELLM_VERSION}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        found = find_litellm()
        if found:
            return found
        shutil.rmtree(venv, ignore_errors=True)  # a partial install: start over
        log(f"installing {REQUIREMENT} into {venv} (about a minute)")
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
        subprocess.run([str(venv / "bin" / "python"), "-m", "pip", "install", "--quiet",
                        "--disable-pip-version-check", REQUIREMENT], check=True)
        _stamp(venv).write_text(REQUIREMENT + "\n")
    log(f"cached {venv}")
    return venv / "bin" / "litellm"


def ensure_litellm(log: Callable[[str], None] = print) -> Path:
    return find_litellm() or install_litellm(log)


@dataclass
class ProxyProcess(ServerProcess):
    startup_s: float  # from the exec to the first answer of /v1/models


def proxy_command(binary: Path, config: Path, port: int) -> list[str]:
    return [str(binary), "--config", str(config), "--host", "127.0.0.1", "--port", str(port)]


def start_proxy(
    binary: Path,
    config: Path,
    *,
    log_path: Path,
    port: int | None = None,
    env: dict[str, str] | None = None,
    timeout: float = 120.0,
) -> ProxyProcess:
    """Start `litellm --config CONFIG` and wait until it lists the config's models.

    ``env`` adds variables (the backends' keys, as services.litellm.environmentFile would)."""
    port = port or free_port()
    config, log_path = config.resolve(), log_path.resolve()
    started = time.monotonic()
    process = spawn_logged(proxy_command(binary, config, port), log_path, log_path.parent, {**OFFLINE_ENV, **(env or {})})
    url = f"http://127.0.0.1:{port}"
    # 401: up, and guarded by a master key
    if wait_answering(process, f"{url}/v1/models", log_path, "litellm", f"while starting with {config}",
                      ProxyStartError, timeout, interval=0.1, tail=3000):
        return ProxyProcess(url, port, process, log_path, time.monotonic() - started)
    ProxyProcess(url, port, process, log_path, 0.0).stop()
    raise ProxyStartError(f"litellm did not answer on {url} within {timeout:.0f} s; see {log_path}")


def main() -> None:
    print(ensure_litellm(lambda m: print(m, file=sys.stderr)))


if __name__ == "__main__":
    main()
