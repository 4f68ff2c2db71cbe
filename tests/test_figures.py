"""Every figure pinned to an independent truth, without a llama-server (tests/test_figures_router.py pins
them against the real router's own accounting).

The timed figures are checked against a raw-socket server (tests/scripted_server.py) that sends the
response head and each token at moments it notes itself, so a test knows what TTFT, cold load and the
client's decode rate must be: send to first content token, in milliseconds (cold load in seconds), not
from the response head, not from a role-only chunk. The statistics are checked on asymmetric data whose
answers are worked out by hand below (a mean, a low or high median, a shifted order statistic all give
another number).
"""

from __future__ import annotations

import tomllib
from pathlib import Path

import pytest

from llm_bench.engines.llama_cpp import LlamaCppEngine
from llm_bench.engines.stream import ChatRequest
from llm_bench.gpu.nvml import Nvml
from llm_bench.plan import Plan, Protocol
from llm_bench.report import markdown_table
from llm_bench.report.rows import Row, rows_of, speedup
from llm_bench.report.table import main_table
from llm_bench.results import (
    AliasRecord,
    ResultSet,
    ResultsWriter,
    RunRecord,
    Summary,
    load_results,
)
from llm_bench.runner import RunAborted, measure_alias, run_plan
from llm_bench.support.stats import median_interval, min_samples, percentile, relative_precision, tail_of
from llm_bench.workloads import PARTS
from llm_bench.workloads.categories import CATEGORIES
from llm_bench.workloads.common import run_record, spec_from_runs
from llm_bench.workloads.concurrency import ConcurrencyLevel
from llm_bench.workloads.standard import standard
from tests.commands import only_file
from tests.fake_nvml import FakeNvml
from tests.scripted_server import DONE, Reply, delta, event, scripted_server, stream_reply

REQUEST = ChatRequest("m", "hi", 8, 1.0, 42, prompt_cache=False)
# Scheduling on a busy two-core machine: how much later than the truth a client may read a moment.
LATE_S = 0.3
ROUTER_API = {"/models": {"data": [{"id": "m", "status": {"value": "unloaded"}}]}, "/props": {},
              "/v1/models": {"data": [{"id": "m"}]}}


def kept_by(workload, *args) -> list[AliasRecord]:
    """The records a workload function keeps, in order."""
    kept: list[AliasRecord] = []
    workload(*args, kept.append)
    return kept


def timings(**values) -> dict:
    return {"prompt_n": 10, "prompt_ms": 20.0, "prompt_per_second": 500.0, "predicted_n": 4,
            "predicted_ms": 40.5, "predicted_per_second": 123.4, "cache_n": 0, **values}


def one_stream(reply: Reply):
    """The reply read by the llama.cpp engine; the run record and what the server did."""
    with scripted_server([reply]) as server:
        engine = LlamaCppEngine(server.url, timeout=10)
        try:
            m = engine.stream(REQUEST)
        finally:
            engine.close()
    return run_record(m, engine), server.chats[0], m


def after(exchange, piece: int, since: float | None = None) -> float:
    """Seconds from the request's arrival (or ``since``) until the server sent piece ``piece``."""
    return exchange.sent_at[piece] - (exchange.read_at if since is None else since)


# --- TTFT, decode rates, token counts: one stream -------------------------------------------------

def test_ttft_is_send_to_first_content_token_in_milliseconds():
    # head and a role-only chunk at 250 ms, the first content token at 800 ms: TTFT is the latter, in ms; the
    # later chunks come more than LATE_S after it, so TTFT taken to any of them fails the bounds below
    reply = stream_reply([0.8, 1.2, 1.6], tokens=[1, 1, 2], head_at=0.25, role_at=0.25, timings=timings())
    run, exchange, _ = one_stream(reply)
    truth_ms = after(exchange, 1) * 1000.0
    assert truth_ms >= 800.0
    assert truth_ms <= run.ttft_ms <= truth_ms + LATE_S * 1000.0
    # the head and a role-only chunk left at least 250 ms before the token (550 ms less the server thread's
    # own lateness, up to LATE_S, in waking for them): neither starts nor ends TTFT
    assert exchange.sent_at[1] - exchange.head_sent_at >= 0.25 and exchange.sent_at[1] - exchange.sent_at[0] >= 0.25


