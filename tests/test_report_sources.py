"""``llm-bench report`` reads each results file through the source registered for its format: every source
recognises its own file and refuses the others, a soak or failover file read back shows what its command
printed, and a file no source reads stops the report with exit 2, naming the file and the fix."""

from __future__ import annotations

import tomllib
from pathlib import Path

import pytest
import tomli_w
from click.testing import CliRunner

from llm_bench.cli import main
from llm_bench.cli.exits import COULD_NOT_RUN
from llm_bench.diagnostics.restarts import Restart
from llm_bench.failover.records import Command, FailoverRun, Request
from llm_bench.failover.summary import summary
from llm_bench.history.command import write_skip
from llm_bench.report.sources import RUN, source_of
from llm_bench.results import AliasRecord, ResultSet, ResultsFileError, RunRecord
from llm_bench.soak.report import markdown as soak_markdown
from llm_bench.soak.traffic import SoakRequest, SoakResult, analyse
from llm_bench.sources import SOURCES
from tests.test_capacity import capacity_results_file


def soak_result() -> SoakResult:
    requests = [SoakRequest(float(t), "prose" if t % 3 else "code", True, 100.0 + t, 50.0 - 0.1 * t,
                            output_tokens=64, wall_s=1.5, vram_mib=1000.0 + t) for t in range(30)]
    requests.append(SoakRequest(30.0, "code", False, failure="timeout", message="no answer in 60 s"))
    result = SoakResult(requests=requests, duration_s=31.0, stopped_by="duration", mix={"prose": 2, "code": 1},
                        skipped={"image": "the model takes no images"},
                        restarts=[Restart("router instances", 1, "smol restarted at 12 s")],
                        unwatched=["systemd: no unit"], gpu_errors=[], gpu_error_count=0, gpu_errors_watched=True)
    analyse(result)
    return result


def failover_run() -> FailoverRun:
    requests = [Request(float(t), t + 0.5, True, backend="a" if t < 4 or t >= 8 else "b", ttft_ms=80.0 + t,
                        decode_tps=40.0, output_tokens=32) for t in range(12)]
    requests.append(Request(4.2, 4.9, False, error="502 from the proxy"))
    return FailoverRun("http://127.0.0.1:4000", "smol", primary="a", requests=requests,
                       stop=Command("systemctl stop a", 4.0, 4.3, 0), start=Command("systemctl start a", 8.0, 8.2, 0),
                       ended_s=12.5)


def write_files(folder: Path) -> dict[str, Path]:
    """One file of each registered source's format, as its command writes it."""
    files = {name: folder / f"{name}.toml" for name in ("run", "power", "capacity", "soak", "failover")}
    files["history"] = write_skip(folder, "smol", "train.service is active: the router gives way to it")
    run = ResultSet({"format": "llm-bench/1", "label": "by-hand"},
                    [AliasRecord("smol", runs=[RunRecord(decode_tps=50.0 + i, ttft_ms=90.0) for i in range(3)])])
    files["run"].write_text(tomli_w.dumps(run.to_toml()))
    files["power"].write_text(tomli_w.dumps({"meta": {"format": "llm-bench-power/1", "alias": "smol"},
                                             "limits": [{"limit_w": 250, "decode_tps": 40.0,
                                                         "tokens_per_joule": 2.0}]}))
    capacity_results_file(files["capacity"])
    files["soak"].write_text(tomli_w.dumps({"meta": {"format": "llm-bench-soak/1", "alias": "smol"},
                                            "soak": soak_result().to_toml()}))
    files["failover"].write_text(tomli_w.dumps(failover_run().to_toml({"format": "ignored", "host": "bed"})))
    return files


def test_every_source_recognises_its_own_file_and_refuses_the_others(tmp_path):
    files = write_files(tmp_path)
    assert [s.name for s in SOURCES] == ["run", "power", "capacity", "soak", "failover", "history"]
    for source in SOURCES:
        for name, path in files.items():
            data = tomllib.loads(path.read_text())
            assert source.recognises(data) == (name == source.name), (source.name, name)
            if name == source.name:
                assert source.load(path, data) is not None
            else:  # given another's file anyway, its loader names the file and what it expected
                with pytest.raises(ResultsFileError, match=str(path)):
                    source.load(path, data)
        assert source_of(files[source.name], tomllib.loads(files[source.name].read_text()), SOURCES) is source


