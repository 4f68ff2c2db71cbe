"""`llm-bench history` on the CPU bed: two builds of llama-server, one slower for real.

The two builds are the same cached binary copied to two paths, each with a NixOS marker naming its own package
(and a nixos-version stand-in naming its own nixpkgs revision), serving the same preset with the same
arguments. Build B is slower for real: its router (and the model instance it spawns, which inherits both) is
pinned to one core with `taskset -c 0` and held to a quarter of that core's time by a duty cycle of SIGSTOP and
SIGCONT on its process group, as `cpulimit` does: a CPU quota that holds whatever else the shared machine runs.
Both serve with one thread: with two, llama.cpp's threads wait for each other at every barrier, and on a busy
machine a build whose threads are descheduled in turn loses far more than its share (measured: A at a tenth
of its idle speed), while one thread loses its share and no more.

The sequence, as an update on a box goes (issue 52): A labelled "before", again (twins); B labelled "after"
with the NVML double's driver moved from 580.95.05 to 590.44.01 in the same step (a nixos-rebuild after nix
flake update: the regression all the same, the driver named as a co-suspect); B again with the power limit
lowered (the same build: a rig change, not blamed); A with another max_tokens (another protocol: refused).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path

import pytest
from click.testing import CliRunner

from llm_bench.cli import main
from llm_bench.cli.exits import NEWEST_IS_REGRESSION
from llm_bench.diagnostics.settings import Checks
from llm_bench.gpu.nvml import Nvml
from llm_bench.history.command import run_history
from llm_bench.history.steps import FIRST, REGRESSION, RIG_CHANGE, TWINS
from llm_bench.plan import Plan, Protocol
from llm_bench.report.verdict import WITHIN_NOISE
from llm_bench.runner import run_plan
from llm_bench.testbed.presets import render_presets_ini
from llm_bench.testbed.router import RouterProcess, start_router
from tests.fake_nvml import FakeGpu, FakeNvml
from tests.test_fingerprint import nixos_box

ALIAS = "larger"
# 10 runs a side: the exact interval then holds with two runs of a side hit by the shared machine's other work. A
# short prompt: the steps are judged on decode, and the shipped prompt's ~230 tokens took 70 % of each run here.
PROTOCOL = Protocol(runs=10, max_tokens=32, prompt="Count to five.")
# The bed's two cores are shared with other work: twins of one build differ by more than a GPU's 2 %; the
# smallest effect a verdict calls a difference is set to what the bed can resolve, far below B's slowdown.
BED_MIN_EFFECT = "25%"
NEW_DRIVER = "590.44.01"


class Throttle:
    """A quota of CPU time for a process group: running ``run_s``, stopped ``stop_s``, over and over."""

    def __init__(self, pgid: int, run_s: float = 0.005, stop_s: float = 0.015):
        self.pgid, self.run_s, self.stop_s = pgid, run_s, stop_s
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._cycle, daemon=True)

    def _cycle(self) -> None:
        while not self._done.is_set():
            try:
                os.killpg(self.pgid, signal.SIGSTOP)
                time.sleep(self.stop_s)
            finally:
                os.killpg(self.pgid, signal.SIGCONT)
            time.sleep(self.run_s)

    def __enter__(self) -> Throttle:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._done.set()
        self._thread.join()
        os.killpg(self.pgid, signal.SIGCONT)


def marker(path: Path, package: str, version: str, url: str) -> Path:
    """The NixOS module's marker (docs/nixos.md) for a build at ``package``."""
    path.write_text(json.dumps({
        "format": "llm-bench-llama-cpp-active/1", "specialisation": "base",
        "package": {"name": "llama-cpp", "version": version, "path": package, "rev": None},
        "presets": [ALIAS], "presets_file": "/etc/llama-cpp/presets.ini", "url": url}) + "\n")
    return path


@contextmanager
def build(root: Path, name: str, binary: Path, ini: Path, slow: bool) -> Iterator[RouterProcess]:
    """Build ``name``: the binary copied to its own path, started (pinned to one core when slow)."""
    bin_dir = root / f"llama-cpp-{name}" / "bin"
    bin_dir.mkdir(parents=True)
    copied = bin_dir / "llama-server"
    shutil.copy2(binary, copied)
    start = copied
    if slow:
        start = bin_dir / "pinned"
        start.write_text(f'#!/bin/sh\nexec taskset -c 0 "{copied}" "$@"\n')
        start.chmod(0o755)
    router = start_router(start, ini, log_path=root / f"router-{name}.log")
    try:
        yield router
    finally:
        router.stop()


def wait_for_the_next_second() -> None:
    """Results are ordered by meta.started_at, written to the second."""
    time.sleep(1.05 - time.time() % 1)


