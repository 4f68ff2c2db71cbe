import pytest
from click.testing import CliRunner

from llm_bench.cli import main
from llm_bench.gpu.nvml import Nvml
from llm_bench.plan import PlanError, Protocol, load_plan_file, plan_from_mapping, shipped_prompt
from llm_bench.report import describe_preset, parse_args, preset_facts
from tests.fake_nvml import FakeGpu, FakeNvml


def test_defaults_are_the_report_protocol():
    p = Protocol()
    assert (p.max_tokens, p.runs, p.temperature, p.seed, p.unload_after) == (512, 3, 1.0, 42, True)
    assert p.vram_threshold_mib == 2048
    assert "LRU cache" in p.with_prompt().prompt


def test_plan_file(tmp_path):
    (tmp_path / "p.txt").write_text("my prompt")
    plan_file = tmp_path / "plan.toml"
    plan_file.write_text(
        'url = "http://127.0.0.1:9"\naliases = ["a", "b"]\nlabel = "fa86"\n'
        '[protocol]\nruns = 5\nprompt_file = "p.txt"\n'
    )
    plan = plan_from_mapping(load_plan_file(plan_file), relative_to=tmp_path)
    assert plan.aliases == ("a", "b")
    assert plan.protocol.runs == 5
    assert plan.protocol.prompt == "my prompt"
    assert plan.output_dir == tmp_path / "results"


@pytest.mark.parametrize(
    "text, message",
    [
        ("[protocol]\nrun = 3\n", "unknown key\\(s\\) run"),
        ("[protocol]\nruns = 0\n", "runs must be at least 1"),
        ("aliases = \"a\"\n", "aliases must be a list"),
        ("urll = 'x'\n", "unknown key\\(s\\) urll"),
        ("url = \n", "not valid TOML"),
    ],
)
def test_bad_plans_name_the_problem(tmp_path, text, message):
    plan_file = tmp_path / "plan.toml"
    plan_file.write_text(text)
    with pytest.raises(PlanError, match=message):
        plan_from_mapping(load_plan_file(plan_file))


def test_bad_plan_on_the_command_line_exits_nonzero(tmp_path):
    plan_file = tmp_path / "plan.toml"
    plan_file.write_text("[protocol]\nrun = 3\n")
    result = CliRunner().invoke(main, ["run", "--plan", str(plan_file)])
    assert result.exit_code == 2
    assert "unknown key(s) run" in result.output


def test_unknown_shipped_prompt():
    with pytest.raises(PlanError, match="code, json, prose"):
        shipped_prompt("nope")


def test_preset_facts_from_router_args():
    args = ["llama-server", "--ctx-size", "65536", "-ctk", "q8_0", "-ctv", "q4_0",
            "--spec-type", "draft-mtp", "--spec-draft-n-max", "2", "--jinja", "--n-gpu-layers", "-1"]
    assert parse_args(args)["--n-gpu-layers"] == "-1"
    assert preset_facts(args)["ctx"] == "65536"
    assert describe_preset(args) == "KV q8_0/q4_0, spec draft-mtp n=2"
    assert describe_preset(["llama-server"]) == "-"


def test_nvml_vram_through_the_fake():
    fake = FakeNvml(gpus=[FakeGpu(used_mib=300), FakeGpu(used_mib=3000)])
    with Nvml(fake) as nvml:
        reading = nvml.vram_used()
        assert reading.used_mib == (300.0, 3000.0)
        assert reading.over(2048) == [1]
        assert nvml.gpus()[0].name == "NVIDIA GeForce RTX 3090"
        assert nvml.driver_version() == "580.95.05"
    assert not fake.initialised


def test_nvml_without_driver_is_unavailable_not_zero():
    import pynvml

    with Nvml(FakeNvml(init_error=pynvml.NVML_ERROR_DRIVER_NOT_LOADED)) as nvml:
        reading = nvml.vram_used()
    assert reading.used_mib is None
    assert "Driver Not Loaded" in reading.unavailable


def test_plan_checks_section(tmp_path):
    plan_file = tmp_path / "plan.toml"
    plan_file.write_text('[checks]\nlog_file = "llama.log"\npower_floor_w = 250\n')
    plan = plan_from_mapping(load_plan_file(plan_file), relative_to=tmp_path)
    assert plan.checks.log_file == tmp_path / "llama.log"
    assert plan.checks.power_floor_w == 250 and plan.checks.roofline_min == 0.25
    plan_file.write_text('[checks]\npower_flor_w = 250\n')
    with pytest.raises(PlanError, match=r"\[checks\]: unknown key\(s\) power_flor_w"):
        plan_from_mapping(load_plan_file(plan_file))


def test_report_names_a_file_it_does_not_read(tmp_path):
    newer = tmp_path / "newer.toml"
    newer.write_text('[meta]\nformat = "llm-bench-soak/2"\n')
    result = CliRunner().invoke(main, ["report", str(newer)])
    assert result.exit_code == 2 and "Traceback" not in result.output
    assert f"{newer}: its meta.format is 'llm-bench-soak/2'; `llm-bench report` reads" in result.output
    assert "power ('llm-bench-power/1'), capacity ('llm-bench-capacity/1'), soak ('llm-bench-soak/1')" in result.output
    other = tmp_path / "other.toml"
    other.write_text("a = 1\n")
    assert "it has no meta.format" in CliRunner().invoke(main, ["report", str(other)]).output
