"""llmBench.watch (modules/watch.nix): the unit that measures the router after every engine change.

Its evaluation under the tree in NIXPKGS_LIB (./dev test runs it under both), and its script
(modules/lib/watch-script.nix) run with bash and stand-ins for llm-bench, systemctl and curl that
answer as the real ones do (exit codes, `is-active --quiet`), on a real marker file.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from tests.nix.helpers import REPO, nix_eval, nix_string
from tests.test_nix_modules import ALL, ENGINES, LLAMAMPERE_SRC, NVIDIA, harness

WATCH = '{ llmBench.watch = { enable = true; presets = [ "qwen3.8-27b-mtp2" "ampere-mtp2" ]; }; }'


def units(*modules: str) -> dict:
    return nix_eval(  # type: ignore[return-value]
        f"let c = ({harness()}.eval [ {' '.join(modules)} ]).config; s = c.systemd.services; in"
        " { watch = s.llm-bench-watch or null; timer = s.llm-bench-watch-timer or null;"
        " timers = c.systemd.timers; failed = map (a: a.message) (builtins.filter (a: !a.assertion) c.assertions);"
        " inherit (c) warnings; packages = map (p: p.name) c.environment.systemPackages;"
        " marker = c.environment.etc.\"llama-cpp/active.json\".text;"
        " ini = c.environment.etc.\"llama-cpp/presets.ini\".source.outPath;"
        " specialised = builtins.mapAttrs (_: sp: sp.configuration.systemd.services.llm-bench-watch)"
        " c.specialisation; }")


def test_off_by_default() -> None:
    found = units(ALL, NVIDIA)
    assert found["watch"] is None and found["timer"] is None and found["timers"] == {}


def test_it_starts_after_the_router_at_idle_priority_and_never_holds_a_rebuild() -> None:
    found = units(ALL, NVIDIA, WATCH)
    assert found["failed"] == [] and found["warnings"] == []
    watch = found["watch"]
    assert watch["after"] == ["llama-cpp.service"] and watch["wants"] == ["llama-cpp.service"]
    assert watch["wantedBy"] == ["multi-user.target"]
    sc = watch["serviceConfig"]
    assert (sc["Nice"], sc["CPUSchedulingPolicy"], sc["IOSchedulingClass"]) == (19, "idle", "idle")
    # Type=exec: the start job (which switch-to-configuration waits for) ends once the script runs;
    # RemainAfterExit keeps it active, so a changed engine restarts it.
    assert (sc["Type"], sc["RemainAfterExit"], sc["SuccessExitStatus"]) == ("exec", True, "4")
    assert sc["ExecStart"].endswith("-llm-bench-watch --on-change")
    assert sc["StateDirectory"] == "llm-bench"
    # llm-bench on PATH for whoever reads the history.
    assert [p.rsplit("-", 1)[0] for p in found["packages"]] == ["llm-bench"], found["packages"]


def test_it_runs_again_only_when_the_engine_changes() -> None:
    """Its restart triggers are the marker (package path, version, presets) and the presets INI: a
    switch to another engine changes them, so switch-to-configuration restarts it; nothing else does."""
    found = units(ALL, NVIDIA, ENGINES, LLAMAMPERE_SRC, WATCH)
    watch = found["watch"]
    assert watch["restartTriggers"] == [found["marker"], found["ini"]]
    assert json.loads(watch["restartTriggers"][0])["package"]["name"] == "llama-cpp"
    triggers = {name: json.loads(s["restartTriggers"][0])["package"]["name"] for name, s in found["specialised"].items()}
    assert triggers == {"llm-fa86": "llama-cpp-fa86", "llm-llamampere": "llamampere"}
    # Each engine's script measures the chosen presets it serves.
    scripts = {name: s["serviceConfig"]["ExecStart"] for name, s in found["specialised"].items()}
    assert scripts["llm-fa86"] == watch["serviceConfig"]["ExecStart"] != scripts["llm-llamampere"]
    same = units(ALL, NVIDIA, ENGINES, LLAMAMPERE_SRC, WATCH, '{ services.llama-cpp.modelsMax = 1; }')
    assert same["watch"]["restartTriggers"] == watch["restartTriggers"]


def test_the_timer_is_opt_in_and_measures_whatever_changed() -> None:
    found = units(ALL, NVIDIA, WATCH, '{ llmBench.watch.timer = "Sun 04:00"; }')
    assert found["timers"] == {"llm-bench-watch-timer": {"wantedBy": ["timers.target"],
                                                         "timerConfig": {"OnCalendar": "Sun 04:00", "Persistent": True}}}
    timed = found["timer"]["serviceConfig"]
    assert timed["ExecStart"].endswith("-llm-bench-watch --always")
    assert (timed["Nice"], timed["CPUSchedulingPolicy"]) == (19, "idle")
    assert "RemainAfterExit" not in timed and "SuccessExitStatus" not in timed  # a regression fails it


def test_it_needs_the_router() -> None:
    failed = nix_eval(f"{harness()}.assertionsOf [ {ALL} {NVIDIA} {WATCH} {{ services.llama-cpp.enable = false; }} ]")
    assert any("llmBench.watch measures services.llama-cpp" in m for m in failed), failed  # type: ignore[union-attr]


# --- the script ------------------------------------------------------------------------------------


class Bed:
    """A folder with the marker and stand-ins for llm-bench, systemctl and curl that log their calls."""

    def __init__(self, root: Path, *, run_status: int = 0, run_sleep: float = 0, history_status: int = 0,
                 active: tuple[str, ...] = ()) -> None:
        self.root = root
        self.calls = root / "calls"
        self.marker = root / "active.json"
        self.marker.write_text('{"package": {"path": "/nix/store/aaaa-llama-cpp-1"}}\n')
        self.directory = root / "history"
        bin_dir = root / "bin"
        bin_dir.mkdir()
        self._tool(bin_dir / "llm-bench", f"""
