"""A URL no request could go to is refused before anything starts: exit 2, a message naming the flag (or plan key)
and the value, no traceback, no results file."""

from __future__ import annotations

import pytest

from llm_bench.cli.exits import COULD_NOT_RUN
from tests.commands import invoke

BAD = "http://[::1"  # an unclosed IPv6 bracket: httpx.URL raises InvalidURL on it


@pytest.fixture(autouse=True)
def in_tmp(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # anything a command would write by default lands here



@pytest.mark.parametrize("args, flag", [
    (["run", "--url", BAD], "--url"),
    (["run", "--engine", "openai", "--url", "http://127.0.0.1:9", "--metrics-url", BAD], "--metrics-url"),
    (["doctor", "--url", BAD], "--url"),
    (["soak", "--url", BAD, "--duration", "1", "--max-requests", "1"], "--url"),
    (["power", "--url", BAD, "--limits", "200"], "--url"),
    (["tune", "--url", BAD, "--preset", "a,b"], "--url"),
    (["tune", "--main-url", BAD, "--model", "m.gguf", "--axis", "ctx-size=512,1024"], "--main-url"),
    (["engine", "hyperqwen", "up", "--url", BAD], "--url"),
    (["engine", "hyperqwen", "down", "--router-url", BAD], "--router-url"),
    (["run", "--url", "localhost:8080"], "--url"),  # no scheme: httpx would read "localhost" as one
])
def test_a_malformed_url_flag_is_a_usage_error_naming_flag_and_value(tmp_path, args, flag):
    result = invoke(*args)
    assert result.exit_code == COULD_NOT_RUN == 2, result.output
    assert f"Invalid value for '{flag}'" in result.output
    assert repr(args[args.index(flag) + 1]) in result.output
    assert "is not a usable URL" in result.output
    assert "Traceback" not in result.output
    assert not list(tmp_path.rglob("*.toml"))


@pytest.mark.parametrize("command, text, message", [
    ("run", f'url = "{BAD}"\n', f"plan: url is not a usable URL: '{BAD}'"),
    ("run", f'metrics_url = "{BAD}"\n', f"plan: metrics_url is not a usable URL: '{BAD}'"),
    ("sweep", f'url = "{BAD}"\n[[targets]]\nname = "a"\n', f"sweep plan: url is not a usable URL: '{BAD}'"),
    ("sweep", '[[targets]]\nname = "v"\nengine = "openai"\nurl = "vllm:8000"\nup_command = "true"\n'
              'down_command = "true"\n', "target 'v': url is not a usable URL: 'vllm:8000'"),
    ("tune", f'url = "{BAD}"\npresets = ["a", "b"]\n', f"tune plan: url is not a usable URL: '{BAD}'"),
    ("tune", f'main_url = "{BAD}"\n', f"tune plan: main_url is not a usable URL: '{BAD}'"),
])
def test_a_malformed_url_in_a_plan_file_is_refused_naming_the_key(tmp_path, command, text, message):
    plan = tmp_path / "plan.toml"
    plan.write_text(text)
    result = invoke(command, "--plan", str(plan))
    assert result.exit_code == 2, result.output
    assert message in result.output
    assert "Traceback" not in result.output


def test_good_urls_and_metrics_paths_pass():
    from llm_bench.plan import Plan

    assert Plan(url="https://[::1]:8443/v1", metrics_url="/metrics").metrics_url == "/metrics"
    assert Plan(url="http://gpu-box.lan:48123", metrics_url="http://127.0.0.1:9400/metrics").url
