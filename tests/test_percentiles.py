"""Tail percentiles only where the samples are enough for them; otherwise the max, labelled as such."""

import pytest

from llm_bench.report import load_rows, markdown_table
from llm_bench.results import AliasRecord, ResultSet, ResultsWriter, RunRecord
from llm_bench.support.stats import min_samples, percentile
from llm_bench.workloads.concurrency import ConcurrencyLevel


def record(ttfts):
    return AliasRecord(alias="a", workload="concurrency", part=ConcurrencyLevel(4),
                       runs=[RunRecord(ttft_ms=t, decode_tps=10.0) for t in ttfts])


def test_enough_samples_rule():
    assert (min_samples(50), min_samples(90), min_samples(99)) == (1, 10, 100)


def test_p99_of_four_values_is_not_printed_as_a_percentile():
    r = record([100.0, 110.0, 120.0, 500.0])
    tail = r.tail("ttft_ms", 99)
    assert (tail.label, tail.value, tail.samples) == ("max", 500.0, 4)  # not 488.6
    saved = r.to_toml()
    assert "ttft_ms_p99" not in saved and "ttft_ms_p90" not in saved
    assert saved["ttft_ms_max"] == 500.0 and saved["ttft_ms_p50"] == 115.0


def test_ten_samples_give_p90_but_not_p99():
    r = record([float(v) for v in range(1, 11)])
    assert r.tail("ttft_ms", 90).label == "p90"
    assert r.tail("ttft_ms", 90).value == pytest.approx(percentile(list(range(1, 11)), 90))
    assert r.tail("ttft_ms", 99).label == "max"
    saved = r.to_toml()
    assert saved["ttft_ms_p90"] == pytest.approx(9.1) and "ttft_ms_p99" not in saved


def test_the_table_labels_the_max(tmp_path):
    writer = ResultsWriter(tmp_path, ResultSet({"format": "llm-bench/1", "label": "t"}), "t")
    writer.extend([record([100.0, 110.0, 120.0, 500.0])])
    table = markdown_table(load_rows([writer.path]))
    (line,) = [line for line in table.splitlines() if line.startswith("| a [x4]")]
    assert "max 500 (n=4)" in line and "488" not in line
