"""The search: a cheap screen of every candidate, then rounds of full runs on the most promising.

1. **Screen**: every candidate (the control first) is loaded cold and measured once with
   ``screen_max_tokens`` tokens. A candidate the server cannot load or serve is recorded as invalid,
   with the server's message and the error lines of its log, and skipped.
2. **Rounds**: the control and the ``finalists`` fastest screened candidates get the protocol's full
   runs (``runs`` more per round, accumulated over the rounds); in the first round each also runs the
   quality workload in the same load (``llm_bench.workloads.quality``, scored against the control's
   with ``llm_bench.workloads.quality.score``). After each round: candidates below the quality gate cannot win; the leader is the
   fastest one that passes; any contender the verdict calls slower than the leader leaves the
   contest. The rounds stop when the leader is faster than every remaining contender by more than
   noise (the verdict's interval), or when the budget (rounds, requests, time) is spent.

Every measurement goes into one results file (screen records with target ``screen``, the rounds'
accumulated runs and the quality records with target ``tune``), rewritten after each candidate. Started again with the same
grid and settings, the tune resumes from the newest such file in the output folder: whatever was
measured there is not measured again.
"""

from __future__ import annotations

import hashlib
import json
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from llm_bench.engines import LlamaCppEngine, open_engine
from llm_bench.engines.errors import ServerError
from llm_bench.gpu.nvml import Nvml
from llm_bench.gpu.telemetry import sampling
from llm_bench.interference.watch import AliasWindow
from llm_bench.interference.window import Limits, disturbance
from llm_bench.plan import Protocol
from llm_bench.provenance import provenance, server_build
from llm_bench.quality.paired import PairedVerdict
from llm_bench.report.verdict import FASTER, SLOWER, Verdict, verdict
from llm_bench.results import (
    FORMAT,
    AliasRecord,
    ResultSet,
    ResultsFileError,
    ResultsWriter,
    load_results,
    reserved_order,
    results_stem,
    spec_from_runs,
)
from llm_bench.runner import AliasUnreachable, RunAborted, measure_alias
from llm_bench.tune.grid import Candidate
from llm_bench.tune.plan import QualityGate, TunePlan
from llm_bench.tune.serve import Served, load_errors
from llm_bench.workloads import PARTS
from llm_bench.workloads.quality import QUALITY
from llm_bench.workloads.quality.record import quality_results
from llm_bench.workloads.quality.score import (
    VERDICTS,
    Agreement,
    Distributions,
    accuracy,
    agreement,
    answers_verdict,
    distributions,
    quality_verdict,
    recall_share,
    same_answers,
    verdict_text,
)
from llm_bench.workloads.standard import STANDARD

Log = Callable[[str], None]
SCREEN = "screen"
TUNE = "tune"


@dataclass(frozen=True)
class QualityScore:
    """A candidate's quality workload against the control's (llm_bench.workloads.quality.score)."""

    agreement: Agreement
    recall: float | None
    control_recall: float | None
    accuracy: float | None
    control_accuracy: float | None
    distributions: Distributions | None = None
    answers: PairedVerdict | None = None
    verdict: str | None = None  # lossless, near-lossless or lossy against the control

    @property
    def identical_share(self) -> float:
        return self.agreement.identical_share or 0.0

    def describe(self) -> str:
        judged = verdict_text(self.verdict, self.distributions, self.answers)
        text = (judged + ", " if judged else "") + f"agreement {self.identical_share:.0%}"
        if self.recall is not None:
            text += f", recall {self.recall:.0%}" + (f" (control {self.control_recall:.0%})"
                                                     if self.control_recall is not None else "")
        if self.accuracy is not None:
            text += f", exact answers {self.accuracy:.0%}"
        return text


def score(candidate: AliasRecord, control: AliasRecord) -> QualityScore:
    dist = distributions(control, candidate)
    answers = answers_verdict(control, candidate)
    mine, theirs = quality_results(candidate), quality_results(control)
    return QualityScore(agreement(theirs.outputs, mine.outputs), recall_share(mine.recall), recall_share(theirs.recall),
                        accuracy(mine.questions), accuracy(theirs.questions), dist, answers,
                        quality_verdict(dist, answers, same_answers(control, candidate)))


