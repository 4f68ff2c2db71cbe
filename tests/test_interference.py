"""Interference during the measured runs (issue 55), without a server: /proc parsed, foreign CPU time counted
against the engine's cores, the NVML double's processes named (the engine's own not), and a disturbed record
made not comparable in every place the report shows a verdict."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from llm_bench.engines import open_engine
from llm_bench.gpu.nvml import Nvml
from llm_bench.interference.cpu import foreign_cpu
from llm_bench.interference.procs import CoreTimes, ProcessTimes, Snapshot, parse_pid_stat, parse_proc_stat
from llm_bench.interference.requests import Count, RequestCounter, started_in_log, vllm_finished
from llm_bench.interference.watch import InterferenceWatch
from llm_bench.interference.window import Interference, Limits
from llm_bench.report import markdown_table, summary
from llm_bench.report.rows import find_baseline, rows_of, verdict_of
from llm_bench.results import AliasRecord, ResultSet, RunRecord
from llm_bench.testbed.router import free_port
from tests.fake_nvml import FakeGpu, FakeNvml, FakeProcess


def test_pid_stat_names_with_spaces_and_parentheses_are_read_from_the_last_parenthesis() -> None:
    text = "4121 (busy (x) spin) R 77 4121 4121 0 -1 4194304 100 0 0 0 250 30 0 0 20 0 1 0 5000 1000 100"
    parsed = parse_pid_stat(4121, text)
    assert parsed == ProcessTimes(4121, "busy (x) spin", 77, 280)


def test_proc_stat_busy_time_leaves_idle_and_iowait_out_and_keeps_steal() -> None:
    text = ("cpu  10 0 10 100 5 0 0 0 0 0\n"
            "cpu0 1 2 3 1000 50 4 5 6 0 0\n"
            "cpu1 10 0 0 10 0 0 0 0 0 0\nintr 1 2 3\n")
    assert parse_proc_stat(text) == {0: CoreTimes(busy=1 + 2 + 3 + 4 + 5 + 6, steal=6), 1: CoreTimes(10, 0)}


def snap(t: float, core0: int, core1: int, procs: dict[int, tuple[str, int, int]], steal: int = 0) -> Snapshot:
    return Snapshot(t, {0: CoreTimes(core0, steal), 1: CoreTimes(core1, 0)},
                    {pid: ProcessTimes(pid, name, ppid, ticks) for pid, (name, ppid, ticks) in procs.items()})


def test_foreign_time_is_the_engine_cores_busy_time_less_the_engine_and_llm_bench() -> None:
    """Core 0 is the engine's (pid 10, its child 11); over 10 s core 0 was busy 900 ticks: the engine took 400,
    llm-bench (pid 20, allowed only on core 1) nothing there, a spinner pinned to core 0 (pid 30) 450, and 50
    ticks went to something that came and went between readings."""
    ticks = os.sysconf("SC_CLK_TCK")
    first = snap(0.0, 0, 0, {10: ("llama-server", 1, 0), 11: ("llama-server", 10, 0), 20: ("pytest", 1, 0),
                             30: ("spinner", 1, 0), 40: ("sshd", 1, 0)})
    last = snap(10.0, 900, 300, {10: ("llama-server", 1, 100), 11: ("llama-server", 10, 300),
                                 20: ("pytest", 1, 200), 30: ("spinner", 1, 450), 40: ("sshd", 1, 40)})
    cores = {10: {0}, 11: {0}, 20: {1}, 30: {0}, 40: {0, 1}}
    window = foreign_cpu([first, last], {10, 11}, 20, frozenset({0}), lambda pid: frozenset(cores[pid]))
    assert window.cores == (0,)
    assert window.foreign_s == pytest.approx(500 / ticks)
    assert window.share == pytest.approx(500 / ticks / 10.0)
    # named largest first, weighted by the share of their allowed cores that are the engine's
    assert [(p.name, round(p.cpu_s * ticks)) for p in window.processes] == [("spinner", 450), ("sshd", 20)]


def test_a_process_that_started_inside_the_window_counts_all_its_time_up_to_its_last_sighting() -> None:
    ticks = os.sysconf("SC_CLK_TCK")
    first = snap(0.0, 0, 0, {10: ("engine", 1, 0)})
    between = snap(1.0, 100, 0, {10: ("engine", 1, 0), 50: ("cc1plus", 1, 80)})
    last = snap(2.0, 100, 0, {10: ("engine", 1, 0)})
    window = foreign_cpu([first, between, last], {10}, 99, frozenset({0}), lambda pid: frozenset({0}))
    assert [(p.name, round(p.cpu_s * ticks)) for p in window.processes] == [("cc1plus", 80)]
    assert window.foreign_s == pytest.approx(100 / ticks)


def test_llama_cpp_log_and_vllm_counters() -> None:
    log = ("[57645] 0.00.017.876 I slot launch_slot_: id  0 | task 0 | processing task, is_child = 0\n"
           "[57645] 0.00.019.982 I slot      release: id  0 | task 0 | stop processing: n_tokens = 34\n"
           "[57645] 0.00.027.569 I slot launch_slot_: id  1 | task 17 | processing task, is_child = 1\n"
           "llama-server[812]: slot launch_slot_: id  0 | task 51 | processing task, is_child = 0\n")
    assert started_in_log(log) == 2
    assert RequestCounter.foreign(Count(10, 3), Count(15, 6)) == (2, None)
    assert RequestCounter.foreign(Count(10, 3), Count(2, 6))[0] is None  # the log started over
    text = ('vllm:request_success_total{finished_reason="length",model_name="m"} 5.0\n'
            'vllm:request_success_total{finished_reason="stop",model_name="m"} 2.0\n'
            'vllm:num_requests_running{model_name="m"} 1.0\n')
    assert vllm_finished(text) == 8.0


@pytest.fixture
def engine_tree(tmp_path: Path):
    """A real server process listening on a port (the engine), with a child of its own, and a foreign process."""
    port = free_port()
    server = subprocess.Popen([sys.executable, "-c", (
        "import http.server, subprocess, sys\n"
        "child = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)'])\n"
        f"http.server.HTTPServer(('127.0.0.1', {port}), http.server.BaseHTTPRequestHandler).serve_forever()\n")])
    foreign = subprocess.Popen(["sleep", "60"])
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        children = Path(f"/proc/{server.pid}/task/{server.pid}/children").read_text().split()
        listening = f":{port:04X} 00000000:0000 0A" in Path("/proc/net/tcp").read_text()
        if children and listening:
            break
        time.sleep(0.05)
    yield port, server.pid, int(children[0]), foreign.pid
    for p in (server, foreign):
        p.kill()
        p.wait()


def test_nvml_double_foreign_gpu_processes_are_named_and_the_engines_own_are_not(engine_tree) -> None:
    """The engine (a server listening on the port) and its child hold the GPU, and so does a foreign process
    (`sleep`, 40 % of the SMs) and a desktop's graphics process gone from /proc: only those two are listed, and
    only the busy one disturbs."""
    port, engine_pid, child_pid, foreign_pid = engine_tree
    fake = FakeNvml(gpus=[FakeGpu(clock_reasons=0x20 | 0x1, processes=[
        FakeProcess(engine_pid, 18000, "compute", 90), FakeProcess(child_pid, 200, "compute", 5),
        FakeProcess(foreign_pid, 4000, "compute", 40),
        FakeProcess(999_999_999, None, "graphics", None, name="/usr/bin/gnome-shell")])])
    url = f"http://127.0.0.1:{port}"
    engine = open_engine("openai", url, timeout=5.0)
    try:
        with Nvml(fake) as nvml:
            watch = InterferenceWatch(engine, "m", nvml, url, interval_s=0.1)
            watch.start()
            time.sleep(0.5)
            seen = watch.stop()
    finally:
        engine.close()
    assert seen is not None and seen.gpu is not None
    listed = {(p.pid, p.name, p.kind) for p in seen.gpu.processes}
    assert listed == {(foreign_pid, "sleep", "compute"), (999_999_999, "/usr/bin/gnome-shell", "graphics")}
    assert seen.gpu.clock_reasons == ["GPU0: software thermal slowdown"]
    disturbed = seen.disturbed_by(Limits(foreign_cpu_max=1.0))
    assert disturbed == [f"GPU0: sleep (pid {foreign_pid}, compute, 4000 MiB, 40 % of the SMs)"]
    assert seen.engine is not None and f"(pid {engine_pid})" in seen.engine
    assert any(n.startswith("requests: ") for n in seen.not_watched)  # no /metrics on this server


def rates(*values: float) -> list[RunRecord]:
    return [RunRecord(decode_tps=v, output_tokens=32) for v in values]


def disturbed_set() -> ResultSet:
    base = AliasRecord("base", runs=rates(100, 101, 99))
    fast = AliasRecord("fast", runs=rates(200, 201, 199))
    busy = AliasRecord("busy", runs=rates(11, 12, 11.5))
    Interference(10.0).apply([base, fast], Limits())
    from llm_bench.interference.cpu import CpuWindow, Foreign
    window = Interference(12.0, cpu=CpuWindow(12.0, (0, 1), 12.0, 0.0, [Foreign(4121, "ComfyUI", 11.0)]))
    window.apply([busy], Limits())
    return ResultSet({"format": "llm-bench/1", "label": "demo"}, [base, fast, busy])


def test_a_disturbed_alias_has_no_verdict_is_never_the_fastest_and_says_by_what() -> None:
    rows = rows_of([disturbed_set()])
    baseline = find_baseline(rows, "base")
    assert baseline is not None
    by_name = {r.configuration: r for r in rows}
    v = verdict_of(by_name["busy"], baseline)
    assert v.kind == "not comparable"
    assert v.describe().startswith("not comparable: disturbed by other processes on the engine's cores (50% of cores 0,1")
    assert "ComfyUI (pid 4121, 11.0 CPU-s)" in v.describe()
    assert verdict_of(by_name["fast"], baseline).kind == "faster"
    table = markdown_table(rows, baseline)
    busy_line = next(line for line in table.splitlines() if line.startswith("| busy"))
    assert "not comparable: disturbed by" in busy_line and "slower" not in busy_line
    text = summary(rows, baseline)
    assert "Slower than the baseline" not in text
    assert "Not comparable" in text and "busy: disturbed by" in text


def test_a_disturbed_baseline_withholds_every_verdict() -> None:
    result = disturbed_set()
    rows = rows_of([result])
    baseline = find_baseline(rows, "busy")
    assert baseline is not None
    v = verdict_of(next(r for r in rows if r.configuration == "fast"), baseline)
    assert v.kind == "not comparable" and v.reason is not None and v.reason.startswith("the baseline busy was disturbed")


def test_the_window_survives_the_results_file(tmp_path: Path) -> None:
    from llm_bench.results import ResultsWriter, load_results
    from llm_bench.workloads import PARTS
    writer = ResultsWriter(tmp_path, disturbed_set(), "x")
    loaded = {r.alias: r for r in load_results(writer.path, PARTS).aliases}
    assert loaded["busy"].interference is not None and loaded["busy"].interference["disturbed"] is True
    assert loaded["busy"].interference["cpu"]["processes"][0]["name"] == "ComfyUI"
    assert loaded["base"].interference == {"window_s": 10.0, "disturbed": False}
    assert not loaded["busy"].comparable


def test_doctor_lists_what_else_is_on_the_gpu_and_which_will_disturb(engine_tree) -> None:
    from llm_bench.diagnostics.busy import check_busy, look
    port, engine_pid, child_pid, foreign_pid = engine_tree
    fake = FakeNvml(gpus=[FakeGpu(processes=[
        FakeProcess(engine_pid, 18000, "compute", 0), FakeProcess(foreign_pid, 4000, "compute", 60),
        FakeProcess(child_pid, 100, "compute", 0),
        FakeProcess(999_999_998, 300, "graphics", 0, name="/usr/bin/Xorg")])])
    engine = open_engine("openai", f"http://127.0.0.1:{port}", timeout=5.0)
    try:
        with Nvml(fake) as nvml:
            findings = check_busy(look(engine, nvml, seconds=0.3))
    finally:
        engine.close()
    gpu = [f for f in findings if f.evidence.startswith("GPU0")]
    assert [(f.severity, f.evidence.split(" (")[0]) for f in gpu] == [("warning", "GPU0: sleep"),
                                                                       ("info", "GPU0: /usr/bin/Xorg")]
    assert "will disturb a benchmark" in gpu[0].evidence
    assert not any(f"pid {engine_pid}," in f.evidence or f"pid {child_pid}," in f.evidence for f in gpu)
    assert any("of the engine's cores" in f.evidence for f in findings)


def test_drift_beyond_noise_is_said_beside_every_verdict_and_noise_is_not() -> None:
    result = disturbed_set()
    slowed = {"alias": "base", "start": [100.0, 101.0, 99.0], "end": [60.0, 61.0, 59.0]}
    for record in result.aliases:
        record.drift = slowed
    rows = rows_of([result])
    baseline = find_baseline(rows, "base")
    assert baseline is not None
    for row in rows:
        v = verdict_of(row, baseline)
        assert v.drift is not None and v.drift.startswith("the machine drifted during this run: base measured again "
                                                          "at its end was slower than at its start (0.60x"), v
    for record in result.aliases:
        record.drift = {"alias": "base", "start": [100.0, 101.0, 99.0], "end": [100.5, 99.5, 100.0]}
    assert all(verdict_of(row, baseline).drift is None for row in rows_of([result]))


def test_history_makes_no_step_on_a_disturbed_result_and_shows_it_as_a_skip(tmp_path: Path) -> None:
    from llm_bench.history.points import read_inputs
    from llm_bench.results import ResultsWriter
    result = disturbed_set()
    result.meta |= {"started_at": "2026-12-07T17:00:00+00:00", "protocol": {}}
    ResultsWriter(tmp_path, result, "llm-bench-20261207-170000-demo")
    inputs = read_inputs([tmp_path])
    assert sorted(p.alias for p in inputs.points) == ["base", "fast"]
    [skip] = inputs.skips
    assert skip.alias.startswith("busy") and skip.reason.startswith("measured, but disturbed by other processes")
