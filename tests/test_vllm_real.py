"""llm-bench against the real vLLM 0.32 (its CPU build) serving SmolLM2: the paths the four-3090 rig takes,
proven on the server whose behaviour they read.

One server for the module (n-gram drafting spelled ``-sc``, compilation off spelled ``-O0``, a 2,048-token
context, an API key), shared by every test here but the kill test, which starts its own (a draft model spelled
``--spec-model``/``--spec-tokens``, and ``--enforce-eager``) and kills it mid-run. The other spellings of
speculation and of compilation off are checked against the real server's own argument parser instead of a
server each: CPU vLLM takes about 40 s to start, and what llm-bench reads is the command line.
"""

from __future__ import annotations

import json
import os
import subprocess
import threading
import time
import tomllib
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from llm_bench.diagnostics.acceptance import check_acceptance, check_acceptance_log, spec_log_lines
from llm_bench.diagnostics.settings import Checks
from llm_bench.diagnostics.vllm_evidence import (
    compilation_off,
    speculative_settings,
    vllm_command_lines,
    vllm_config,
)
from llm_bench.engines.client import OpenAIClient
from llm_bench.engines.logprobs import VllmLogprobs, teacher_force
from llm_bench.engines.metrics import SpecCounters, parse_prometheus, spec_counters
from llm_bench.engines.openai import OpenAIEngine
from llm_bench.gpu.nvml import Nvml
from llm_bench.plan import ApiKeySource, Plan, Protocol
from llm_bench.quality.divergence import compare
from llm_bench.results import AliasRecord, load_results
from llm_bench.runner import RunAborted, run_plan
from llm_bench.testbed.vllm_server import VllmProcess, start_vllm
from llm_bench.workloads import PARTS
from llm_bench.workloads.concurrency import level_of
from llm_bench.workloads.depth import DEPTH, point_of
from llm_bench.workloads.prefix_cache import hit_of
from llm_bench.workloads.quality import QUALITY
from llm_bench.workloads.session import SESSION
from tests.commands import invoke
from tests.fake_nvml import FakeNvml
from tests.short_session import write_short_session

KEY = "bed-key"
CONTEXT = 2048
NGRAM = '{"method":"ngram","num_speculative_tokens":3,"prompt_lookup_max":3,"prompt_lookup_min":1}'
# VLLM_LOG_STATS_INTERVAL: a SpecDecoding line every 2 s instead of 10, so that a short run logs several
SERVER_ENV = {"VLLM_API_KEY": KEY, "VLLM_LOG_STATS_INTERVAL": "2"}