def gate_reasons(q: QualityScore, gate: QualityGate) -> list[str]:
    """Why the quality gate refuses a candidate with this score against the control (none: it passes)."""
    reasons = []
    if gate.accept in VERDICTS:
        if q.verdict is None:
            problem = q.distributions.problem if q.distributions is not None else None
            reasons.append(f"quality not scored: {problem or 'no token distributions were measured'}")
        elif VERDICTS.index(q.verdict) > VERDICTS.index(gate.accept):
            reasons.append(f"{verdict_text(q.verdict, q.distributions, q.answers)} (the gate accepts {gate.accept})")
    needed = gate.agreement_needed
    if needed is not None and q.identical_share < needed:
        reasons.append(f"agreement {q.identical_share:.0%} < {needed:.0%} ({q.agreement.describe()})")
    if q.recall is not None and q.control_recall is not None and q.recall < q.control_recall - gate.max_recall_drop:
        reasons.append(f"recall {q.recall:.0%} below the control's {q.control_recall:.0%}")
    return reasons


@dataclass
class Entry:
    """One candidate's standing in the search."""

    candidate: Candidate
    control: bool = False
    screen: AliasRecord | None = None
    full: AliasRecord | None = None
    quality: QualityScore | None = None
    quality_record: AliasRecord | None = None  # the quality workload's record (greedy outputs, recall)
    invalid: str | None = None
    finalist: bool = False
    dropped: str | None = None  # why it left the rounds
    rejected: str | None = None  # why the quality gate refused it
    verdict: Verdict | None = None  # against the control

    @property
    def name(self) -> str:
        return self.candidate.name

    def full_runs(self) -> list[float]:
        return [r.decode_tps for r in (self.full.runs if self.full else []) if r.decode_tps]

    def screen_speed(self) -> float | None:
        runs = [r.decode_tps for r in (self.screen.runs if self.screen else []) if r.decode_tps]
        return statistics.median(runs) if runs else None

    def speed(self) -> float | None:
        runs = self.full_runs()
        return statistics.median(runs) if runs else self.screen_speed()


@dataclass
class Outcome:
    entries: list[Entry]
    control: Entry
    winner: Entry | None
    separated: bool
    stop_reason: str
    results: Path

    def rejected_faster(self) -> list[Entry]:
        """Candidates the quality gate refused although they measured faster than the winner (or control)."""
        bar = (self.winner or self.control).speed() or 0.0
        return [e for e in self.entries if e.rejected and (e.speed() or 0.0) > bar]


def fingerprint(plan: TunePlan, candidates: list[Candidate]) -> str:
    """What must match for an earlier tune's measurements to count: the candidates and how they are measured."""
    p = plan.protocol
    data = {"candidates": [[c.name, [[k, str(v)] for k, v in c.settings]] for c in candidates],
            "url": plan.url, "screen_max_tokens": plan.screen_max_tokens, "max_tokens": p.max_tokens,
            "runs": p.runs, "temperature": p.temperature, "seed": p.seed, "prompt": p.prompt_name,
            "prompt_chars": len(p.prompt)}
    return hashlib.sha256(json.dumps(data, sort_keys=True).encode()).hexdigest()[:16]


def previous_result(output_dir: Path, print_: str) -> ResultSet | None:
    """The newest tune results file in the folder with this fingerprint."""
    found = None
    for path in sorted(output_dir.glob("llm-bench-*-tune-*.toml"), key=reserved_order):
        try:
            result = load_results(path, PARTS)
        except ResultsFileError:
            continue
        if (result.meta.get("tune") or {}).get("fingerprint") == print_:
            found = (path, result)
    if found is None:
        return None
    found[1].meta.setdefault("tune", {})["resumed_from"] = str(found[0])
    return found[1]


def requests_of(record: AliasRecord) -> int:
    """The requests a record's figures took (its warm-up aside)."""
    quality = quality_results(record)
    return len(record.runs) + len(quality.outputs) + len(quality.questions) + \
        sum(1 for p in quality.recall if p.found is not None)


