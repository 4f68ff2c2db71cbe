"""llm-bench sweep over three "specialisations" of the real test-bed router and an OpenAI engine.

The switch command (tests/switchbed/switch.py) changes the real router the way a NixOS
specialisation does: another presets INI, a restart of llama-server, a new marker file.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from llm_bench.demo import write_demo_bed
from llm_bench.testbed.presets import render_presets_ini
from llm_bench.testbed.router import free_port
from tests.cli_process import LlmBench
from tests.commands import invoke, only_file

SWITCH = Path(__file__).parent / "switchbed" / "switch.py"


class Bed:
    def __init__(self, root: Path, binary: Path):
        self.state = root / "state"
        self.state.mkdir()
        self.port = free_port()
        (self.state / "llama_server").write_text(str(binary))
        (self.state / "port").write_text(str(self.port))
        models = write_demo_bed(root / "bed").parent / "models"
        target, draft = models / "tiny-target.gguf", models / "tiny-draft.gguf"
        self.inis = {
            "base": {"tiny-plain": {"model": str(target)}, "tiny-ngram": {"model": str(target),
                                                                          "spec-type": "ngram-simple"}},
            "llm-fa86": {"tiny-plain": {"model": str(target)},
                         "tiny-synth": {"model": str(target), "spec-type": "draft-simple", "model-draft": str(draft),
                                        "spec-draft-n-max": 4, "spec-synth-len": 3}},
            "llm-llamampere": {"ampere-none": {"model": str(target), "spec-type": "none"}},
        }
        for name in self.inis:
            self.write_ini(name)
        self.plan_path = root / "sweep.toml"

    def write_ini(self, name: str) -> None:
        presets = {"*": {"ctx-size": 2048}, **self.inis[name]}
        (self.state / f"{name}.ini").write_text(render_presets_ini(presets))

    def switch(self, name: str) -> None:
        subprocess.run([sys.executable, str(SWITCH), str(self.state), name], check=True)

    def active(self) -> str:
        return json.loads((self.state / "active.json").read_text())["specialisation"]

    def write_plan(self, targets: str, extra: str = "") -> Path:
        self.plan_path.write_text(f"""
output_dir = "out"
url = "http://127.0.0.1:{self.port}"
marker = "{self.state / 'active.json'}"
unit = ""
switch_command = "{sys.executable} {SWITCH} {self.state} {{specialisation}}"
switch_timeout_s = 60
baseline = "base / tiny-plain"
{extra}
[protocol]
max_tokens = 32
runs = 2
{targets}
""")
        return self.plan_path

    def stop(self) -> None:
        from tests.switchbed.switch import stop_running

        stop_running(self.state)


THREE_TARGETS = """
[[targets]]
name = "base"
specialisation = "base"
presets = ["tiny-plain", "tiny-ngram"]

[[targets]]
name = "llm-llamampere"
specialisation = "llm-llamampere"
expect_package = "llama-cpp-llm-llamampere"

[[targets]]
name = "llm-fa86"
specialisation = "llm-fa86"
"""


@pytest.fixture
def bed(tmp_path, llama_server_bin):
    bed = Bed(tmp_path, llama_server_bin)
    bed.switch("llm-fa86")  # the sweep must come back to this
    yield bed
    bed.stop()



def merged(out: Path) -> dict:
    path = only_file(out, "llm-bench-sweep-*-merged.toml")
    return tomllib.loads(path.read_text())


def run_files(out: Path) -> list[Path]:
    return sorted(p for p in out.glob("llm-bench-*.toml") if "-merged" not in p.name)


def test_sweep_over_three_specialisations_and_an_openai_engine(bed, router_factory, tiny_models):
    # The OpenAI target is a second real llama-server, measured through its /v1 routes (--engine openai).
    openai_server = router_factory(render_presets_ini({"tiny-v1": {"model": str(tiny_models["target"]),
                                                                   "ctx-size": 1024}}))
    plan = bed.write_plan(THREE_TARGETS + f"""