@pytest.fixture(scope="module")
def vllm(vllm_python: Path, vllm_model: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[VllmProcess]:
    log = tmp_path_factory.mktemp("vllm") / "vllm.log"
    server = start_vllm(vllm_python, vllm_model, log_path=log, env=SERVER_ENV,
                        args=["-sc", NGRAM, "-O0", "--max-model-len", str(CONTEXT)])
    yield server
    server.stop()


@pytest.fixture
def key_env(monkeypatch: pytest.MonkeyPatch) -> str:
    monkeypatch.setenv("LLM_BENCH_TEST_KEY", KEY)
    return "LLM_BENCH_TEST_KEY"


def plan_for(server: VllmProcess, tmp_path: Path, key_env: str, protocol: Protocol) -> Plan:
    return Plan(url=server.url, engine="openai", output_dir=tmp_path, api_key=ApiKeySource(env=key_env),
                checks=Checks(log_file=server.log_path), protocol=protocol)


def test_the_api_key_guards_the_openai_routes_and_not_metrics_or_health(vllm: VllmProcess) -> None:
    assert httpx.get(f"{vllm.url}/v1/models").status_code == 401
    auth = {"Authorization": f"Bearer {KEY}"}
    [model] = httpx.get(f"{vllm.url}/v1/models", headers=auth).json()["data"]
    assert model["id"] == "smol" and model["max_model_len"] == CONTEXT
    assert httpx.post(f"{vllm.url}/v1/chat/completions", json={"model": "smol", "messages": []}).status_code == 401
    health = httpx.get(f"{vllm.url}/health")
    assert health.status_code == 200 and health.content == b""  # an empty 200, no JSON
    assert httpx.get(f"{vllm.url}/metrics").status_code == 200  # upstream vLLM leaves /metrics open


def test_what_the_server_says_of_itself_is_read_from_each_source(vllm: VllmProcess) -> None:
    """Its command line (/proc), its log's config line and /metrics each say n-gram, 3 tokens a round, the
    context and compilation off."""
    [line] = [line for line in vllm_command_lines() if f"--port {vllm.port}" in line]
    by_line = vllm_config([line])
    assert (by_line.speculation, by_line.drafts_from_context, by_line.context[0]) == ("ngram n=3", True, CONTEXT)
    assert by_line.eager and by_line.eager.startswith("-O0")
    by_log = vllm_config([], None, None, vllm.log())
    assert (by_log.speculation, by_log.context and by_log.context[0]) == ("ngram n=3", CONTEXT)
    assert by_log.eager and "compilation mode NONE" in by_log.eager
    metrics = httpx.get(f"{vllm.url}/metrics").text
    by_metrics = vllm_config([], None, metrics)
    assert by_metrics.speculation == "on n=3"  # /metrics names no method: one per-position counter per token
    assert by_metrics.prefix_caching_off is None  # vllm:cache_config_info{enable_prefix_caching="True"}
    assert 'enable_prefix_caching="True"' in metrics


def test_run_every_workload_records_speculation_context_acceptance_and_cache_hits(
        vllm: VllmProcess, tmp_path: Path, key_env: str) -> None:
    """standard, concurrency, prefix-cache, depth and session in one run: no workload fails; the records say
    n-gram and the context as the server does (defect 2), the prefix-cache prompt is cut to the context read
    from /v1/models (defect 1) and its hit comes from vLLM's counters; the acceptance per position agrees with
    /metrics; the SpecDecoding lines are weighed against the run's counters (defect 4)."""
    logs: list[str] = []
    session = write_short_session(tmp_path / "session.json", chars=150, tool_chars=300, tools=False)
    protocol = Protocol(runs=1, max_tokens=24, prompt="Count to five.", concurrency=(2,), prefix_max_tokens=4,
                        workloads=("standard", "concurrency", "prefix-cache", "depth", "session")).with_settings(
        DEPTH, {"depths": (0, 256)}).with_settings(SESSION, {"max_tokens": 8, "session_file": str(session)})
    plan = plan_for(vllm, tmp_path, key_env, protocol)
    metrics_before = spec_counters(parse_prometheus(httpx.get(f"{vllm.url}/metrics").text))
    path = run_plan(plan, logs.append, nvml=Nvml(FakeNvml())).path
    metrics_after = spec_counters(parse_prometheus(httpx.get(f"{vllm.url}/metrics").text))
    records = load_results(path, PARTS).aliases
    assert {r.workload for r in records} == {"standard", "concurrency", "prefix-cache", "depth", "session"}
    for record in records:
        assert not record.errors, (record.workload, record.errors, "\n".join(logs))
        assert (record.speculation, record.context) == ("ngram n=3", CONTEXT)
        assert any("max_model_len in /v1/models" in e for e in record.server_evidence)
    # defect 1: the 11,000-token default prompt, cut to the 2,048-token context the server reports
    [cached] = [r for r in records if r.workload == "prefix-cache"]
    hit = hit_of(cached)
    assert any(w.startswith("prefix-cache prompt cut from 11000") for w in cached.warnings), cached.warnings
    assert cached.runs[0].prompt_tokens <= CONTEXT - 4
    assert hit.cached_tokens and hit.evidence and hit.evidence.startswith("vllm:prefix_cache_hits_total grew by")
    assert hit.cached_tokens <= cached.runs[1].prompt_tokens
    [level] = [r for r in records if r.workload == "concurrency"]
    assert level_of(level).streams == 2 and len(level.runs) == 2
    assert sorted(p.tokens for p in (point_of(r) for r in records) if p is not None) == [0, 256]
    # acceptance per position: a record's counters are /metrics deltas, one position per drafted token
    drafting = [r for r in records if r.spec is not None and r.spec.drafts]
    assert drafting and all(len(r.spec.accepted_per_position) == 3 for r in drafting)
    total = metrics_after.minus(metrics_before)
    assert sum(r.spec.draft_tokens for r in drafting) <= total.draft_tokens  # the warm-ups draft too
    assert total.draft_tokens == 3 * total.drafts  # n-gram proposes 3 whenever it drafts
    for r in drafting:
        rates = r.spec.per_position_rates
        assert all(a >= b for a, b in zip(rates, rates[1:], strict=False))  # a later position needs the earlier
    # defect 4: the log's lines of the same span against the run's counters: they agree, or the finding says why
    accepted = sum(r.spec.accepted_tokens for r in drafting)
    lines = spec_log_lines(vllm.log())
    assert lines, "vLLM logged no SpecDecoding line"
    said = [w for r in records for w in r.warnings if "acceptance-log" in w]
    if accepted:
        assert not [w for w in said if "accepts none" in w]
        assert all("the counters are the run's figure" in w for w in said)
    # defect 2: the table and the HTML page show what the server said
    html = tmp_path / "report.html"
    result = invoke("report", str(path), "--html", str(html))
    assert result.exit_code == 0, result.output
    row = next(line for line in result.output.splitlines() if line.startswith("| smol |"))
    assert "| ngram n=3 |" in row and f"| {CONTEXT} |" in row, row
    assert "ngram n=3" in html.read_text()


def test_counters_and_log_lines_of_one_span_agree_or_say_why(vllm: VllmProcess) -> None:
    """vLLM's own two accounts of drafting, over one span of requests: the summed SpecDecoding lines logged
    after it, and the /metrics deltas. Their windows differ (a line sums one logging interval), so the check
    compares them only where they disagree about the trap, and says why."""
    engine = OpenAIEngine(vllm.url, timeout=120, api_key=KEY)
    try:
        mark = len(vllm.log())
        before = engine.spec_counters("smol")
        for _ in range(2):
            engine.chat({"model": "smol", "max_tokens": 32, "temperature": 0,
                         "messages": [{"role": "user", "content": "Repeat exactly: one two three four five six "
                                                                  "seven eight nine ten one two three four five six"}]})
        after = engine.spec_counters("smol")
    finally:
        engine.close()
    assert before is not None and after is not None
    span = after.minus(before)
    time.sleep(4.5)  # two logging intervals: the span's last one is logged
    lines = spec_log_lines(vllm.log()[mark:])
    assert lines and all(line.accepted is not None for line in lines)
    logged = SpecCounters(sum(line.drafted or 0 for line in lines), sum(line.accepted or 0 for line in lines))
    # nothing else was served meanwhile: the lines of the span add up to the counters of the span
    assert (logged.draft_tokens, logged.accepted_tokens) == (span.draft_tokens, span.accepted_tokens)
    assert check_acceptance_log(vllm.log()[mark:], "vllm.log", True, span) == []
    # the same lines against counters that say otherwise: an INFO naming both windows, never the trap
    [finding] = check_acceptance_log(vllm.log()[mark:], "vllm.log", True,
                                     SpecCounters(span.draft_tokens, 0.0, span.drafts))
    assert finding.severity == "info" and "logging interval" in finding.evidence
    assert "the counters are the run's figure" in finding.evidence


def test_the_quality_workload_runs_on_it(vllm: VllmProcess, tmp_path: Path, key_env: str) -> None:
    """Sized down (its checks are that every part runs against vLLM, not its figures): a recall probe that fits
    the context read from the server, teacher-forced distributions through prompt_logprobs, exact answers."""
    protocol = Protocol(runs=1, max_tokens=16, workloads=("quality",)).with_settings(QUALITY, {
        "recall_lengths": (1024, 8192), "recall_depths": (0.5,), "max_tokens": 16, "top_k": 5, "text_tokens": 16,
        "exact_items_per_kind": 1, "exact_difficulties": ("easy",)})
    logs: list[str] = []
    path = run_plan(plan_for(vllm, tmp_path, key_env, protocol), logs.append, nvml=Nvml(FakeNvml())).path
    [record] = load_results(path, PARTS).aliases
    assert not record.errors, (record.errors, "\n".join(logs))
    part = record.part
    assert part is not None and part.forced and not part.forced_error and part.exact_answers and part.recall
    # the 8,192-token probe does not fit the 2,048-token context the server reports: skipped, with the reason
    assert any(probe.skipped for probe in part.recall) and any(not probe.skipped for probe in part.recall)


def test_teacher_forced_prompt_logprobs(vllm: VllmProcess) -> None:
    """Every position's top-k from one prompt_logprobs request; the same model against itself diverges by 0."""
    with OpenAIClient(vllm.url, timeout=120, api_key=KEY) as client:
        source = VllmLogprobs(client)
        text = "The quick brown fox jumps over the lazy dog. " * 4
        ids = source.tokenize("smol", text)
        assert source.context_length("smol") == CONTEXT
        first = teacher_force(source, "smol", ids, first=1, k=5)
        again = teacher_force(source, "smol", ids, first=1, k=5)
    assert len(first.top) == len(ids) - 1 and all(len(top) >= 5 for top in first.top)
    same = compare(first.top, again.top, replicates=50)
    assert same.mean_kld.value == pytest.approx(0.0, abs=1e-6) and same.same_top.value == 1.0


def test_doctor_names_compilation_off_and_blames_no_dtype_for_n_gram(vllm: VllmProcess, key_env: str) -> None:
    """The doctor against the real server: -O0 is compilation off (ERROR), n-gram has no drafter whose dtype
    could be wrong (defect 3), and the log's quote keeps its first characters (defect 5)."""
    result = invoke("doctor", "--engine", "openai", "--url", vllm.url, "--api-key-env", key_env,
                    "--log-file", str(vllm.log_path), "--max-tokens", "16")
    assert "ERROR [vllm-eager] vLLM runs with compilation off (-O0" in result.output, result.output
    assert "[vllm-dtype]" not in result.output
    [line] = [line for line in vllm_command_lines() if f"--port {vllm.port}" in line]
    config = vllm_config([line])
    trapped = AliasRecord(alias="smol", engine="openai", spec=SpecCounters(45.0, 0.0, 15.0))
    [finding] = check_acceptance(trapped, config.drafts_from_context)
    assert "N-gram drafting" in finding.evidence and "dtype" not in finding.evidence + finding.fix
    for line in spec_log_lines(vllm.log()):
        assert line.text.startswith("(") and "pid=" in line.text.split(")")[0]  # vLLM's "(APIServer pid=N)"
    for said in result.output.splitlines():
        if "SpecDecoding metrics" in said:
            assert '"(APIServer pid=' in said or '"(EngineCore' in said, said


def test_soak_against_it(vllm: VllmProcess, key_env: str, tmp_path: Path) -> None:
    result = invoke("soak", "--engine", "openai", "--url", vllm.url, "--api-key-env", key_env, "--duration", "60",
                    "--max-requests", "4", "--max-tokens", "12", "--mix", "prose=1,code=1,json=1,concurrent=1",
                    "--burst", "2", "--output-dir", str(tmp_path))
    assert result.exit_code == 0, result.output
    [path] = tmp_path.glob("*.toml")
    data = tomllib.loads(path.read_text())
    assert data and "requests" in json.dumps(data)


# --- every spelling, checked against the real server's own argument parser ------------------------------------

# vLLM's parser, and what it makes of a command line: speculation (method, tokens) and compilation off, as
# vllm/config/vllm.py decides it (enforce_eager, -O0, mode NONE, cudagraph_mode NONE)
PARSE = """
import json, sys
from vllm.utils.argparse_utils import FlexibleArgumentParser
from vllm.entrypoints.launchers.cli_args import make_arg_parser
from vllm.engine.arg_utils import AsyncEngineArgs
parser = make_arg_parser(FlexibleArgumentParser())
out = []
for argv in json.loads(sys.argv[1]):
    try:
        a = AsyncEngineArgs.from_cli_args(parser.parse_args(argv))
    except (SystemExit, Exception) as e:
        out.append({"refused": repr(e)})
        continue
    spec = dict(a.speculative_config or {})
    for key, value in (("method", a.spec_method), ("model", a.spec_model), ("num_speculative_tokens", a.spec_tokens)):
        if value is not None:
            spec[key] = value
    cc = a.compilation_config
    mode, graphs = getattr(cc, "mode", None), getattr(cc, "cudagraph_mode", None)
    off = (a.enforce_eager or int(a.optimization_level) == 0 or (mode is not None and int(mode) == 0)
           or (graphs is not None and graphs.name == "NONE"))
    out.append({"spec": {k: str(v) for k, v in spec.items()} or None, "off": bool(off)})
print(json.dumps(out))
"""

SPELLINGS = [
    ["-sc", NGRAM], ["--speculative-config", '{"method": "mtp", "num_speculative_tokens": 2}'],
    ["--speculative_config", '{"method":"eagle3","model":"d","num_speculative_tokens":4}'],
    ["--spec-method", "ngram", "--spec-tokens", "2"], ["--spec-method", "mtp"], ["--spec_method", "suffix"],
    ["--spec-model", "org/drafter", "--spec-tokens", "5"], ["--speculative-config.method", "mtp"],
    ["-sc.method=ngram", "-sc.num_speculative_tokens", "4"], ["--speculative-config.num_speculative_tokens=3",
                                                            "--speculative-config.method=ngram"],
    ["-O0"], ["-O", "0"], ["-O=0"], ["--optimization-level", "0"], ["--optimization_level=0"], ["-O3"], ["-O1"],
    ["--enforce-eager"], ["--enforce_eager"], ["-cc.mode=none"], ["-cc.mode", "NONE"], ["-cc.mode=0"],
    ["--compilation-config.mode=none"], ["-cc.cudagraph_mode=NONE"], ["-cc", '{"mode": 0}'],
    ["-cc", '{"cudagraph_mode": "NONE"}'], ["--compilation-config", '{"mode": "VLLM_COMPILE"}'],
    ["-cc.cudagraph_mode=PIECEWISE"], ["--dtype", "half"], [],
]


def test_every_spelling_reads_as_the_real_parser_reads_it(vllm_python: Path, vllm_model: Path) -> None:
    """For each spelling of speculation and of compilation off vLLM 0.32 accepts: llm-bench's reading of the
    command line (as /proc gives it, joined by spaces) is what vLLM's own parser makes of it."""
    argvs = [["--model", str(vllm_model), *spelling] for spelling in SPELLINGS]
    done = subprocess.run([str(vllm_python), "-c", PARSE, json.dumps(argvs)], capture_output=True, text=True,
                          check=True, env={**os.environ, "HF_HUB_OFFLINE": "1"}, timeout=300)
    parsed = json.loads(done.stdout.strip().splitlines()[-1])
    for argv, real in zip(argvs, parsed, strict=True):
        assert "refused" not in real, (argv, real)
        line = "python -m vllm.entrypoints.openai.api_server " + " ".join(argv)
        ours = speculative_settings(line)
        assert (ours is not None) == (real["spec"] is not None), (argv, ours, real)
        if real["spec"] is not None:
            assert ours is not None
            for key in ("method", "num_speculative_tokens"):
                assert ours.get(key) == real["spec"].get(key), (argv, key, ours, real)
        assert (compilation_off(line) is not None) == real["off"], (argv, compilation_off(line), real)


# --- killed mid-run -------------------------------------------------------------------------------------------

def test_a_drafting_vllm_killed_mid_run_ends_it_clearly_and_keeps_the_finished_runs(
        vllm_python: Path, vllm_model: Path, tmp_path: Path) -> None:
    """Its own server, drafting with a draft model (SmolLM2 drafts for itself: CPU vLLM runs one), spelled with
    the shorthands --spec-model and --spec-tokens, and --enforce-eager: read as such (the method from the log's
    config line, which names what the command line leaves to vLLM), acceptance per position from /metrics,
    then killed while the standard workload runs: the run ends with a clear error, and the results file holds
    the runs finished before."""
    server = start_vllm(vllm_python, vllm_model, log_path=tmp_path / "killed.log",
                        args=["--spec-model", str(vllm_model), "--spec-tokens", "2", "--enforce-eager",
                              "--max-model-len", "512"])
    try:
        [line] = [line for line in vllm_command_lines() if f"--port {server.port}" in line]
        config = vllm_config([line], None, None, server.log())
        assert config.speculation == "draft_model n=2" and config.drafts_from_context is False
        assert config.eager and config.eager.startswith("--enforce-eager")
        assert vllm_config([line]).speculation == "on n=2"  # the command line alone names no method
        plan = Plan(url=server.url, engine="openai", output_dir=tmp_path / "out",
                    checks=Checks(log_file=server.log_path), protocol=Protocol(runs=50, max_tokens=24))
        outcome: dict[str, BaseException | None] = {}

        def run() -> None:
            try:
                run_plan(plan, lambda m: None, nvml=Nvml(FakeNvml()))
                outcome["error"] = None
            except BaseException as e:  # noqa: BLE001 - handed to the test's thread
                outcome["error"] = e

        thread = threading.Thread(target=run)
        thread.start()
        deadline = time.monotonic() + 120

        def answered() -> float:  # the warm-up and the runs vLLM has finished
            text = httpx.get(f"{server.url}/metrics").text
            return sum(s.value for s in parse_prometheus(text) if s.name == "vllm:request_success_total")

        while answered() < 3 and time.monotonic() < deadline:
            time.sleep(0.2)
        assert answered() >= 3
        drafted = spec_counters(parse_prometheus(httpx.get(f"{server.url}/metrics").text), "smol")
        assert drafted is not None and drafted.drafts and len(drafted.accepted_per_position) == 2
        assert drafted.accepted_tokens == sum(drafted.accepted_per_position)  # each accepted token has a position
        server.process.kill()  # the API server only: its engine goes with it
        thread.join(120)
    finally:
        server.stop()
    # The API server killed mid-stream breaks the stream (the alias ends with that error, and the run with it); killed
    # between two requests, the next finds no server (the run is aborted, naming its results file). Either way the
    # runs finished before are in the file, beside a clear error.
    error = outcome.get("error")
    assert error is None or (isinstance(error, RunAborted) and "results so far are in" in str(error)), error
    [path] = (tmp_path / "out").glob("*.toml")
    [record] = load_results(path, PARTS).aliases
    assert len(record.runs) >= 2 and record.errors, record
    assert any(word in record.errors[-1] for word in ("stream", "connect", "reach")), record.errors
    assert (record.speculation, record.context) == ("draft_model n=2", 512)