class Budget:
    def __init__(self, plan: TunePlan, used_requests: int = 0):
        self.plan = plan
        self.started = time.monotonic()
        self.requests = used_requests

    def spent(self) -> str | None:
        b = self.plan.budget
        if self.requests >= b.max_requests:
            return f"the request budget ({b.max_requests}) is spent"
        if time.monotonic() - self.started >= b.max_time_s:
            return f"the time budget ({b.max_time_s:.0f} s) is spent"
        return None


def cost_text(plan: TunePlan, n: int) -> str:
    p = plan.protocol
    finalists = min(plan.finalists, n - 1)
    return (f"Search cost: {n} presets ({n - 1} candidates and the control) screened with 1 run of "
            f"{plan.screen_max_tokens} tokens each; then up to {plan.budget.max_rounds} round(s) of {p.runs} run(s) "
            f"of {p.max_tokens} tokens on the control and {finalists} finalist(s), with the quality workload on each; "
            f"budget: {plan.budget.max_requests} requests, {plan.budget.max_time_s:.0f} s.")


def estimate_text(plan: TunePlan, n: int, control: AliasRecord) -> str:
    """The time the search will take at most, from the control's screen (cold load, per-token rate)."""
    run = control.runs[0] if control.runs else None
    if run is None or not run.wall_s or not run.output_tokens:
        return "Estimated time: unknown (the control's screen measured nothing)"
    load = control.cold_load_s or 0.0
    per_token = max(run.wall_s - (run.ttft_ms or 0.0) / 1000.0, 0.0) / max(run.output_tokens, 1)
    first = (run.ttft_ms or 0.0) / 1000.0
    screen = n * (load + 2 * (first + plan.screen_max_tokens * per_token))
    finalists = min(plan.finalists, n - 1) + 1
    full = first + plan.protocol.max_tokens * per_token
    rounds = plan.budget.max_rounds * finalists * (load + (plan.protocol.runs + 1) * full)
    # The quality workload: the agreement prompts (at most 96 tokens each), 4 short questions, the recall probes.
    qp = QUALITY.settings_in(plan.protocol)
    agreement_tokens = 3 * min(96, qp.max_tokens or 96)
    probes = len(qp.recall_lengths) * len(qp.recall_depths)
    quality = finalists * ((7 + probes) * first + (agreement_tokens + 4 * 16 + probes * 24) * per_token)
    total = min(screen + rounds + quality, plan.budget.max_time_s)
    return (f"Estimated time: at most {total / 60:.1f} min (screen {screen:.0f} s, rounds {rounds:.0f} s, "
            f"quality {quality:.0f} s; from the control's cold load {load:.1f} s and {1 / per_token:.1f} t/s "
            f"wall-clock)" if per_token else "Estimated time: unknown")