def test_decode_rate_is_the_servers_and_the_clients_is_tokens_after_the_first_over_the_chunk_span():
    # chunks 400 ms apart, more than LATE_S: a chunk stamped with its neighbour's arrival fails the bounds below
    reply = stream_reply([0.1, 0.5, 0.9], tokens=[1, 1, 2], timings=timings(predicted_per_second=123.4))
    run, exchange, m = one_stream(reply)
    assert run.decode_tps == 123.4 and run.server_decode_tps == 123.4  # the server's own figure, as sent
    assert run.decode_ms == 40.5 and run.prompt_tps == 500.0
    # the first and last chunk are stamped when they arrived: after the server sent each, at most LATE_S later
    # (bounds on each stamp, not on the span: a late read of the first chunk alone shortens the span)
    assert exchange.sent_at[0] <= m.first_token_at <= exchange.sent_at[0] + LATE_S
    assert exchange.sent_at[2] <= m.last_token_at <= exchange.sent_at[2] + LATE_S
    # usage says 4 tokens in 3 chunks: (4 - 1) tokens over the span between the first and last chunk
    # (chunks: 2 / span; all tokens: 4 / span)
    assert run.client_decode_tps == pytest.approx(3 / (m.last_token_at - m.first_token_at))
    assert (run.output_tokens, run.token_chunks, run.finish_reason) == (4, 3, "length")


def test_wall_time_is_send_to_the_end_of_the_stream():
    run, exchange, _ = one_stream(stream_reply([0.05, 0.6], timings=timings()))
    assert after(exchange, -1) <= run.wall_s <= after(exchange, -1) + LATE_S


def test_prompt_tokens_and_cache_from_timings_without_usage():
    # llama.cpp's timings alone: prompt tokens are the processed ones plus the reused ones
    t = timings(prompt_n=3, cache_n=7, predicted_n=2)
    reply = Reply([(0.0, delta("a")), (0.0, delta("b", finish="length", timings=t)), (0.0, DONE)])
    run, _, _ = one_stream(reply)
    assert (run.prompt_tokens, run.cache_n, run.output_tokens) == (10, 7, 2)


def test_cache_from_usage_details_where_the_server_has_no_timings():
    usage = {"prompt_tokens": 12, "completion_tokens": 2, "prompt_tokens_details": {"cached_tokens": 5}}
    reply = Reply([(0.0, delta("a")), (0.0, delta("b", finish="length")),
                   (0.0, event({"choices": [], "usage": usage})), (0.0, DONE)])
    run, _, _ = one_stream(reply)
    assert (run.prompt_tokens, run.cache_n, run.output_tokens) == (12, 5, 2)
    assert run.decode_tps is None  # no server figure: absent, never the client's under the server's name


# --- Cold load: the runner against a raw socket ----------------------------------------------------

def test_cold_load_is_send_to_the_warm_ups_first_token_in_seconds(tmp_path):
    warm_up = stream_reply([0.6, 0.65], head_at=0.35, role_at=0.35, timings=timings())
    run = stream_reply([0.05, 0.1], timings=timings())
    with scripted_server([warm_up, run], gets=ROUTER_API) as server:
        engine = LlamaCppEngine(server.url, timeout=10)
        try:
            (record,) = kept_by(measure_alias, engine, "m", Protocol(runs=1, max_tokens=8, unload_after=False),
                                Nvml(FakeNvml()), lambda message: None)
        finally:
            engine.close()
    exchange = server.chats[0]
    assert record.errors == []
    truth = after(exchange, 1)
    assert truth >= 0.6
    assert truth <= record.cold_load_s <= truth + LATE_S
    assert record.runs[0].ttft_ms < truth * 1000.0  # the measured run is not the warm-up


