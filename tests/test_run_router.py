"""llm-bench run, end to end against a real llama-server router serving tiny models."""

from __future__ import annotations

import tomllib

import httpx
import pytest

import llm_bench.engines.client as client_module
from llm_bench.cli.exits import RAN_WITH_FAILURES
from llm_bench.demo import DRAFT_MAX, SYNTH_LEN
from llm_bench.gpu.nvml import Nvml
from llm_bench.plan import Plan, Protocol
from llm_bench.results import load_results
from llm_bench.runner import RunAborted, run_plan
from llm_bench.testbed.presets import render_presets_ini
from llm_bench.testbed.router import free_port
from llm_bench.workloads import PARTS
from tests.commands import invoke, only_file
from tests.fake_nvml import FakeGpu, FakeNvml

ALIASES = ["tiny-draft", "tiny-draft-synth", "tiny-ngram", "tiny-plain"]


def status_of(url: str, alias: str) -> str:
    for item in httpx.get(f"{url}/models").json()["data"]:
        if item["id"] == alias:
            return item["status"]["value"]
    raise AssertionError(f"{alias} not listed")



@pytest.fixture(scope="module")
def full_run(router, tmp_path_factory):
    """One `llm-bench run` over every preset, with the server's timings captured on the side."""
    seen_timings: list[dict] = []
    original = client_module.measure_stream

    def recording(*args, **kwargs):
        m = original(*args, **kwargs)
        seen_timings.append(m.timings)
        return m

    out = tmp_path_factory.mktemp("results")
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(client_module, "measure_stream", recording)
        result = invoke("run", "--url", router.url, "--output-dir", str(out), "--label", "cpu-test",
                        "--max-tokens", "256", "--runs", "3")
    assert result.exit_code == 0, result.output
    path = only_file(out, "*.toml")
    return path, tomllib.loads(path.read_text()), seen_timings, result.output


def test_every_alias_is_measured(full_run):
    _, data, _, output = full_run
    assert sorted(a["alias"] for a in data["aliases"]) == ALIASES
    for a in data["aliases"]:
        assert a["errors"] == []
        assert len(a["runs"]) == 3
        assert a["output_tokens"] == 256  # generated to the end: stopped on length, not EOS
        assert all(r["finish_reason"] == "length" for r in a["runs"])
        assert a["decode_tps_min"] <= a["decode_tps_median"] <= a["decode_tps_max"]
        assert a["client_decode_tps_median"] > 0
        assert a["ttft_ms_median"] > 0
        assert a["prompt_tokens"] > 100
    assert "| tiny-plain |" in output


def test_decode_rate_is_the_servers_own(full_run):
    _, data, seen, _ = full_run
    # Each alias makes a warm-up request and then three measured ones, in this order.
    measured = [t for i, t in enumerate(seen) if i % 4 != 0]
    runs = [r for a in data["aliases"] for r in a["runs"]]
    assert [r["decode_tps"] for r in runs] == [t["predicted_per_second"] for t in measured]


def test_cold_load_follows_a_real_unload_and_alias_is_unloaded_after(full_run, router):
    _, data, _, _ = full_run
    for a in data["aliases"]:
        assert a["cold_load_s"] > 0
        assert a["load_transitions"] == ["loading", "loaded"]  # the warm-up really loaded the model
        assert a["unloaded_after"] is True
        assert a["preset_args"], "the router's arguments for the preset are recorded"
        assert status_of(router.url, a["alias"]) == "unloaded"


def test_synthetic_acceptance_matches_the_setting(full_run):
    _, data, _, _ = full_run
    by_alias = {a["alias"]: a for a in data["aliases"]}
    expected = (SYNTH_LEN - 1) / DRAFT_MAX
    assert by_alias["tiny-draft-synth"]["draft_acceptance"] == pytest.approx(expected, abs=0.08)
    assert by_alias["tiny-draft-synth"]["draft_n"] > 100
    assert "draft_acceptance" not in by_alias["tiny-plain"]


def test_provenance(full_run):
    _, data, _, _ = full_run
    meta = data["meta"]
    assert meta["format"] == "llm-bench/1"
    assert meta["complete"] is True
    assert meta["label"] == "cpu-test"
    assert meta["server_build"]
    assert meta["protocol"]["max_tokens"] == 256 and meta["protocol"]["seed"] == 42
    assert meta["host"] and meta["started_at"] and meta["finished_at"]
    if "nvml_unavailable" in meta:  # no NVIDIA driver here: recorded as unavailable, not as zero VRAM
        assert all("vram_used_mib_before" not in a for a in data["aliases"])


