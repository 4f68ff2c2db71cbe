#!/usr/bin/env python3
"""Fidelity benchmark: how close llm-bench's client-side figures come to the server's own.

Against the CPU bed (a real llama-server router serving a tiny random-weight model, fast enough for
~2,000 t/s from one stream), it sends the standard request (prompt processed whole, generated to
max_tokens) at 1 stream and at 8 simultaneous streams on a preset with 8 slots, and for every request
compares

- the client's decode t/s (tokens after the first over first-to-last token arrival) with the server's
  ``timings.predicted_per_second`` (the same n-1 intervals, timed inside the server), and
- the client's TTFT with the server's ``timings.prompt_ms`` (the client's includes the HTTP round trip,
  the router's proxying and tokenisation, so it is longer; printed in ms).

It prints the deviation of each run and the median; it is a benchmark, not a test, and asserts nothing.

``--capacity-streams 64,128`` drives the same presets with ``llm-bench capacity``'s closed loop instead (N
streams, each sending its next request when its last one ended, for a warm-up and a window) and prints,
over the window's requests, how far the client's decode t/s lies from the server's (median, the share
within 1 %, the extremes) and the client's lag (from when a request was due to when its last byte was
written: what capacity refuses above 1 % of the TTFT objective).
Usage: .venv/bin/python scripts/fidelity-bench.py [--runs 20] [--max-tokens 512] [--streams 1,8]
       .venv/bin/python scripts/fidelity-bench.py --capacity-streams 64,128 [--window-s 20]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
from pathlib import Path

from llm_bench.capacity.loops import Budget, closed_level, new_level
from llm_bench.capacity.prompts import PlanPrompt
from llm_bench.capacity.records import Level
from llm_bench.capacity.settings import CapacitySettings
from llm_bench.engines import open_engine
from llm_bench.engines.stream import ChatRequest, StreamMeasurement
from llm_bench.prompts import shipped_prompt
from llm_bench.support.stats import tail_of
from llm_bench.testbed.llama_server import ensure_llama_server
from llm_bench.testbed.presets import render_presets_ini
from llm_bench.testbed.router import running_router
from llm_bench.testbed.tiny_gguf import TinyModelSpec, write_tiny_model
from llm_bench.workloads.concurrency import simultaneous


def deviation(client: float | None, server: float | None) -> float | None:
    return None if not client or not server else client / server - 1.0


def pct(value: float | None) -> str:
    return "   n/a" if value is None else f"{value:+.3%}"


def measure(engine, request: ChatRequest, streams: int, runs: int) -> list[StreamMeasurement]:
    engine.stream(request)  # load the preset and warm it up; not counted
    found: list[StreamMeasurement] = []
    for _ in range(runs):
        if streams == 1:
            found.append(engine.stream(request))
        else:
            measurements, errors, _ = simultaneous(engine, request, streams)
            if errors:
                raise SystemExit(f"a batch failed: {errors[0]}")
            found.extend(measurements)
    return found


def report(streams: int, measurements: list[StreamMeasurement]) -> None:
    # the figures depend on the machine being quiet: a client or router not scheduled when a token
    # arrives stamps it late, so the load is printed with them
    load = " ".join(f"{v:.2f}" for v in os.getloadavg())
    print(f"\n== {streams} stream{'s' if streams > 1 else ''}: {len(measurements)} requests "
          f"(load average {load} on {os.cpu_count()} CPUs) ==")
    print(f"{'#':>3} {'server t/s':>11} {'client t/s':>11} {'decode dev':>10} "
          f"{'prompt_ms':>10} {'TTFT ms':>9} {'TTFT - prompt_ms':>17}")
    decode_devs, ttft_gaps = [], []
    for i, m in enumerate(measurements, 1):
        timings = m.timings or {}
        server, client = timings.get("predicted_per_second"), m.client_decode_tps
        dev = deviation(client, server)
        prompt_ms, ttft_ms = timings.get("prompt_ms"), None if m.ttft_s is None else m.ttft_s * 1000
        gap = None if prompt_ms is None or ttft_ms is None else ttft_ms - prompt_ms
        if dev is not None:
            decode_devs.append(dev)
        if gap is not None:
            ttft_gaps.append(gap)
        print(f"{i:>3} {server or 0:>11.1f} {client or 0:>11.1f} {pct(dev):>10} "
              f"{prompt_ms or 0:>10.1f} {ttft_ms or 0:>9.1f} {gap or 0:>17.1f}")
    if decode_devs:
        print(f"median decode deviation (client vs server): {pct(statistics.median(decode_devs))}  "
              f"[min {pct(min(decode_devs))}, max {pct(max(decode_devs))}]")
    if ttft_gaps:
        print(f"median TTFT - server prompt_ms: {statistics.median(ttft_gaps):+.1f} ms  "
              f"[min {min(ttft_gaps):+.1f}, max {max(ttft_gaps):+.1f}]")


def capacity_level(engine, request: ChatRequest, streams: int, window_s: float) -> Level:
    """One closed-loop level as ``llm-bench capacity`` runs it; every stream sends at least once in the window."""
    engine.stream(request)  # load the preset and warm it up; not counted
    settings = CapacitySettings(min_stream_tps=1.0, max_ttft_s=1.0, warmup_s=5.0, window_s=window_s,
                                min_window_requests=streams)
    level = new_level("closed", streams)
    closed_level(engine, PlanPrompt(request).level(), level, settings, Budget(1_000_000, 3600.0))
    return level


def report_capacity(streams: int, level: Level) -> None:
    window = [r for r in level.requests if r.counted]
    failed = [r for r in window if r.error]
    devs = [r.client_decode_tps / r.server_decode_tps - 1.0 for r in window
            if r.client_decode_tps and r.server_decode_tps]
    lags = [r.lag_ms for r in window if r.lag_ms is not None]
    load = " ".join(f"{v:.2f}" for v in os.getloadavg())
    print(f"\n== capacity closed loop, {streams} streams: {len(window)} window requests of {len(level.requests)} "
          f"(load average {load} on {os.cpu_count()} CPUs) ==")
    if failed:
        print(f"{len(failed)} failed, e.g. {failed[0].error}")
    if devs:
        within = sum(abs(d) <= 0.01 for d in devs)
        server = statistics.median(r.server_decode_tps for r in window if r.server_decode_tps)
        print(f"per-stream server decode: median {server:.1f} t/s")
        print(f"median decode deviation (client vs server): {pct(statistics.median(devs))}  "
              f"[min {pct(min(devs))}, max {pct(max(devs))}]; within 1 %: {within} of {len(devs)}")
    if lags:
        tail = tail_of(lags, 99)
        print(f"client lag: median {statistics.median(lags):.2f} ms, {tail.label} {tail.value:.2f} ms "
              f"(n={tail.samples}); 1 % of a 2 s TTFT objective is 20 ms")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=20, help="requests (1 stream) or batches (8 streams) per level")
    parser.add_argument("--max-tokens", type=int, default=512)
    parser.add_argument("--streams", default="1,8", help="stream counts, comma-separated")
    parser.add_argument("--server-threads", type=int, default=1,
                        help="llama-server threads (default 1: the client keeps a core of its own)")
    parser.add_argument("--capacity-streams", help="closed-loop stream counts (capacity's load), e.g. 64,128; "
                                                   "instead of --streams")
    parser.add_argument("--window-s", type=float, default=20.0, help="closed loop: seconds of window, at least")
    args = parser.parse_args()
    closed = bool(args.capacity_streams)
    levels = [int(s) for s in (args.capacity_streams or args.streams).split(",")]

    with tempfile.TemporaryDirectory(prefix="llm-bench-fidelity-") as tmp:
        folder = Path(tmp)
        model = write_tiny_model(folder / "tiny.gguf", TinyModelSpec(seed=1, name="tiny-fidelity"))
        slots = max(levels)
        presets = {f"x{n}": {"model": str(model), "parallel": n, "ctx-size": n * 2048,
                             "threads": args.server_threads} for n in levels}
        ini = folder / "presets.ini"
        ini.write_text(render_presets_ini(presets))
        with running_router(ensure_llama_server(), ini, log_path=folder / "router.log") as router:
            engine = open_engine("llama-cpp", router.url, timeout=300, streams=slots)
            try:
                for n in levels:
                    request = ChatRequest(f"x{n}", shipped_prompt("code"), args.max_tokens, 1.0, 42,
                                          prompt_cache=False)
                    if closed:
                        report_capacity(n, capacity_level(engine, request, n, args.window_s))
                    else:
                        report(n, measure(engine, request, n, args.runs))
            finally:
                engine.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
