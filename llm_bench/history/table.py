"""The history table, declared once as ``Column``s (Markdown, HTML, JSON and CSV all come from it), and the
lines that go with it: regressions, refusals, skips, files set aside."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from llm_bench.history.points import Inputs
from llm_bench.history.steps import REGRESSION, History, Step
from llm_bench.report.export import table_csv
from llm_bench.report.verdict import CONFIDENCE, MIN_EFFECT, Verdict
from llm_bench.support.numbers import fmt
from llm_bench.support.stats import median_interval
from llm_bench.tables import Cell, Column, Row, Table

JSON_FORMAT = "llm-bench-history/1"


def _verdict_values(prefix: str, v: Verdict | None) -> dict[str, Any]:
    return {f"{prefix}_verdict": None if v is None else v.kind, f"{prefix}_ratio": None if v is None else v.ratio,
            f"{prefix}_low": None if v is None else v.low, f"{prefix}_high": None if v is None else v.high,
            f"{prefix}_confidence": None if v is None else v.confidence}


def _median_cell(row: Row, metric: str, key: str, digits: int) -> Cell:
    values = [getattr(run, metric) for run in row.record.runs]
    summary = row.record.summary(metric)
    band = median_interval(values)
    if summary is None:
        return Cell("-", {key: None})
    text = fmt(summary.median, digits)
    if band is not None:
        text += f" [{fmt(band[0], digits)}, {fmt(band[1], digits)}]"
    return Cell(text, {key: summary.median, f"{key}_low": None if band is None else band[0],
                       f"{key}_high": None if band is None else band[1], f"{key}_runs": len(values)})


def _step_cell(row: Row, step: Step) -> Cell:
    return Cell(step.kind.upper() if step.kind == REGRESSION else step.kind,
                {"step": step.kind, "regression": step.regression})


def _decode_verdict(row: Row, step: Step) -> Cell:
    v = step.decode
    return Cell("-" if v is None else v.describe(), _verdict_values("decode", v) | {"decode_metric": step.metric})


def _ttft_verdict(row: Row, step: Step) -> Cell:
    v = step.ttft
    return Cell("-" if v is None else v.describe(), _verdict_values("ttft", v))


def _against(row: Row, step: Step) -> Cell:
    prev = step.previous
    return Cell("-" if prev is None else f"{prev.started_at:%Y-%m-%d %H:%M} {prev.build.describe()}",
                {"previous_file": None if prev is None else str(prev.path),
                 "previous_build": None if prev is None else prev.build.describe()})


COLUMNS: list[Column[Step]] = [
    Column("Configuration", lambda r, s: Cell(s.point.name, {"configuration": s.point.name,
                                                             "model": s.point.model,
                                                             "series": s.point.configuration,
                                                             "label": s.point.record.target or None,
                                                             "specialisation": s.point.specialisation or None}),
           text=True),
    Column("When", lambda r, s: Cell(f"{s.point.started_at:%Y-%m-%d %H:%M}",
                                     {"started_at": s.point.started_at.isoformat(), "file": str(s.point.path)}),
           text=True),
    Column("Build", lambda r, s: Cell(s.point.build.describe(), {
        "build": s.point.build.describe(), "llama_cpp_version": s.point.build.version,
        "package_path": s.point.build.package_path, "nixpkgs_revision": s.point.build.nixpkgs_revision,
        "server_build": s.point.build.server_build}), text=True),
    Column("Decode t/s [95% CI]", lambda r, s: _median_cell(r, s.metric, "decode_tps", 1)),
    Column("TTFT ms [95% CI]", lambda r, s: _median_cell(r, "ttft_ms", "ttft_ms", 0)),
    Column("Step", _step_cell, text=True),
    Column("Decode vs previous", _decode_verdict, text=True),
    Column("TTFT vs previous", _ttft_verdict, text=True),
    Column("Against", _against, text=True),
    Column("Notes", lambda r, s: Cell("; ".join(x for x in (s.rig_note, s.note)
                                                if x), {"rig_changes": list(s.rig) or None, "note": s.note or None}),
           text=True),
]


def row_of(step: Step) -> Row:
    return Row(step.point.name, step.point.record, str(step.point.record.target), step.point.record.engine)


def history_table(history: History) -> Table:
    return Table("History", "history", [c.name for c in COLUMNS],
                 [[c.cell(row_of(s), s) for c in COLUMNS] for s in history.steps],
                 text_columns=frozenset(c.name for c in COLUMNS if c.text))


def lines(history: History, inputs: Inputs) -> list[str]:
    """What a person must read beside the table: each regression by its two builds, each refusal, each skip."""
    out = [s.describe() + f" [{s.point.name}, {s.point.path.name}]" for s in history.steps if s.regression]
    out.extend(f"not compared: {r.describe()}" for r in history.refusals)
    out.extend(f"skipped {s.started_at:%Y-%m-%d %H:%M} ({s.alias}): {s.reason} [{s.path.name}]" for s in inputs.skips)
    out.extend(f"set aside: {why}" for why in inputs.ignored)
    return out


def markdown_lines(history: History, inputs: Inputs) -> str:
    from llm_bench.tables import markdown  # noqa: PLC0415 - one renderer, kept beside its table

    text = markdown(history_table(history))
    extra = lines(history, inputs)
    return text + ("\n" + "\n".join(f"- {line}" for line in extra) + "\n" if extra else "")


def history_data(history: History, inputs: Inputs, min_effect: float | None = None) -> dict[str, Any]:
    table = history_table(history)
    return {
        "format": JSON_FORMAT,
        "verdict_method": {"confidence": CONFIDENCE, "min_effect": MIN_EFFECT if min_effect is None else min_effect},
        "columns": table.columns,
        "history": table.records(),
        "regressions": [{"configuration": s.point.name, "file": str(s.point.path), "from": s.previous.build.describe(),
                         "to": s.point.build.describe(), "newest": s in history.newest()}
                        for s in history.steps if s.regression and s.previous is not None],
        "not_compared": [{"configuration": r.name, "earlier": str(r.earlier.path), "later": str(r.later.path),
                          "reason": r.reason} for r in history.refusals],
        "skipped": [{"alias": s.alias, "started_at": s.started_at.isoformat(), "reason": s.reason, "file": str(s.path)}
                    for s in inputs.skips],
        "set_aside": list(inputs.ignored),
    }


def to_json(history: History, inputs: Inputs, min_effect: float | None = None) -> str:
    return json.dumps(history_data(history, inputs, min_effect), indent=2, ensure_ascii=False) + "\n"


def to_csv(history: History) -> str:
    return table_csv(history_table(history))


def newest_first(steps: Sequence[Step]) -> list[Step]:
    return sorted(steps, key=lambda s: s.point.started_at, reverse=True)
