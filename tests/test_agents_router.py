"""Depth, the replayed session and thinking models on a real llama-server router serving SmolLM2.

Every figure is checked against the server's own accounting: the ``print_timing`` lines each model
instance writes to the router's log (tokens it processed and its decode rate, per request), its cache
counters (``timings.cache_n``, ``usage.prompt_tokens_details.cached_tokens``), and, for thinking, the
reasoning budget the server enforces. The presets: the plain model (n_ctx 4096); the same under a
Qwen3-style template that opens a think block, with ``--reasoning-format deepseek`` and
``--reasoning-budget`` (the server splits reasoning from the answer for real); and under a template
that rewrites the start of every prompt (no turn can reuse the previous one's cache).
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from statistics import median

import pytest

from llm_bench.engines.client import OpenAIClient
from llm_bench.engines.logprobs import LlamaServerLogprobs
from llm_bench.plan import Plan, Protocol
from llm_bench.report import load_rows, markdown_table
from llm_bench.report.export import report_data, to_csv
from llm_bench.report.html import render_html
from llm_bench.results import AliasRecord, RunRecord, load_results
from llm_bench.runner import run_plan
from llm_bench.testbed.presets import render_presets_ini
from llm_bench.testbed.router import RouterProcess, start_router
from llm_bench.workloads import PARTS, workload
from llm_bench.workloads.depth import point_of
from llm_bench.workloads.session import result_of
from tests.short_session import write_short_session

FIXTURES = Path(__file__).parent / "fixtures"
BUDGET = 8  # --reasoning-budget: the server forces </think> after this many reasoning tokens
MAX_CONTEXT = 1200  # the session workload's max_context: the short session's fourth turn (~1,330 tokens) is beyond it


@pytest.fixture(scope="module")
def bed(llama_server_bin: Path, smollm2: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[RouterProcess]:
    folder = tmp_path_factory.mktemp("agents")
    think = resources.files("llm_bench") / "testbed" / "chatml-think.jinja"
    presets = {
        "*": {"ctx-size": 4096, "parallel": 1, "model": str(smollm2)},
        "smol-plain": {},
        "smol-think": {"jinja": True, "chat-template-file": str(think), "reasoning-format": "deepseek",
                       "reasoning-budget": BUDGET},
        "smol-rewrite": {"jinja": True, "chat-template-file": str(FIXTURES / "chatml-rewrites-history.jinja")},
    }
    ini = folder / "presets.ini"
    ini.write_text(render_presets_ini(presets))
    router = start_router(llama_server_bin, ini, log_path=folder / "router.log")
    yield router
    router.stop()


def measure(router: RouterProcess, out: Path, aliases: tuple[str, ...], engine: str = "llama-cpp",
            settings: dict[str, dict] | None = None, **protocol) -> tuple[Path, list[AliasRecord]]:
    """``settings``: workload name -> its [protocol.<workload>] table. A short prompt unless one is given: the
    shipped one's ~230 tokens, processed for every run and warm-up, were a sixth of this module's time here."""
    chosen = Protocol(**{"prompt": "Count to five.", **protocol})
    for name, table in (settings or {}).items():
        chosen = chosen.with_settings(workload(name), table)
    plan = Plan(url=router.url, aliases=aliases, label="agents", output_dir=out, engine=engine, protocol=chosen)
    path = run_plan(plan, lambda _message: None).path
    return path, load_results(path, PARTS).aliases


@dataclass(frozen=True)
class Printed:
    """One request as the model instance printed it (slot print_timing)."""

    prompt_ms: float
    prompt_n: int  # prompt tokens it processed (not taken from its cache)
    prompt_tps: float
    eval_n: int
    eval_tps: float


NUMBER = r"\s*([\d.]+)"
PROMPT_EVAL = re.compile(rf"prompt eval time ={NUMBER} ms /{NUMBER} tokens \({NUMBER} ms per token,{NUMBER} tokens per second\)")
EVAL = re.compile(rf"(?<!prompt )eval time ={NUMBER} ms /{NUMBER} tokens \({NUMBER} ms per token,{NUMBER} tokens per second\)")


def printed(router: RouterProcess) -> list[Printed]:
    """Each task's prompt line with the eval line that follows it; the router may write a line of its own
    between the two, so they are paired line by line rather than as adjacent lines."""
    found, prompt = [], None
    for line in router.log().splitlines():
        if m := PROMPT_EVAL.search(line):
            prompt = m.groups()
        elif (m := EVAL.search(line)) and prompt is not None:
            p_ms, p_n, _p_tok, p_tps = prompt
            _e_ms, e_n, _e_tok, e_tps = m.groups()
            found.append(Printed(float(p_ms), int(p_n), float(p_tps), int(e_n), float(e_tps)))
            prompt = None
    return found


def assert_printed(run: RunRecord, log: list[Printed], processed: int | None = None) -> None:
    """The run's decode rate, output tokens, processed prompt tokens and prompt rate are those the server
    printed, and its TTFT holds the server's time for the prompt."""
    processed = run.prompt_tokens - (run.cache_n or 0) if processed is None else processed
    same = [p for p in log if p.prompt_n == processed and p.eval_n == run.output_tokens
            and abs(p.eval_tps - run.decode_tps) < 0.01 and abs(p.prompt_tps - run.prompt_tps) < 0.01]
    assert same, (run, [p for p in log if p.prompt_n == processed])
    assert run.ttft_ms >= same[0].prompt_ms


