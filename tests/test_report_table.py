"""The main table's one declaration: every output renders the same columns, and category rows are compared
with the baseline's record of the same category."""

from __future__ import annotations

import json
from html import escape

from llm_bench.report import main_table, markdown_table, rows_from_sets
from llm_bench.report.export import to_csv, to_json
from llm_bench.report.html import render_html
from llm_bench.report.rows import base_for, find_baseline
from llm_bench.results import AliasRecord, ResultSet, RunRecord
from llm_bench.workloads.categories import PromptCategory
from llm_bench.workloads.quality.record import QualityOutput, QualityResults


def record(alias: str, rates: list[float], category: str | None = None) -> AliasRecord:
    return AliasRecord(alias=alias, workload="category" if category else "standard",
                       part=PromptCategory(category) if category else None,
                       runs=[RunRecord(decode_tps=r, client_decode_tps=r, ttft_ms=100.0, finish_reason="length")
                             for r in rates],
                       preset_args=["llama-server", "--ctx-size", "4096", "-ctk", "q8_0", "--spec-type", "draft-mtp",
                                    "--spec-draft-n-max", "2"])


def result_set() -> ResultSet:
    return ResultSet({"format": "llm-bench/1", "label": "x"}, [
        record("base", [50.0, 51.0, 49.0]),
        record("base", [80.0, 81.0, 79.0], "code"),
        record("fast", [100.0, 101.0, 99.0]),
        record("fast", [80.5, 81.5, 79.5], "code"),
    ])


def test_every_output_renders_the_one_declaration():
    rows = rows_from_sets([result_set()], qualify=False)
    base = find_baseline(rows, "base")
    table = main_table(rows, base)
    header = markdown_table(rows, base).splitlines()[0]
    assert header == "| " + " | ".join(table.columns) + " |"
    assert json.loads(to_json(rows, base))["columns"] == table.columns
    assert to_csv(rows, base).splitlines()[0].split(",") == table.keys()
    page = render_html([result_set()], "base", rows=rows)
    for column in table.columns:
        assert f'<th scope="col">{escape(column)}</th>' in page
    first = dict(zip(table.columns, (c.text for c in table.rows[0])))
    assert first["Speculation"] == "draft-mtp n=2" and first["KV"] == "q8_0/f16" and first["Context"] == "4096"


def test_a_category_is_compared_with_the_baselines_same_category():
    rows = rows_from_sets([result_set()], qualify=False)
    base = find_baseline(rows, "base")
    fast_code = next(r for r in rows if r.configuration == "fast [code]")
    assert base_for(fast_code, rows, base).configuration == "base [code]"
    data = {r["configuration"]: r for r in json.loads(to_json(rows, base))["main"]}
    assert data["fast"]["verdict"] == "faster" and data["fast"]["speedup"] == 2.0
    assert data["fast [code]"]["verdict"] == "within noise"  # 81 against 80, not against the standard 50
    assert data["base [code]"]["verdict"] == "baseline"


def test_the_html_page_carries_the_quality_section_against_the_baseline():
    def quality(alias: str, ids: list[int]) -> AliasRecord:
        return AliasRecord(alias=alias, workload="quality",
                           part=QualityResults(outputs=[QualityOutput("a", "x", len(ids), ids, "length")]))

    result = result_set()
    result.aliases += [quality("base", [1, 2, 3]), quality("fast", [1, 2, 9])]
    rows = rows_from_sets([result], qualify=False)
    page = render_html([result], "base", rows=rows)
    assert '<table id="quality">' in page and "Agreement with base" in page
    assert "0% identical" in page  # fast's one answer parts from base's at its third token
