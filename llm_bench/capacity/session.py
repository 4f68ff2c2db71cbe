"""One ``llm-bench capacity`` from start to end: for each alias a probe (which loads the model and shows
whether the objective can be checked at all), then each loop's search, level after level, the results
file rewritten after every level so that a dying server or Ctrl-C loses nothing measured.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, replace
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from llm_bench.capacity.answer import amount, answer_sentence
from llm_bench.capacity.loops import (
    Budget,
    LevelAborted,
    LevelInterrupted,
    clock,
    closed_level,
    new_level,
    open_level,
)
from llm_bench.capacity.prompts import PlanPrompt, Prompt, Prompts, SessionPrompts
from llm_bench.capacity.records import PROBE, AliasCapacity, Level, RequestRecord, Search, request_record
from llm_bench.capacity.search import bracket, next_rate, next_streams
from llm_bench.capacity.settings import CapacityPlan, CapacitySettings, Objective
from llm_bench.capacity.slots import SlotWatch
from llm_bench.engines import Engine, open_engine, select_models
from llm_bench.engines.errors import ServerError, ServerUnreachable
from llm_bench.gpu.nvml import Nvml
from llm_bench.plan import Protocol
from llm_bench.results import reserve_path, results_stem, write_toml
from llm_bench.runner import run_meta
from llm_bench.workloads.common import chat_request
from llm_bench.workloads.session import Session

FORMAT = "llm-bench-capacity/1"
Log = Callable[[str], None]


class ObjectiveUncheckable(ValueError):
    """The server's answers lack what the objective needs (timings or usage counts): refused before measuring."""


class CapacityAborted(RuntimeError):
    """The server went away partway; every level measured is in the results file."""


@dataclass
class CapacityRun:
    path: Path | None
    objective: Objective
    aliases: list[AliasCapacity] = field(default_factory=list)
    meta: dict[str, Any] = field(default_factory=dict)

    @property
    def failed(self) -> list[str]:
        return [f"{a.alias}: {e}" for a in self.aliases for e in a.errors]


class _File:
    """The results file: reserved when the first probe has passed, rewritten after every level."""

    def __init__(self, run: CapacityRun, output_dir: Path, stem: str, log: Log):
        self.run = run
        self.output_dir = output_dir
        self.stem = stem
        self.log = log

    def save(self) -> None:
        if self.run.path is None:
            self.run.path = reserve_path(self.output_dir, self.stem)
            self.log(f"Results: {self.run.path}")
        meta = {k: v for k, v in self.run.meta.items() if v is not None}
        write_toml(self.run.path, {"meta": meta, "aliases": [a.to_toml() for a in self.run.aliases]})


def uncheckable(probe: RequestRecord, server_decode_rate: bool) -> str | None:
    """What the probe's answer lacks for the objective to be checked, in words; None when nothing."""
    if probe.error is not None:
        return None  # a failed probe is a failure, not a missing figure
    if probe.ttft_ms is None:
        return "the answer streamed no token, so there is no TTFT"
    if probe.decode_tps is None:
        if server_decode_rate:
            return "the server reported no timings.predicted_per_second, so per-stream decode t/s is unknown"
        return ("the server reported no usage.completion_tokens (stream_options.include_usage), so per-stream "
                "decode t/s cannot be computed from the stream")
    return None


def probe(engine: Engine, prompt: Prompt) -> list[RequestRecord]:
    """Two requests alone: the first loads the model (not timed for anything), the second is the one the
    objective's check and the open loop's first rate read."""
    records = []
    for _ in range(2):
        start = clock()
        m = engine.stream(prompt.request)
        records.append(request_record(m, level=0, phase=PROBE, scheduled=m.sent_at, origin=start,
                                      server_decode_rate=engine.capabilities.server_decode_rate, turn=prompt.turn))
    return records


def _slots(engine: Engine, alias: str, watch: SlotWatch) -> int | None:
    try:
        props = engine.model_props(alias) or {}
    except ServerError:
        props = {}
    total = props.get("total_slots")
    return int(total) if isinstance(total, int) and total > 0 else watch.slot_count()


def _describe_level(level: Level, objective: Objective) -> str:
    j = level.judgement
    assert j is not None
    head = f"    {amount(level.loop, level.level)}: {j.counted} requests"
    if level.cut_short and j.meets is None:
        return f"{head}, not judged ({level.cut_short})"
    figures = (f", decode p10 {_v(j.decode_p10)} t/s, TTFT p95 {_v(j.ttft_p95, 0.001, 2)} s, "
               f"client lag p99 {_v(j.lag_p99, 1, 2)} ms")
    if j.client_bound:
        return f"{head}{figures}: REFUSED, the client lagged more than {objective.max_lag_ms:g} ms"
    return head + figures + (": meets the objective" if j.meets else f": breaks it ({level.cause(objective)})")