# --- A workload's records, the results file and its summaries ----------------------------------------

def asymmetric_replies() -> list[Reply]:
    """Three runs: first tokens at 100, 150 and 800 ms (median 150, mean 350); the server's decode
    rates 10, 11 and 30 t/s (median 11, mean 17); drafted 10/30/0, accepted 1/27/0; 0/6/0 cached;
    prompts of 40, 41 and 50 tokens (median 41, mean 43.7)."""
    shape = [(0.10, 10.0, 10, 1, 0, 40), (0.15, 11.0, 30, 27, 6, 41), (0.80, 30.0, 0, 0, 0, 50)]
    replies = []
    for first, tps, drafted, accepted, cached, prompt in shape:
        t = timings(predicted_per_second=tps, cache_n=cached)
        if drafted:
            t.update(draft_n=drafted, draft_n_accepted=accepted)
        replies.append(stream_reply([first, first + 0.05, first + 0.1], tokens=[1, 2, 1], timings=t,
                                    usage={"prompt_tokens": prompt, "completion_tokens": 4}))
    return replies


@pytest.fixture(scope="module")
def measured(tmp_path_factory):
    """The standard workload over the three asymmetric runs, written to a results file."""
    with scripted_server(asymmetric_replies()) as server:
        engine = LlamaCppEngine(server.url, timeout=10)
        try:
            (record,) = kept_by(standard, engine, "m", Protocol(runs=3, max_tokens=4), AliasRecord(alias="m"),
                                 lambda message: None)
        finally:
            engine.close()
    writer = ResultsWriter(tmp_path_factory.mktemp("results"), ResultSet({"format": "llm-bench/1"}), "t")
    writer.add(record)
    return record, server.chats, writer.path


def test_each_run_is_what_its_request_measured(measured):
    record, chats, _ = measured
    assert len(record.runs) == len(chats) == 3
    for run, exchange, tps, cached, prompt in zip(record.runs, chats, (10.0, 11.0, 30.0), (0, 6, 0), (40, 41, 50)):
        truth_ms = after(exchange, 0) * 1000.0
        assert truth_ms <= run.ttft_ms <= truth_ms + LATE_S * 1000.0
        assert run.decode_tps == tps
        assert run.cache_n == cached  # the server's own count, per run
        assert (run.prompt_tokens, run.output_tokens) == (prompt, 4)
        # what was asked: a cold prompt, max_tokens really generated
        assert exchange.body["cache_prompt"] is False and exchange.body["ignore_eos"] is True
        assert exchange.body["max_tokens"] == 4 and exchange.body["stream"] is True


def test_the_file_holds_medians_min_max_and_summed_acceptance(measured):
    record, chats, path = measured
    (saved,) = tomllib.loads(path.read_text())["aliases"]
    assert (saved["decode_tps_median"], saved["decode_tps_min"], saved["decode_tps_max"]) == (11.0, 10.0, 30.0)
    ttfts = sorted(run.ttft_ms for run in record.runs)
    assert (saved["ttft_ms_median"], saved["ttft_ms_min"], saved["ttft_ms_max"]) == (ttfts[1], ttfts[0], ttfts[2])
    assert after(chats[1], 0) * 1000.0 <= saved["ttft_ms_median"] <= (after(chats[1], 0) + LATE_S) * 1000.0
    # acceptance is summed over the runs: (1 + 27) / (10 + 30), not the mean of 0.1 and 0.9
    assert saved["draft_acceptance"] == pytest.approx(0.7)
    assert (saved["draft_n"], saved["draft_n_accepted"]) == (40, 28)
    assert [r["cache_n"] for r in saved["runs"]] == [0, 6, 0]
    assert [r["decode_tps"] for r in saved["runs"]] == [10.0, 11.0, 30.0]
    assert [r["ttft_ms"] for r in saved["runs"]] == [run.ttft_ms for run in record.runs]
    assert (saved["prompt_tokens"], saved["output_tokens"]) == (41, 4)  # medians
    assert saved["warnings"] == [] and saved["comparable"] is True  # 6 of 41 prompt tokens reused is no cache hit


