"""llmBench.watch's script (modules/lib/watch-script.nix) against a real llama-server router and the real
llm-bench: the command lines it writes are ones llm-bench takes, its results are what `llm-bench history`
follows, and it leaves no model loaded. Only systemctl is a stand-in (nothing is active)."""

from __future__ import annotations

import json
import subprocess
import sys
import tomllib
from pathlib import Path

import httpx

from llm_bench.testbed.presets import render_presets_ini
from tests.nix.helpers import REPO, nix_eval, nix_string
from tests.test_nix_modules import harness


def watch_script(url: str, directory: Path, marker: Path, systemctl: Path, keep: int) -> str:
    llm_bench = Path(sys.executable).parent / "llm-bench"
    args = {"llmBench": str(llm_bench), "url": url, "directory": str(directory), "systemctl": str(systemctl),
            "sha256sum": "sha256sum", "curl": "curl", "marker": str(marker)}
    fields = " ".join(f"{k} = {nix_string(v)};" for k, v in args.items())
    return nix_eval(  # type: ignore[return-value]
        f"import {REPO}/modules/lib/watch-script.nix {{ lib = {harness()}.lib; {fields}"
        f' presets = [ "tiny-plain" ]; runs = 3; maxTokens = 16; keep = {keep}; timeLimitSec = 600;'
        ' givesWayTo = [ "train" ]; }')


def results(directory: Path) -> list[Path]:
    return sorted(p for p in directory.rglob("*.toml"))


def loaded(url: str) -> list[str]:
    models = httpx.get(f"{url}/models", timeout=30).json()["data"]
    return [m["id"] for m in models if (m.get("status") or {}).get("value") == "loaded"]


def test_the_watch_measures_a_new_engine_into_the_history(router_factory, tiny_models, tmp_path: Path) -> None:
    router = router_factory(render_presets_ini({"tiny-plain": {"model": str(tiny_models["target"]), "threads": 1}}))
    directory, marker = tmp_path / "history", tmp_path / "active.json"
    marker.write_text('{"package": {"path": "/nix/store/aaaa-llama-cpp-1"}}\n')
    systemctl = tmp_path / "systemctl"
    systemctl.write_text("#!/bin/sh\nexit 3\n")  # `is-active --quiet`: not active
    systemctl.chmod(0o755)

    def watch(keep: int = 20, mode: str = "--on-change") -> subprocess.CompletedProcess:
        script = watch_script(router.url, directory, marker, systemctl, keep)
        return subprocess.run(["bash", "-c", script, "llm-bench-watch", mode], capture_output=True, text=True,
                              timeout=600)

    first = watch()
    assert first.returncode == 0, first.stdout + first.stderr
    (path,) = results(directory)
    data = tomllib.loads(path.read_text())
    (record,) = data["aliases"]
    assert record["alias"] == "tiny-plain" and len(record["runs"]) == 3
    assert data["meta"]["protocol"]["max_tokens"] == 16 and data["meta"]["label"] == "watch"
    assert "first" in first.stdout  # the history's table, in the journal
    assert loaded(router.url) == []

    # The same engine again: nothing measured.
    again = watch()
    assert again.returncode == 0 and "nothing to measure" in again.stdout and len(results(directory)) == 1

    # The timer measures anyway: the same build twice is twins, never a regression.
    timed = watch(mode="--always")
    assert timed.returncode == 0, timed.stdout + timed.stderr
    assert len(results(directory)) == 2 and "twins" in timed.stdout, timed.stdout
    history = subprocess.run([str(Path(sys.executable).parent / "llm-bench"), "history", "--format", "json",
                              str(directory)], capture_output=True, text=True, timeout=120)
    assert history.returncode == 0, history.stderr
    assert json.loads(history.stdout)["regressions"] == []

    # keep = 1: the older result goes.
    marker.write_text('{"package": {"path": "/nix/store/bbbb-llama-cpp-1"}}\n')
    kept = watch(keep=1)
    assert kept.returncode == 0, kept.stdout + kept.stderr
    assert len(results(directory)) == 1 and "Removed" in kept.stderr, kept.stderr
    assert loaded(router.url) == []