def _v(tail, scale: float = 1.0, digits: int = 1) -> str:
    if tail is None:
        return "n/a"
    value = f"{tail.value * scale:.{digits}f}"
    return value if tail.label.startswith("p") else f"{value} ({tail.label} of {tail.samples})"


class _Searcher:
    def __init__(self, engine: Engine, prompts: Prompts, settings: CapacitySettings, objective: Objective,
                 budget: Budget, save: Callable[[], None], log: Log):
        self.engine, self.prompts, self.settings, self.objective = engine, prompts, settings, objective
        self.budget, self.save, self.log = budget, save, log

    def search(self, alias: AliasCapacity, search: Search, watch: SlotWatch | None, start_rate: float,
               spread_s: float) -> None:
        outcomes: dict[float, bool] = {}
        measure = self._measurer(search.loop, watch, spread_s)
        try:
            while True:
                value: float | None  # streams (a whole number) for the closed loop, a rate for the open
                if search.loop == "closed":
                    value, why = next_streams(outcomes, int(search.ceiling or self.settings.max_streams))
                else:
                    value, why = next_rate(outcomes, start_rate, self.settings.rate_resolution)
                if value is None:
                    search.stopped_by = why
                    break
                bound = self.budget.exhausted()
                if bound:
                    search.stopped_by = bound
                    break
                level = new_level(search.loop, value)
                search.levels.append(level)  # kept as its requests end, whatever stops it
                try:
                    measure(level)
                except LevelAborted:
                    self._stop(alias, search, outcomes, "server-gone", level)
                    raise
                except LevelInterrupted:
                    self._stop(alias, search, outcomes, "interrupted", level)
                    raise KeyboardInterrupt from None
                judgement = level.judge(self.objective)
                self.log(_describe_level(level, self.objective))
                if judgement.client_bound:
                    search.stopped_by = "client-bound"
                    alias.errors.append(
                        f"{search.loop} loop at {amount(search.loop, value)}: refused, the client's lag (p99 "
                        f"{judgement.lag_p99.value:.1f} ms) exceeds 1 % of the TTFT objective "  # type: ignore[union-attr]
                        f"({self.objective.max_lag_ms:g} ms): this machine cannot drive that load faithfully")
                    break
                if judgement.meets is None:
                    search.stopped_by = level.cut_short or "not judged"
                    break
                outcomes[value] = judgement.meets
                self._conclude(alias, search, outcomes)
                self.save()
        except KeyboardInterrupt:  # between two levels, or LevelInterrupted's own
            if search.stopped_by != "interrupted":
                self._stop(alias, search, outcomes, "interrupted", None)
            raise
        self._conclude(alias, search, outcomes)

    def _stop(self, alias: AliasCapacity, search: Search, outcomes: dict[float, bool], why: str,
              level: Level | None) -> None:
        if level is not None:
            level.judge(self.objective)
        search.stopped_by = why
        self._conclude(alias, search, outcomes)

    def _measurer(self, loop: str, watch: SlotWatch | None, spread_s: float) -> Callable[[Level], None]:
        sampler = None if watch is None else watch.watching
        if loop == "closed":
            return lambda level: closed_level(self.engine, self.prompts.level(), level, self.settings, self.budget,
                                              sampler, spread_s)
        return lambda level: open_level(self.engine, self.prompts.level(), level, self.settings, self.budget,
                                        sampler)

    def _conclude(self, alias: AliasCapacity, search: Search, outcomes: dict[float, bool]) -> None:
        b = bracket(outcomes)
        search.carried, search.broken_at = b.carried, b.broken_at
        search.answer = answer_sentence(alias.alias, search, self.objective)


def run_capacity(cplan: CapacityPlan, log: Log, nvml: Nvml | None = None) -> CapacityRun:
    """Search every alias of the plan; the results file exists from the first passed probe on.

    Raises ServerError (unreachable server, unknown alias: nothing measured), ObjectiveUncheckable (the
    first alias's probe lacks a figure the objective needs: nothing measured), CapacityAborted (the server
    went away: what was measured is saved), KeyboardInterrupt (saved too)."""
    plan, settings = cplan.plan, cplan.settings
    objective = settings.objective()
    session = settings.read_session()  # a bad session file stops here, before the server is asked anything
    protocol: Protocol = plan.protocol.with_prompt()
    started_at = datetime.now(timezone.utc)
    engine = open_engine(plan.engine, plan.url, timeout=protocol.request_timeout_s, api_key=plan.api_key.read(),
                         metrics_url=plan.metrics_url, load_timeout=protocol.load_timeout_s,
                         streams=max(settings.max_streams, settings.max_in_flight), metrics_key=plan.metrics_key)
    run = CapacityRun(None, objective)
    try:
        with nvml or Nvml() as gpus:
            aliases = select_models(engine, plan.aliases, log)
            run.meta = run_meta(replace(plan, protocol=protocol), engine, gpus, started_at) | {
                "format": FORMAT, "capacity": settings.to_toml(),
                "objective": {"min_stream_tps": objective.min_stream_tps, "max_ttft_s": objective.max_ttft_s}}
            results = _File(run, plan.output_dir, results_stem(started_at, f"capacity-{plan.label}".rstrip("-")), log)
            budget = Budget(settings.max_requests, settings.max_duration_s)
            for n, alias in enumerate(aliases, 1):
                log(f"Capacity {n}/{len(aliases)}: {alias}")
                _one_alias(engine, alias, protocol, session, settings, objective, budget, run, results, log)
            run.meta["finished_at"] = datetime.now(timezone.utc).isoformat(timespec="seconds")
            run.meta["complete"] = True
            if run.path is not None:
                results.save()
    finally:
        engine.close()
    return run


