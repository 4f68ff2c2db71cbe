"""`run --workload quality` alone (sized down by a plan), then `report FILE --baseline ALIAS`, on a real router:
the baseline is the alias's quality record (there is no speed record to be the baseline), and every output of
the report works with it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from llm_bench.cli import main
from tests.commands import only_file, small_quality_plan


@pytest.fixture(scope="module")
def quality_file(router, tmp_path_factory):
    folder = tmp_path_factory.mktemp("quality-only")
    out = folder / "out"
    plan = small_quality_plan(folder / "plan.toml")
    result = CliRunner().invoke(main, ["run", "--url", router.url, "--alias", "tiny-plain,tiny-ngram", "--workload",
                                       "quality", "--plan", str(plan), "--output-dir", str(out)], catch_exceptions=False)
    assert result.exit_code == 0, result.output
    path = only_file(out, "*.toml")
    return path, result


def report(*args: str):
    return CliRunner().invoke(main, ["report", *args], catch_exceptions=False)


def test_report_with_a_baseline_measured_only_for_quality(quality_file, tmp_path):
    path, _ = quality_file
    result = report(str(path), "--baseline", "tiny-plain", "--html", str(tmp_path / "report.html"))
    assert result.exit_code == 0, result.output
    assert "is not among the configurations" not in result.output
    assert "| Configuration | Verdict | Mean KLD (95 % CI) |" in result.output  # the verdicts lead (issue 22)
    assert "| Agreement with tiny-plain |" in result.output
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


QUALITY_STEPS = ["agreement code", "agreement prose", "agreement json", "question arithmetic",
                 "question json-value", "question code-output", "question unit-conversion"]


def test_the_quality_workload_prints_a_line_per_request_when_not_on_a_terminal(quality_file):
    """CliRunner's stderr is no terminal: plain progress lines, n/N and the time left as every progress line."""
    _, result = quality_file
    steps = [line for line in result.stderr.splitlines() if line.startswith("  Quality ")]
    # per alias: the 3 agreement prompts, the 4 questions, the recall probes (2 lengths x 3 depths by default)
    probes = [f"recall {n} tokens at depth {d}" for n in (8192, 32768) for d in ("0.1", "0.5", "0.9")]
    for alias_steps in (steps[:13], steps[13:]):
        assert [line.split(": ", 1)[1] for line in alias_steps] == QUALITY_STEPS + probes
        assert alias_steps[0].startswith("  Quality 1/13: ")
        assert all(line.startswith(f"  Quality {i}/13, about ") for i, line in enumerate(alias_steps[1:], 2))
    assert len(steps) == 26


def test_the_quality_workload_draws_a_live_bar_on_a_terminal(router, tmp_path):
    """A real `llm-bench run` with its stderr on a pseudo-terminal (one nobody sized, which reports 0 columns):
    the bar redraws in place (carriage returns), and the plain per-step lines are not printed."""
    import os
    import pty
    import subprocess
    import sys

    main_fd, terminal_fd = pty.openpty()
    process = subprocess.Popen(
        [sys.executable, "-m", "llm_bench", "run", "--url", router.url, "--alias", "tiny-plain", "--workload",
         "quality", "--plan", str(small_quality_plan(tmp_path / "plan.toml")), "--output-dir", str(tmp_path)],
        stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=terminal_fd, cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])})
    os.close(terminal_fd)
    chunks = []
    while True:
        try:
            chunk = os.read(main_fd, 65536)
        except OSError:  # EIO: the process closed the terminal
            break
        if not chunk:
            break
        chunks.append(chunk)
    os.close(main_fd)
    assert process.wait(timeout=300) == 0
    text = b"".join(chunks).decode(errors="replace")
    assert "\r  Quality " in text  # redrawn in place
    assert "/13 " in text and "about" in text
    assert "  Quality 1/13: " not in text  # no plain lines on a terminal
    assert "quality: 3 greedy answers" in text  # the summary after the bar
