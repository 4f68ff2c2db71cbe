"""Each point of a configuration's history against the one before it: the step's kind and its verdict.

The verdict is the report's (``report.verdict``: the Hodges-Lehmann ratio with its exact interval) on the
per-run decode rates, and on TTFT the other way round (a lower TTFT is faster). What a step is called:

- a new build: ``regression`` when its decode is slower beyond noise, whatever else changed with it (a
  ``nixos-rebuild`` after ``nix flake update`` moves llama.cpp and the NVIDIA driver together: the most common
  update must alert), each rig fact that changed with it named as a co-suspect; else ``faster``,
  ``within noise`` or ``too few runs`` as the verdict says, the co-changed rig facts noted;
- the same build with a rig fact changed (power limit, PCIe width, driver, memory busy before the load, the
  CPU governor): ``rig change``; the speed may have moved with it, and no build is blamed;
- the same build and rig: ``twins``; their verdict shows the noise, and is never a regression.

Points of one configuration whose model, preset arguments or protocol differ are never compared; each such
boundary is a ``Refusal`` with its reason. The label (a run's target) is no part of the configuration.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field

from llm_bench.history.points import Point, made_order, rig_changes
from llm_bench.report.verdict import FASTER, SLOWER, TOO_FEW_RUNS, WITHIN_NOISE, Verdict, verdict

REGRESSION = "regression"
TWINS = "twins"
RIG_CHANGE = "rig change"
FIRST = "first"
STEP_KINDS = (FIRST, REGRESSION, FASTER, WITHIN_NOISE, TOO_FEW_RUNS, TWINS, RIG_CHANGE)


@dataclass(frozen=True)
class Step:
    """A point and what it is against the point before it (None for a series' first)."""

    point: Point
    previous: Point | None
    kind: str
    decode: Verdict | None = None
    ttft: Verdict | None = None
    metric: str = "decode_tps"
    rig: tuple[str, ...] = ()
    note: str = ""

    @property
    def regression(self) -> bool:
        return self.kind == REGRESSION

    def describe(self) -> str:
        if self.previous is None:
            return "first result of this configuration"
        if self.kind == REGRESSION:
            return (f"REGRESSION: decode {self.decode.describe() if self.decode else '-'} from "
                    f"{self.previous.build.describe()} to {self.point.build.describe()}"
                    + (f"; co-suspects, changed with the build: {'; '.join(self.rig)}" if self.rig else ""))
        if self.kind == RIG_CHANGE:
            return f"rig change ({'; '.join(self.rig)}), not blamed on the build"
        if self.kind == TWINS:
            return f"twins (same build): {self.decode.describe() if self.decode else '-'} is the noise"
        return self.decode.describe() if self.decode else self.kind

    @property
    def rig_note(self) -> str:
        """The rig facts that changed at this step, said as what they are to the step's verdict."""
        if not self.rig:
            return ""
        if self.kind == RIG_CHANGE:
            return f"rig: {'; '.join(self.rig)}"
        return f"changed with the build (co-suspects): {'; '.join(self.rig)}"


@dataclass(frozen=True)
class Refusal:
    """Two consecutive results of one configuration name that are not compared, and why."""

    name: str
    earlier: Point
    later: Point
    reason: str

    def describe(self) -> str:
        return f"{self.name}: {self.later.path.name} is not compared with {self.earlier.path.name}: {self.reason}"


def decode_metric(a: Point, b: Point) -> str | None:
    """The rate both points measured: the server's own decode rate, else the stream's; None if neither."""
    for metric in ("decode_tps", "client_decode_tps"):
        if a.record.summary(metric) and b.record.summary(metric):
            return metric
    return None


def judge(previous: Point, current: Point, min_effect: float | None = None) -> Step:
    """The step from ``previous`` to ``current`` (the same configuration, protocol and model)."""
    effect = {} if min_effect is None else {"min_effect": min_effect}
    metric = decode_metric(previous, current)
    if metric is None:
        return Step(current, previous, TOO_FEW_RUNS, note="no decode rate measured on both sides")
    decode = verdict(current.decode_values(metric), previous.decode_values(metric), **effect)
    # TTFT: lower is faster, so the candidate is the earlier one (ratio > 1: this one answers sooner)
    ttft = verdict(previous.ttft_values(), current.ttft_values(), **effect)
    rig = tuple(rig_changes(previous.rig, current.rig))
    if previous.build.identity == current.build.identity:
        kind = RIG_CHANGE if rig else TWINS
    elif decode.kind == SLOWER:
        kind = REGRESSION
    else:
        kind = decode.kind
    return Step(current, previous, kind, decode, ttft, metric, rig)


def _difference(a: Point, b: Point) -> str | None:
    """Why two points of one name are not comparable; None when they are."""
    if a.model != b.model:
        return f"the model differs ({a.model} vs {b.model})"
    if a.args != b.args:
        return f"the preset's arguments differ ({' '.join(a.args)} vs {' '.join(b.args)})"
    if a.protocol != b.protocol:
        pa, pb = json.loads(a.protocol), json.loads(b.protocol)
        keys = sorted(k for k in set(pa) | set(pb) if pa.get(k) != pb.get(k))
        shown = ", ".join(f"{k} {pa.get(k, '(unset)')} vs {pb.get(k, '(unset)')}" for k in keys[:4])
        return f"the protocol differs ({shown}{', ...' if len(keys) > 4 else ''})"
    return None


@dataclass
class History:
    steps: list[Step] = field(default_factory=list)  # series by series, each in time order
    refusals: list[Refusal] = field(default_factory=list)

    def newest(self) -> list[Step]:
        """Each series' newest step."""
        last: dict[tuple[str, ...], Step] = {}
        for step in self.steps:
            last[step.point.series] = step
        return list(last.values())

    def newest_regressions(self) -> list[Step]:
        return [s for s in self.newest() if s.regression]


def history_of(points: Sequence[Point], min_effect: float | None = None) -> History:
    """Every point judged against the one before it in its series; every incomparable boundary refused."""
    out = History()
    by_name: dict[str, list[Point]] = {}
    for p in sorted(points, key=made_order):
        by_name.setdefault(p.configuration, []).append(p)
    for name, named in by_name.items():
        for a, b in zip(named, named[1:], strict=False):
            why = _difference(a, b)
            if why is not None:
                out.refusals.append(Refusal(name, a, b, why))
        series: dict[tuple[str, ...], list[Point]] = {}
        for p in named:
            series.setdefault(p.series, []).append(p)
        for members in series.values():
            out.steps.append(Step(members[0], None, FIRST))
            out.steps.extend(judge(a, b, min_effect) for a, b in zip(members, members[1:], strict=False))
    return out
