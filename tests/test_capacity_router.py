"""llm-bench capacity against a real llama-server router on 2 CPU cores.

SmolLM2 presets with 1, 2 and 4 slots (one server thread, so the client keeps a core of its own), a short
prompt and a request whose decode alone takes about 1.25 s: the number of tokens is measured on the bed itself,
from the server's own decode rate of one request alone, so the answer does not depend on the machine's speed (a
fixed 96 tokens let one slot carry two sessions on a machine 1.5 times as fast as this one). The objective (a
quarter of that rate per stream, p95 TTFT <= 1.2 s) holds while every stream has a slot (TTFT: the prompt,
~0.25 s) and breaks one stream later, when each request waits for a slot (TTFT: a whole request and its own
prompt, ~1.8 s or more). The TTFT objective also sets the client's allowed lag (1 %, 12 ms): a tighter
objective refuses levels whenever the shared machine makes the client late, which is why the request is
scaled to the objective and not the objective to the request. A run over the 2- and 1-slot presets shows the
larger answer for more slots, a second over the 2-slot one its stability; every request is checked against the
server's own timings and counters. A real SIGINT, a server killed partway, an objective nothing meets, one that
cannot be checked, and the open loop's seeded arrivals each get their own test.
"""

from __future__ import annotations

import json
import os
import random
import signal
import statistics
import subprocess
import sys
import tomllib
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from click.testing import CliRunner

from llm_bench.cli import main
from llm_bench.cli.exits import ABORTED, COULD_NOT_RUN, INTERRUPTED, OK
from llm_bench.engines.metrics import parse_prometheus
from llm_bench.support.poll import poll_until
from llm_bench.testbed.presets import render_presets_ini
from llm_bench.testbed.router import RouterProcess, start_router
from tests.commands import only_file
from tests.fake_vllm import FakeVllm, FakeVllmConfig

REPO = Path(__file__).resolve().parents[1]
MAX_TOKENS = 96
MAX_TTFT_S = 1.2
OBJECTIVE = ["--min-stream-tps", "10", "--max-ttft-s", str(MAX_TTFT_S)]
# A request's decode alone, a little over the TTFT objective: queued behind one, a request waits that long and then
# its own prompt (~0.25 s), so the queued TTFT clears the objective by at least the prompt's time on any machine.
REQUEST_S = 1.25
# Two window requests: at N = slots + 1 closed-loop streams, two consecutive requests wait for the next two slot
# releases, which together take a whole request's time, so one of them waits at least half a request on two busy
# slots (about REQUEST_S: one server thread decodes both) before its prompt: p95 TTFT (their max) breaks MAX_TTFT_S
# as surely as over four.
QUICK = ["--warmup-s", "1", "--window-s", "1", "--min-window-requests", "2"]
# Where the answer is not what is checked (an objective nothing meets, Ctrl-C, a server dying), short requests: a
# level then lasts its warm-up and window, and the requests in flight at its end are short too.
SHORT_TOKENS = 8
PROMPT = "Write a short story about a lighthouse keeper who finds a message in a bottle.\n"


def slot_presets(model: Path) -> str:
    presets: dict[str, dict] = {"*": {"model": str(model), "threads": 1, "metrics": True}}
    presets |= {f"p{slots}": {"parallel": slots, "ctx-size": 1024 * slots} for slots in (1, 2, 4)}
    return render_presets_ini(presets)


@pytest.fixture(scope="module")
def slots_bed(tmp_path_factory: pytest.TempPathFactory, llama_server_bin: Path, smollm2: Path) -> Iterator[tuple[RouterProcess, Path]]:
    folder = tmp_path_factory.mktemp("capacity")
    ini = folder / "presets.ini"
    ini.write_text(slot_presets(smollm2))
    (folder / "prompt.txt").write_text(PROMPT)
    router = start_router(llama_server_bin, ini, log_path=folder / "router.log")
    yield router, folder
    router.stop()


def capacity_args(url: str, folder: Path, out: Path, *extra: str, objective: list[str] = OBJECTIVE,
                  max_tokens: int = MAX_TOKENS) -> list[str]:
    return ["capacity", "--url", url, *objective, *QUICK, "--max-tokens", str(max_tokens),
            "--prompt-file", str(folder / "prompt.txt"), "--output-dir", str(out), *extra]