[[targets]]
name = "hyperqwen"
engine = "openai"
url = "{openai_server.url}"
up_command = "true"
down_command = "true"
ready_timeout_s = 60
""")
    result = invoke("sweep", "--plan", str(plan))
    assert result.exit_code == 0, result.output
    assert bed.active() == "llm-fa86"  # switched back to where it started
    # How far it is, and the time left from the mean of the targets measured so far.
    assert "== target base (llama-cpp): 1/4\n" in result.output
    assert "== target hyperqwen (openai): 4/4, about " in result.output
    out = bed.plan_path.parent / "out"
    records = merged(out)["aliases"]
    measured = {(r["target"], r["alias"]) for r in records if r["runs"] and not r["errors"]}
    assert measured == {("base", "tiny-plain"), ("base", "tiny-ngram"), ("llm-llamampere", "ampere-none"),
                        ("llm-fa86", "tiny-plain"), ("llm-fa86", "tiny-synth"),
                        ("hyperqwen", "tiny-v1")}
    report = (out / "report.md").read_text()
    assert "fastest on llama-cpp" in report and "fastest on openai" in report
    assert "| vs base / tiny-plain |" in report
    assert "| llm-fa86 / tiny-synth |" in report
    assert (out / "chart.png").read_bytes()[:4] == b"\x89PNG"
    page = (out / "report.html").read_text()
    assert "<svg" in page and "llm-fa86 / tiny-synth" in page and "fastest on openai" in page


def test_failure_in_the_middle_switches_back_keeps_results_and_resumes(bed):
    (bed.state / "llm-llamampere.ini").unlink()  # the middle target cannot be switched to
    plan = bed.write_plan(THREE_TARGETS)
    first = invoke("sweep", "--plan", str(plan))
    assert first.exit_code == 1
    assert "llm-llamampere" in first.output and "switching to llm-llamampere failed" in first.output
    assert bed.active() == "llm-fa86"
    out = plan.parent / "out"
    done = {(r["target"], r["alias"]) for f in run_files(out) for r in tomllib.loads(f.read_text())["aliases"]}
    assert done == {("base", "tiny-plain"), ("base", "tiny-ngram"), ("llm-fa86", "tiny-plain"),
                    ("llm-fa86", "tiny-synth")}
    assert "target llm-llamampere:" in (out / "report.md").read_text()  # the summary names the failure

    bed.write_ini("llm-llamampere")
    files_before = set(run_files(out))
    second = invoke("sweep", "--plan", str(plan))
    assert second.exit_code == 0, second.output
    assert "resuming: 4 configuration(s) already measured" in second.output
    assert "every preset already measured" in second.output
    new = set(run_files(out)) - files_before
    remeasured = {(r["target"], r["alias"]) for f in new for r in tomllib.loads(f.read_text())["aliases"]}
    assert remeasured == {("llm-llamampere", "ampere-none")}, "nothing measured before is measured again"
    assert bed.active() == "llm-fa86"
    # the second sweep's own merged file: within the same second as the first's it is ...-merged-2.toml
    latest = Path(re.search(r"Merged results: (\S+)", second.output).group(1))
    configurations = {(r["target"], r["alias"]) for r in tomllib.loads(latest.read_text())["aliases"]}
    assert ("llm-llamampere", "ampere-none") in configurations and len(configurations) == 5


def test_refuses_to_measure_the_wrong_build(bed):
    (bed.state / "llm-llamampere.package").write_text("llama-cpp")  # stock llama.cpp where the fork should be
    plan = bed.write_plan(THREE_TARGETS)
    result = invoke("sweep", "--plan", str(plan))
    assert result.exit_code == 1
    assert "refusing to measure" in result.output and "'llama-cpp-llm-llamampere'" in result.output
    out = plan.parent / "out"
    assert not any(r["target"] == "llm-llamampere"
                   for f in run_files(out) for r in tomllib.loads(f.read_text())["aliases"])


def test_ctrl_c_switches_back_and_keeps_what_was_measured(bed):
    plan = bed.write_plan(THREE_TARGETS)
    sweep = LlmBench("sweep", "--plan", str(plan), cwd=plan.parent)
    sweep.wait_for("== target llm-llamampere")  # base is measured; the switch to the second target begins
    sweep.interrupt()
    assert sweep.finish(180) == 130, sweep.stderr
    assert "Traceback" not in sweep.stderr
    assert bed.active() == "llm-fa86"
    (path,) = run_files(plan.parent / "out")
    assert {r["alias"] for r in tomllib.loads(path.read_text())["aliases"]} == {"tiny-plain", "tiny-ngram"}


def test_bad_sweep_plans(tmp_path):
    plan = tmp_path / "sweep.toml"
    plan.write_text('[[targets]]\nname = "x"\nengine = "openai"\n')
    result = invoke("sweep", "--plan", str(plan))
    assert result.exit_code == 2 and "needs url, up_command, down_command" in result.output
    plan.write_text('marker = "/nonexistent/active.json"\n[[targets]]\nname = "base"\n')
    result = invoke("sweep", "--plan", str(plan))
    assert result.exit_code == 2 and "no marker at /nonexistent/active.json" in result.output
