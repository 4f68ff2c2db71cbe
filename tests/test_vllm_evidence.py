"""What vLLM says of itself, read without a server: every spelling of speculation and of compilation off (the
same spellings tests/test_vllm_real.py checks against vLLM 0.32's own parser), the config line of a real
vLLM 0.32 log (tests/fixtures/vllm-0.32-config.log, from the bed's server), the SpecDecoding lines weighed
against /metrics counters, and the server's own account carried into records and the table."""

from __future__ import annotations

from pathlib import Path

import pytest

from llm_bench.diagnostics.acceptance import check_acceptance, check_acceptance_log
from llm_bench.diagnostics.findings import ERROR, INFO
from llm_bench.diagnostics.in_run import describe_served
from llm_bench.diagnostics.vllm_evidence import (
    ServerConfig,
    check_dtype_with_speculation,
    check_enforce_eager,
    compilation_off,
    log_config,
    speculative_settings,
    vllm_config,
)
from llm_bench.engines.metrics import SpecCounters
from llm_bench.engines.openai import OpenAIEngine
from llm_bench.gpu.nvml import Nvml
from llm_bench.plan import Plan, Protocol
from llm_bench.report.rows import context_of
from llm_bench.report.table import MAIN_COLUMNS, context_for
from llm_bench.results import AliasRecord, load_results
from llm_bench.runner import run_plan
from llm_bench.tables import Row
from llm_bench.workloads import PARTS
from llm_bench.workloads.prefix_cache import hit_of
from tests.fake_nvml import FakeNvml
from tests.fake_vllm import FakeVllm, FakeVllmConfig

LOG = (Path(__file__).parent / "fixtures" / "vllm-0.32-config.log").read_text()

# spelling -> (method, tokens) of the speculation it turns on, as vLLM 0.32's parser reads it
SPECULATION = {
    "-sc '{\"method\":\"ngram\",\"num_speculative_tokens\":3}'": ("ngram", "3"),
    '--speculative-config {"method": "mtp", "num_speculative_tokens": 2}': ("mtp", "2"),
    "--spec-method ngram --spec-tokens 2": ("ngram", "2"),
    "--spec_method suffix": ("suffix", None),
    "--spec-model org/drafter --spec-tokens 5": (None, "5"),
    "--speculative-config.method mtp": ("mtp", None),
    "-sc.method=ngram -sc.num_speculative_tokens 4": ("ngram", "4"),
}
COMPILATION_OFF = ["-O0", "-O 0", "-O=0", "--optimization-level 0", "--optimization_level=0", "--enforce-eager",
                   "--enforce_eager", "-cc.mode=none", "-cc.mode NONE", "-cc.mode=0", "--compilation-config.mode=none",
                   "-cc.cudagraph_mode=NONE", "-cc {\"mode\": 0}", '-cc {"cudagraph_mode": "NONE"}']
COMPILED = ["-O3", "-O1", '--compilation-config {"mode": "VLLM_COMPILE"}', "-cc.cudagraph_mode=PIECEWISE",
            "--dtype half", "--no-enforce-eager", ""]


@pytest.mark.parametrize("spelling", sorted(SPECULATION))
def test_every_spelling_of_speculation_is_read(spelling: str) -> None:
    line = f"python -m vllm.entrypoints.openai.api_server --model m {spelling}"
    method, tokens = SPECULATION[spelling]
    settings = speculative_settings(line)
    assert settings is not None and settings.get("method") == method and settings.get("num_speculative_tokens") == tokens
    config = vllm_config([line + " --dtype half"])
    assert config.speculative and config.speculative_method == method
    # with --dtype half: the trap is said for a drafter, not for n-gram or suffix drafting
    trapped = check_dtype_with_speculation(config)
    assert bool(trapped) == (method not in ("ngram", "suffix")), (spelling, trapped)


def test_no_speculation_is_read_where_there_is_none() -> None:
    assert speculative_settings("vllm serve m --dtype half --disable-sc 3") is None
    assert vllm_config(["vllm serve m --dtype half"]).speculation is None


@pytest.mark.parametrize("spelling", COMPILATION_OFF)
def test_every_spelling_of_compilation_off_is_eager(spelling: str) -> None:
    line = f"vllm serve m {spelling}"
    assert compilation_off(line), spelling
    [finding] = check_enforce_eager([line])
    assert finding.check == "vllm-eager" and finding.severity == ERROR


@pytest.mark.parametrize("spelling", COMPILED)
def test_compiled_spellings_are_not_eager(spelling: str) -> None:
    assert compilation_off(f"vllm serve m {spelling}") is None
    assert check_enforce_eager([f"vllm serve m {spelling}"]) == []


def test_a_real_config_line_says_speculation_context_and_compilation_off() -> None:
    said = log_config(LOG)
    assert (said.speculative_method, said.speculative_tokens, said.context, said.dtype) == ("ngram", 3, 2048,
                                                                                            "bfloat16")
    assert said.eager and said.eager.startswith("compilation mode NONE in the server log's config line")
    assert said.line and said.line.startswith("the server log's config line: \"with config: model=")
    config = vllm_config([], None, None, LOG)
    assert config.speculation == "ngram n=3" and config.drafts_from_context and config.context
    [finding] = check_enforce_eager([], LOG)
    assert "compilation mode NONE" in finding.evidence