def test_report_and_chart(full_run, tmp_path):
    path, _, _, _ = full_run
    for name in ("chart.png", "chart.svg"):
        result = invoke("report", str(path), "--baseline", "tiny-plain", "--chart", str(tmp_path / name))
        assert result.exit_code == 0, result.output
        assert "vs tiny-plain" in result.output
        assert "1.00x" in result.output
    assert (tmp_path / "chart.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert b"<svg" in (tmp_path / "chart.svg").read_bytes()[:500]
    bad = invoke("report", str(path), "--baseline", "nope")
    assert bad.exit_code == 2 and "baseline 'nope' is not among" in bad.output


def test_dead_server_gives_a_clear_error(tmp_path):
    result = invoke("run", "--url", f"http://127.0.0.1:{free_port()}", "--output-dir", str(tmp_path))
    assert result.exit_code == 2
    assert "cannot connect" in result.output and "is the server running" in result.output


def test_unknown_alias_gives_a_clear_error(router, tmp_path):
    result = invoke("run", "--url", router.url, "--alias", "nope", "--output-dir", str(tmp_path))
    assert result.exit_code == 2
    assert "unknown preset(s) nope" in result.output
    assert "tiny-plain" in result.output  # names what the router does list
    assert not list(tmp_path.glob("*.toml"))


def test_vram_in_use_marks_not_comparable_and_strict_refuses(router, tmp_path):
    busy = FakeNvml(gpus=[FakeGpu(used_mib=3000)])
    plan = Plan(url=router.url, aliases=("tiny-plain",), output_dir=tmp_path / "loose",
                protocol=Protocol(max_tokens=16, runs=1))
    record = load_results(run_plan(plan, lambda m: None, nvml=Nvml(busy)).path, PARTS).aliases[0]
    assert record.comparable is False
    assert "GPU0 (3000 MiB)" in record.not_comparable_reason
    assert record.vram_used_mib_before == [3000.0]
    assert record.runs, "without --strict it is still measured"

    strict = Plan(url=router.url, aliases=("tiny-plain",), output_dir=tmp_path / "strict",
                  protocol=Protocol(max_tokens=16, runs=1, strict=True))
    record = load_results(run_plan(strict, lambda m: None, nvml=Nvml(busy)).path, PARTS).aliases[0]
    assert record.runs == []
    assert "not measured (--strict)" in record.errors[0]


def test_load_failure_is_recorded_and_the_run_goes_on(router_factory, bed, tmp_path):
    target = bed.parent / "models" / "tiny-target.gguf"
    ini = render_presets_ini({
        "broken": {"model": str(tmp_path / "missing.gguf")},
        "fine": {"model": str(target), "ctx-size": 2048},
    })
    router = router_factory(ini)
    result = invoke("run", "--url", router.url, "--output-dir", str(tmp_path / "out"),
                    "--max-tokens", "16", "--runs", "1")
    assert result.exit_code == RAN_WITH_FAILURES == 1
    assert "some aliases failed" in result.output
    path = only_file((tmp_path / "out"), "*.toml")
    records = {a.alias: a for a in load_results(path, PARTS).aliases}
    assert not records["broken"].runs
    assert "broken failed to load" in records["broken"].errors[0]  # the router's own message
    assert records["fine"].errors == [] and records["fine"].runs


def test_server_dying_mid_run_aborts_with_results_kept(router_factory, bed, tmp_path):
    router = router_factory(bed)

    def log(message: str) -> None:
        if message.startswith("Benchmark 2/"):
            router.stop()

    plan = Plan(url=router.url, aliases=("tiny-plain", "tiny-ngram"), output_dir=tmp_path,
                protocol=Protocol(max_tokens=16, runs=1))
    with pytest.raises(RunAborted, match="results so far are in"):
        run_plan(plan, log)
    path = only_file(tmp_path, "*.toml")
    records = load_results(path, PARTS).aliases
    assert records[0].alias == "tiny-plain" and records[0].runs
    assert records[1].alias == "tiny-ngram" and "cannot connect" in records[1].errors[0]



def test_results_record_the_nixos_package_and_the_forks_revision(router, tmp_path):
    """The NixOS module's marker (/etc/llama-cpp/active.json, format in docs/nixos.md) names the
    active build and the commit its source came from; a run of the server it describes records
    both in meta, and a run of another server records neither."""
    import json

    from llm_bench.plan import Checks

    rev = "0123456789abcdef0123456789abcdef01234567"
    marker = tmp_path / "active.json"
    marker.write_text(json.dumps({
        "format": "llm-bench-llama-cpp-active/1", "specialisation": "llm-llamampere",
        "package": {"name": "llamampere", "version": "0-unstable-2026-06-14", "rev": rev,
                    "path": "/nix/store/aaaa-llamampere-0-unstable-2026-06-14"},
        "presets": ["tiny-plain"], "presets_file": "/etc/llama-cpp/presets.ini",
        "url": router.url.replace("127.0.0.1", "localhost"),
    }))

    def meta_of(url: str) -> dict:
        plan = Plan(url=url, aliases=("tiny-plain",), output_dir=tmp_path / "results",
                    protocol=Protocol(runs=1, max_tokens=8), checks=Checks(marker=marker))
        return load_results(run_plan(plan, lambda m: None, nvml=Nvml(FakeNvml(gpus=[]))).path, PARTS).meta

    meta = meta_of(router.url)
    assert meta["llama_cpp_package"] == {
        "specialisation": "llm-llamampere", "name": "llamampere", "version": "0-unstable-2026-06-14", "rev": rev,
        "path": "/nix/store/aaaa-llamampere-0-unstable-2026-06-14"}
    assert meta["server_build"]  # the server's own account stays beside it
    marker.write_text(marker.read_text().replace(f":{router.port}", f":{free_port()}"))
    assert "llama_cpp_package" not in meta_of(router.url)
