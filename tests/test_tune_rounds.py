"""tune's round, decided on hand-made runs and answers (no server): who leads, who leaves, when the leader is
separated, what the quality gate refuses. Every case is built so that the wrong rule names another winner.
tests/test_tune_decisions.py makes the same decisions on a real router. The leader and the agreement gate are
decided with the verdict gate off (``accept = "off"``); the verdict gate on hand-made token distributions."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from llm_bench.plan import Protocol
from llm_bench.results import AliasRecord, RunRecord
from llm_bench.tune import search
from llm_bench.tune.grid import Candidate
from llm_bench.tune.plan import Budget, QualityGate, TunePlan
from llm_bench.workloads.quality.record import ForcedText, QualityOutput, QualityResults, RecallProbe

SAME = [[1, 2, 3, 4], [5, 6, 7], [8, 9]]  # the control's greedy answers, as token ids
OFF = QualityGate(accept="off")  # the gate of greedy answers alone: agreement of 75 % and recall


@dataclass
class Writer:
    flushed: int = 0

    def flush(self) -> None:
        self.flushed += 1


def forced(top: list[float]) -> list[ForcedText]:
    """A text of 40 positions teacher-forced through a configuration: at each, two listed tokens with the
    probabilities ``top`` (the first alternating slightly, so that the positions are not all alike)."""
    probs = [(top[0] - 0.01 * (j % 2), top[1] + 0.01 * (j % 2)) for j in range(40)]
    return [ForcedText("s0", "", "", 1, list(range(41)), [[1, 2]] * 40,
                       [[math.log(a), math.log(b)] for a, b in probs])]


def entry(name: str, rates: list[float], answers: list[list[int]] = SAME, *, control: bool = False,
          recall: list[bool] | None = None, distribution: list[float] | None = None) -> search.Entry:
    quality = AliasRecord(alias=name, workload="quality", target=search.TUNE,
                          part=QualityResults(
                              outputs=[QualityOutput(f"p{i}", "", len(ids), ids, "length") for i, ids in enumerate(answers)],
                              recall=[RecallProbe(1024, 0.5, "2533", found=f) for f in (recall or [])],
                              forced=forced(distribution) if distribution else []))
    full = AliasRecord(alias=name, target=search.TUNE, runs=[RunRecord(decode_tps=r) for r in rates])
    return search.Entry(Candidate(name, (), ()), control=control, full=full, quality_record=quality, finalist=True)


@dataclass
class Rounds:
    winner: search.Entry | None
    separated: bool
    stop: str
    entries: dict[str, search.Entry]
    meta: dict = field(default_factory=dict)


def one_round(*entries: search.Entry, gate: QualityGate | None = None) -> Rounds:
    """Tuner.rounds over runs already measured: 3 runs each and one round, so nothing more is measured."""
    plan = TunePlan(protocol=Protocol(runs=3), budget=Budget(max_rounds=1), quality=gate or OFF)
    tuner = search.Tuner.__new__(search.Tuner)  # no router: everything it would measure is there
    tuner.plan, tuner.log, tuner.writer, tuner.tune_meta = plan, lambda _m: None, Writer(), {}
    tuner.entries, tuner.control = list(entries), entries[0]
    tuner.budget = search.Budget(plan)
    winner, separated, stop = tuner.rounds(list(entries))
    return Rounds(winner, separated, stop, {e.name: e for e in entries}, tuner.tune_meta)


CONTROL = [100.0, 101.0, 99.0]


def test_the_fastest_passing_preset_leads_and_wins_when_faster_than_every_other_beyond_noise():
    r = one_round(entry("control", CONTROL, control=True), entry("mid", [150.0, 151.0, 149.0]),
                  entry("top", [200.0, 204.0, 198.0]))
    assert r.winner is r.entries["top"] and r.separated
    assert r.stop == "the leader is faster than every other contender beyond noise after round 1"
    assert r.entries["mid"].dropped == "top is faster beyond noise (round 1)"
    assert r.entries["control"].dropped == "top is faster beyond noise (round 1)"
    [record] = r.meta["rounds"]
    assert record["leader"] == "top" and set(record["verdicts"]) == {"control", "mid"}
    assert all(v.startswith("faster (") for v in record["verdicts"].values())


def test_a_leader_within_noise_of_the_control_is_not_separated_and_a_slower_contender_leaves():
    # "top" has the highest median, but one of its runs is below the control's: within noise of it.
    # "low" is below every run of "top": it leaves the contest; the control never does.
    r = one_round(entry("control", CONTROL, control=True), entry("top", [300.0, 90.0, 310.0]),
                  entry("low", [50.0, 51.0, 49.0]))
    assert r.winner is r.entries["top"] and not r.separated
    assert r.stop == "the round budget (1) is spent"
    assert r.entries["low"].dropped == "slower than top (round 1)"
    assert r.entries["control"].dropped is None
    assert r.meta["rounds"][0]["verdicts"]["control"].startswith("within noise (")


def test_the_gate_refuses_the_fastest_preset_and_the_next_fastest_that_passes_wins():
    different = [[1, 2, 3, 4], [5, 6, 0], [8, 9]]  # 2 of 3 identical: 67 %, below the default 75 %
    r = one_round(entry("control", CONTROL, control=True), entry("rejected", [400.0, 404.0, 396.0], different),
                  entry("kept", [200.0, 204.0, 198.0]))
    assert r.winner is r.entries["kept"] and r.separated
    assert r.entries["rejected"].rejected.startswith("agreement 67% < 75% (2/3 identical, first difference at "
                                                     "token 2 (p1))")
    assert r.entries["kept"].rejected is None and r.entries["kept"].quality.identical_share == 1.0
    # the same answers pass a gate of 2/3
    opened = one_round(entry("control", CONTROL, control=True), entry("rejected", [400.0, 404.0, 396.0], different),
                       entry("kept", [200.0, 204.0, 198.0]), gate=QualityGate(accept="off", min_agreement=2 / 3))
    assert opened.winner is opened.entries["rejected"]


def test_an_answer_that_is_a_prefix_of_the_controls_does_not_pass_the_gate():
    prefix = [[1, 2, 3], [5, 6, 7], [8, 9]]  # the first answer stops one token early
    r = one_round(entry("control", CONTROL, control=True), entry("short", [200.0, 204.0, 198.0], prefix),
                  gate=QualityGate(accept="off", min_agreement=1.0))
    assert r.entries["short"].rejected is not None and r.winner is r.entries["control"]
    assert r.stop.startswith("no other contender is left after round 1")


def test_the_gate_refuses_a_recall_drop_beyond_the_one_allowed():
    found = [True, True, True, True]
    half = [True, False, True, False]
    strict = one_round(entry("control", CONTROL, control=True, recall=found),
                       entry("forgets", [200.0, 204.0, 198.0], recall=half))
    assert strict.entries["forgets"].rejected == "recall 50% below the control's 100%"
    assert strict.winner is strict.entries["control"]
    allowed = one_round(entry("control", CONTROL, control=True, recall=found),
                        entry("forgets", [200.0, 204.0, 198.0], recall=half), gate=QualityGate(accept="off", max_recall_drop=0.5))
    assert allowed.entries["forgets"].rejected is None and allowed.winner is allowed.entries["forgets"]



def verdict_contenders() -> tuple[search.Entry, ...]:
    reference = [0.9, 0.1]
    return (entry("control", CONTROL, control=True, distribution=reference),
            entry("lossy", [400.0, 404.0, 396.0], distribution=[0.5, 0.5]),
            entry("unscored", [300.0, 304.0, 296.0]),
            # its greedy answers differ (2/3 identical), but the verdict judges instead of agreement
            entry("same", [200.0, 204.0, 198.0], [[1, 2, 3, 4], [5, 6, 0], [8, 9]], distribution=reference))


def test_the_verdict_gate_refuses_a_lossy_or_unscored_preset_and_accepts_any_verdict_when_asked():
    r = one_round(*verdict_contenders(), gate=QualityGate())  # the default: near-lossless
    assert r.winner is r.entries["same"] and r.entries["same"].quality.verdict == "lossless"
    lossy = r.entries["lossy"].rejected
    assert lossy.startswith("lossy (KLD 0.3") and lossy.endswith("(the gate accepts near-lossless)")
    assert r.entries["unscored"].rejected == "quality not scored: no token distributions were measured"
    anything = one_round(*verdict_contenders(), gate=QualityGate(accept="any"))
    assert anything.winner is anything.entries["lossy"] and anything.entries["lossy"].rejected is None