# --- depth ---

@pytest.fixture(scope="module")
def depth_run(bed: RouterProcess, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[AliasRecord]]:
    return measure(bed, tmp_path_factory.mktemp("depth"), ("smol-plain",), workloads=("depth",), runs=2,
                   max_tokens=16, settings={"depth": {"depths": (0, 1500, 8192)}})


def test_decode_at_1500_tokens_of_depth_is_slower_by_the_servers_own_timings(bed, depth_run):
    _path, (d0, d1500, d8192) = depth_run
    assert [point_of(r).tokens for r in (d0, d1500, d8192)] == [0, 1500, 8192]
    log = printed(bed)
    for record in (d0, d1500):
        assert not record.errors and record.warnings == [], record.warnings
        assert len(record.runs) == 2
        for run in record.runs:
            assert run.cache_n == 0  # the server processed the whole prompt, by its own counter
            assert_printed(run, log)
    # the depth is tokens of filler by the server's count of the prompt
    added = d1500.runs[0].prompt_tokens - d0.runs[0].prompt_tokens
    assert abs(added - 1500) <= 20, added
    # Slower by the medians of the server's own rates, not by a fixed factor between single runs: on a noisy
    # 2-core machine two runs at one depth were seen 36 % apart (38 and 52 t/s), and the slowest depth-0 run
    # came within 0.89 of the fastest at 1,500 while the medians stood at 0.72.
    assert median(r.decode_tps for r in d1500.runs) < median(r.decode_tps for r in d0.runs)
    # beyond the model's context: skipped with the reason, nothing sent
    assert d8192.runs == [] and "context is 4096" in point_of(d8192).skipped


def test_depth_is_in_the_table_the_exports_and_the_html(depth_run):
    path, records = depth_run
    rows = load_rows([path])
    table = markdown_table(rows)
    assert "### Speed at context depth" in table and "| smol-plain | 1500 |" in table
    depth = report_data(rows)["depth"]
    assert [d["depth"] for d in depth] == [0, 1500, 8192]
    d0, d1500 = (median(r.decode_tps for r in record.runs) for record in records[:2])
    assert depth[0]["decode_vs_shallowest"] == 1.0
    assert depth[1]["decode_vs_shallowest"] == pytest.approx(d1500 / d0) and d1500 < d0
    assert depth[2]["decode_tps_median"] is None and "4096" in depth[2]["skipped"]
    csv_lines = to_csv(rows, table="depth").splitlines()
    assert csv_lines[0].startswith("configuration,depth,context_tokens,decode_tps_median") and len(csv_lines) == 4
    html = render_html([load_results(path, PARTS)], rows=rows)
    assert 'id="depth"' in html and 'id="depth-chart"' in html and 'aria-label="depth chart"' in html


def test_a_depth_list_that_fits_no_model_is_an_error_naming_the_setting(bed, tmp_path):
    _path, (record,) = measure(bed, tmp_path, ("smol-plain",), workloads=("depth",), runs=1, max_tokens=4,
                               settings={"depth": {"depths": (8192,)}})
    assert record.runs == []
    assert record.errors == ["no depth of [protocol.depth] depths = [8192] fits the model's context of 4096 tokens; "
                             "choose depths below it (--depths)"]


