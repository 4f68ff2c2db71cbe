"""Every plan value is checked against its field's type and range, with a message naming field, value and rule."""

from dataclasses import dataclass, field

import pytest
from click.testing import CliRunner

from llm_bench.cli import main
from llm_bench.plan import PlanError, Protocol, check_fields, load_plan_file, plan_from_mapping


@pytest.mark.parametrize(
    "text, message",
    [
        ('[protocol]\nruns = "x"\n', "[protocol]: runs must be a whole number (at least 1), not 'x'"),
        ("[protocol]\nruns = 1.5\n", "[protocol]: runs must be a whole number (at least 1), not 1.5"),
        ("[protocol]\nruns = true\n", "[protocol]: runs must be a whole number (at least 1), not True"),
        ("[protocol]\ntemperature = -1\n", "[protocol]: temperature must be at least 0.0, not -1"),
        ('[protocol]\ntemperature = "hot"\n', "[protocol]: temperature must be a number (at least 0.0), not 'hot'"),
        ("[protocol]\nmax_tokens = 1\n", "[protocol]: max_tokens must be at least 2, not 1"),
        ("[protocol]\nunload_after = 1\n", "[protocol]: unload_after must be true or false, not 1"),
        ("[protocol]\nconcurrency = [1, 0]\n", "[protocol]: concurrency must be at least 1 (each), not [1, 0]"),
        ("[protocol]\nconcurrency = 4\n", "[protocol]: concurrency must be a list of whole numbers (at least 1), not 4"),
        ('[protocol]\ncategories = "code"\n', "[protocol]: categories must be a list of strings, not 'code'"),
        ("[protocol]\nrequest_timeout_s = 0\n", "[protocol]: request_timeout_s must be above 0.0, not 0"),
        ("[checks]\nroofline_min = 2\n", "[checks]: roofline_min must be at least 0.0, at most 1.0, not 2"),
        ("[checks]\npower_floor_w = -5\n", "[checks]: power_floor_w must be at least 0.0, not -5"),
        ("url = 5\n", "plan: url must be a string, not 5"),
        ("label = []\n", "plan: label must be a string, not []"),
        ("api_key_env = 3\n", "plan: api_key_env must be a string, not 3"),
        ("aliases = [1]\n", "plan: aliases must be a list of preset names, not [1]"),
    ],
)
def test_bad_values_name_field_value_and_rule(tmp_path, text, message):
    plan_file = tmp_path / "plan.toml"
    plan_file.write_text(text)
    with pytest.raises(PlanError) as e:
        plan_from_mapping(load_plan_file(plan_file))
    assert message in str(e.value)


def test_good_values_are_normalised():
    plan = plan_from_mapping({"protocol": {"temperature": 0, "concurrency": [1, 128]}, "output_dir": "out"})
    assert plan.protocol.temperature == 0.0 and isinstance(plan.protocol.temperature, float)
    assert plan.protocol.concurrency == (1, 128)
    assert str(plan.output_dir) == "out"


def test_a_field_added_later_is_checked_without_new_code():
    @dataclass(frozen=True)
    class Extended:
        max_runs: int | None = field(default=None, metadata={"min": 1})
        precision: float = field(default=0.02, metadata={"above": 0.0})

        def __post_init__(self):
            check_fields(self)

    assert Extended(max_runs=None).max_runs is None
    with pytest.raises(PlanError, match=r"max_runs must be a whole number \(at least 1\), not '3'"):
        Extended(max_runs="3")
    with pytest.raises(PlanError, match="precision must be above 0.0, not 0"):
        Extended(precision=0)
    # and Protocol itself is checked through the same path
    with pytest.raises(PlanError, match="seed must be a whole number"):
        Protocol(seed=1.5)


def test_bad_plan_value_on_the_command_line_is_one_line_and_nonzero(tmp_path):
    plan_file = tmp_path / "plan.toml"
    plan_file.write_text('[protocol]\nruns = "x"\n')
    result = CliRunner().invoke(main, ["run", "--plan", str(plan_file)])
    assert result.exit_code == 2
    assert "runs must be a whole number (at least 1), not 'x'" in result.output
    assert "Traceback" not in result.output
    assert isinstance(result.exception, SystemExit)  # a clean exit, not an exception escaping the command
