"""No stream or run is lost: finished runs survive a failed alias, every request of a batch has an
outcome, and a batch's streams really run together (against a real router)."""

from __future__ import annotations

import pytest

from llm_bench.engines import open_engine
from llm_bench.engines.stream import ChatRequest
from llm_bench.plan import Plan, Protocol
from llm_bench.report import load_rows, markdown_table
from llm_bench.results import AliasRecord, load_results
from llm_bench.runner import RunAborted, run_plan
from llm_bench.workloads import PARTS
from llm_bench.workloads.concurrency import concurrency, level_of, simultaneous
from tests.commands import only_file
from tests.gate import RequestGate


def test_router_killed_during_run_3_of_5_keeps_runs_1_and_2(router_factory, bed, tmp_path):
    router = router_factory(bed)

    def log(message: str) -> None:
        if message.startswith("  Run 2/5"):
            router.stop()

    plan = Plan(url=router.url, aliases=("tiny-plain",), output_dir=tmp_path,
                protocol=Protocol(max_tokens=16, runs=5))
    with pytest.raises(RunAborted, match="results so far are in"):
        run_plan(plan, log)
    path = only_file(tmp_path, "*.toml")
    (record,) = load_results(path, PARTS).aliases
    assert len(record.runs) == 2 and all(r.decode_tps for r in record.runs)
    assert record.errors and "run 3 of 5 failed (2 finished)" in record.errors[0]
    # the table shows the two runs, with the failure noted
    table = markdown_table(load_rows([path]))
    (line,) = [line for line in table.splitlines() if line.startswith("| tiny-plain")]
    assert "FAILED: run 3 of 5 failed" in line
    assert "| 2 |" in line


def eight_slots(router_factory, bed, slots: int, ctx: int):
    target = bed.parent / "models" / "tiny-target.gguf"
    return router_factory(f"[tiny]\nmodel = {target}\nctx-size = {ctx}\nparallel = {slots}\n")


def test_streams_of_a_batch_overlap(router_factory, larger_model):
    # the larger model: the first token of any stream comes over 200 ms after its request. The tiny model
    # answered 20 ms after the last request was written, less than a busy machine may hold back one of the
    # client's threads.
    router = router_factory(f"[tiny]\nmodel = {larger_model}\nctx-size = {8 * 1024}\nparallel = 8\n")
    engine = open_engine("llama-cpp", router.url, timeout=120, streams=8)
    try:
        prompt = Protocol().with_prompt().prompt  # the shipped code prompt, ~760 tokens, processed whole
        request = ChatRequest("tiny", prompt, 32, 1.0, 42, prompt_cache=False)
        engine.stream(request)  # load the model
        measurements, errors, _ = simultaneous(engine, request, 8)
    finally:
        engine.close()
    assert errors == [] and len(measurements) == 8
    # every request was written to its connection before the first token of any came back
    assert all(m.written_at is not None for m in measurements)
    assert max(m.written_at for m in measurements) < min(m.first_token_at for m in measurements)


def test_128_streams_are_not_queued_by_the_client(router_factory, bed):
    # The gate holds every request until all 128 have reached it: without it, a busy machine ran the client's
    # threads so slowly that the server finished the first streams (one alone decodes 384 tokens in 0.4 s)
    # before the client had written the last, and the test failed with a client that queued nothing.
    router = eight_slots(router_factory, bed, 128, 128 * 256)
    request = ChatRequest("tiny", "Hi", 64, 1.0, 42, prompt_cache=False)
    warm = open_engine("llama-cpp", router.url, timeout=120)
    try:
        warm.stream(request)  # load the model
    finally:
        warm.close()
    with RequestGate(router.url, expect=128, timeout_s=60) as gate:
        engine = open_engine("llama-cpp", gate.url, timeout=120, streams=128)
        try:
            measurements, errors, _ = simultaneous(engine, request, 128)
        finally:
            engine.close()
    assert errors == [] and len(measurements) == 128 and {m.output_tokens for m in measurements} == {64}
    # a request the client's pool held back would reach the gate only after some stream ended: the gate would
    # have opened on its timeout, with fewer than 128 requests in
    assert gate.opened_by_count, f"only {gate.arrived} of 128 requests were out before the gate's timeout"
    assert all(m.written_at is not None for m in measurements)
    assert max(m.written_at for m in measurements) < min(m.done_at for m in measurements)


class OneBrokenStream:
    """The real engine, except that its third stream fails the way a bug in our own code would."""

    def __init__(self, engine):
        self.engine, self.calls = engine, 0

    def __getattr__(self, name):
        return getattr(self.engine, name)

    def stream(self, request):
        self.calls += 1
        if self.calls == 3:
            raise ValueError("not a ServerError")
        return self.engine.stream(request)


def test_a_failed_request_is_recorded_and_totals_count_only_measured_streams(router_factory, bed):
    router = eight_slots(router_factory, bed, 4, 4 * 1024)
    engine = open_engine("llama-cpp", router.url, timeout=120, streams=4)
    try:
        protocol = Protocol(max_tokens=16, runs=2, concurrency=(4,)).with_prompt()
        engine.stream(ChatRequest("tiny", "Hi", 4, 1.0, 42))
        base = AliasRecord(alias="tiny")
        kept: list[AliasRecord] = []
        concurrency(OneBrokenStream(engine), "tiny", protocol, base, lambda m: None, kept.append)
        (record,) = kept
    finally:
        engine.close()
    assert len(record.runs) == 7  # 2 batches of 4, one request failed
    batches = sorted([r.batch for r in record.runs].count(b) for b in (1, 2))
    assert batches == [3, 4]  # the broken request's batch kept its other three streams
    (error,) = record.errors
    assert "ValueError: not a ServerError" in error and error.startswith("batch 1, request ")
    assert any("1 of 4 requests failed; its total t/s counts only the 3 streams measured" in w
               for w in record.warnings)
    assert level_of(record).total_tps > 0