def test_a_run_that_timed_a_cache_hit_says_so():
    # the server reused 30 of the 40 prompt tokens although cold prompts were asked for
    hit = stream_reply([0.0, 0.0], timings=timings(cache_n=30), usage={"prompt_tokens": 40, "completion_tokens": 2})
    with scripted_server([hit]) as server:
        engine = LlamaCppEngine(server.url, timeout=10)
        try:
            (record,) = kept_by(standard, engine, "m", Protocol(runs=1, max_tokens=2), AliasRecord(alias="m"),
                                 lambda message: None)
        finally:
            engine.close()
    assert record.runs[0].cache_n == 30
    (warning,) = record.warnings
    assert "reused up to 30 of 40 prompt tokens" in warning


def test_the_file_reads_back_as_measured(measured):
    record, _, path = measured
    (loaded,) = load_results(path, PARTS).aliases
    assert loaded.runs == record.runs
    assert loaded.spec.acceptance_rate == pytest.approx(0.7)
    assert loaded.summary("decode_tps") == Summary(11.0, 10.0, 30.0)


def test_acceptance_is_accepted_over_drafted_summed():
    runs = [RunRecord(draft_n=10, draft_n_accepted=1), RunRecord(draft_n=30, draft_n_accepted=27),
            RunRecord(draft_n=None, draft_n_accepted=None)]
    spec = spec_from_runs(runs)
    assert (spec.draft_tokens, spec.accepted_tokens) == (40.0, 28.0)
    assert spec.acceptance_rate == pytest.approx(28 / 40)
    assert spec_from_runs([RunRecord(decode_tps=1.0)]) is None  # nothing drafted: no acceptance at all


def test_a_run_that_stops_before_max_tokens_is_not_comparable():
    early = Reply([(0.0, delta("a")), (0.0, delta("b", finish="stop", timings=timings(predicted_n=2))),
                   (0.0, event({"choices": [], "usage": {"prompt_tokens": 9, "completion_tokens": 2}})), (0.0, DONE)])
    with scripted_server([early]) as server:
        engine = LlamaCppEngine(server.url, timeout=10)
        try:
            (record,) = kept_by(standard, engine, "m", Protocol(runs=1, max_tokens=4), AliasRecord(alias="m"),
                                 lambda message: None)
        finally:
            engine.close()
    assert record.comparable is False
    assert record.not_comparable_reason.startswith("a run stopped on 'stop' after 2 tokens instead of generating all 4")


# --- Adaptive run counts: the stopping rule on known decode rates ------------------------------------

def zero_delay(tps: float) -> Reply:
    return stream_reply([0.0, 0.0], timings=timings(predicted_per_second=tps))


def adaptive(rates: list[float]) -> tuple[AliasRecord, int]:
    """The standard workload with ``precision = 0.02``, ``runs = 3``, ``max_runs = 10``."""
    protocol = Protocol(runs=3, max_tokens=4, precision=0.02, max_runs=10)
    with scripted_server([zero_delay(r) for r in rates]) as server:
        engine = LlamaCppEngine(server.url, timeout=10)
        try:
            (record,) = kept_by(standard, engine, "m", protocol, AliasRecord(alias="m"), lambda message: None)
        finally:
            engine.close()
    return record, len(server.chats)