class Tuner:
    """Runs the search against one router; everything it measures is on disk before the next step."""

    def __init__(self, plan: TunePlan, served: Served, writer: ResultsWriter, gpus: Nvml, log: Log,
                 entries: list[Entry]):
        self.plan, self.served, self.writer, self.gpus, self.log = plan, served, writer, gpus, log
        self.entries = entries
        self.control = entries[0]
        self.tune_meta: dict[str, Any] = writer.result_set.meta["tune"]
        used = sum(requests_of(r) + 1 for r in writer.result_set.aliases)
        self.budget = Budget(plan, used)
        p = plan.protocol
        self.engine = open_engine(LlamaCppEngine.kind, served.url, timeout=p.request_timeout_s, api_key=served.api_key,
                                  load_timeout=p.load_timeout_s)

    def close(self) -> None:
        self.engine.close()

    # --- measuring ------------------------------------------------------------------------------

    def _measure(self, entry: Entry, protocol: Protocol, target: str) -> list[AliasRecord]:
        self.served.new_log()  # only this load's lines count for its errors
        try:
            with sampling(self.gpus):
                records: list[AliasRecord] = []  # written by the caller once the candidate is whole
                # what else ran in the window (llm_bench.interference): a disturbed record is never picked or rejected
                window = AliasWindow(self.engine, entry.name, self.gpus, self.served.url, Limits(), None, self.log,
                                     self._router_log)
                measure_alias(self.engine, entry.name, protocol, self.gpus, self.log, records.append, target=target,
                              window=window)
                window.apply(records)
        except AliasUnreachable as e:
            # what this candidate measured before is not written: a resumed tune measures it again whole
            raise RunAborted(f"the router serving the candidates went away while {entry.name} was measured: {e}; "
                             f"what was measured before is kept in {self.writer.path}: run the same command again "
                             "to resume") from e.cause
        self.budget.requests += sum(requests_of(r) for r in records) + 1
        failed = [r for r in records if r.errors]
        if failed:
            lines = load_errors(self.served.new_log())
            if lines:
                failed[0].errors.append("server log: " + " | ".join(lines))
        return records

    def _router_log(self) -> str | None:
        """The whole log of the router we started (its requests are counted from it); None for a --url router."""
        process = self.served.process
        if process is None or not process.log_path.exists():
            return None
        return process.log_path.read_text(errors="replace")

    def screen(self) -> None:
        protocol = replace(self.plan.protocol, runs=1, max_tokens=self.plan.screen_max_tokens,
                           workloads=(STANDARD.name,))
        todo = [e for e in self.entries if e.screen is None]
        if len(todo) < len(self.entries):
            self.log(f"resuming: {len(self.entries) - len(todo)} preset(s) already screened")
        for n, entry in enumerate(todo, 1):
            spent = self.budget.spent()
            if spent:
                self.log(f"screen stopped: {spent}")
                break
            self.log(f"Screen {n}/{len(todo)}: {entry.name}")
            records = self._measure(entry, protocol, SCREEN)
            self.writer.extend(records)
            entry.screen = records[0]
            self._check_valid(entry)
            if entry.control:
                if entry.invalid:
                    raise RunAborted(f"the control {entry.name} failed: {entry.invalid}; nothing can be compared "
                                     f"with it (results in {self.writer.path})")
                self.log(estimate_text(self.plan, len(self.entries), entry.screen))

    def _check_valid(self, entry: Entry) -> None:
        record = entry.screen
        if record is not None and (record.errors or not record.runs):
            entry.invalid = "; ".join(record.errors) or "no run measured"
            self.log(f"  INVALID: {entry.invalid}")
        elif record is not None and disturbance(record) is not None:
            entry.invalid = f"not judged: {disturbance(record)}"
            self.log(f"  NOT JUDGED: {entry.invalid}")

    def choose_finalists(self) -> list[Entry]:
        valid = [e for e in self.entries[1:] if e.screen is not None and not e.invalid and e.screen_speed()]
        valid.sort(key=lambda e: -(e.screen_speed() or 0.0))
        chosen = valid[: self.plan.finalists]
        for e in [self.control, *chosen]:
            e.finalist = True
        for e in valid[self.plan.finalists:]:
            e.dropped = "screened out (slower in the screen than the finalists)"
        return [self.control, *chosen]

    def _full(self, entry: Entry, runs: int, with_quality: bool) -> None:
        """``runs`` more full runs, and the quality workload in the same load when it is still missing."""
        quality_now = with_quality and entry.quality_record is None
        workloads = ((STANDARD.name,) if runs > 0 else ()) + ((QUALITY.name,) if quality_now else ())
        if not workloads:
            return
        protocol = replace(self.plan.protocol, runs=max(runs, 1), workloads=workloads)
        if self.plan.quality.accept == "off":  # no verdict: neither token distributions nor exact-answer items
            protocol = protocol.with_settings(QUALITY, {"top_k": 0, "exact_items_per_kind": 0})
        elif self.control.quality_record is not None:  # the control's reference text, for every candidate
            protocol = protocol.carried([self.control.quality_record])
        records = self._measure(entry, protocol, TUNE)
        for record in records:
            if record.workload == QUALITY.record_name:
                entry.quality_record = record
                self.writer.add(record)
            elif entry.full is None:
                entry.full = record
                self.writer.add(record)
            else:
                entry.full.runs.extend(record.runs)
                entry.full.spec = spec_from_runs(entry.full.runs)
                entry.full.errors.extend(record.errors)
                entry.full.warnings.extend(w for w in record.warnings if w not in entry.full.warnings)
                entry.full.comparable = entry.full.comparable and record.comparable
                entry.full.not_comparable_reason = entry.full.not_comparable_reason or record.not_comparable_reason
                if disturbance(record) is not None:  # one disturbed round leaves the whole not judged
                    entry.full.interference = record.interference
                self.writer.flush()
        failed = [e for r in records for e in r.errors]
        if failed:
            entry.dropped = "failed: " + "; ".join(failed)

    def judge(self, entry: Entry) -> None:
        control = self.control.quality_record
        if entry.control or entry.quality_record is None or control is None:
            return
        entry.quality = q = score(entry.quality_record, control)
        entry.rejected = "; ".join(gate_reasons(q, self.plan.quality)) or None

    def eligible(self, entry: Entry) -> bool:
        if entry.full is not None and disturbance(entry.full) is not None:
            return False  # measured while something else ran: neither picked nor compared with
        if entry.control:
            return bool(entry.full_runs())
        return (entry.quality is not None and not entry.rejected and not entry.dropped
                and bool(entry.full_runs()))

    def rounds(self, contenders: list[Entry]) -> tuple[Entry | None, bool, str]:
        runs = self.plan.protocol.runs
        leader: Entry | None = None
        for r in range(1, self.plan.budget.max_rounds + 1):
            self.log(f"Round {r}: {', '.join(e.name for e in contenders)} ({r * runs} runs each)")
            for entry in contenders:
                spent = self.budget.spent()
                if spent:
                    return self._leader(contenders), False, spent
                missing = r * runs - len(entry.full.runs if entry.full else [])
                if missing > 0 or entry.quality_record is None:
                    self.log(f"  {entry.name}: {max(missing, 0)} run(s)")
                    self._full(entry, max(missing, 0), with_quality=True)
            for entry in contenders:
                self.judge(entry)
            leader = self._leader(contenders)
            if leader is None:
                return None, False, "no contender passed the quality gate with full runs"
            others = [e for e in contenders if e is not leader and self.eligible(e)]
            verdicts = {e.name: verdict(leader.full_runs(), e.full_runs()) for e in others}
            self.tune_meta.setdefault("rounds", []).append(
                {"round": r, "leader": leader.name, "verdicts": {k: v.describe() for k, v in verdicts.items()}})
            self.writer.flush()
            for e in others:
                self.log(f"  {leader.name} vs {e.name}: {verdicts[e.name].describe()}")
            if not others:
                return leader, True, f"no other contender is left after round {r} (rejected for quality, failed or slower)"
            if all(v.kind == FASTER for v in verdicts.values()):
                for e in others:
                    e.dropped = f"{leader.name} is faster beyond noise (round {r})"
                return leader, True, f"the leader is faster than every other contender beyond noise after round {r}"
            for e in others:
                if not e.control and verdict(e.full_runs(), leader.full_runs()).kind == SLOWER:
                    e.dropped = f"slower than {leader.name} (round {r})"
            contenders = [e for e in contenders if e.control or e is leader or (not e.dropped and not e.rejected)]
        return leader, False, f"the round budget ({self.plan.budget.max_rounds}) is spent"

    def _leader(self, contenders: list[Entry]) -> Entry | None:
        eligible = [e for e in contenders if self.eligible(e)]
        if not eligible:
            return None
        return max(eligible, key=lambda e: statistics.median(e.full_runs()))


