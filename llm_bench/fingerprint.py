"""The build and the rig a results file was measured on, read once before the first load.

The build: the NixOS system generation (the store path behind ``/run/current-system``, and what
``nixos-version --json`` says of nixpkgs and the configuration), the NixOS module's marker
(``/etc/llama-cpp/active.json``: specialisation, package name, version, store path, source revision) and
the server's own build string (``/props`` ``build_info``). The rig, per GPU through read-only NVML: the
enforced and default power limit, the PCIe link (current and maximum generation and width), persistence
mode, memory in use, clocks; the driver; the CPU governor.

Every fact is a value or the text ``not available: <why>``, never a blank or a guess, so two files can be
compared fact by fact and a reader sees why one is missing. Where each fact comes from is a ``Sources``
(paths and the command), so tests use stand-ins that follow the real formats.
"""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from llm_bench.gpu.nvml import MIB, Nvml

NOT_AVAILABLE = "not available: "
MARKER_FORMAT = "llm-bench-llama-cpp-active/1"  # docs/nixos.md, "The marker"


def not_available(why: str) -> str:
    return NOT_AVAILABLE + why


def is_available(value: Any) -> bool:
    return not (isinstance(value, str) and value.startswith(NOT_AVAILABLE))


@dataclass(frozen=True)
class Sources:
    """Where the facts are read: the real paths and command by default."""

    current_system: Path = Path("/run/current-system")
    marker: Path = Path("/etc/llama-cpp/active.json")
    nixos_version: Sequence[str] = field(default=("nixos-version", "--json"))
    cpu_governor: Path = Path("/sys/devices/system/cpu/cpu0/cpufreq/scaling_governor")
    command_timeout_s: float = 10.0


# --- the build ---

def system_generation(path: Path) -> str:
    """The store path /run/current-system points at (the system generation), or why there is none."""
    if not os.path.lexists(path):
        return not_available(f"{path} does not exist (not a NixOS system)")
    try:
        target = os.readlink(path)
    except OSError as e:
        return not_available(f"{path} is not a link to a system generation ({e.strerror or e})")
    # a generation links through /nix/var/nix/profiles/system-N-link; the store path is at the end
    return os.path.realpath(os.path.join(os.path.dirname(path), target))


NIXOS_VERSION_KEYS = {  # nixos-version --json's keys (nixos/modules/installer/tools) -> ours
    "nixosVersion": "nixos_version",
    "nixpkgsRevision": "nixpkgs_revision",
    "configurationRevision": "configuration_revision",
}
# why nixos-version leaves a key out: the configuration did not set the option behind it
NIXOS_VERSION_UNSET = {
    "nixosVersion": "nixos-version --json named no nixosVersion",
    "nixpkgsRevision": "nixos-version --json names no nixpkgsRevision (system.nixos.revision is unset: "
                       "nixpkgs came from a tarball or path without its git revision)",
    "configurationRevision": "nixos-version --json names no configurationRevision "
                             "(set system.configurationRevision, e.g. to the flake's self.rev)",
}


def nixos_version(command: Sequence[str], timeout_s: float) -> dict[str, str]:
    """nixos-version --json: the NixOS version, nixpkgs' revision and the configuration's revision."""
    name = " ".join(command)
    try:
        done = subprocess.run(list(command), capture_output=True, text=True, timeout=timeout_s, check=False)
    except FileNotFoundError:
        return dict.fromkeys(NIXOS_VERSION_KEYS.values(), not_available(f"{command[0]} not found (not NixOS)"))
    except (OSError, subprocess.TimeoutExpired) as e:
        return dict.fromkeys(NIXOS_VERSION_KEYS.values(), not_available(f"{name} failed: {e}"))
    if done.returncode != 0:
        why = (done.stderr.strip().splitlines() or [f"exit status {done.returncode}"])[-1]
        return dict.fromkeys(NIXOS_VERSION_KEYS.values(), not_available(f"{name} failed: {why}"))
    try:
        data = json.loads(done.stdout)
    except ValueError:
        return dict.fromkeys(NIXOS_VERSION_KEYS.values(),
                             not_available(f"{name} printed no JSON (an older NixOS without --json?)"))
    if not isinstance(data, dict):
        data = {}
    return {ours: str(data[theirs]) if isinstance(data.get(theirs), str) and data[theirs]
            else not_available(NIXOS_VERSION_UNSET[theirs]) for theirs, ours in NIXOS_VERSION_KEYS.items()}


MARKER_FACTS = ("specialisation", "package_name", "package_version", "package_path", "package_rev")


def _endpoint(url: str) -> tuple[str, int | None]:
    parts = urlsplit(url)
    host = parts.hostname or ""
    host = "127.0.0.1" if host in ("localhost", "127.0.0.1", "::1", "0.0.0.0") else host
    return host, parts.port or {"http": 80, "https": 443}.get(parts.scheme)


def marker_facts(path: Path, server_url: str | None = None) -> dict[str, str]:
    """The marker's account of the active llama.cpp build; each fact, or why the marker cannot say."""
    def none(why: str) -> dict[str, str]:
        return dict.fromkeys(MARKER_FACTS, not_available(why))

    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        return none(f"no marker {path} (the NixOS module services.llama-cpp writes it)")
    except (OSError, UnicodeDecodeError) as e:
        return none(f"{path} cannot be read ({e})")
    except ValueError as e:
        return none(f"{path} is not JSON ({e})")
    if not isinstance(data, dict) or data.get("format") != MARKER_FORMAT:
        return none(f"{path} is not a marker of format {MARKER_FORMAT!r}")
    url = data.get("url")
    if server_url is not None and isinstance(url, str) and _endpoint(url) != _endpoint(server_url):
        return none(f"the marker {path} describes the server at {url}, not the one measured ({server_url})")
    package: dict[str, Any] = data["package"] if isinstance(data.get("package"), dict) else {}
    found = {"specialisation": data.get("specialisation")} | {f"package_{k}": package.get(k) for k in
                                                               ("name", "version", "path", "rev")}
    facts = {}
    for key, value in found.items():
        if isinstance(value, str) and value:
            facts[key] = value
        elif key == "package_rev" and "rev" in package:
            facts[key] = not_available("the marker's package.rev is null (the source names no commit: "
                                       "a nixpkgs release tag)")
        else:
            facts[key] = not_available(f"the marker {path} has no {key.replace('package_', 'package.')}")
    return facts