def test_a_soak_file_read_back_is_the_soak_that_was_measured(tmp_path):
    measured = soak_result()
    path = write_files(tmp_path)["soak"]
    assert len(measured.trends) == 3 and measured.failures == {"timeout": 1}
    again = SoakResult.from_toml(tomllib.loads(path.read_text())["soak"])
    assert again == measured
    shown = CliRunner().invoke(main, ["report", str(path)])
    assert shown.exit_code == 0, shown.output
    assert shown.output == soak_markdown(measured)
    assert "31 mixed requests" in shown.output and "1 restart" in shown.output


def test_a_failover_file_read_back_shows_what_the_command_printed(tmp_path):
    run = failover_run()
    path = write_files(tmp_path)["failover"]
    again = FailoverRun.from_toml(tomllib.loads(path.read_text()))
    assert summary(again) == summary(run) and again.figures() == run.figures()
    assert run.figures().failover_s == pytest.approx(0.5)  # the stop at 4.0; b answered the request ending at 4.5
    shown = CliRunner().invoke(main, ["report", str(path)])
    assert shown.exit_code == 0, shown.output
    assert summary(run) in shown.output


def test_a_history_skip_record_is_read_beside_the_run_results(tmp_path):
    """The watch's folder holds run results and skip records; report reads both."""
    files = write_files(tmp_path)
    result = CliRunner().invoke(main, ["report", str(files["run"]), str(files["history"])])
    assert result.exit_code == 0, result.output
    assert "### Measurements not made (history skip records)" in result.output
    assert "| smol | train.service is active: the router gives way to it |" in result.output


def test_every_file_at_once_one_report_with_each_sources_section(tmp_path):
    files = write_files(tmp_path)
    html, chart = tmp_path / "all.html", tmp_path / "chart.svg"
    shown = CliRunner().invoke(main, ["report", *map(str, files.values()), "--html", str(html), "--chart", str(chart)])
    assert shown.exit_code == 0, shown.output
    assert shown.output.index("| smol |") < shown.output.index("### Power limits")  # the run's table first
    assert "| smol | 250 | 40.0 | 2.000 | 0.50 |" in shown.output
    assert "smol-a carries 3 concurrent sessions" in shown.output and "Soak: 31 mixed requests" in shown.output
    assert "fallback answered 0.5 s after the stop command started" in shown.output
    page = html.read_text()
    for section in ('id="capacity"', 'id="soak"', 'id="failover"', "power sweep power.toml", "soak soak.toml",
                    "failover failover.toml"):
        assert section in page, section
    for name in ("chart.svg", "chart-capacity.svg", "chart-soak.svg", "chart-failover.svg"):
        assert (tmp_path / name).stat().st_size > 0, name


def test_the_exports_cover_only_the_files_that_join_a_run_report(tmp_path):
    files = write_files(tmp_path)
    both = CliRunner().invoke(main, ["report", str(files["run"]), str(files["power"]), "--format", "csv",
                                     "--table", "power"])
    assert both.exit_code == 0, both.output
    assert both.output.splitlines()[1].startswith("smol,250,40.0,2.0,0.5,")
    for name in ("soak", "failover"):
        refused = CliRunner().invoke(main, ["report", str(files["run"]), str(files[name]), "--format", "json"])
        assert refused.exit_code == COULD_NOT_RUN and f"does not cover {name} results" in refused.output


def test_an_unknown_file_names_itself_and_the_fix(tmp_path):
    unknown = tmp_path / "notes.toml"
    unknown.write_text('[meta]\nformat = "llm-bench-history/1"\n')
    result = CliRunner().invoke(main, ["report", str(write_files(tmp_path)["run"]), str(unknown)])
    assert result.exit_code == COULD_NOT_RUN and "Traceback" not in result.output
    message = " ".join(result.output.split())
    assert f"{unknown}: its meta.format is 'llm-bench-history/1'" in message
    assert ("reads the results files of run, tune, sweep and demo ('llm-bench/1'), power ('llm-bench-power/1'), "
            "capacity ('llm-bench-capacity/1'), soak ('llm-bench-soak/1'), failover ('llm-bench-failover/1') and "
            "history --skipped (llmBench.watch) ('llm-bench-history-skip/1'): "
            "give it a file one of those commands wrote") in message


def test_the_run_source_is_the_results_format():
    assert RUN.format == "llm-bench/1" and RUN.beside_rows