# --- session ---

@pytest.fixture(scope="module")
def session_run(bed: RouterProcess, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, AliasRecord]:
    """Four short turns (175 tokens by the server's count, then about 385 more each), the fourth beyond the
    context allowed: three turns replayed, with the cache and cold."""
    folder = tmp_path_factory.mktemp("session")
    session = write_short_session(folder / "session.json", turns=4)
    path, (record,) = measure(bed, folder, ("smol-plain",), workloads=("session",), temperature=0.0,
                              settings={"session": {"max_tokens": 8, "max_context": MAX_CONTEXT,
                                                    "session_file": str(session)}})
    return path, record


def test_with_the_cache_each_turn_reuses_the_previous_context_by_the_servers_counters(bed, session_run):
    _path, record = session_run
    result = result_of(record)
    assert not record.errors and record.warnings == [], record.warnings
    assert len(result.warm) == len(result.cold) == 3 and result.stopped and str(MAX_CONTEXT) in result.stopped
    log = printed(bed)
    for before, turn in zip(result.warm, result.warm[1:]):
        assert turn.prompt_tokens > before.prompt_tokens + 300  # each turn adds a tool result of 350+ tokens
        # the server's own count of tokens reused from its cache: (nearly) all of the previous turn's context
        assert turn.cache_n >= 0.9 * before.prompt_tokens and turn.reuse_flag is None
    for turn in result.warm + result.cold:
        assert turn.processed_tokens == turn.prompt_tokens - turn.cache_n
        assert_printed(turn, log, turn.processed_tokens)
        # TTFT, in ms, covers the server's own prompt time for the tokens it processed (its prompt_per_second)
        assert turn.ttft_ms >= 1000.0 * turn.processed_tokens / turn.prompt_tps - 1.0
    for turn in result.cold:
        assert turn.cache_n == 0  # cold: the whole context processed, by the server's counter
    # the same turns; each replay's mark at the start may take a token more or less
    assert all(abs(c.prompt_tokens - w.prompt_tokens) <= 4 for c, w in zip(result.cold, result.warm))
    # the cold last turn processed the whole context, the warm one only what its turn added (the server's counts:
    # 1,027 tokens against 468), so it waited longer for its first token. The times are two single requests
    # seconds apart (3.6 s and 1.8 s here): a busy machine that slows one more than the other changes their
    # ratio, so the factor is pinned on the token counts, the times in their order.
    assert result.cold[-1].processed_tokens > 2 * result.warm[-1].processed_tokens
    assert result.cold[-1].ttft_ms > result.warm[-1].ttft_ms


def test_the_session_summary_and_turns_are_in_the_tables_and_exports(session_run):
    path, record = session_run
    rows = load_rows([path])
    data = report_data(rows)
    (summary,) = data["session"]
    warm, cold = result_of(record).warm[-1], result_of(record).cold[-1]
    assert summary["last_ttft_ms_warm"] == warm.ttft_ms and summary["last_ttft_ms_cold"] == cold.ttft_ms
    assert summary["last_ttft_cold_over_warm"] == pytest.approx(cold.ttft_ms / warm.ttft_ms)
    assert summary["processed_tokens_cold"] == sum(t.prompt_tokens for t in result_of(record).cold)
    assert summary["flagged_turns"] == []
    assert len(data["session_turns"]) == len(result_of(record).warm)
    table = markdown_table(rows)
    assert "### Agent session (replayed with the prompt cache, and cold)" in table and "### Session turns" in table
    assert to_csv(rows, table="session_turns").count("\n") == len(result_of(record).warm) + 1


def test_a_template_that_rewrites_earlier_turns_is_flagged(bed, tmp_path):
    session = write_short_session(tmp_path / "session.json", tools=False)
    _path, (record,) = measure(bed, tmp_path, ("smol-rewrite",), workloads=("session",), temperature=0.0,
                               settings={"session": {"max_tokens": 4, "session_file": str(session)}})
    warm = result_of(record).warm
    assert len(warm) == 2 and warm[1].prompt_tokens > warm[0].prompt_tokens + 200
    for turn in warm[1:]:
        assert turn.cache_n < 0.1 * turn.prompt_tokens  # the server's counter: the prefix changed at the start
        assert "rewrote earlier turns" in turn.reuse_flag
    assert any(w.startswith("session: turn(s) 2") for w in record.warnings)