@pytest.fixture(scope="module")
def history_dir(llama_server_bin: Path, larger_model: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("history-bed")
    ini = root / "presets.ini"
    ini.write_text(render_presets_ini({"*": {"ctx-size": 1024, "parallel": 1},
                                       ALIAS: {"model": str(larger_model), "threads": 1}}))
    out = root / "history"
    systems = {
        name: nixos_box(root / f"system-{name}", json_text=json.dumps(
            {"nixosVersion": f"25.05.2025061{n}.{rev[:7]}", "nixpkgsRevision": rev}))
        for n, (name, rev) in enumerate((("a", "4a5d0b1f" * 5), ("b", "9c1e77d2" * 5)))}

    def measure(router: RouterProcess, name: str, version: str, label: str, protocol: Protocol = PROTOCOL,
                power_limit_mw: int = 350000, driver: str = "580.95.05") -> None:
        wait_for_the_next_second()
        package = f"/nix/store/{name * 32}-llama-cpp-{version}"
        marked = marker(root / f"active-{name}.json", package, version, router.url)
        sources = replace(systems[name], marker=marked)
        plan = Plan(url=router.url, aliases=(ALIAS,), output_dir=out, label=label, protocol=protocol,
                    checks=Checks(marker=marked))
        nvml = Nvml(FakeNvml(gpus=[FakeGpu(power_limit_mw=power_limit_mw)], driver=driver))
        run_plan(plan, lambda m: None, nvml=nvml, sources=sources).finish(
            __import__("datetime").datetime.now(__import__("datetime").timezone.utc))

    with build(root, "a", llama_server_bin, ini, slow=False) as a:
        measure(a, "a", "7123", "before")
        measure(a, "a", "7123", "before")
        with build(root, "b", llama_server_bin, ini, slow=True) as b, Throttle(b.process.pid):
            # the update: llama.cpp and the driver in one step, labelled apart
            measure(b, "b", "7130", "after", driver=NEW_DRIVER)
            # the same build with the power limit lowered: a rig change, no build blamed
            measure(b, "b", "7130", "after", driver=NEW_DRIVER, power_limit_mw=270000)
        measure(a, "a", "7123", "after", driver=NEW_DRIVER, power_limit_mw=270000,
                protocol=replace(PROTOCOL, max_tokens=16))
    return out


def test_the_regression_is_found_once_twins_are_noise_and_the_rig_change_is_not_blamed(history_dir: Path) -> None:
    from llm_bench.history.points import read_inputs
    from llm_bench.history.steps import history_of

    history = history_of(read_inputs([history_dir]).points, min_effect=0.25)
    kinds = [s.kind for s in history.steps]
    assert kinds == [FIRST, TWINS, REGRESSION, RIG_CHANGE, FIRST], [s.describe() for s in history.steps]
    twins, regression, rig = history.steps[1:4]
    assert twins.decode is not None and twins.decode.kind == WITHIN_NOISE, twins.describe()
    # B really is slower: the interval's upper end is far below 1, not just below the smallest effect
    assert regression.decode is not None and regression.decode.high is not None
    assert regression.decode.high < 0.6, regression.describe()
    assert "llama.cpp 7123 (/nix/store/" + "a" * 32 + "-llama-cpp-7123, nixpkgs 4a5d0b1f4a5d)" in regression.describe()
    assert "llama.cpp 7130 (/nix/store/" + "b" * 32 + "-llama-cpp-7130, nixpkgs 9c1e77d29c1e)" in regression.describe()
    # the driver moved with the build: named, and the regression stands
    assert regression.rig == ("driver 580.95.05 -> 590.44.01",)
    assert [s.point.record.target for s in history.steps[:3]] == ["before", "before", "after"]
    assert rig.rig == ("GPU0 power limit 350 W -> 270 W",)
    assert rig.point.build.identity == regression.point.build.identity  # B twice: the rig change is kept for it
    [refusal] = history.refusals
    assert refusal.reason == "the protocol differs (max_tokens 32 vs 16)"


def test_the_command_line_on_the_bed(history_dir: Path, tmp_path: Path) -> None:
    files = sorted(history_dir.glob("*.toml"))
    assert len(files) == 5
    runner = CliRunner()
    # up to the regression: the newest step is it, so the exit code says so, naming the driver beside the builds
    upto = runner.invoke(main, ["history", *map(str, files[:3]), "--min-effect", BED_MIN_EFFECT])
    assert upto.exit_code == NEWEST_IS_REGRESSION, upto.output
    assert upto.output.count("| REGRESSION |") == 1
    assert "co-suspects, changed with the build: driver 580.95.05 -> 590.44.01 [before / larger" not in upto.output
    assert "co-suspects, changed with the build: driver 580.95.05 -> 590.44.01 [after / larger" in upto.output
    print(upto.output)  # docs/history.md's worked example, the second listing
    whole = runner.invoke(main, ["history", str(history_dir), "--min-effect", BED_MIN_EFFECT,
                                 "--chart", str(tmp_path / "history.png"), "--html", str(tmp_path / "history.html")])
    assert whole.exit_code == 0, whole.output  # the newest step of the series is the rig change
    print(whole.output)  # docs/history.md's worked example
    assert "not compared: " in whole.output and "the protocol differs (max_tokens 32 vs 16)" in whole.output
    assert (tmp_path / "history.png").stat().st_size > 10_000
    page = (tmp_path / "history.html").read_text()
    assert "REGRESSION" in page and 'id="history-table"' in page and "build: nixpkgs revision" in page
    assert len(run_history([history_dir]).inputs.points) == 5
