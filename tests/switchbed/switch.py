"""A switch command for the sweep tests that does to the real test-bed router what
`switch-to-configuration test` does to llama-cpp.service: another presets INI, a restart of the
real llama-server on the same port, and the marker file the NixOS module writes.

    python switch.py STATE_DIR NAME

STATE_DIR holds `llama_server` (the binary's path), `port`, one `NAME.ini` per configuration,
optionally `NAME.package` (the package name the marker claims; default llama-cpp-NAME), and
gets `router.pid`, `router.log` and `active.json`.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx


def group_running(pgid: int) -> bool:
    """A process of the group still runs. An exited one counts as gone: its parent, this script, has exited,
    so it waits as a zombie until init reaps it, which here takes about a second (systemd takes none)."""
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            # pid (comm) state ppid pgrp ...: comm may hold spaces and parentheses
            state, _ppid, pgrp = stat.read_text().rsplit(")", 1)[1].split()[:3]
        except (OSError, IndexError, ValueError):
            continue  # it ended while we read
        if int(pgrp) == pgid and state != "Z":
            return True
    return False


def stop_group(pgid: int, grace_s: float = 5.0) -> None:
    """SIGTERM, and SIGKILL after ``grace_s`` what still runs, as systemd stops a unit."""
    try:
        os.killpg(pgid, signal.SIGTERM)
    except ProcessLookupError:
        return
    deadline = time.monotonic() + grace_s
    while group_running(pgid):
        if time.monotonic() > deadline:
            try:
                os.killpg(pgid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            return
        time.sleep(0.02)


def stop_running(state: Path) -> None:
    pid_file = state / "router.pid"
    if not pid_file.exists():
        return
    stop_group(int(pid_file.read_text()))
    pid_file.unlink()


def main(state: Path, name: str) -> int:
    ini = state / f"{name}.ini"
    if not ini.exists():
        print(f"switch: no configuration {name} ({ini} is missing)", file=sys.stderr)
        return 1
    stop_running(state)
    port = int((state / "port").read_text())
    with (state / "router.log").open("ab") as log:
        process = subprocess.Popen(
            [(state / "llama_server").read_text().strip(), "--models-preset", str(ini), "--host", "127.0.0.1",
             "--port", str(port), "--models-max", "1", "--no-webui"],
            stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True,
        )
    (state / "router.pid").write_text(str(process.pid))
    for _ in range(300):
        try:
            models = httpx.get(f"http://127.0.0.1:{port}/models", timeout=1).json()["data"]
            break
        except (httpx.HTTPError, ValueError):
            time.sleep(0.1)
    else:
        print("switch: the router did not come up", file=sys.stderr)
        return 1
    package = state / f"{name}.package"
    marker = {
        "format": "llm-bench-llama-cpp-active/1",
        "specialisation": name,
        "package": {"name": package.read_text().strip() if package.exists() else f"llama-cpp-{name}",
                    "version": "11434", "path": "/nix/store/test"},
        "presets": sorted(m["id"] for m in models),
        "presets_file": str(ini),
        "url": f"http://127.0.0.1:{port}",
    }
    (state / "active.json").write_text(json.dumps(marker))
    return 0


if __name__ == "__main__":
    sys.exit(main(Path(sys.argv[1]), sys.argv[2]))