def test_the_openai_engine_replays_the_session_through_the_templates_tool_path(bed, tmp_path):
    # llama-server's own /v1 through the OpenAI engine (its cache counter: usage.prompt_tokens_details), on the
    # preset whose template renders the tools (SmolLM2's own renders none); the tool's result cut to 300 characters:
    # the tool definitions are what this template adds
    session = write_short_session(tmp_path / "session.json", tool_chars=300)
    _path, (record,) = measure(bed, tmp_path, ("smol-think",), engine="openai", workloads=("session",),
                               temperature=0.0, settings={"session": {"max_tokens": 8, "session_file": str(session)}})
    result = result_of(record)
    assert record.decode_source == "stream" and len(result.warm) == 2
    # the server's own count of the first turn's messages under the same template, without the tools
    first = json.loads(session.read_text())["messages"][:2]
    with OpenAIClient(bed.url, timeout=60) as client:
        templated = client.post_json("/apply-template", {"model": "smol-think", "messages": first})["prompt"]
        bare = LlamaServerLogprobs(client).tokenize("smol-think", templated)
    assert result.warm[0].prompt_tokens > len(bare) + 300  # the four tool definitions
    for before, turn in zip(result.warm, result.warm[1:]):
        assert turn.cache_n >= 0.9 * before.prompt_tokens and turn.reuse_flag is None
    # the OpenAI engine asks for cold prompts with a cache_salt, which llama-server does not know: it reuses
    # the previous turn anyway, and its counter says so
    assert result.cold[1].cache_n > 0
    assert any("cold replay the server still reused" in w for w in record.warnings)


# --- thinking ---

@pytest.fixture(scope="module")
def thinking_run(bed: RouterProcess, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[AliasRecord]]:
    return measure(bed, tmp_path_factory.mktemp("thinking"), ("smol-think", "smol-plain"), runs=2, max_tokens=24,
                   thinking="on")


def test_a_thinking_run_records_its_first_event_first_token_and_first_answer(thinking_run):
    _path, (think, _plain) = thinking_run
    assert think.thinking == "on" and not think.warnings
    for run in think.runs:
        # the server forces the end of thinking after BUDGET tokens: reasoning and then an answer, for real
        assert 1 <= run.reasoning_tokens <= BUDGET and run.reasoning_source == "deltas"
        assert run.first_event_ms <= run.ttft_ms < run.first_answer_ms
        # the reasoning took at least half of its tokens' worth of the server's own time per token
        per_token_ms = run.decode_ms / run.output_tokens
        assert run.first_answer_ms - run.ttft_ms >= 0.5 * (run.reasoning_tokens - 1) * per_token_ms


def test_thinking_on_that_the_server_ignores_is_reported(thinking_run):
    _path, (_think, plain) = thinking_run
    assert all(r.reasoning_tokens is None for r in plain.runs)
    assert any('thinking = "on" was asked (protocol setting thinking) but no answer carried any reasoning' in w
               for w in plain.warnings)


def test_the_table_shows_the_first_answer_and_the_thinking_setting(thinking_run):
    path, (think, _plain) = thinking_run
    rows = load_rows([path])
    table = markdown_table(rows)
    assert "| TTFT ms | First answer ms |" in table and "thinking = on (protocol)." in table
    main = {m["configuration"]: m for m in report_data(rows)["main"]}
    assert main["smol-think"]["first_answer_ms_median"] == think.summary("first_answer_ms").median
    assert load_results(path, PARTS).meta["protocol"]["thinking"] == "on"


def test_thinking_off_asks_the_template_not_to_think(bed, tmp_path):
    _path, (record,) = measure(bed, tmp_path, ("smol-think",), runs=1, max_tokens=12, thinking="off")
    assert record.thinking is None and record.warnings == []
    (run,) = record.runs
    assert run.reasoning_tokens is None and run.first_answer_ms == run.ttft_ms
