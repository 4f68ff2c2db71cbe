"""Interference on the CPU bed, for real (issue 55): a real router pinned to core 0 serves three identical presets;
llm-bench (this process) runs on core 1. During one alias's runs two processes spin on core 0, during another a
second client streams requests to the same router: each of those is marked disturbed, by what, and gets no
verdict. The alias measured alone is clean, and the same run without the competing load gives the usual verdict.

The limit these tests use is 0.4 of the engine's core (the default is 0.1): this machine runs other work while the
tests run, unpinned, some of which the kernel places on core 0; two spinners pinned to core 0 take about half of
it (more between requests), which clears 0.4 by far, while the background seen on core 0 here stayed below it.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from llm_bench.diagnostics.settings import Checks
from llm_bench.plan import Plan, Protocol
from llm_bench.report import markdown_table
from llm_bench.report.rows import find_baseline, rows_of, verdict_of
from llm_bench.report.verdict import FASTER, SLOWER, WITHIN_NOISE
from llm_bench.results import load_results
from llm_bench.runner import run_plan
from llm_bench.testbed.presets import render_presets_ini
from llm_bench.testbed.router import RouterProcess
from llm_bench.workloads import PARTS

pytestmark = pytest.mark.skipif((os.cpu_count() or 1) < 2 or not hasattr(os, "sched_setaffinity"),
                                reason="needs two cores and CPU affinity: the engine on one, llm-bench on the other")

ENGINE_CORE, OWN_CORE = 0, 1
LIMIT = 0.4
SPIN = ("import os, time\n"
        f"os.sched_setaffinity(0, {{{ENGINE_CORE}}})\n"
        "open('/proc/self/comm', 'w').write('busy-spinner')\n"
        "end = time.monotonic() + 120\n"
        "while time.monotonic() < end: pass\n")


@pytest.fixture
def pinned_router(router_factory, smollm2) -> Iterator[RouterProcess]:
    """Three presets of SmolLM2 (a random tiny model answers 32 tokens in 4 ms: a window too short to see
    anything in) at the ordinary priority (a competing process takes its share), the router
    pinned to core 0 before any model instance starts (they inherit it), and this process on core 1."""
    ini = render_presets_ini({
        "*": {"ctx-size": 512, "parallel": 1, "threads": 1, "threads-batch": 1, "model": str(smollm2)},
        "tiny-a": {}, "tiny-b": {}, "tiny-c": {},
    })
    router = router_factory(ini)
    for thread in Path(f"/proc/{router.process.pid}/task").iterdir():  # a child inherits its forking thread's
        os.sched_setaffinity(int(thread.name), {ENGINE_CORE})
    before = os.sched_getaffinity(0)
    os.sched_setaffinity(0, {OWN_CORE})
    try:
        yield router
    finally:
        os.sched_setaffinity(0, before)


class Competition:
    """Started and stopped by the run's own progress lines: spinners on the engine's core during ``spin``'s
    runs, a second client's requests during ``stream``'s."""

    def __init__(self, url: str, spin: str | None, stream: str | None):
        self.url, self.spin, self.stream = url, spin, stream
        self.spinners: list[subprocess.Popen] = []
        self.streaming = threading.Event()
        self.sent = 0
        self.thread: threading.Thread | None = None
        self.lines: list[str] = []

    def log(self, line: str) -> None:
        self.lines.append(line)
        if line.startswith("Benchmark "):
            self.stop_all()
            if self.spin and line.endswith(f": {self.spin}"):
                self.spinners = [subprocess.Popen([sys.executable, "-c", SPIN])
                                 for _ in range(2)]
            self.current = line.rsplit(": ", 1)[1]
        elif line.startswith("  Cold load") and self.stream and self.current == self.stream:
            self.streaming.set()
            self.thread = threading.Thread(target=self._send, daemon=True)
            self.thread.start()

    def _send(self) -> None:
        with httpx.Client(base_url=self.url, timeout=60) as client:
            # autoload=false: once the alias is unloaded after its runs, a request must not load it again
            while self.streaming.is_set() and self.sent < 20:
                self.sent += 1  # sent: one cut short by the unload was still started by the server
                client.post("/v1/chat/completions", params={"autoload": "false"}, json={
                    "model": self.stream, "max_tokens": 8, "messages": [{"role": "user", "content": "Hi"}]})

    def stop_all(self) -> None:
        for p in self.spinners:
            p.kill()
            p.wait()
        self.spinners = []
        self.streaming.clear()
        if self.thread is not None:
            self.thread.join()
            self.thread = None


def measure(router: RouterProcess, out: Path, aliases: tuple[str, ...], competition: Competition, drift: bool = False,
            limit: float = LIMIT):
    plan = Plan(url=router.url, aliases=aliases, label="busy", output_dir=out,
                protocol=Protocol(prompt="Count to five.", max_tokens=96, runs=3),
                checks=Checks(foreign_cpu_max=limit, log_file=router.log_path, drift=drift))
    try:
        path = run_plan(plan, competition.log).path
    finally:
        competition.stop_all()
    return path, {r.alias: r for r in load_results(path, PARTS).aliases}


def test_a_competing_load_marks_its_alias_disturbed_and_withholds_its_verdict(pinned_router, tmp_path) -> None:
    competition = Competition(pinned_router.url, spin="tiny-b", stream="tiny-c")
    path, records = measure(pinned_router, tmp_path / "busy", ("tiny-a", "tiny-b", "tiny-c"), competition)
    log = "\n".join(competition.lines)
    clean, spun, streamed = records["tiny-a"], records["tiny-b"], records["tiny-c"]
    for record in records.values():
        assert record.interference is not None, log
        assert record.interference["cpu"]["cores"] == [ENGINE_CORE], record.interference
        assert "llama-server" in record.interference["engine"]
    # alone: no request but ours (the server's log accounts for every one we sent), and no spinner
    assert clean.interference["foreign_requests"] == 0, clean.interference
    assert not clean.interference["disturbed"], clean.interference
    assert clean.comparable
    # two spinners on the engine's core
    assert spun.interference["disturbed"], spun.interference
    assert spun.interference["cpu"]["foreign_share"] > LIMIT, (clean.interference, spun.interference)
    assert spun.interference["cpu"]["processes"][0]["name"] == "busy-spinner"
    assert "busy-spinner" in spun.not_comparable_reason
    assert spun.interference["foreign_requests"] == 0
    # a second client's requests to the same router, during the runs
    assert competition.sent >= 1
    assert streamed.interference["disturbed"], streamed.interference
    assert 1 <= streamed.interference["foreign_requests"] <= competition.sent
    assert "request" in streamed.not_comparable_reason and "not ours" in streamed.not_comparable_reason
    rows = rows_of([load_results(path, PARTS)])
    baseline = find_baseline(rows, "tiny-a")
    assert baseline is not None
    for alias in ("tiny-b", "tiny-c"):
        v = verdict_of(next(r for r in rows if r.configuration == alias), baseline)
        assert v.kind == "not comparable" and v.describe().startswith("not comparable: disturbed by"), v


def test_the_same_run_without_it_gives_the_usual_verdict(pinned_router, tmp_path) -> None:
    competition = Competition(pinned_router.url, spin=None, stream=None)
    path, records = measure(pinned_router, tmp_path / "calm", ("tiny-a", "tiny-b"), competition)
    for record in records.values():
        assert record.interference is not None
        assert record.interference["foreign_requests"] == 0, record.interference
        assert not record.interference["disturbed"], record.interference
    rows = rows_of([load_results(path, PARTS)])
    baseline = find_baseline(rows, "tiny-a")
    assert baseline is not None
    v = verdict_of(next(r for r in rows if r.configuration == "tiny-b"), baseline)
    assert v.kind in (FASTER, SLOWER, WITHIN_NOISE) and v.reason is None, v


class Throttle(Competition):
    """From the drift check's line on, the engine's model instances are stopped and continued in turn (SIGSTOP and
    SIGCONT, 20 ms each): the whole machine as the engine sees it runs at half speed, as under a thermal limit,
    with no other process taking its cores."""

    def __init__(self, router: RouterProcess):
        super().__init__(router.url, None, None)
        self.router_pid = router.process.pid
        self.throttling = threading.Event()
        self.throttler: threading.Thread | None = None

    def log(self, line: str) -> None:
        self.lines.append(line)
        if line.startswith("Drift check"):
            self.throttling.set()
            self.throttler = threading.Thread(target=self._throttle, daemon=True)
            self.throttler.start()

    def _instances(self) -> list[int]:
        found = []
        for task in Path(f"/proc/{self.router_pid}/task").iterdir():
            with contextlib.suppress(OSError):  # a thread that ended meanwhile
                found += [int(pid) for pid in (task / "children").read_text().split()]
        return found

    def _throttle(self) -> None:
        while self.throttling.is_set():
            stopped = self._instances()
            for pid in stopped:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGSTOP)
            time.sleep(0.02)
            for pid in stopped:
                with contextlib.suppress(ProcessLookupError):  # unloaded meanwhile
                    os.kill(pid, signal.SIGCONT)
            time.sleep(0.02)

    def stop_all(self) -> None:
        self.throttling.clear()
        if self.throttler is not None:
            self.throttler.join()
            self.throttler = None


def test_a_machine_that_slowed_down_during_the_run_is_said_in_every_verdict(pinned_router, tmp_path) -> None:
    """Other processes' CPU time is not judged here (limit 1.0): what is tested is the drift, and this machine's
    background would otherwise leave it unknown now and then."""
    throttle = Throttle(pinned_router)
    path, records = measure(pinned_router, tmp_path / "drift", ("tiny-a", "tiny-b"), throttle, drift=True, limit=1.0)
    result = load_results(path, PARTS)
    drift = result.meta["drift"]
    assert drift["alias"] == "tiny-a" and len(drift["start"]) == 3 and len(drift["end"]) == 3, drift
    assert "end_not_comparable" not in drift, drift  # stopping the engine is no other process's CPU time
    rows = rows_of([result])
    baseline = find_baseline(rows, "tiny-a")
    assert baseline is not None
    for row in rows:
        v = verdict_of(row, baseline)
        assert v.drift is not None and v.drift.startswith("the machine drifted during this run: tiny-a measured "
                                                          "again at its end was slower than at its start"), v
    table = markdown_table(rows, baseline)
    assert table.count("the machine drifted during this run") == 2
