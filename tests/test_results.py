import re
import tomllib
from datetime import datetime, timezone

import pytest

from llm_bench.results import (
    AliasRecord,
    ResultSet,
    ResultsFileError,
    ResultsWriter,
    RunRecord,
    load_results,
    reserved_order,
    results_stem,
    spec_from_runs,
)
from llm_bench.support.stats import percentile
from llm_bench.workloads import PARTS


def record() -> AliasRecord:
    runs = [RunRecord(decode_tps=10.0, ttft_ms=5, draft_n=10, draft_n_accepted=4, output_tokens=64),
            RunRecord(decode_tps=30.0, ttft_ms=7, draft_n=10, draft_n_accepted=6, output_tokens=64),
            RunRecord(decode_tps=20.0, ttft_ms=6, output_tokens=64)]
    return AliasRecord(alias="a", runs=runs, spec=spec_from_runs(runs),
                       vram_unavailable="pynvml is not installed", cold_load_s=1.5)


def test_summary_fields_and_absent_figures(tmp_path):
    writer = ResultsWriter(tmp_path, ResultSet({"format": "llm-bench/1", "label": "x"}), "stem")
    writer.add(record())
    data = tomllib.loads(writer.path.read_text())
    (a,) = data["aliases"]
    assert (a["decode_tps_median"], a["decode_tps_min"], a["decode_tps_max"]) == (20.0, 10.0, 30.0)
    assert a["draft_acceptance"] == pytest.approx(0.5)  # (4 + 6) / (10 + 10), summed over runs
    assert a["output_tokens"] == 64
    assert "vram_used_mib_before" not in a  # unknown, so absent: never 0
    assert a["vram_unavailable"] == "pynvml is not installed"
    assert "client_decode_tps_median" not in a
    assert a["errors"] == []
    assert len(a["runs"]) == 3


def test_no_drafting_means_no_acceptance_key(tmp_path):
    writer = ResultsWriter(tmp_path, ResultSet({"format": "llm-bench/1"}), "stem")
    writer.add(AliasRecord(alias="b", runs=[RunRecord(decode_tps=1.0)]))
    assert "draft_acceptance" not in tomllib.loads(writer.path.read_text())["aliases"][0]


def test_round_trip(tmp_path):
    writer = ResultsWriter(tmp_path, ResultSet({"format": "llm-bench/1", "label": "x"}), "stem")
    writer.add(record())
    writer.finish(datetime(2026, 11, 30, tzinfo=timezone.utc))
    loaded = load_results(writer.path, PARTS)
    assert loaded.meta["complete"] is True
    assert loaded.aliases[0].runs[1].decode_tps == 30.0
    assert loaded.aliases[0].spec.acceptance_rate == pytest.approx(0.5)


def test_never_overwrites(tmp_path):
    first = ResultsWriter(tmp_path, ResultSet({"format": "llm-bench/1"}), "same")
    second = ResultsWriter(tmp_path, ResultSet({"format": "llm-bench/1"}), "same")
    assert first.path != second.path
    assert first.path.exists() and second.path.exists()


@pytest.mark.parametrize("stem", ["llm-bench-20260102-030405-tune-qwen", "llm-bench-20260102-030405-tune-qwen-2"])
def test_files_of_one_second_sort_in_the_order_they_were_reserved(tmp_path, stem):
    made = [ResultsWriter(tmp_path, ResultSet({"format": "llm-bench/1"}), stem).path for _ in range(11)]
    later = ResultsWriter(tmp_path, ResultSet({"format": "llm-bench/1"}), "llm-bench-20260102-030406-tune-qwen").path
    assert made[1].name == f"{stem}-2.toml" and made[10].name == f"{stem}-11.toml"
    assert sorted(reversed([*made, later]), key=reserved_order) == [*made, later]


def test_stem_is_safe_for_file_names():
    stem = results_stem(datetime(2026, 1, 2, 3, 4, 5), "llm-llamampere / turbo")
    assert stem == "llm-bench-20260102-030405-llm-llamampere---turbo"


def test_not_a_results_file(tmp_path):
    path = tmp_path / "x.toml"
    path.write_text("a = 1\n")
    with pytest.raises(ResultsFileError, match="not an llm-bench results file"):
        load_results(path, PARTS)
    path.write_text("a = \n")
    with pytest.raises(ResultsFileError, match="not valid TOML"):
        load_results(path, PARTS)
    path.write_bytes(b"\x89PNG\r\n")  # a chart given by mistake
    with pytest.raises(ResultsFileError, match=re.escape(f"{path} is not a text file")):
        load_results(path, PARTS)
    with pytest.raises(ResultsFileError, match=re.escape(f"{tmp_path} cannot be read")):
        load_results(tmp_path, PARTS)  # a folder: IsADirectoryError


def test_percentile_interpolates_like_numpy():
    assert percentile([1.0, 2.0, 3.0, 4.0], 50) == 2.5
    assert percentile([1.0, 2.0, 3.0, 4.0], 90) == pytest.approx(3.7)
    assert percentile([5.0], 99) == 5.0
