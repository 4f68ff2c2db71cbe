"""The acceptance trap (doctor checks ``acceptance`` and ``acceptance-log``): it fires when the server drafts
and accepts (almost) nothing, and not otherwise; both thresholds at their boundary. End to end on a real
llama-server through ``--engine openai``: a preset whose drafts are never accepted, and one whose are."""

from __future__ import annotations

import tomllib

import pytest
from click.testing import CliRunner

from llm_bench.cli import main
from llm_bench.diagnostics.acceptance import ACCEPTANCE_TRAP_RATE, check_acceptance, check_acceptance_log
from llm_bench.diagnostics.findings import ERROR
from llm_bench.engines.metrics import SpecCounters
from llm_bench.results import AliasRecord
from llm_bench.testbed.presets import render_presets_ini
from tests.commands import only_file


def drafted(draft_tokens: float, accepted: float, drafts: float | None = None) -> AliasRecord:
    return AliasRecord(alias="m", spec=SpecCounters(draft_tokens, accepted, drafts))


def test_drafting_with_nothing_accepted_is_an_error():
    [finding] = check_acceptance(drafted(1000, 0, drafts=250))
    assert finding.check == "acceptance" and finding.severity == ERROR
    assert finding.evidence.startswith("the server drafted 1000 tokens and accepted 0 (0.0%, mean acceptance "
                                       "length 1.00)")
    [almost] = check_acceptance(drafted(1000, 9))  # 0.9 %: still nothing worth the drafting
    assert "accepted 9 (0.9%)" in almost.evidence


def test_n_gram_drafting_is_not_blamed_on_a_drafters_dtype():
    ngram = AliasRecord(alias="m", spec=SpecCounters(33, 0, 11), preset_args=["--spec-type", "ngram-simple"])
    [finding] = check_acceptance(ngram)
    assert "repeat" in finding.evidence and "dtype" not in finding.evidence + finding.fix
    drafter = AliasRecord(alias="m", spec=SpecCounters(33, 0, 11),
                          preset_args=["--spec-type", "draft-simple", "--model-draft", "d.gguf"])
    [model] = check_acceptance(drafter)
    assert "dtype" in model.evidence and "dtype" in model.fix and "repeat" not in model.evidence + model.fix


def test_a_server_that_does_not_say_how_it_drafts_is_given_the_cause_of_each_kind():
    # an OpenAI server reports no preset arguments: a drafter's dtype or n-gram drafting, both named
    [unknown] = check_acceptance(drafted(33, 0))
    assert "dtype" in unknown.evidence and "repeats little of its context" in unknown.evidence
    assert "bfloat16" in unknown.fix and "n-gram" in unknown.fix


def test_the_trap_stops_at_1_percent_and_needs_drafting():
    assert ACCEPTANCE_TRAP_RATE == 0.01
    assert check_acceptance(drafted(1000, 10)) == []  # exactly 1 %
    assert check_acceptance(drafted(1000, 500, drafts=250)) == []
    assert check_acceptance(drafted(0, 0)) == []  # speculation off, or nothing generated
    assert check_acceptance(AliasRecord(alias="m")) == []


V1 = ("SpecDecoding metrics: Mean acceptance length: {length}, Accepted throughput: 0.00 tokens/s, "
      "Drafted throughput: {drafted} tokens/s, Accepted: 0 tokens, Drafted: 2597 tokens")
V0 = "SpecDecoding metrics: Draft acceptance rate: {rate}%, Accepted: 3 tokens, Drafted: {drafted} tokens"


def test_vllms_line_is_a_trap_up_to_length_1_01_while_drafting():
    [finding] = check_acceptance_log(V1.format(length="1.01", drafted="259.68"), "vllm.log")
    assert finding.check == "acceptance-log" and finding.severity == ERROR
    assert "(vllm.log, latest of 1 such line(s)" in finding.evidence
    assert check_acceptance_log(V1.format(length="1.02", drafted="259.68")) == []
    assert check_acceptance_log(V1.format(length="1.00", drafted="0.00")) == []  # idle: drafts nothing


