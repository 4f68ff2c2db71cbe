"""`run --workload quality` alone, then `report FILE --baseline ALIAS`, as a newcomer does it, on a real router:
the baseline is the alias's quality record (there is no speed record to be the baseline), and every output of
the report works with it."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from llm_bench.cli import main


@pytest.fixture(scope="module")
def quality_file(router, tmp_path_factory):
    out = tmp_path_factory.mktemp("quality-only")
    result = CliRunner().invoke(main, ["run", "--url", router.url, "--alias", "tiny-plain,tiny-ngram",
                                       "--workload", "quality", "--output-dir", str(out)], catch_exceptions=False)
    assert result.exit_code == 0, result.output
    (path,) = out.glob("*.toml")
    return path, result


def report(*args: str):
    return CliRunner().invoke(main, ["report", *args], catch_exceptions=False)


def test_report_with_a_baseline_measured_only_for_quality(quality_file, tmp_path):
    path, _ = quality_file
    result = report(str(path), "--baseline", "tiny-plain", "--html", str(tmp_path / "report.html"))
    assert result.exit_code == 0, result.output
    assert "is not among the configurations" not in result.output
    assert "| Configuration | Agreement with tiny-plain |" in result.output
    lines = {line.split(" | ")[0].strip("| "): line for line in result.output.splitlines() if line.startswith("| tiny")}
    assert "| reference |" in lines["tiny-plain"]
    assert "% identical" in lines["tiny-ngram"]  # scored against the baseline's answers
    assert "Agreement with tiny-plain" in (tmp_path / "report.html").read_text()

    data = json.loads(report(str(path), "--baseline", "tiny-plain", "--format", "json").output)
    assert data["baseline"] == "tiny-plain [quality]"
    agreement = {row["configuration"]: row["agreement"] for row in data["quality"]}
    assert agreement["tiny-ngram"] is not None and agreement["tiny-plain"] is None

    assert report(str(path), "--baseline", "tiny-plain", "--format", "csv").exit_code == 0


def test_an_unknown_baseline_still_lists_the_configurations(quality_file):
    path, _ = quality_file
    result = report(str(path), "--baseline", "nope")
    assert result.exit_code == 2
    assert "baseline 'nope' is not among the configurations: tiny-plain [quality], tiny-ngram [quality]" \
        in result.output


def test_a_chart_of_a_quality_only_file_says_why_there_is_none(quality_file, tmp_path):
    path, _ = quality_file
    result = report(str(path), "--baseline", "tiny-plain", "--chart", str(tmp_path / "chart.png"))
    assert result.exit_code == 2
    assert "no speed workload (standard, categories) was measured" in result.output
    assert "every alias failed" not in result.output  # none did