case "$1" in
  run) sleep {run_sleep}; exit {run_status} ;;
  history) case "$*" in *--skipped*) exit 0 ;; esac; echo "REGRESSION stand-in"; exit {history_status} ;;
esac""")
        active_units = " ".join(f"{u}.service" for u in active)
        self._tool(bin_dir / "systemctl", f'for u in {active_units}; do [ "$3" = "$u" ] && exit 0; done; exit 3')
        self._tool(bin_dir / "curl", "exit 0")
        self.bin = bin_dir

    def _tool(self, path: Path, body: str) -> None:
        path.write_text(f'#!/bin/sh\necho "{path.name} $*" >> {self.calls}\n{body}\n')
        path.chmod(0o755)

    def script(self, presets: list[str], time_limit: int = 600, gives_way_to: tuple[str, ...] = ("train",)) -> str:
        args = {
            "llmBench": str(self.bin / "llm-bench"), "url": "http://127.0.0.1:48123",
            "directory": str(self.directory), "systemctl": str(self.bin / "systemctl"), "sha256sum": "sha256sum",
            "curl": str(self.bin / "curl"), "marker": str(self.marker),
        }
        fields = " ".join(f"{k} = {nix_string(v)};" for k, v in args.items())
        return nix_eval(  # type: ignore[return-value]
            f"import {REPO}/modules/lib/watch-script.nix {{ lib = {harness()}.lib; {fields}"
            f" presets = [ {' '.join(nix_string(p) for p in presets)} ]; runs = 3; maxTokens = 256; keep = 20;"
            f" timeLimitSec = {time_limit}; givesWayTo = [ {' '.join(nix_string(u) for u in gives_way_to)} ]; }}")

    def run(self, script: str, mode: str = "--on-change") -> subprocess.CompletedProcess:
        return subprocess.run(["bash", "-c", script, "llm-bench-watch", mode], capture_output=True, text=True,
                              timeout=60, env={**os.environ, "PATH": f"{self.bin}:{os.environ['PATH']}"})

    def logged(self) -> list[str]:
        lines = self.calls.read_text().splitlines() if self.calls.exists() else []
        self.calls.unlink(missing_ok=True)
        return [line for line in lines if not line.startswith("curl") or "unload" in line]


def test_the_script_measures_a_new_engine_once(tmp_path: Path) -> None:
    bed = Bed(tmp_path)
    script = bed.script(["p1", "p2"])
    first = bed.run(script)
    assert first.returncode == 0, first
    calls = bed.logged()
    assert calls[1].startswith("llm-bench run --url http://127.0.0.1:48123 --alias p1 --alias p2 --runs 3"
                               " --max-tokens 256 --strict --unload --label watch --output-dir "), calls
    assert calls[1].split("--output-dir ")[1].startswith(str(bed.directory) + "/")
    assert calls[2] == f"llm-bench history --keep 20 {bed.directory}"
    # The same engine again (a reboot, a switch that changed something else): nothing measured.
    again = bed.run(script)
    assert again.returncode == 0 and "nothing to measure" in again.stdout
    assert not any(c.startswith("llm-bench") for c in bed.logged())
    # The timer measures whatever changed; a new marker is a new engine.
    assert bed.run(script, "--always").returncode == 0
    assert any(c.startswith("llm-bench run") for c in bed.logged())
    bed.marker.write_text('{"package": {"path": "/nix/store/bbbb-llama-cpp-2"}}\n')
    assert bed.run(script).returncode == 0
    assert any(c.startswith("llm-bench run") for c in bed.logged())


def test_a_regression_is_the_scripts_exit_code_and_journal_line(tmp_path: Path) -> None:
    bed = Bed(tmp_path, history_status=4)
    result = bed.run(bed.script(["p1"]))
    assert result.returncode == 4 and "REGRESSION stand-in" in result.stdout


def test_the_script_gives_way_to_training_with_a_skip_record(tmp_path: Path) -> None:
    bed = Bed(tmp_path, active=("train",))
    result = bed.run(bed.script(["p1", "p2"]))
    assert result.returncode == 0, result
    calls = bed.logged()
    assert calls[0] == "systemctl is-active --quiet train.service"
    skips = [c for c in calls if c.startswith("llm-bench")]
    reason = "train.service is active: the router gives way to it (llmBench.arbiter)"
    assert skips == [f"llm-bench history --skipped {reason} --alias {p} {bed.directory}" for p in ("p1", "p2")]
    # Not recorded as measured: once training ends, the next start measures.
    assert not (bed.directory / ".engine").exists()


def test_a_measurement_past_its_time_limit_is_stopped_unloaded_and_recorded(tmp_path: Path) -> None:
    bed = Bed(tmp_path, run_sleep=30)
    result = bed.run(bed.script(["p1", "p2"], time_limit=1))
    assert result.returncode == 0, result
    assert "stopped after 1 s" in result.stdout
    calls = bed.logged()
    unloads = [c for c in calls if c.startswith("curl")]
    assert len(unloads) == 2 and all("http://127.0.0.1:48123/models/unload" in c for c in unloads), calls
    assert '{"model":"p1"}' in unloads[0] and '{"model":"p2"}' in unloads[1]
    assert any("--skipped the measurement took longer than 1 s" in c for c in calls), calls


@pytest.mark.parametrize("status", [2, 3])
def test_a_run_that_could_not_measure_is_retried_next_time(tmp_path: Path, status: int) -> None:
    bed = Bed(tmp_path, run_status=status)
    script = bed.script(["p1"])
    result = bed.run(script)
    assert result.returncode == status and "measured on the next start" in result.stdout
    assert not any(c.startswith("llm-bench history") for c in bed.logged())
    assert not (bed.directory / ".engine").exists()


def test_an_engine_without_the_chosen_presets_measures_nothing(tmp_path: Path) -> None:
    bed = Bed(tmp_path)
    result = bed.run(bed.script([]))
    assert result.returncode == 0 and "serves none of llmBench.watch.presets" in result.stdout
    assert bed.logged() == []