def test_vllm_v0s_line_is_a_trap_below_1_percent_while_drafting():
    assert check_acceptance_log(V0.format(rate="0.9", drafted="400"))[0].check == "acceptance-log"
    assert check_acceptance_log(V0.format(rate="1.0", drafted="400")) == []
    assert check_acceptance_log(V0.format(rate="0.0", drafted="0")) == []


def test_vllms_line_is_blamed_on_how_the_configuration_says_the_server_drafts():
    line = V1.format(length="1.00", drafted="259.68")
    [ngram] = check_acceptance_log(line, "vllm.log", drafts_from_context=True)
    assert "this output repeats little of it" in ngram.evidence and "dtype" not in ngram.evidence + ngram.fix
    [drafter] = check_acceptance_log(line, "vllm.log", drafts_from_context=False)
    assert "dtype" in drafter.evidence and "repeat" not in drafter.evidence + drafter.fix
    [unknown] = check_acceptance_log(line, "vllm.log")  # no command line found: each kind's cause
    assert "dtype" in unknown.evidence and "repeats little of its context" in unknown.evidence
    assert "bfloat16" in unknown.fix and "n-gram" in unknown.fix


def test_the_latest_line_decides():
    trap, healthy = V1.format(length="1.00", drafted="259.68"), V1.format(length="2.70", drafted="259.68")
    assert check_acceptance_log("\n".join([trap, trap, healthy])) == []  # it recovered
    [finding] = check_acceptance_log("\n".join([trap, healthy, trap]))
    assert "latest of 2 such line(s)" in finding.evidence


@pytest.fixture(scope="module")
def drafting_router(llama_server_bin, tiny_models, tmp_path_factory):
    """A real llama-server with two drafting presets: synthetic acceptance length 1 (drafts, accepts none) and
    length 3 (drafts 4, accepts about half)."""
    from llm_bench.testbed.router import start_router

    folder = tmp_path_factory.mktemp("trap")
    spec = {"model": str(tiny_models["target"]), "spec-type": "draft-simple",
            "model-draft": str(tiny_models["draft"]), "spec-draft-n-max": 4}
    ini = folder / "presets.ini"
    ini.write_text(render_presets_ini({"*": {"ctx-size": 1024, "parallel": 1},
                                       "trap": {**spec, "spec-synth-len": 1},
                                       "accepts": {**spec, "spec-synth-len": 3}}))
    router = start_router(llama_server_bin, ini, log_path=folder / "router.log")
    yield router
    router.stop()


def run_openai(url: str, alias: str, out) -> tuple:
    result = CliRunner().invoke(main, ["run", "--engine", "openai", "--url", url, "--alias", alias, "--runs", "1",
                                       "--max-tokens", "32", "--output-dir", str(out)], catch_exceptions=False)
    path = only_file(out, "*.toml")
    (record,) = tomllib.loads(path.read_text())["aliases"]
    return result, record


def test_the_trap_is_loud_through_the_openai_engine_on_a_real_server(drafting_router, tmp_path):
    result, record = run_openai(drafting_router.url, "trap", tmp_path / "trap")
    assert result.exit_code == 0, result.output  # a warning, not a failure: the figures are real
    assert "!!! ACCEPTANCE TRAP: the server drafted " in result.output and "--dtype half" in result.output
    # llama.cpp's own counts (timings.draft_n, draft_n_accepted) are what the record holds
    assert record["draft_n"] > 0 and record["draft_n_accepted"] == 0 and record["draft_acceptance"] == 0.0
    assert any(w.startswith("ACCEPTANCE TRAP") for w in record["warnings"])


def test_no_trap_where_drafts_are_accepted(drafting_router, tmp_path):
    result, record = run_openai(drafting_router.url, "accepts", tmp_path / "accepts")
    assert result.exit_code == 0, result.output
    assert record["draft_n"] > 0 and record["draft_acceptance"] > 0.3
    assert "ACCEPTANCE TRAP" not in result.output
    assert not any("ACCEPTANCE TRAP" in w for w in record.get("warnings", []))
