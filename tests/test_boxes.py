"""Several boxes in one run (`llm-bench run --url A --url B`, or a plan's `urls`): two real routers, one
merged results file with the box in every record and every row, each box's runs served by that box."""

from __future__ import annotations

import tomllib

from click.testing import CliRunner

from llm_bench.cli import main
from llm_bench.cli.exits import RAN_WITH_FAILURES
from llm_bench.testbed.router import free_port
from tests.commands import only_file

ALIAS = "tiny-plain"
TASK_DONE = "prompt eval time ="  # the router's own timing line, one per request it served


def served(log) -> int:
    return log.read_text(errors="replace").count(TASK_DONE)


def test_two_boxes_merge_into_one_report_with_the_box_in_every_row(router_factory, bed, tmp_path):
    box1, box2 = router_factory(bed), router_factory(bed)
    out = tmp_path / "out"
    result = CliRunner().invoke(main, ["run", "--url", box1.url, "--url", box2.url, "--alias", ALIAS, "--runs", "2",
                                       "--max-tokens", "8", "--output-dir", str(out)], catch_exceptions=False)
    assert result.exit_code == 0, result.output
    merged = only_file(out, "llm-bench-boxes-*-merged.toml")
    data = tomllib.loads(merged.read_text())
    names = [f"127.0.0.1:{box1.port}", f"127.0.0.1:{box2.port}"]
    assert data["meta"]["targets"] == names
    assert sorted(r["target"] for r in data["aliases"]) == sorted(names)
    for name in names:
        assert f"| {name} / {ALIAS} |" in result.output
    # Each box served its own runs (and warm-up): its own log counts them.
    assert served(box1.log_path) == served(box2.log_path) == 3
    assert len(list(out.glob("llm-bench-*.toml"))) == 3  # each box's file and the merged one


def test_a_box_that_cannot_be_reached_fails_alone(router_factory, bed, tmp_path):
    box = router_factory(bed)
    plan = tmp_path / "plan.toml"
    dead = f"http://127.0.0.1:{free_port()}"
    plan.write_text(f'urls = ["{dead}", "{box.url}"]\naliases = ["{ALIAS}"]\noutput_dir = "out"\n'
                    '[protocol]\nruns = 1\nmax_tokens = 8\n')
    result = CliRunner().invoke(main, ["run", "--plan", str(plan)], catch_exceptions=False)
    assert result.exit_code == RAN_WITH_FAILURES, result.output
    assert f"box 127.0.0.1:{dead.rsplit(':', 1)[1]}: cannot connect to {dead}" in result.output
    assert f"| 127.0.0.1:{box.port} / {ALIAS} |" not in result.output  # one box measured: no prefix needed
    merged = only_file((tmp_path / "out"), "llm-bench-boxes-*-merged.toml")
    (record,) = tomllib.loads(merged.read_text())["aliases"]
    assert record["target"] == f"127.0.0.1:{box.port}"


def test_plan_urls_must_be_a_list_of_urls(tmp_path):
    plan = tmp_path / "plan.toml"
    plan.write_text('urls = "http://a:1"\n')
    result = CliRunner().invoke(main, ["run", "--plan", str(plan)])
    assert result.exit_code == 2 and "urls must be a list of server URLs" in result.output
    plan.write_text('urls = ["ftp://a"]\n')
    result = CliRunner().invoke(main, ["run", "--plan", str(plan)])
    assert result.exit_code == 2 and "plan: urls is not a usable URL" in result.output