def build_facts(sources: Sources, server_build: str | None, server_url: str | None = None) -> dict[str, str]:
    return {
        "system": system_generation(sources.current_system),
        **nixos_version(sources.nixos_version, sources.command_timeout_s),
        **marker_facts(sources.marker, server_url),
        "server_build": server_build or not_available(
            "the server did not say (no build_info in /props)" if server_url else "no server was asked"),
    }


# --- the rig ---

FEATURE_ENABLED = 1  # pynvml.NVML_FEATURE_ENABLED: nvmlDeviceGetPersistenceMode's "on"


def _mw_to_w(value: Any) -> Any:
    return value / 1000.0 if is_available(value) else value


def gpu_facts(nvml: Nvml, index: int) -> dict[str, Any]:
    """One GPU's rig facts, each through read-only NVML (milliwatts, bytes and MHz converted)."""
    def read(fn: str, *constants: str) -> Any:
        value, why = nvml.query(fn, index, *constants)
        return not_available(why) if why is not None else value

    memory = read("nvmlDeviceGetMemoryInfo")
    persistence = read("nvmlDeviceGetPersistenceMode")
    name = read("nvmlDeviceGetName")
    return {
        "index": index,
        "name": name.decode() if isinstance(name, bytes) else name,
        "power_limit_enforced_w": _mw_to_w(read("nvmlDeviceGetEnforcedPowerLimit")),
        "power_limit_default_w": _mw_to_w(read("nvmlDeviceGetPowerManagementDefaultLimit")),
        "pcie_gen": read("nvmlDeviceGetCurrPcieLinkGeneration"),
        "pcie_width": read("nvmlDeviceGetCurrPcieLinkWidth"),
        "pcie_gen_max": read("nvmlDeviceGetMaxPcieLinkGeneration"),
        "pcie_width_max": read("nvmlDeviceGetMaxPcieLinkWidth"),
        "persistence_mode": ("enabled" if persistence == FEATURE_ENABLED else "disabled")
        if is_available(persistence) else persistence,
        "memory_used_mib": memory.used / MIB if is_available(memory) else memory,
        "sm_clock_mhz": read("nvmlDeviceGetClockInfo", "NVML_CLOCK_SM"),
        "mem_clock_mhz": read("nvmlDeviceGetClockInfo", "NVML_CLOCK_MEM"),
        "max_sm_clock_mhz": read("nvmlDeviceGetMaxClockInfo", "NVML_CLOCK_SM"),
        "max_mem_clock_mhz": read("nvmlDeviceGetMaxClockInfo", "NVML_CLOCK_MEM"),
    }


def cpu_governor(path: Path) -> str:
    try:
        return path.read_text().strip() or not_available(f"{path} is empty")
    except FileNotFoundError:
        return not_available(f"no {path} (no cpufreq driver, or a virtual machine)")
    except OSError as e:
        return not_available(f"{path} cannot be read ({e.strerror or e})")


def rig_facts(nvml: Nvml, sources: Sources) -> dict[str, Any]:
    if not nvml.available:
        none = not_available(nvml.unavailable or "NVML is not initialised")
        return {"driver": none, "gpus": none, "cpu_governor": cpu_governor(sources.cpu_governor)}
    driver, why = nvml.query_system("nvmlSystemGetDriverVersion")
    gpus: Any = [gpu_facts(nvml, i) for i in range(nvml.count())] or not_available("NVML reports no GPUs")
    return {"driver": not_available(why) if why is not None else
            (driver.decode() if isinstance(driver, bytes) else str(driver)),
            "gpus": gpus, "cpu_governor": cpu_governor(sources.cpu_governor)}


def fingerprint(nvml: Nvml, sources: Sources | None = None, server_build: str | None = None,
                server_url: str | None = None) -> dict[str, Any]:
    """The build and the rig, now (call it before the first load: the memory in use is part of the rig)."""
    sources = sources or Sources()
    return {"build": build_facts(sources, server_build, server_url), "rig": rig_facts(nvml, sources)}


def fingerprint_facts(print_: dict[str, Any] | None) -> list[tuple[str, str]]:
    """A file's fingerprint as (fact, text) pairs, the build's then the rig's (GPU by GPU), for a person;
    a file written before the fingerprint existed says so."""
    if not isinstance(print_, dict):
        return [("fingerprint", not_available("this file was written before llm-bench recorded one"))]
    out = [(f"build: {k.replace('_', ' ')}", str(v)) for k, v in (print_.get("build") or {}).items()]
    rig = print_.get("rig") or {}
    out.extend((f"rig: {k.replace('_', ' ')}", str(v)) for k, v in rig.items() if k != "gpus")
    gpus = rig.get("gpus")
    if isinstance(gpus, list):
        for gpu in gpus:
            out.extend((f"rig: GPU{gpu.get('index')} {k.replace('_', ' ')}", str(v))
                       for k, v in gpu.items() if k != "index")
    elif gpus is not None:
        out.append(("rig: GPUs", str(gpus)))
    return out
