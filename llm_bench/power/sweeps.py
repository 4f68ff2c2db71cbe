"""The ``llm-bench power`` results file: its format, a sweep read back, its table, and its report source
(the power-limit table beside a run's, in the Markdown, the exports and the HTML page)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from llm_bench.report.sources import Shown, Source
from llm_bench.results import ResultsFileError
from llm_bench.support.numbers import fmt
from llm_bench.tables import Cell, Table, markdown

FORMAT = "llm-bench-power/1"


@dataclass(frozen=True)
class PowerSweep:
    """One ``llm-bench power`` file: its provenance and one mapping per power limit (power.limits.LimitResult)."""

    path: Path
    meta: dict
    limits: list[dict]


def sweep_of(path: Path, data: dict[str, Any]) -> PowerSweep:
    """A power results file, as ``results.read_toml`` read it."""
    meta, limits = data.get("meta"), data.get("limits", [])
    if not isinstance(meta, dict) or meta.get("format") != FORMAT:
        raise ResultsFileError(f"{path} is not an llm-bench power results file (no meta.format = {FORMAT!r})")
    if not isinstance(limits, list) or not all(isinstance(limit, dict) for limit in limits):
        raise ResultsFileError(f"{path}: a power results file whose limits are not a list of tables")
    return PowerSweep(path, meta, list(limits))


def power_table(sweeps: Sequence[PowerSweep]) -> Table | None:
    """``llm-bench power`` sweeps: decode rate, energy and heat at each power limit."""
    if not sweeps:
        return None
    header = ["Configuration", "Limit W", "Decode t/s", "Tokens/J", "J/token", "Mean power W", "Max temp C",
              "SM clock MHz", "Energy from", "Notes"]
    fields = [("limit_w", 0), ("decode_tps", 1), ("tokens_per_joule", 3), ("joules_per_token", 2),
              ("mean_power_w", 1), ("max_temperature_c", 0), ("mean_sm_clock_mhz", 0)]
    lines = []
    for sweep in sweeps:
        name = str(sweep.meta.get("alias", sweep.path.name))
        for limit in sweep.limits:
            figures = {k: v for k, v in limit.items() if isinstance(v, (int, float)) and not isinstance(v, bool)}
            if figures.get("tokens_per_joule"):
                figures["joules_per_token"] = 1.0 / figures["tokens_per_joule"]
            cells = [Cell(name, {"configuration": name})]
            cells += [Cell(fmt(figures.get(key), digits), {key: figures.get(key)}) for key, digits in fields]
            cells.append(Cell(str(limit.get("energy_source", "-")), {"energy_source": limit.get("energy_source")}))
            errors = [str(e) for e in limit.get("errors", [])]
            cells.append(Cell("FAILED: " + "; ".join(errors) if errors else "", {"errors": errors}))
            lines.append(cells)
    return Table("Power limits", "power", header, lines, frozenset({"Configuration", "Energy from", "Notes"}))


def show(sweeps: Sequence[PowerSweep]) -> Shown:
    table = power_table(sweeps)
    return Shown(markdown=markdown(table) if table else "", tables=(table,) if table else (),
                 provenance=tuple(dict(s.meta, label=f"power sweep {s.path.name}") for s in sweeps))


SOURCE = Source("power", FORMAT, "power", load=sweep_of, show=show, beside_rows=True)