def entries_from(candidates: list[Candidate], previous: ResultSet | None) -> list[Entry]:
    entries = [Entry(c, control=(i == 0)) for i, c in enumerate(candidates)]
    if previous is None:
        return entries
    by_name = {e.name: e for e in entries}
    for record in previous.aliases:
        entry = by_name.get(record.alias)
        if entry is None:
            continue
        if record.target == SCREEN:
            entry.screen = record
        elif record.target == TUNE and record.workload == STANDARD.record_name:
            entry.full = record
        elif record.target == TUNE and record.workload == QUALITY.record_name:
            entry.quality_record = record
    for entry in entries:
        if entry.screen is not None and (entry.screen.errors or not entry.screen.runs):
            entry.invalid = "; ".join(entry.screen.errors) or "no run measured"
    return entries


def new_meta(plan: TunePlan, candidates: list[Candidate], print_: str, engine_url: str,
             server_build: str | None, gpus: Nvml, previous: ResultSet | None) -> dict[str, Any]:
    tune: dict[str, Any] = {
        "fingerprint": print_, "name": plan.name, "control": candidates[0].name,
        "mode": "existing router" if plan.url else "temporary router",
        "candidates": [{"name": c.name, "settings": dict(c.settings)} for c in candidates],
        "finalists": plan.finalists, "screen_max_tokens": plan.screen_max_tokens,
        "budget": {"max_rounds": plan.budget.max_rounds, "max_requests": plan.budget.max_requests,
                   "max_time_s": plan.budget.max_time_s},
        "quality_gate": {k: v for k, v in (("accept", plan.quality.accept), ("min_agreement", plan.quality.min_agreement),
                                           ("max_recall_drop", plan.quality.max_recall_drop)) if v is not None},
    }
    if previous is not None:
        tune["resumed_from"] = (previous.meta.get("tune") or {}).get("resumed_from")
    return provenance(FORMAT, gpus, server_build=server_build, server_url=engine_url) | {
        "complete": False, "label": TUNE, "engine": LlamaCppEngine.kind, "server_url": engine_url,
        "server_build": server_build, "protocol": plan.protocol.to_toml(), "tune": tune,
    }