def test_precision_is_reached_at_the_ninth_run_when_the_interval_drops_the_outlier():
    # Up to 8 runs the 95 % interval spans all of them, outlier included; from 9 on it is [x(2), x(8)]:
    # sorted 9.9 9.95 9.98 10.0 10.01 10.02 10.05 10.1 30 -> [9.95, 10.1], median 10.01: +-0.75 %
    rates = [10.0, 30.0, 10.1, 9.9, 10.05, 9.95, 10.02, 9.98, 10.01, 10.0, 10.0]
    record, requests = adaptive(rates)
    assert requests == len(record.runs) == 9
    assert record.stopped_by == "precision" and record.precision_target == 0.02
    assert record.precision_reached == pytest.approx(0.075 / 10.01)


def test_the_cap_stops_an_imprecise_alias_with_the_precision_it_reached():
    # 10 runs: sorted 10 x5, 12, 30 x4; interval [x(2), x(9)] = [10, 30]; median 11: +-10/11
    rates = [10.0, 30.0, 10.0, 30.0, 10.0, 30.0, 10.0, 30.0, 10.0, 12.0, 10.0]
    record, requests = adaptive(rates)
    assert requests == len(record.runs) == 10
    assert record.stopped_by == "max_runs"
    assert record.precision_reached == pytest.approx(10.0 / 11.0)


# --- The runner keeps what was measured -----------------------------------------------------------------

def plan(url: str, tmp_path: Path, runs: int = 3) -> Plan:
    return Plan(url=url, engine="openai", aliases=("m",), output_dir=tmp_path,
                protocol=Protocol(runs=runs, max_tokens=4))


def test_a_failed_run_keeps_the_finished_runs_in_the_file(tmp_path):
    replies = [zero_delay(1.0)] + [stream_reply([0.0, 0.1], tokens=[1, 2], timings=timings())] * 2
    failed = Reply(status=500, body={"error": {"message": "engine fell over"}})
    with scripted_server(replies + [failed], gets=ROUTER_API) as server:
        writer = run_plan(plan(server.url, tmp_path), lambda message: None, nvml=Nvml(FakeNvml()))
    (record,) = load_results(writer.path, PARTS).aliases
    # the two runs, 3 tokens each by the server's usage (the warm-up had 2), with their decode rates (the rate's
    # arithmetic is pinned above; a 100 ms span read by two threads is too short to pin it here)
    assert [r.output_tokens for r in record.runs] == [3, 3]
    assert all(r.client_decode_tps > 0 for r in record.runs)
    assert any("run 3 of 3 failed (2 finished)" in e and "engine fell over" in e for e in record.errors)


def test_a_server_that_goes_away_keeps_the_finished_runs_in_the_file(tmp_path):
    with scripted_server([zero_delay(1.0)] * 4, gets=ROUTER_API) as server:
        def log(message: str) -> None:
            if message.startswith("  Run 2/"):
                server.close()

        with pytest.raises(RunAborted, match="results so far are in"):
            run_plan(plan(server.url, tmp_path), log, nvml=Nvml(FakeNvml()))
    path = only_file(tmp_path, "*.toml")
    saved = load_results(path, PARTS)
    assert saved.meta["complete"] is False
    assert [len(a.runs) for a in saved.aliases if a.alias == "m" and a.runs] == [2]



def test_each_record_is_in_the_file_as_soon_as_it_finishes(tmp_path):
    """The standard record is on disk before the next workload sends anything: a crash of llm-bench
    itself (not a server error it records) would still leave it."""
    seen: list[list[int]] = []
    with scripted_server([zero_delay(1.0)] * 8, gets=ROUTER_API) as server:
        def log(message: str) -> None:
            if message.startswith("  category prose"):
                path = only_file(tmp_path, "*.toml")
                seen.append([len(a.runs) for a in load_results(path, PARTS).aliases])

        protocol = Protocol(runs=2, max_tokens=4, workloads=("standard", "categories")).with_settings(
            CATEGORIES, {"names": ("prose",)})
        run_plan(Plan(url=server.url, engine="openai", aliases=("m",), output_dir=tmp_path, protocol=protocol),
                 log, nvml=Nvml(FakeNvml()))
    assert seen == [[2]]

