"""The answer, one sentence per alias and loop, and the table of levels behind it."""

from __future__ import annotations

from llm_bench.capacity.records import AliasCapacity, Level, Search
from llm_bench.capacity.settings import Objective
from llm_bench.support.numbers import fmt
from llm_bench.support.stats import Tail
from llm_bench.tables import Cell, Table
from llm_bench.tables import markdown as table_markdown

STOPPED = {
    "max_requests": "the search's request bound (--max-requests) was reached",
    "max_duration": "the search's time bound (--max-duration-s) was reached",
    "client-bound": "the client lagged more than 1 % of the TTFT objective, so the next level measured the client",
    "server-gone": "the server went away",
    "interrupted": "interrupted",
}


def amount(loop: str, level: float) -> str:
    if loop == "closed":
        return f"{level:g} concurrent session{'' if level == 1 else 's'}"
    return f"{level:g} requests/min"


def _breaks(loop: str, level: Level, objective: Objective) -> str:
    j = level.judgement or level.judge(objective)
    parts = j.broken()
    what = (f"the {' and '.join(parts)} objective{'s' if len(parts) > 1 else ''}" if parts else "the objective")
    verb = "breaks" if loop == "closed" and level.level == 1 else "break"
    shown = f"{level.level:g}" + ("" if loop == "closed" else " requests/min")
    return f"{shown} {verb} {what} ({level.cause(objective)})"


def _goodput(search: Search, level: float) -> str:
    carried = search.level(level)
    j = None if carried is None else carried.judgement
    if search.loop != "open" or j is None or j.goodput_per_min is None:
        return ""
    # a window's Poisson arrivals scatter around the nominal rate, so its own figures are shown beside it
    return f" (goodput {j.goodput_per_min:.1f} of {j.throughput_per_min:.1f} requests/min in its window)"


def answer_sentence(alias: str, search: Search, objective: Objective) -> str:
    loop, goal = search.loop, objective.describe()
    carried = search.carried
    broken = None if search.broken_at is None else search.level(search.broken_at)
    breaks = "" if broken is None else _breaks(loop, broken, objective)
    if search.stopped_by == "found" and carried is not None and broken is not None:
        return f"{alias} carries {amount(loop, carried)}{_goodput(search, carried)} at {goal}; {breaks}"
    if search.stopped_by == "ceiling" and carried is not None:
        return (f"{alias} carries at least {amount(loop, carried)}{_goodput(search, carried)} at {goal}: the "
                f"search's ceiling ({search.ceiling_reason})")
    if search.stopped_by == "none-meets" and broken is not None:
        return f"{alias} does not carry even {amount(loop, broken.level)} at {goal}: {breaks}"
    why = STOPPED.get(search.stopped_by or "", search.stopped_by or "unknown")
    if carried is not None:
        return (f"{alias} carries at least {amount(loop, carried)}{_goodput(search, carried)} at {goal}"
                + (f"; {breaks}" if breaks else "") + f"; the search stopped before narrowing it down: {why}")
    if broken is not None:
        return f"{alias}: {breaks}; no lower level was measured: {why}"
    return f"{alias}: no answer for the {loop} loop: {why} before any level was judged"


def _cell(tail: Tail | None, digits: int = 1) -> str:
    """The percentile's value, or 'max 2310 (n=12)' where the samples were too few for it."""
    if tail is None:
        return "-"
    value = fmt(tail.value, digits)
    return value if tail.label.startswith("p") else f"{tail.label} {value} (n={tail.samples})"


def _cells(level: Level, objective: Objective) -> list[Cell]:
    j = level.judgement or level.judge(objective)
    if level.cut_short and j.meets is None:
        verdict = f"not judged ({level.cut_short})"
    elif j.client_bound:
        verdict = "refused: client-bound"
    else:
        verdict = "meets" if j.meets else f"breaks: {level.cause(objective)}"
    slots = level.slots
    queue = "-" if slots is None or not slots.samples else (
        f"{slots.busy_max}/{slots.slots} busy, {slots.waiting_max} waiting")
    texts = [f"{level.level:g}", str(j.counted), _cell(j.decode_p10), fmt(j.decode_median), _cell(j.ttft_p95, 0),
             fmt(j.ttft_median, 0), _cell(j.wait_ms_p95, 0), _cell(j.lag_p99, 2), fmt(j.throughput_per_min),
             fmt(j.goodput_per_min), queue, verdict]
    return [Cell(text) for text in texts]


COLUMNS = ["Level", "Requests", "Decode t/s p10", "median", "TTFT ms p95", "median", "Wait ms p95",
           "Client lag ms p99", "Requests/min", "Goodput/min", "Slots", "Verdict"]


def levels_table(search: Search, objective: Objective) -> Table:
    """One search's levels in the order measured."""
    return Table(None, f"capacity-{search.loop}", COLUMNS, [_cells(level, objective) for level in search.levels],
                 text_columns=frozenset({"Slots", "Verdict"}))


def markdown(aliases: list[AliasCapacity], objective: Objective) -> str:
    """The answers, then each search's levels in the order measured."""
    lines = [f"# Capacity at {objective.describe()}", ""]
    lines += [f"- {s.answer}" for a in aliases for s in a.searches]
    lines += [f"- {a.alias}: {e}" for a in aliases for e in a.errors]
    for alias in aliases:
        for search in alias.searches:
            unit = "streams" if search.loop == "closed" else "requests/min"
            lines += ["", f"## {alias.alias}: {search.loop} loop (level = {unit})", "",
                      table_markdown(levels_table(search, objective)).rstrip("\n")]
    return "\n".join(lines) + "\n"
