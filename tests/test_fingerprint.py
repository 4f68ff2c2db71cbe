"""The build-and-rig fingerprint, fact by fact: against NVML's double (pynvml's names, milliwatts, bytes,
str drivers) and against stand-ins for /run/current-system, nixos-version --json and the marker that follow
the real formats."""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path

import pynvml

from llm_bench.fingerprint import NOT_AVAILABLE, Sources, fingerprint, is_available
from llm_bench.gpu.nvml import Nvml
from llm_bench.provenance import provenance
from llm_bench.results import ResultSet, load_results, write_toml
from llm_bench.workloads import PARTS
from tests.fake_nvml import FakeGpu, FakeNvml

STORE_SYSTEM = "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa-nixos-system-box-25.05.20250612.4a5d0b1"
NIXPKGS_REV = "4a5d0b1f0c2a8d3e9b7f6a5c4d3e2f1a0b9c8d7e"
CONFIG_REV = "0123456789abcdef0123456789abcdef01234567"


def nixos_box(tmp_path: Path, *, json_text: str | None = None, marker: dict | None = None) -> Sources:
    """A NixOS box's stand-ins: /run/current-system -> profiles/system-42-link -> the store path (as NixOS
    links them), an executable nixos-version that prints what the real one does, the module's marker."""
    store = tmp_path / "nix" / "store" / STORE_SYSTEM
    store.mkdir(parents=True)
    profiles = tmp_path / "nix" / "var" / "nix" / "profiles"
    profiles.mkdir(parents=True)
    (profiles / "system-42-link").symlink_to(store)
    (profiles / "system").symlink_to("system-42-link")
    run = tmp_path / "run"
    run.mkdir()
    (run / "current-system").symlink_to(profiles / "system")
    # nixos-version --json prints builtins.toJSON of nixosVersion and, where set, the two revisions
    printed = json_text if json_text is not None else json.dumps(
        {"nixosVersion": "25.05.20250612.4a5d0b1", "nixpkgsRevision": NIXPKGS_REV, "configurationRevision": CONFIG_REV})
    script = tmp_path / "nixos-version"
    script.write_text(f"#!/bin/sh\n[ \"$1\" = --json ] || exit 1\ncat <<'EOF'\n{printed}\nEOF\n")
    script.chmod(script.stat().st_mode | stat.S_IEXEC)
    marker_path = tmp_path / "active.json"
    marker_path.write_text(json.dumps(marker if marker is not None else {
        "format": "llm-bench-llama-cpp-active/1", "specialisation": "llm-fa86",
        "package": {"name": "llama-cpp-fa86", "version": "7123",
                    "path": "/nix/store/bbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbb-llama-cpp-fa86-7123", "rev": None},
        "presets": ["smol"], "presets_file": "/etc/llama-cpp/presets.ini", "url": "http://127.0.0.1:48123"}) + "\n")
    governor = tmp_path / "scaling_governor"
    governor.write_text("performance\n")
    return Sources(current_system=run / "current-system", marker=marker_path,
                   nixos_version=(str(script), "--json"), cpu_governor=governor)


def test_the_build_from_a_nixos_box(tmp_path: Path) -> None:
    build = fingerprint(Nvml(FakeNvml()), nixos_box(tmp_path), "b7123-abc1234", "http://localhost:48123")["build"]
    assert build["system"] == str(tmp_path / "nix" / "store" / STORE_SYSTEM)
    assert build["nixos_version"] == "25.05.20250612.4a5d0b1"
    assert build["nixpkgs_revision"] == NIXPKGS_REV
    assert build["configuration_revision"] == CONFIG_REV
    assert build["specialisation"] == "llm-fa86"
    assert build["package_name"] == "llama-cpp-fa86"
    assert build["package_version"] == "7123"
    assert build["package_path"] == "/nix/store/bbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbb-llama-cpp-fa86-7123"
    assert build["package_rev"].startswith(NOT_AVAILABLE) and "null" in build["package_rev"]
    assert build["server_build"] == "b7123-abc1234"


def test_nixos_version_without_the_revisions_says_which_option_is_unset(tmp_path: Path) -> None:
    sources = nixos_box(tmp_path, json_text=json.dumps({"nixosVersion": "25.05pre-git"}))
    build = fingerprint(Nvml(FakeNvml()), sources)["build"]
    assert build["nixos_version"] == "25.05pre-git"
    assert "system.nixos.revision" in build["nixpkgs_revision"] and not is_available(build["nixpkgs_revision"])
    assert "system.configurationRevision" in build["configuration_revision"]
    assert build["server_build"] == NOT_AVAILABLE + "no server was asked"


def test_off_nixos_every_build_fact_says_why(tmp_path: Path) -> None:
    sources = Sources(current_system=tmp_path / "current-system", marker=tmp_path / "active.json",
                      nixos_version=(str(tmp_path / "nixos-version"), "--json"), cpu_governor=tmp_path / "gov")
    out = fingerprint(Nvml(FakeNvml()), sources, None, "http://127.0.0.1:1")
    build = out["build"]
    assert all(v.startswith(NOT_AVAILABLE) for v in build.values()), build
    assert "not a NixOS system" in build["system"]
    assert "not found" in build["nixpkgs_revision"]
    assert "services.llama-cpp" in build["package_path"]
    assert "build_info" in build["server_build"]
    assert "no cpufreq" in out["rig"]["cpu_governor"]


