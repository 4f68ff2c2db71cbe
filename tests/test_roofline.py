"""The memory-bandwidth roofline: formula, model size from the router's arguments, table and chart."""

from __future__ import annotations

import pytest

from llm_bench.engines.metrics import SpecCounters
from llm_bench.gpu import roofline
from llm_bench.gpu.nvml import memory_bandwidth_gbs
from llm_bench.report import Row, markdown_table
from llm_bench.report.chart import draw_chart
from llm_bench.results import AliasRecord, RunRecord


def test_bandwidth_formula_matches_published_figures():
    assert memory_bandwidth_gbs(9751, 384) == pytest.approx(936.1, abs=0.1)  # RTX 3090, GDDR6X
    assert memory_bandwidth_gbs(10501, 384) == pytest.approx(1008.1, abs=0.1)  # RTX 4090
    assert memory_bandwidth_gbs(2619, 5120) == pytest.approx(3352, abs=1)  # H100 SXM, HBM3


def test_model_size_from_the_router_arguments(tmp_path):
    model = tmp_path / "m.gguf"
    model.write_bytes(b"\0" * 1000)
    args = ["llama-server", "--alias", "a", "--model", str(model), "--ctx-size", "2048"]
    assert roofline.model_path(args) == str(model) and roofline.model_bytes(str(model)) == 1000
    for n in (1, 2, 3):
        (tmp_path / f"big-0000{n}-of-00003.gguf").write_bytes(b"\0" * 100 * n)
    assert roofline.model_bytes(tmp_path / "big-00001-of-00003.gguf") == 600
    assert roofline.model_bytes(tmp_path / "absent.gguf") is None


def record(alias: str, tps: float, size: int, spec: SpecCounters | None = None, args=()) -> AliasRecord:
    r = AliasRecord(alias=alias, runs=[RunRecord(decode_tps=tps)], spec=spec, preset_args=list(args))
    roofline.apply(r, 936.0, size)
    return r


def test_bound_and_speculative_multiplier():
    plain = record("plain", 30.0, 18_000_000_000)
    assert plain.roofline_tps == pytest.approx(52.0)
    vllm = record("mtp", 60.0, 18_000_000_000, SpecCounters(300.0, 200.0, drafts=100.0))
    assert vllm.roofline_tps == pytest.approx(52.0 * 3.0)  # mean acceptance length 1 + 200/100
    llama = record("draft", 60.0, 18_000_000_000, SpecCounters(400.0, 200.0),
                   args=["--spec-draft-n-max", "4"])  # no rounds reported: 1 + 0.5 x 4
    assert llama.roofline_tps == pytest.approx(52.0 * 3.0)


def test_table_column_and_chart_marker(tmp_path):
    rows = [Row(r.alias, r, "", "llama-cpp") for r in
            (record("plain", 30.0, 18_000_000_000), record("fast", 45.0, 18_000_000_000))]
    table = markdown_table(rows)
    assert "Roofline t/s (reached)" in table and "52.0 (58%)" in table and "52.0 (87%)" in table
    chart = draw_chart(rows, tmp_path / "chart.png")
    assert chart.read_bytes()[:4] == b"\x89PNG"
    plain_only = [Row("x", AliasRecord(alias="x", runs=[RunRecord(decode_tps=1.0)]), "", "llama-cpp")]
    assert "Roofline" not in markdown_table(plain_only)