@pytest.fixture(scope="module")
def calibrated(slots_bed) -> tuple[int, list[str]]:
    """The bed's own speed, from the server's timings of one request alone on the 1-slot preset: the tokens of
    a REQUEST_S request, and the objective (a quarter of that decode rate per stream, TTFT <= MAX_TTFT_S)."""
    router, _ = slots_bed
    response = httpx.post(f"{router.url}/v1/completions", timeout=300, json={
        "model": "p1", "prompt": PROMPT, "max_tokens": MAX_TOKENS, "temperature": 0, "ignore_eos": True})
    assert response.status_code == 200, response.text
    timings = response.json()["timings"]
    assert timings["predicted_n"] == MAX_TOKENS, timings
    tps = timings["predicted_per_second"]
    tokens = max(32, min(1024, round(tps * REQUEST_S)))
    return tokens, ["--min-stream-tps", f"{tps / 4:.1f}", "--max-ttft-s", str(MAX_TTFT_S)]


def load(out: Path) -> dict:
    path = only_file(out, "*.toml")
    return tomllib.loads(path.read_text())


@pytest.fixture(scope="module")
def two_runs(slots_bed, calibrated) -> tuple[dict, dict, str, int]:
    """A search over p2 and p1, then over p2 again. The router holds one model: loading p1 evicted the first
    run's p2 and the second run loaded p2 afresh, still loaded after it (--no-unload), so its instance's
    /metrics counters cover exactly the second run's requests."""
    router, folder = slots_bed
    tokens, objective = calibrated
    results = []
    for n, aliases in ((1, "p2,p1"), (2, "p2")):
        # A level the client could not drive faithfully is refused (its lag over 1 % of the TTFT objective, 12 ms
        # here), which is the machine, not what these tests check: in two of three whole-suite runs one level's
        # p99 of 2 requests came out at 13-25 ms, while the module alone stays under it. Such a run is made
        # again, after p2 is unloaded so that its counters cover only the kept run's requests.
        for attempt in range(3):
            out = folder / f"run{n}-{attempt}"
            result = CliRunner().invoke(main, capacity_args(router.url, folder, out, "--alias", aliases, "--no-unload",
                                                            objective=objective, max_tokens=tokens))
            if result.exit_code == OK or "cannot drive that load faithfully" not in result.output:
                break
            httpx.post(f"{router.url}/models/unload", json={"model": "p2"}, timeout=60)
            poll_until(lambda: next((m["status"]["value"] == "unloaded" for m in
                                     httpx.get(f"{router.url}/models", timeout=30).json()["data"]
                                     if m["id"] == "p2"), False) or None, timeout=60, interval=0.05)
        assert result.exit_code == OK, result.output
        results.append(load(out))
    metrics = httpx.get(f"{router.url}/metrics", params={"model": "p2", "autoload": "false"}, timeout=30)
    assert metrics.status_code == 200, metrics.text
    return results[0], results[1], metrics.text, tokens


def carried(results: dict) -> dict[str, int]:
    return {a["alias"]: int(a["searches"][0].get("carried", 0)) for a in results["aliases"]}


def all_requests(alias: dict) -> list[dict]:
    return alias["probes"] + [r for s in alias["searches"] for lv in s["levels"] for r in lv["requests"]]


def test_more_slots_carry_more_sessions(two_runs):
    results = two_runs[0]
    n = carried(results)
    assert n["p1"] < n["p2"], n
    p1 = next(a for a in results["aliases"] if a["alias"] == "p1")
    assert p1["slots"] == 1 and n["p1"] == 1
    assert "2 break the TTFT objective" in p1["searches"][0]["answer"]
    assert "requests queued for a slot (2 streams on 1 slot)" in p1["searches"][0]["answer"]
    # the server itself said so: its requests_deferred gauge and its slots, all busy while one waited
    queued = next(lv for lv in p1["searches"][0]["levels"] if lv["level"] == 2)["slots"]
    assert queued["deferred_max"] >= 1 and queued["queued_samples"] > 0
    alone = next(lv for lv in p1["searches"][0]["levels"] if lv["level"] == 1)["slots"]
    assert alone.get("deferred_max", 0) == 0 and alone["queued_samples"] == 0


def test_answers_are_stable_within_one_step(two_runs):
    first, second = carried(two_runs[0]), carried(two_runs[1])
    assert list(second) == ["p2"] and abs(first["p2"] - second["p2"]) <= 1, (first, second)


