"""The report: results files merged into rows, verdicts against a baseline, and the tables, summary,
chart, HTML page and exports built from them.

- ``rows.py``: loading and merging results into ``Row`` objects, preset facts, speed-up and verdict per row
- ``verdict.py``: faster / slower / within noise, with the ratio and its exact interval
- ``table.py``: the tables, declared once as columns (Markdown, HTML, JSON and CSV all render them)
- ``summary.py``: the summary lines; ``chart.py``: the figure; ``html.py``: the self-contained page;
  ``export.py``: JSON and CSV
"""

from llm_bench.preset_args import describe_preset, kv_types, parse_args, preset_facts, speculation
from llm_bench.report.rows import (
    context_of,
    find_baseline,
    load_rows,
    load_sets,
    rows_from_sets,
    rows_of,
    sort_fastest_first,
    speed_rows,
    speedup,
    speedup_text,
    verdict_of,
)
from llm_bench.report.summary import summary, summary_sections
from llm_bench.report.table import all_tables, main_table, markdown_table
from llm_bench.tables import Row, acceptance_text, notes_of

__all__ = [
    "Row", "acceptance_text", "all_tables", "context_of", "describe_preset", "find_baseline", "kv_types",
    "load_rows", "load_sets", "main_table", "markdown_table", "notes_of", "parse_args", "preset_facts",
    "rows_from_sets", "rows_of", "sort_fastest_first", "speculation", "speed_rows", "speedup", "speedup_text",
    "summary", "summary_sections", "verdict_of",
]
