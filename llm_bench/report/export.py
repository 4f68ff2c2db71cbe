"""Machine-readable exports of the report's tables: JSON (every table) and CSV (one table, the main one by default).

Both carry the raw values behind every column of ``table.MAIN_COLUMNS`` (see docs/report.md, "JSON and CSV
export"), so a figure in the exports is the one the Markdown and HTML tables show, unrounded.
"""

from __future__ import annotations

import csv
import io
import json
from collections.abc import Sequence
from typing import Any

from llm_bench.report.table import all_tables, main_table
from llm_bench.report.verdict import CONFIDENCE, MIN_EFFECT
from llm_bench.tables import Row, Table

JSON_FORMAT = "llm-bench-report/1"


def report_data(rows: Sequence[Row], baseline: Row | None = None, min_effect: float | None = None,
                extra: Sequence[Table] = ()) -> dict[str, Any]:
    """Every table, with the verdicts' method; ``extra``: the tables of other results files (report.sources)."""
    tables = all_tables(rows, baseline, min_effect) + list(extra)
    return {
        "format": JSON_FORMAT,
        "baseline": None if baseline is None else baseline.configuration,
        "verdict_method": {"confidence": CONFIDENCE, "min_effect": MIN_EFFECT if min_effect is None else min_effect},
        "columns": next((t.columns for t in tables if t.key == "main"), []),
        **{t.key: t.records() for t in tables},
    }


def to_json(rows: Sequence[Row], baseline: Row | None = None, min_effect: float | None = None,
            extra: Sequence[Table] = ()) -> str:
    return json.dumps(report_data(rows, baseline, min_effect, extra), indent=2, ensure_ascii=False) + "\n"


def _csv_value(value: Any) -> Any:
    if value is None:
        return ""
    if isinstance(value, list):
        return "; ".join(str(v) for v in value)
    if isinstance(value, float):
        return repr(value)  # shortest text that reads back as the same float
    return value


def table_csv(table: Table) -> str:
    out = io.StringIO()
    keys = table.keys()
    writer = csv.DictWriter(out, fieldnames=keys, lineterminator="\n")
    writer.writeheader()
    for record in table.records():
        writer.writerow({k: _csv_value(record.get(k)) for k in keys})
    return out.getvalue()


def to_csv(rows: Sequence[Row], baseline: Row | None = None, min_effect: float | None = None,
           table: str = "main", extra: Sequence[Table] = ()) -> str:
    """One table (by its JSON key; the main table by default), one line per row, one column per key (empty
    where there is no figure)."""
    if table == "main":
        return table_csv(main_table(rows, baseline, min_effect))
    tables = {t.key: t for t in [*all_tables(rows, baseline, min_effect), *extra]}
    if table not in tables:
        raise ValueError(f"--table {table}: these results have no such table; they have: "
                         f"{', '.join(['main', *(k for k in tables if k != 'main')])}")
    return table_csv(tables[table])