def test_per_request_figures_are_the_servers_own(two_runs):
    _, second, metrics, tokens = two_runs
    p2 = next(a for a in second["aliases"] if a["alias"] == "p2")
    requests = all_requests(p2)
    assert all("error" not in r for r in requests)
    # every request the server served is in the file, once, with the server's own figures: the instance's
    # counters are the sums of the per-request timings
    counters = {s.name: s.value for s in parse_prometheus(metrics)}
    assert counters["llamacpp:tokens_predicted_total"] == sum(r["output_tokens"] for r in requests)
    assert counters["llamacpp:prompt_tokens_total"] == sum(r["prompt_tokens"] - r["cache_n"] for r in requests)
    decode_s = sum(r["decode_ms"] for r in requests) / 1000.0
    # the server prints the counter with three decimals
    assert counters["llamacpp:tokens_predicted_seconds_total"] == pytest.approx(decode_s, abs=5e-4 + 1e-5 * len(requests))
    for r in requests:
        assert r["output_tokens"] == tokens and r["finish_reason"] == "length"
        assert r["decode_tps"] == r["server_decode_tps"]  # llama.cpp: the server's timings.predicted_per_second
        assert r["decode_tps"] == pytest.approx((tokens - 1) / (r["decode_ms"] / 1000.0), rel=1e-6)
        assert r["ttft_ms"] >= r["prompt_ms"] and r["wait_ms"] == pytest.approx(r["ttft_ms"] - r["prompt_ms"])
        assert r["sent_s"] >= r["scheduled_s"] and r["lag_ms"] >= 0
    # the client's own clock agrees with the server's on the decode rate (median over the requests)
    deviations = [r["client_decode_tps"] / r["server_decode_tps"] - 1 for r in requests]
    assert abs(statistics.median(deviations)) < 0.01
    # closed loop: a stream's next request was due the moment its last one ended
    for level in p2["searches"][0]["levels"]:
        by_stream: dict[int, list[dict]] = {}
        for r in level["requests"]:
            by_stream.setdefault(r["stream"], []).append(r)
        for stream in by_stream.values():
            stream.sort(key=lambda r: r["scheduled_s"])
            for before, after in zip(stream, stream[1:]):
                assert after["scheduled_s"] == pytest.approx(before["ended_s"], abs=1e-9)
        window = [r for r in level["requests"] if r["phase"] == "window"]
        assert len(window) == level["counted"] >= 2
        assert max(r["lag_ms"] for r in window) == pytest.approx(level["lag_p99"])


def test_an_objective_no_level_meets_is_an_answer(slots_bed):
    router, folder = slots_bed
    out = folder / "none"
    result = CliRunner().invoke(main, capacity_args(router.url, folder, out, "--alias", "p2", "--min-stream-tps",
                                                    "100000", max_tokens=SHORT_TOKENS))
    assert result.exit_code == OK, result.output
    (search,) = load(out)["aliases"][0]["searches"]
    assert search["stopped_by"] == "none-meets" and "carried" not in search
    assert search["answer"].startswith("p2 does not carry even 1 concurrent session at >= 100000 t/s")
    assert "1 breaks the decode objective" in result.output


def test_open_loop_arrivals_are_seeded_poisson_and_the_search_stops_by_itself(slots_bed):
    router, folder = slots_bed
    out = folder / "open"
    # The arrivals are what is checked here, not where the objective breaks: a TTFT objective of 5 s allows the
    # client 50 ms of lag. At 1.2 s (12 ms) one request of two sent 25 ms late on a busy machine made the level
    # client-bound, and the search refused it.
    # A level lasts as long as its arrivals take: from 48 a minute, not 24, the search's 12 requests come in half
    # the time, and short requests keep even its fastest level within what two slots serve.
    result = CliRunner().invoke(main, capacity_args(
        router.url, folder, out, "--alias", "p2", "--loop", "open", "--start-rate-per-min", "48",
        "--rate-resolution", "0.5", "--max-requests", "12", "--arrival-seed", "7",
        objective=["--min-stream-tps", "10", "--max-ttft-s", "5"], max_tokens=SHORT_TOKENS))
    assert result.exit_code == OK, result.output
    (search,) = load(out)["aliases"][0]["searches"]
    assert search["loop"] == "open" and search["stopped_by"] in ("found", "max_requests", "none-meets"), search
    assert all(level.get("lag_p99", 0) <= 50 for level in search["levels"]), search  # none refused as client-bound
    assert search["levels"][0]["level"] == 48
    for level in search["levels"]:
        # the level's requests were due at the seeded Poisson arrivals, R per minute
        arrivals, due, rng = [], 0.0, random.Random(7)
        for _ in level["requests"]:
            due += rng.expovariate(1.0) * 60.0 / level["level"]
            arrivals.append(due)
        assert sorted(r["scheduled_s"] for r in level["requests"]) == pytest.approx(arrivals, abs=1e-6)
        if "goodput_per_min" in level:
            assert level["goodput_per_min"] <= level["throughput_per_min"]
    if search["stopped_by"] == "max_requests":
        assert "(--max-requests)" in search["answer"]