def test_a_marker_of_another_server_names_it(tmp_path: Path) -> None:
    build = fingerprint(Nvml(FakeNvml()), nixos_box(tmp_path), "b1", "http://127.0.0.1:9999")["build"]
    assert "describes the server at http://127.0.0.1:48123" in build["package_path"]


def test_each_rig_fact_from_nvml() -> None:
    gpu = FakeGpu(power_limit_mw=270000, default_limit_mw=350000, pcie_gen=3, pcie_width=8, max_pcie_gen=4,
                  max_pcie_width=16, persistence_mode=pynvml.NVML_FEATURE_ENABLED, used_mib=1234,
                  sm_clock_mhz=1695, mem_clock_mhz=9501)
    with Nvml(FakeNvml(gpus=[gpu, FakeGpu()], driver="580.95.05")) as nvml:
        rig = fingerprint(nvml, Sources(cpu_governor=Path("/nonexistent/governor")))["rig"]
    assert rig["driver"] == "580.95.05"
    first, second = rig["gpus"]
    assert first["name"] == "NVIDIA GeForce RTX 3090"
    assert first["power_limit_enforced_w"] == 270.0 and first["power_limit_default_w"] == 350.0
    assert (first["pcie_gen"], first["pcie_width"], first["pcie_gen_max"], first["pcie_width_max"]) == (3, 8, 4, 16)
    assert first["persistence_mode"] == "enabled" and second["persistence_mode"] == "disabled"
    assert first["memory_used_mib"] == 1234.0 and second["memory_used_mib"] == 300.0
    assert (first["sm_clock_mhz"], first["mem_clock_mhz"]) == (1695, 9501)
    assert (first["max_sm_clock_mhz"], first["max_mem_clock_mhz"]) == (2100, 9751)


def test_a_driver_in_bytes_is_text() -> None:
    fake = FakeNvml()
    fake.driver = b"470.256.02"  # type: ignore[assignment] - older pynvml returned bytes
    with Nvml(fake) as nvml:
        assert fingerprint(nvml, Sources(cpu_governor=Path("/nonexistent")))["rig"]["driver"] == "470.256.02"


def test_an_unsupported_reading_says_which_call_and_why() -> None:
    fake = FakeNvml(gpus=[FakeGpu(fail={"nvmlDeviceGetEnforcedPowerLimit": pynvml.NVML_ERROR_NOT_SUPPORTED,
                                        "nvmlDeviceGetPersistenceMode": pynvml.NVML_ERROR_NOT_SUPPORTED})])
    with Nvml(fake) as nvml:
        gpu = fingerprint(nvml, Sources(cpu_governor=Path("/nonexistent")))["rig"]["gpus"][0]
    assert gpu["power_limit_enforced_w"].startswith(NOT_AVAILABLE + "nvmlDeviceGetEnforcedPowerLimit: ")
    assert "Not Supported" in gpu["power_limit_enforced_w"]
    assert gpu["persistence_mode"].startswith(NOT_AVAILABLE + "nvmlDeviceGetPersistenceMode")
    assert gpu["power_limit_default_w"] == 350.0


def test_without_nvml_the_rig_says_why() -> None:
    with Nvml(FakeNvml(init_error=pynvml.NVML_ERROR_DRIVER_NOT_LOADED)) as nvml:
        rig = fingerprint(nvml, Sources(cpu_governor=Path("/nonexistent")))["rig"]
    assert rig["driver"] == rig["gpus"]
    assert rig["gpus"].startswith(NOT_AVAILABLE + "NVML could not start") and "Driver Not Loaded" in rig["gpus"]


def test_the_fingerprint_survives_a_results_file(tmp_path: Path) -> None:
    """TOML has no null: every fact is a value or its reason, so the file reads back whole."""
    with Nvml(FakeNvml()) as nvml:
        meta = provenance("llm-bench/1", nvml, sources=nixos_box(tmp_path), server_build="b1")
    path = tmp_path / "r.toml"
    write_toml(path, ResultSet(meta).to_toml())
    assert load_results(path, PARTS).meta["fingerprint"] == meta["fingerprint"]
    assert os.path.getsize(path) > 0


def test_the_html_report_shows_the_fingerprint_escaped(tmp_path: Path) -> None:
    from llm_bench.report.html import render_html
    from llm_bench.results import AliasRecord, RunRecord

    with Nvml(FakeNvml(gpus=[FakeGpu(power_limit_mw=270000)])) as nvml:
        meta = provenance("llm-bench/1", nvml, sources=nixos_box(tmp_path), server_build="<b>b7123</b>")
    page = render_html([ResultSet(meta | {"label": "fp"}, [AliasRecord("a", runs=[RunRecord(decode_tps=10.0)])])])
    section = page[page.index('<section id="provenance">'):]
    assert "build and rig" in section
    assert f"<dt>build: nixpkgs revision</dt><dd>{NIXPKGS_REV}</dd>" in section
    assert "<dt>rig: GPU0 power limit enforced w</dt><dd>270.0</dd>" in section
    assert "&lt;b&gt;b7123&lt;/b&gt;" in section and "<b>b7123" not in section


def test_a_file_from_before_the_fingerprint_says_so() -> None:
    from llm_bench.fingerprint import fingerprint_facts

    assert fingerprint_facts(None) == [("fingerprint", NOT_AVAILABLE + "this file was written before llm-bench "
                                                                      "recorded one")]