# --- Statistics, worked out by hand -----------------------------------------------------------------------

def test_summary_is_the_median_with_min_and_max():
    assert Summary.of([10.0, 11.0, 30.0]) == Summary(11.0, 10.0, 30.0)  # the mean would be 17
    assert Summary.of([1.0, 2.0, 3.0, 10.0]) == Summary(2.5, 1.0, 10.0)  # even count: the middle two's mean
    assert Summary.of([None, 4.0, None]) == Summary(4.0, 4.0, 4.0)  # a missing figure is not a sample
    assert Summary.of([None]) is None


def test_percentile_interpolates_between_closest_ranks():
    ten = [1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0, 9.0, 100.0]
    # rank 0.9 * 9 = 8.1: 9 + 0.1 * (100 - 9)
    assert percentile(ten, 90) == pytest.approx(18.1)
    assert percentile(ten, 50) == pytest.approx(5.5)
    assert percentile([10.0, 20.0, 40.0], 25) == pytest.approx(15.0)  # rank 0.5: halfway from 10 to 20


def test_a_tail_percentile_needs_samples_above_it():
    assert (min_samples(50), min_samples(90), min_samples(95), min_samples(99)) == (1, 10, 20, 100)
    nine = [1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0, 100.0]
    assert tail_of(nine, 90) == tail_of(nine, 99)
    assert (tail_of(nine, 90).label, tail_of(nine, 90).value, tail_of(nine, 90).samples) == ("max", 100.0, 9)
    ten = nine[:8] + [9.0, 100.0]
    p90 = tail_of(ten, 90)
    assert (p90.label, p90.samples) == ("p90", 10) and p90.value == pytest.approx(18.1)
    assert tail_of(ten, 99).label == "max"
    p50 = tail_of([3.0, 1.0, 10.0], 50)
    assert (p50.label, p50.value) == ("p50", 3.0)


def test_concurrency_records_write_a_tail_only_with_its_samples():
    nine = AliasRecord(alias="a", workload="concurrency", part=ConcurrencyLevel(2),
                       runs=[RunRecord(ttft_ms=float(v), decode_tps=1.0) for v in (1, 2, 3, 4, 5, 6, 7, 8, 100)])
    saved = nine.to_toml()
    assert "ttft_ms_p90" not in saved and saved["ttft_ms_max"] == 100.0 and saved["ttft_ms_p50"] == 5.0
    nine.runs.append(RunRecord(ttft_ms=9.0, decode_tps=1.0))
    assert nine.to_toml()["ttft_ms_p90"] == pytest.approx(18.1)


def test_the_medians_exact_interval_by_hand():
    # n = 5: even [x(1), x(5)] covers only 1 - 2/32 = 93.75 %
    assert median_interval([1.0, 2.0, 3.0, 4.0, 50.0]) is None
    # n = 6: k = 1 covers 1 - 2/64; k = 2 only 1 - 14/64
    assert median_interval([5.0, 1.0, 2.0, 3.0, 4.0, 60.0]) == (1.0, 60.0, pytest.approx(1 - 2 / 64))
    # n = 8: k = 2 covers 1 - 18/256 = 92.97 % < 95 %, so still [x(1), x(8)]
    assert median_interval([float(v) for v in range(1, 9)]) == (1.0, 8.0, pytest.approx(1 - 2 / 256))
    # n = 9: k = 2 covers 1 - 20/512 = 96.09 %; k = 3 only 1 - 92/512
    nine = [7.0, 1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 8.0, 90.0]
    assert median_interval(nine) == (2.0, 8.0, pytest.approx(1 - 20 / 512))
    # not-a-figure values are dropped before counting
    assert median_interval([None, 0.0, 1.0, 2.0, 3.0, 4.0, 5.0, 60.0]) == (1.0, 60.0, pytest.approx(1 - 2 / 64))
    # a lower confidence takes a narrower interval: n = 9 at 80 %: k = 3 covers 1 - 92/512 = 82.03 %
    assert median_interval(nine, 0.8) == (3.0, 7.0, pytest.approx(1 - 92 / 512))