def _one_alias(engine: Engine, alias: str, protocol: Protocol, session: Session | None, settings: CapacitySettings,
               objective: Objective, budget: Budget, run: CapacityRun, results: _File, log: Log) -> None:
    request = chat_request(alias, protocol, protocol.prompt)
    prompts: Prompts = PlanPrompt(request) if session is None else SessionPrompts.of(request, session)
    record = AliasCapacity(alias, engine.kind, engine.capabilities.decode_source)
    try:
        probes = probe(engine, prompts.probe)
    except ServerUnreachable as e:
        if run.path is None:
            raise
        record.errors.append(f"probe failed: {e}")
        run.aliases.append(record)
        results.save()
        raise CapacityAborted(f"{e}; what was measured is in {run.path}") from e
    except ServerError as e:  # this alias failed (e.g. it would not load); the others are still measured
        log(f"  FAILED: {e}")
        record.errors.append(f"probe failed: {e}")
        run.aliases.append(record)
        results.save()
        return
    record.probes = probes
    missing = uncheckable(probes[-1], engine.capabilities.server_decode_rate)
    if missing:
        message = f"the objective cannot be checked on {alias}: {missing}"
        if run.path is None:
            raise ObjectiveUncheckable(message + "; nothing was measured")
        record.errors.append(message)
        run.aliases.append(record)
        results.save()
        return
    watch = SlotWatch(engine.base_url, engine.auth_headers(), alias, settings.slot_poll_s)
    try:
        record.slots = _slots(engine, alias, watch)
        try:
            record.preset_args, record.server_build = engine.describe(alias)
        except ServerError:
            pass
        run.aliases.append(record)
        results.save()
        alone = probes[-1]
        log(f"  probe: decode {alone.decode_tps:.1f} t/s, TTFT {alone.ttft_ms:.0f} ms"
            + (f", {record.slots} slot(s)" if record.slots else ""))
        if isinstance(prompts, SessionPrompts):
            prompts = prompts.fitting(alone.prompt_tokens, _context(engine, alias))
            log(f"  prompts: {prompts.describe()}")
        searcher = _Searcher(engine, prompts, settings, objective, budget, results.save, log)
        duration = (alone.ended_s or 0.0) - alone.scheduled_s
        start_rate = settings.start_rate_per_min or float(f"{30.0 / max(duration, 1e-3):.3g}")
        for loop in settings.loops:
            search = Search(loop)
            if loop == "closed":
                search.ceiling, search.ceiling_reason = _ceiling(settings.max_streams, record.slots)
            record.searches.append(search)
            log(f"  {loop} loop" + (f", up to {search.ceiling:g} streams ({search.ceiling_reason})"
                                    if search.ceiling else f", from {start_rate:g} requests/min"))
            try:
                searcher.search(record, search, None if record.slots is None else watch, start_rate, duration)
            except LevelAborted as e:
                results.save()
                raise CapacityAborted(f"the server went away during {alias}'s {loop} loop ({e}); every level "
                                      f"measured is in {run.path}") from e.cause
            except KeyboardInterrupt:
                results.save()
                raise
            results.save()
            log(f"  {search.answer}")
    finally:
        watch.close()
    if protocol.unload_after:
        try:
            engine.release(alias)
        except ServerError as e:
            log(f"  unload failed: {e}")


def _context(engine: Engine, alias: str) -> int | None:
    try:
        return engine.context_length(alias)
    except ServerError:
        return None


def _ceiling(max_streams: int, slots: int | None) -> tuple[int, str]:
    """A llama.cpp preset's slots bound N: one stream more than its slots shows where requests start to
    queue; more only queue longer."""
    if slots is not None and slots + 1 < max_streams:
        return slots + 1, f"{slots} slot{'s' if slots != 1 else ''} + 1"
    return max_streams, "--max-streams"