def summarise(tuner: Tuner, winner: Entry | None, separated: bool, stop: str) -> None:
    control = tuner.control
    for entry in tuner.entries:
        if entry.full_runs() and control.full_runs() and not entry.control:
            entry.verdict = verdict(entry.full_runs(), control.full_runs())
    outcome: dict[str, Any] = {"separated": separated, "stop_reason": stop}
    if winner is not None:
        outcome["winner"] = winner.name
        if winner.verdict is not None:
            outcome["verdict"] = winner.verdict.describe()
    outcome["rejected_for_quality"] = [{"name": e.name, "reason": e.rejected} for e in tuner.entries if e.rejected]
    outcome["invalid"] = [{"name": e.name, "message": e.invalid} for e in tuner.entries if e.invalid]
    tuner.tune_meta["outcome"] = outcome


def run_search(plan: TunePlan, served: Served, log: Log, nvml: Nvml | None = None, fresh: bool = False) -> Outcome:
    """The whole search on a router that serves every candidate; resumes from an earlier file unless fresh."""
    protocol = plan.protocol.with_prompt()
    plan = replace(plan, protocol=protocol)
    candidates = plan.candidates()
    print_ = fingerprint(plan, candidates)
    previous = None if fresh else previous_result(plan.output_dir, print_)
    log(cost_text(plan, len(candidates)))
    with nvml or Nvml() as gpus:
        probe = open_engine(LlamaCppEngine.kind, served.url, timeout=30.0, api_key=served.api_key)
        try:
            build = server_build(probe)
        finally:
            probe.close()
        meta = new_meta(plan, candidates, print_, served.url, build, gpus, previous)
        writer = ResultsWriter(plan.output_dir, ResultSet(meta, list(previous.aliases) if previous else []),
                               results_stem(datetime.now(timezone.utc), f"tune-{plan.name}"))
        log(f"Results: {writer.path}" + (f" (resuming {meta['tune']['resumed_from']})" if previous else ""))
        entries = entries_from(candidates, previous)
        tuner = Tuner(plan, served, writer, gpus, log, entries)
        try:
            tuner.screen()
            contenders = tuner.choose_finalists()
            winner, separated, stop = tuner.rounds(contenders)
            summarise(tuner, winner, separated, stop)
            writer.finish(datetime.now(timezone.utc))
        except ServerError as e:
            if not writer.path.exists():
                raise
            raise RunAborted(f"the tune stopped partway: {e}; what was measured is kept in {writer.path}: "
                             "run the same command again to resume") from e
        finally:
            tuner.close()
    return Outcome(entries, tuner.control, winner, separated, stop, writer.path)