def test_precision_is_the_intervals_half_width_over_the_median():
    six = [10.0, 11.0, 12.0, 13.0, 14.0, 40.0]  # [10, 40], median 12.5 (mean 16.67)
    assert relative_precision(six) == pytest.approx(15.0 / 12.5)
    assert relative_precision(six[:5]) is None


# --- The report's rows ----------------------------------------------------------------------------------

def runs_of(*rates: float, client: float | None = None) -> list[RunRecord]:
    return [RunRecord(decode_tps=r, client_decode_tps=client, ttft_ms=r * 10) for r in rates]


def test_rows_show_medians_and_the_speedup_is_their_ratio():
    base = AliasRecord(alias="base", runs=runs_of(10.0, 11.0, 30.0, client=5.0), cold_load_s=1.25)
    fast = AliasRecord(alias="fast", runs=runs_of(20.0, 24.0, 23.0, client=5.0))
    rows = {r.configuration: r for r in rows_of([ResultSet({"format": "llm-bench/1", "label": "x"}, [base, fast])])}
    assert rows["base"].decode_tps == 11.0  # the server's median, not the client's, not the mean
    assert rows["fast"].decode_tps == 23.0
    assert speedup(rows["fast"], rows["base"]) == pytest.approx(23.0 / 11.0)
    table = main_table(list(rows.values()), rows["base"])
    (fast_row,) = [r for r in table.records() if r["configuration"] == "fast"]
    (base_row,) = [r for r in table.records() if r["configuration"] == "base"]
    assert fast_row["speedup"] == pytest.approx(23.0 / 11.0)
    assert (base_row["decode_tps_min"], base_row["decode_tps_max"], base_row["ttft_ms_median"]) == (10.0, 30.0, 110.0)
    assert base_row["cold_load_s"] == 1.25


def test_a_row_without_server_rates_shows_the_clients():
    record = AliasRecord(alias="s", engine="openai", decode_source="stream",
                         runs=[RunRecord(client_decode_tps=v) for v in (7.0, 8.0, 30.0)])
    (row,) = rows_of([ResultSet({"format": "llm-bench/1"}, [record])])
    assert (row.decode_metric, row.decode_tps) == ("client_decode_tps", 8.0)


def test_a_later_measurement_of_a_configuration_replaces_the_earlier():
    old = ResultSet({"format": "llm-bench/1", "label": "x"}, [AliasRecord(alias="a", runs=runs_of(1.0))])
    new = ResultSet({"format": "llm-bench/1", "label": "x"}, [AliasRecord(alias="a", runs=runs_of(2.0))])
    (row,) = rows_of([old, new])
    assert row.decode_tps == 2.0


def test_the_markdown_table_prints_the_figures_in_their_units(tmp_path):
    record = AliasRecord(alias="a", runs=runs_of(10.0, 11.0, 30.0), cold_load_s=2.5)
    writer = ResultsWriter(tmp_path, ResultSet({"format": "llm-bench/1", "label": "t"}), "t")
    writer.add(record)
    (row,) = rows_of([load_results(writer.path, PARTS)])
    table = markdown_table([row])
    (line,) = [line for line in table.splitlines() if line.startswith("| a |")]
    cells = [c.strip() for c in line.strip("|").split("|")]
    header = [c.strip() for c in table.splitlines()[0].strip("|").split("|")]
    shown = dict(zip(header, cells))
    assert (shown["Decode t/s"], shown["min-max"], shown["TTFT ms"], shown["Cold load s"]) == (
        "11.0", "10.0-30.0", "110", "2.50")
    assert isinstance(row, Row)