def test_the_log_lines_disagreeing_with_the_runs_counters_is_said_with_both_windows() -> None:
    """vLLM's lines said none accepted in their intervals, the run's counters 1 of 45: no trap, an INFO
    naming both, and why they differ."""
    line = ("(APIServer pid=13671) INFO 12-07 17:42:57 [metrics.py:120] SpecDecoding metrics: Mean acceptance "
            "length: 1.00, Accepted throughput: 0.00 tokens/s, Drafted throughput: 4.50 tokens/s, Accepted: 0 "
            "tokens, Drafted: 45 tokens, Per-position acceptance rate: 0.000, 0.000, 0.000, Avg Draft acceptance "
            "rate: 0.0%")
    [finding] = check_acceptance_log(line, "vllm.log", True, SpecCounters(45.0, 1.0, 15.0))
    assert finding.severity == INFO and "0 of 45 drafted tokens accepted" in finding.evidence
    assert "1 of 45 drafted tokens accepted (2.2%)" in finding.evidence and "logging interval" in finding.evidence
    # the counters agree that none was accepted: the record's own warning says the trap, not the log's
    assert check_acceptance_log(line, "vllm.log", True, SpecCounters(45.0, 0.0, 15.0)) == []
    # no counters: the trap from the line, quoted from its first character
    [trap] = check_acceptance_log(line, "vllm.log", True)
    assert trap.severity == ERROR and '"(APIServer pid=13671) INFO 12-07 17:42:57' in trap.evidence
    assert "logged 12-07 17:42:57" in trap.evidence and "N-gram drafting" in trap.evidence


def test_a_records_speculation_names_the_cause_of_its_trap() -> None:
    record = AliasRecord(alias="smol", engine="openai", speculation="ngram n=3", spec=SpecCounters(45.0, 0.0, 15.0))
    [finding] = check_acceptance(record)
    assert "N-gram drafting" in finding.evidence and "dtype" not in finding.evidence + finding.fix
    drafter = AliasRecord(alias="q", engine="openai", speculation="eagle3 n=3", spec=SpecCounters(45.0, 0.0, 15.0))
    assert "issue #55250" in check_acceptance(drafter)[0].evidence


def test_the_servers_own_account_goes_into_the_record_and_the_table() -> None:
    config = ServerConfig(speculative="command line: vllm serve m -sc ...", speculative_method="ngram",
                          speculative_tokens=3)
    with FakeVllm(FakeVllmConfig(model="smol", max_model_len=4096)) as fake:
        engine = OpenAIEngine(fake.url, timeout=10)
        record = AliasRecord(alias="smol", engine="openai")
        describe_served(engine, "smol", record, config)
        engine.close()
    assert (record.speculation, record.context) == ("ngram n=3", 4096)
    assert "context 4096: max_model_len in /v1/models" in record.server_evidence
    assert context_of(record) == "4096"
    row = Row(record.configuration, record, "", "openai")
    context = context_for([row], None)
    cells = {c.name: c.cell(row, context) for c in MAIN_COLUMNS if c.name in ("Speculation", "Context")}
    assert cells["Speculation"].text == "ngram n=3" and cells["Context"].text == "4096"


def test_the_prefix_cache_prompt_fits_the_context_the_server_reports(tmp_path: Path) -> None:
    """The default 11,000-token prompt against a 4,096-token context: sized down by the server's count, the
    cut said on the record, and nothing refused (the double refuses what vLLM refuses: HTTP 400)."""
    with FakeVllm(FakeVllmConfig(model="smol", max_model_len=4096)) as fake:
        plan = Plan(url=fake.url, engine="openai", output_dir=tmp_path,
                    protocol=Protocol(runs=1, max_tokens=8, workloads=("prefix-cache",)))
        [record] = load_results(run_plan(plan, lambda m: None, nvml=Nvml(FakeNvml())).path, PARTS).aliases
    assert not record.errors, record.errors
    assert any(w.startswith("prefix-cache prompt cut from 11000") and "context of 4096" in w for w in record.warnings)
    assert record.runs[0].prompt_tokens and record.runs[0].prompt_tokens + 32 <= 4096
    assert hit_of(record).cached_tokens


def test_the_command_line_of_the_vllm_serving_the_url_is_the_one_read() -> None:
    from llm_bench.diagnostics.vllm_evidence import serving
    here = "python -m vllm.entrypoints.openai.api_server --model m --port 8001 -sc.method ngram"
    other = "vllm serve other --port 8002 --dtype half --spec-method eagle3"
    assert serving([other, here], "http://127.0.0.1:8001") == [here]
    # none serves that port (a container's vLLM listens on its own, mapped on the host): each one says something
    assert serving([other, here], "http://127.0.0.1:9000") == [other, here]