def wait_for_levels(out: Path, count: int, process: subprocess.Popen, timeout: float = 300) -> None:
    def saved() -> bool | None:
        if process.poll() is not None:
            raise AssertionError(f"capacity exited early ({process.returncode}): {process.stderr.read()}")
        for path in out.glob("*.toml"):
            try:
                data = tomllib.loads(path.read_text())
            except (tomllib.TOMLDecodeError, OSError):
                continue
            levels = [lv for a in data.get("aliases", []) for s in a["searches"] for lv in s["levels"]]
            if len(levels) >= count:
                return True
        return None

    assert poll_until(saved, timeout=timeout, interval=0.2), f"no {count} level(s) saved within {timeout} s"


def slots_idle(url: str, alias: str) -> bool:
    slots = httpx.get(f"{url}/slots", params={"model": alias, "autoload": "false"}, timeout=10).json()
    return not any(slot["is_processing"] for slot in slots)


def start_capacity(args: list[str]) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "llm_bench", *args], cwd=REPO, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, env={**os.environ})


def test_ctrl_c_keeps_every_level_measured(slots_bed):
    router, folder = slots_bed
    out = folder / "interrupted"
    process = start_capacity(capacity_args(router.url, folder, out, "--alias", "p4", "--window-s", "3",
                                           "--min-window-requests", "2", max_tokens=SHORT_TOKENS))
    wait_for_levels(out, 1, process)  # the first level is on disk; the second has just started
    process.send_signal(signal.SIGINT)
    _, err = process.communicate(timeout=60)
    assert process.returncode == INTERRUPTED, err
    assert "interrupted" in err and "Traceback" not in err
    # The requests Ctrl-C abandoned end on the server before the next test measures there; an instance still
    # answering one when the router stops held the stop for 10 s, until the router killed it.
    assert poll_until(lambda: slots_idle(router.url, "p4") or None, timeout=30, interval=0.05)
    data = load(out)
    assert data["meta"]["complete"] is False
    levels = data["aliases"][0]["searches"][0]["levels"]
    assert levels[0]["level"] == 1 and levels[0]["counted"] >= 2 and "cut_short" not in levels[0]
    if len(levels) > 1:  # the level Ctrl-C stopped: the requests that had ended, marked, not judged
        assert levels[1]["cut_short"] == "interrupted" and "meets" not in levels[1]
    assert data["aliases"][0]["searches"][0]["stopped_by"] == "interrupted"


def test_a_server_dying_partway_exits_3_with_every_level_kept(llama_server_bin, smollm2, tmp_path):
    ini = tmp_path / "presets.ini"
    ini.write_text(slot_presets(smollm2))
    (tmp_path / "prompt.txt").write_text(PROMPT)
    router = start_router(llama_server_bin, ini, log_path=tmp_path / "router.log")
    out = tmp_path / "out"
    try:
        process = start_capacity(capacity_args(router.url, tmp_path, out, "--alias", "p2", "--window-s", "3",
                                               "--min-window-requests", "2", max_tokens=SHORT_TOKENS))
        wait_for_levels(out, 1, process)
        # SIGTERM, then SIGKILL after 1 s: the router would wait 10 s for the busy instance to end its streams
        router.stop(timeout=1.0)
        _, err = process.communicate(timeout=120)
    finally:
        router.stop()
    assert process.returncode == ABORTED, err
    assert "the server went away" in err and "Traceback" not in err
    data = load(out)
    levels = data["aliases"][0]["searches"][0]["levels"]
    assert levels[0]["counted"] >= 2 and levels[0]["meets"] is True
    assert levels[-1]["cut_short"] == "server-gone" and any("error" in r for r in levels[-1]["requests"])
    assert data["aliases"][0]["searches"][0]["stopped_by"] == "server-gone"


def test_an_objective_the_server_cannot_show_is_refused_before_measuring(tmp_path):
    with FakeVllm(FakeVllmConfig(usage=False)) as vllm:
        result = CliRunner().invoke(main, ["capacity", "--engine", "openai", "--url", vllm.url, *OBJECTIVE,
                                           "--output-dir", str(tmp_path), "--max-tokens", "8"])
        calls = vllm.state.chat_calls
    assert result.exit_code == COULD_NOT_RUN, result.output
    assert "no usage.completion_tokens" in result.output and "nothing was measured" in result.output
    assert calls == 2 and not list(tmp_path.glob("*.toml"))  # the probe only


# --- prompts from a session's turns (--session-file): each stream an agent, its context growing turn by turn ---

# The bed's presets use SmolLM2's own chat template, which renders no tools: the session is an agent's without
# tool calls (the turns' growing context is what matters here).
AGENT_SESSION = {"messages": [
    {"role": "system", "content": "You are a coding agent. Read the code you are shown before you answer."},
    {"role": "user", "content": "Why does parse_config() crash on an empty file?\n\ndef parse_config(text):\n"
                                "    first = text.splitlines()[0]\n    return dict(l.split('=', 1) for l in text.splitlines())"},
    {"role": "assistant", "content": "splitlines() of an empty file is [], so [0] raises IndexError."},
    {"role": "user", "content": "Good. Now write the fix, please."},
    {"role": "assistant", "content": "def parse_config(text):\n    lines = text.splitlines()\n    if not lines:\n"
                                     "        return {}\n    return dict(l.split('=', 1) for l in lines)"},
    {"role": "user", "content": "And a pytest test for the empty file."},
]}


def test_session_prompts_replay_the_turns_with_the_servers_own_counts(slots_bed):
    router, folder = slots_bed
    session_file = folder / "agent-session.json"
    session_file.write_text(json.dumps(AGENT_SESSION))
    out = folder / "session"
    # an objective both levels meet (the turns are what is checked here, not the answer), and a client lag allowance
    # (1 % of 5 s) that a busy 2-core machine keeps; four window requests, so that each stream replays whole
    # conversations (docs/capacity.md's example)
    result = CliRunner().invoke(main, ["capacity", "--url", router.url, "--min-stream-tps", "1", "--max-ttft-s", "5",
                                       *QUICK, "--min-window-requests", "4", "--alias", "p2", "--max-streams", "2",
                                       "--max-tokens", "8", "--prompt-cache",
                                       "--session-file", str(session_file), "--output-dir", str(out)])
    assert result.exit_code == OK, result.output
    assert "3 of its 3 turns per conversation" in result.output
    data = load(out)
    assert data["meta"]["capacity"]["session_file"] == str(session_file)
    assert [p["turn"] for p in data["aliases"][0]["probes"]] == [1, 1]  # the probe sends the first turn
    levels = data["aliases"][0]["searches"][0]["levels"]
    assert [lv["level"] for lv in levels] == [1, 2]
    growth: set[tuple[int, int]] = set()
    for level in levels:
        by_stream: dict[int, list[dict]] = {}
        for r in level["requests"]:
            assert "error" not in r
            by_stream.setdefault(r["stream"], []).append(r)
        assert len(by_stream) == level["level"]
        for requests in by_stream.values():
            requests.sort(key=lambda r: r["scheduled_s"])
            # each stream is one agent at a time: turns 1, 2, 3, then a new conversation from turn 1
            assert [r["turn"] for r in requests] == [i % 3 + 1 for i in range(len(requests))]
            conversations = [requests[i:i + 3] for i in range(0, len(requests) - 2, 3)]
            assert conversations, requests
            for turns in conversations:
                # the server's own prompt count grows by what each turn adds (the recorded answer and the tool's
                # result, then the user's next message): the same in every conversation, whatever its mark
                tokens = [r["prompt_tokens"] for r in turns]
                growth.add((tokens[1] - tokens[0], tokens[2] - tokens[1]))
                # with the prompt cache on, a turn reuses the previous turn's context; a new conversation does not
                assert turns[0]["cache_n"] < tokens[0] // 2
                for before, after in zip(turns, turns[1:]):
                    assert after["cache_n"] >= 0.9 * before["prompt_tokens"], (before, after)
                    assert after["cache_n"] + 1 < after["prompt_tokens"]  # the added messages were processed
    (added,) = growth
    assert all(n > 10 for n in added), added
