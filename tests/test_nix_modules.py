"""The NixOS modules evaluated with nixpkgs' lib.evalModules (needs NIXPKGS_LIB).

tests/nix/eval-module.nix declares, loosely, the NixOS options the modules set
(systemd.services, environment.etc, assertions, specialisation, the NVIDIA driver switch, ...),
puts nixpkgs' own services.llama-cpp module in the module list (as NixOS does; ours extends it),
and gives the modules a `pkgs` whose llama-cpp is nixpkgs' real recipe called with stand-ins. It returns, for the base system and for every specialisation, the option values, the
unit's ExecStart and serviceConfig, the /etc files (with the derivation that checks the INI),
the package (name, version, CMake flags, hooks) and the failed assertions. Without NIXPKGS_LIB
these tests skip and say so (in CI they fail: CI has ../shared/nixpkgs).

Every test runs against the tree NIXPKGS_LIB names, and `./dev test` runs them once per tree:
../shared/nixpkgs-unstable (nixpkgs' `settings` module, the flake's lock) and ../shared/nixpkgs
(NixOS 26.05's `extraFlags` one). Where the generations differ in what a user writes or in how
nixpkgs renders the unit, the test says which it expects (`generation()`).
"""

from __future__ import annotations

import json
import shlex

import pytest

from tests.nix.helpers import (
    EXPECTED,
    REPO,
    NixError,
    effective_environment,
    exec_flags,
    generation,
    nix_eval,
    nix_string,
    nixpkgs_root,
    service_settings,
)

HARNESS = REPO / "tests" / "nix" / "eval-module.nix"
ALL = f"{REPO}/modules/default.nix"
GENERIC = f"{REPO}/modules/llama-cpp.nix"
FORK_REV = "0123456789abcdef0123456789abcdef01234567"
LLAMAMPERE_SRC = ('{ llmBench.llamampere = { version = "0-unstable-2026-06-14"; src = { rev = "' + FORK_REV + '";'
                  ' outPath = "/nix/store/aaaa-llamampere-src"; }; }; }')
# The machine has the NVIDIA driver (the CUDA router asserts it), and both extra engines on.
NVIDIA = '{ services.xserver.videoDrivers = [ "nvidia" ]; }'
ENGINES = "{ llmBench.engines = { fa86.enable = true; llamampere.enable = true; }; }"
EMPTY_DIR = "-empty-directory"
# Each tree's llama-cpp recipe: its version and the build number and commit it passes to CMake
# (26.05's reads the commit from its source at build time).
RECIPES = {"flags": ("9608", "9608", None), "settings": ("0.5.0-unstable-2026-10-04", "11393", "dbe4c3e")}


def recipe() -> tuple[str, str, str | None]:
    return RECIPES[generation()]


def single_model(path: str, **more: str) -> str:
    """A user's single-model server in the tree's nixpkgs terms."""
    if generation() == "settings":
        extra = " ".join(f"{k} = {v};" for k, v in more.items())
        return f'{{ services.llama-cpp = {{ enable = true; settings = {{ model = {path}; {extra} }}; }}; }}'
    extra = " ".join(f"{ {'models-dir': 'modelsDir'}.get(k, k)} = {v};" for k, v in more.items())
    return f"{{ services.llama-cpp = {{ enable = true; model = {path}; {extra} }}; }}"

BASE_PRESETS = ["qwen3.8-27b-base", "qwen3.8-27b-dflash2-4", "qwen3.8-27b-mtp2", "qwen3.8-27b-turbo-coder-mtp2"]


def harness(**args: str) -> str:
    root = nixpkgs_root()
    extra = " ".join(f"{k} = {v};" for k, v in args.items())
    return f"(import {HARNESS} {{ libPath = {root}/lib; {extra} }})"


def summary(*modules: str) -> dict:
    return nix_eval(f"{harness()}.summary [ {' '.join(modules)} ]")  # type: ignore[return-value]


def failed_assertions(*modules: str) -> list[str]:
    return nix_eval(f"{harness()}.assertionsOf [ {' '.join(modules)} ]")  # type: ignore[return-value]


@pytest.fixture(scope="module")
def full() -> dict:
    return summary(ALL, LLAMAMPERE_SRC, NVIDIA, ENGINES)


def exec_args(exec_start: str) -> list[str]:
    return shlex.split(exec_start)


# The options this module adds to nixpkgs' services.llama-cpp.
OWN_OPTIONS = {"presets", "presetGrids", "checkPresetKeys", "presetsIni", "modelsMax", "sleepIdleSeconds",
               "environment", "environmentFile", "specialisation", "cuda", "deviceAllow", "prefetchModels"}
NIXPKGS_OPTIONS = {
    "flags": {"enable", "package", "model", "modelsDir", "extraFlags", "host", "port", "openFirewall"},
    # With the renamed and removed names, which nixpkgs declares as aliases.
    "settings": {"enable", "package", "settings", "openFirewall", "host", "port", "model", "modelsDir", "modelsPreset",
                 "extraFlags"},
}


def test_the_module_extends_nixpkgs_own() -> None:
    """nixpkgs' module stays in the module list and declares its options; ours declares only the
    options it adds (none of them a name of nixpkgs' module) and replaces no module."""
    files = nix_eval(f"builtins.mapAttrs (_: o: o.declarations or null)"
                     f" ({harness()}.eval [ {GENERIC} ]).options.services.llama-cpp")
    nixpkgs = str(nixpkgs_root() / "nixos/modules/services/misc/llama-cpp.nix")
    assert {name for name, f in files.items() if f == [nixpkgs]} == NIXPKGS_OPTIONS[generation()]
    assert {name for name, f in files.items() if f == [GENERIC]} == OWN_OPTIONS
    for path in (REPO / "modules").rglob("*.nix"):
        assert "disabledModules" not in path.read_text(), path


def test_nixpkgs_module_configuration_is_what_nixpkgs_renders() -> None:
    """With nothing of ours set, the unit is nixpkgs' own: its ExecStart, Type and restart delay."""
    result = summary(GENERIC, single_model('"/models/m.gguf"'))
    assert result["failedAssertions"] == [] and result["warnings"] == []
    model = "--model" if generation() == "settings" else "-m"
    assert exec_flags(result["execStart"]) == {"--host": "127.0.0.1", "--port": "8080", model: "/models/m.gguf"}
    sc = result["serviceConfig"]
    assert (sc["RestartSec"], sc["MemoryDenyWriteExecute"]) == (300, True)
    assert sc.get("Type") == ("idle" if generation() == "flags" else None)


def test_defaults(full: dict) -> None:
    assert full["failedAssertions"] == [] and full["warnings"] == []
    for spec in full["specialised"].values():
        assert spec["failedAssertions"] == [] and spec["warnings"] == []
    options = full["options"]
    assert options["enable"] is True
    assert options["port"] == 48123
    assert options["host"] == "127.0.0.1"
    assert options["modelsMax"] == 1
    assert options["sleepIdleSeconds"] == 300
    assert options["specialisation"] == "base"
    assert options["openFirewall"] is False and full["firewall"] == []
    assert full["wantedBy"] == ["multi-user.target"]
    assert full["default"] == "stock"
    assert full["checkPresetKeys"] is True
    assert options["cuda"] is True


def test_exec_start_runs_the_router(full: dict) -> None:
    """The base system and every specialisation run the router with the same flags."""
    for config in [full, *full["specialised"].values()]:
        args = exec_args(config["execStart"])
        assert args[0] == f"{config['package']['path']}/bin/llama-server"
        flags = exec_flags(config["execStart"])
        # nixpkgs' older module asserts `model` or `modelsDir`: an empty directory adds no model.
        assert flags.pop("--models-dir").endswith(EMPTY_DIR), flags
        assert flags == {"--host": "127.0.0.1", "--port": "48123", "--models-preset": "/etc/llama-cpp/presets.ini",
                         "--models-max": "1", "--sleep-idle-seconds": "300"}
    # The unit names the INI by its /etc path; a new INI restarts it through restartTriggers.
    assert full["restartTriggers"] == [full["etc"]["presetsIni"]["sourcePath"]]


def test_ini_file_and_marker_in_etc(full: dict) -> None:
    expected = (EXPECTED / "base.ini").read_text()
    assert full["presetsIni"] == expected
    assert full["etc"]["presetsIni"]["sourceText"] == expected
    marker = json.loads(full["etc"]["activeJson"])
    assert marker == {
        "format": "llm-bench-llama-cpp-active/1",
        "specialisation": "base",
        "package": {"name": "llama-cpp", "version": recipe()[0], "path": full["package"]["path"], "rev": None,
                    "build_number": recipe()[1], "build_commit": recipe()[2]},
        "presets": BASE_PRESETS,
        "presets_file": "/etc/llama-cpp/presets.ini",
        "url": "http://127.0.0.1:48123",
    }


def check_command(config: dict) -> str:
    ini = config["etc"]["presetsIni"]
    assert "check-preset-keys-1" in ini["nativeBuildInputs"], ini
    assert ini["preferLocalBuild"] is True  # a few kilobytes of text: never worth a remote builder
    return ini["buildCommand"]


def test_ini_is_checked_against_each_configurations_own_package(full: dict) -> None:
    """Each INI is built by running check-preset-keys on its own package's llama-server."""
    servers = set()
    for config in [full, *full["specialised"].values()]:
        command = check_command(config)
        server = f"{config['package']['path']}/bin/llama-server"
        assert f"check-preset-keys --server {server} " in command, command
        # The unit's own flags are checked against the same --help.
        flags = [arg.split("=", 1)[1] for arg in shlex.split(command.split("check-preset-keys", 1)[1])
                 if arg.startswith("--flag=")]
        assert sorted(flags) == ["--host", "--models-dir", "--models-max", "--models-preset", "--port",
                                 "--sleep-idle-seconds"], flags
        servers.add(server)
    assert len(servers) == 3  # stock, fa86 and the fork: three packages, three checks
    # The INI derivation depends on the package, so a new package gives a new INI path.
    paths = {c["etc"]["presetsIni"]["sourcePath"] for c in [full, *full["specialised"].values()]}
    assert len(paths) == 3


def test_the_flag_check_covers_the_users_extra_flags() -> None:
    """The user's own command-line options (nixpkgs' `settings`, or `extraFlags` before it) reach
    the unit and the key check."""
    result = summary(ALL, NVIDIA, service_settings(c=4096, temp="-0.5", jinja=True))
    assert result["failedAssertions"] == [] and result["warnings"] == []
    command = check_command(result)
    for flag in ("--flag=-c ", "--flag=--temp ", "--flag=--jinja "):
        assert flag in command, command
    checked = [arg.split("=", 1)[1] for arg in shlex.split(command.split("check-preset-keys", 1)[1])
               if arg.startswith("--flag=")]
    assert "-0.5" not in checked and "4096" not in checked  # values are not flags
    flags = exec_flags(result["execStart"])
    assert (flags["-c"], flags["--temp"], flags["--jinja"]) == ("4096", "-0.5", None), flags
    assert flags["--models-preset"] == "/etc/llama-cpp/presets.ini"  # the router's stay


def test_a_users_router_settings_win_over_the_modules() -> None:
    """A user's own value of a router flag replaces the module's, not joins it."""
    if generation() == "settings":
        result = summary(ALL, NVIDIA, service_settings(**{"models-max": 2, "sleep-idle-seconds": 60}))
    else:
        result = summary(ALL, NVIDIA, "{ services.llama-cpp = { modelsMax = 2; sleepIdleSeconds = 60; }; }")
    flags = exec_flags(result["execStart"])
    assert (flags["--models-max"], flags["--sleep-idle-seconds"]) == ("2", "60"), flags
    # The module's own options say the same under either generation.
    options = summary(ALL, NVIDIA, "{ services.llama-cpp = { modelsMax = 3; sleepIdleSeconds = -1; }; }")
    flags = exec_flags(options["execStart"])
    assert (flags["--models-max"], flags["--sleep-idle-seconds"]) == ("3", "-1"), flags


def test_the_key_check_can_be_turned_off() -> None:
    result = summary(ALL, LLAMAMPERE_SRC, NVIDIA, "{ services.llama-cpp.checkPresetKeys = false; }")
    assert result["etc"]["presetsIni"]["buildCommand"] is None
    assert result["etc"]["presetsIni"]["sourceText"] == (EXPECTED / "base.ini").read_text()


def test_base_package_is_nixpkgs_llama_cpp_with_cuda(full: dict) -> None:
    assert full["package"]["pname"] == "llama-cpp"
    assert full["package"]["version"] == recipe()[0]
    assert "-DGGML_CUDA:BOOL=TRUE" in full["package"]["cmakeFlags"]
    cpu = summary(ALL, LLAMAMPERE_SRC, "{ llmBench.cuda = false; }")
    assert "-DGGML_CUDA:BOOL=FALSE" in cpu["package"]["cmakeFlags"]
    assert cpu["failedAssertions"] == []  # no NVIDIA driver needed
    assert cpu["options"]["cuda"] is False and cpu["options"]["deviceAllow"] is None
    assert "DevicePolicy" not in cpu["serviceConfig"]
    assert cpu["execStartPre"] is None and cpu["kernelModules"] == []
    assert cpu["serviceConfig"]["MemoryDenyWriteExecute"] is True  # nixpkgs' hardening stays without CUDA


def test_hardened_unit_reaches_the_gpu_and_shares_the_cache(full: dict) -> None:
    sc = full["serviceConfig"]
    assert sc["PrivateDevices"] is False
    assert sc["DevicePolicy"] == "closed"
    # /proc/devices names: "nvidia" and "nvidiactl" since driver 550.40, "nvidia-frontend" before.
    assert set(sc["DeviceAllow"]) == {"char-nvidiactl", "char-nvidia", "char-nvidia-frontend", "char-nvidia-uvm",
                                      "char-nvidia-caps"}
    assert sc["MemoryDenyWriteExecute"] is False
    assert sc["ProcSubset"] == "all"
    # Downloads are state (an administrator may wipe /var/cache), shared by every specialisation.
    assert sc["StateDirectory"] == "llama-cpp"
    assert sc["WorkingDirectory"] == "/var/lib/llama-cpp"
    env = effective_environment(full)
    assert (env["LLAMA_CACHE"], env["HOME"]) == ("/var/lib/llama-cpp", "/var/lib/llama-cpp"), env
    assert sc["DynamicUser"] is True and sc["ProtectSystem"] == "strict" and sc["NoNewPrivileges"] is True
    assert sc["ProtectKernelModules"] is True  # hence nvidia_uvm at boot
    for spec in full["specialised"].values():
        assert spec["serviceConfig"]["StateDirectory"] == "llama-cpp"
        assert effective_environment(spec)["LLAMA_CACHE"] == "/var/lib/llama-cpp"


def test_the_effective_cache_is_the_shared_state_directory(full: dict) -> None:
    """What systemd hands llama-server, read as systemd reads the unit: `environment` lines first,
    then serviceConfig's Environment= lines, the last assignment winning. nixpkgs' newer unit sets
    LLAMA_CACHE=/var/cache/llama-cpp there; ours comes after it."""
    sc = full["serviceConfig"]
    lines = sc["Environment"]
    if generation() == "settings":
        assert lines[0] == "LLAMA_CACHE=/var/cache/llama-cpp", lines  # nixpkgs' own, first
    assert effective_environment(full)["LLAMA_CACHE"] == "/var/lib/llama-cpp"
    # The reading is the systemd one: with our line before nixpkgs', the cache would be nixpkgs'.
    swapped = {**full, "serviceConfig": {**sc, "Environment": list(reversed(lines))}}
    expected = "/var/cache/llama-cpp" if generation() == "settings" else "/var/lib/llama-cpp"
    assert effective_environment(swapped)["LLAMA_CACHE"] == expected
    # A user's own LLAMA_CACHE (and other variables) still reach the service.
    mine = summary(ALL, NVIDIA, '{ services.llama-cpp.environment = { LLAMA_CACHE = "/srv/models"; FOO = "bar"; }; }')
    env = effective_environment(mine)
    assert (env["LLAMA_CACHE"], env["FOO"], env["HOME"]) == ("/srv/models", "bar", "/var/lib/llama-cpp"), env


def test_cuda_needs_the_nvidia_driver_uvm_and_a_cuda_device(full: dict) -> None:
    """Without the driver, evaluation fails saying how to configure it; with it, nvidia_uvm is loaded
    at boot and the unit's ExecStartPre (every specialisation's, with its own llama-server) refuses
    to start without a CUDA device."""
    messages = failed_assertions(ALL, LLAMAMPERE_SRC)
    assert any("services.llama-cpp.cuda: a CUDA build needs the NVIDIA driver" in m
               and 'services.xserver.videoDrivers = [ "nvidia" ]' in m for m in messages), messages
    assert failed_assertions(ALL, LLAMAMPERE_SRC, "{ hardware.nvidia.datacenter.enable = true; }") == []
    assert failed_assertions(ALL, LLAMAMPERE_SRC, "{ llmBench.cuda = false; }") == []
    for config in [full, *full["specialised"].values()]:
        assert config["kernelModules"] == ["nvidia_uvm"]
        assert config["execStartPre"].endswith("-llama-cpp-require-cuda"), config["execStartPre"]
        assert config["serviceConfig"]["ExecStartPre"] == config["execStartPre"]
    # The script text of each configuration, for its own package (the stand-ins' writeShellScript
    # keeps the text; tests/test_nix_preset_keys.py runs it against a real llama-server).
    scripts = nix_eval(f"let h = {harness()}; c = (h.eval [ {ALL} {LLAMAMPERE_SRC} {NVIDIA} {ENGINES} ]).config; "
                       f"cuda = import {REPO}/modules/lib/cuda-unit.nix; in "
                       'map (cfg: cuda.requireCudaDevice "${cfg.services.llama-cpp.package}/bin/llama-server")'
                       " ([ c ] ++ map (s: s.configuration) (builtins.attrValues c.specialisation))")
    paths = {config["package"]["path"] for config in [full, *full["specialised"].values()]}
    assert {next(p for p in paths if p in script) for script in scripts} == paths
    assert all("--list-devices" in script for script in scripts)


def test_a_broken_engine_stops_after_a_few_starts(full: dict) -> None:
    """nixpkgs restarts after RestartSec = 300 s; the start limit counts three failed starts within
    an interval longer than their restart delays, so it can trip (systemd's default, 5 starts in
    10 s, never does)."""
    for config in [full, *full["specialised"].values()]:
        burst, interval = config["startLimit"]["burst"], config["startLimit"]["intervalSec"]
        restart = config["serviceConfig"]["RestartSec"]
        assert (burst, restart) == (3, 300) and interval > burst * restart, config["startLimit"]
        assert config["serviceConfig"]["Restart"] == "on-failure"


def test_hf_token_comes_from_an_environment_file() -> None:
    result = summary(ALL, NVIDIA, '{ services.llama-cpp.environmentFile = "/run/secrets/llama-cpp.env"; }')
    assert result["serviceConfig"]["EnvironmentFile"] == "/run/secrets/llama-cpp.env"
    assert "EnvironmentFile" not in summary(ALL, NVIDIA)["serviceConfig"]


def test_a_model_source_can_pin_a_hugging_face_revision() -> None:
    pinned = ('{ llmBench.models.qwen38 = { repo = "unsloth/Qwen3.8-27B-GGUF"; file = "Qwen3.8-27B-UD-Q4_K_XL.gguf";'
              f' revision = "{FORK_REV}"; }}; }}')
    result = summary(ALL, NVIDIA, pinned)
    url = f"https://huggingface.co/unsloth/Qwen3.8-27B-GGUF/resolve/{FORK_REV}/Qwen3.8-27B-UD-Q4_K_XL.gguf"
    assert f"[qwen3.8-27b-base]\nmodel-url = {url}\n" in result["presetsIni"], result["presetsIni"]
    assert "unsloth/Qwen3.8-27B-GGUF:UD-Q4_K_XL" not in result["presetsIni"]
    with pytest.raises(NixError, match="cannot be pinned to a revision"):
        summary(ALL, NVIDIA, pinned.replace("qwen38", "dflash2Draft"))
    with pytest.raises(NixError, match="revision"):
        summary(ALL, NVIDIA, pinned.replace(FORK_REV, "main"))


def test_extra_engines_are_opt_in_and_the_base_never_builds_them() -> None:
    """By default only the default engine exists: no specialisation, and evaluating the whole base
    system (unit, INI, marker) never touches the fa86 or llamampere package, so neither a failing
    fork build nor its key check can fail a rebuild of a system that did not ask for them."""
    result = summary(ALL, NVIDIA, '{ llmBench.engines.fa86.package = throw "fa86 was built";'
                     ' llmBench.engines.llamampere.package = throw "the fork was built"; }')
    assert result["specialisations"] == [] and result["failedAssertions"] == []
    assert result["package"]["pname"] == "llama-cpp"
    # The control: turned on, the base system does depend on it.
    with pytest.raises(NixError, match="fa86 was built"):
        summary(ALL, NVIDIA, '{ llmBench.engines.fa86 = { enable = true; package = throw "fa86 was built"; }; }')


def test_no_specialisation_without_the_router() -> None:
    result = nix_eval(f"({harness()}.eval [ {ALL} {NVIDIA} {ENGINES} {{ services.llama-cpp.enable = false; }} ])"
                      ".config.specialisation")
    assert result == {}
    with_router = nix_eval(f"builtins.attrNames ({harness()}.eval [ {ALL} {NVIDIA} {ENGINES} {LLAMAMPERE_SRC} ])"
                           ".config.specialisation")
    assert with_router == ["llm-fa86", "llm-llamampere"]


def test_specialisations_are_declared(full: dict) -> None:
    assert full["specialisations"] == ["llm-fa86", "llm-llamampere"]
    assert set(full["specialised"]) == {"llm-fa86", "llm-llamampere"}
    for spec in full["specialised"].values():
        assert spec["failedAssertions"] == []


CPU = "{ llmBench.cuda = false; }"


def test_the_flakes_key_check_reads_specialisations_as_nixos_gives_them() -> None:
    """The flake's presets-keys check (tests/nixos/presets-keys.nix) takes each INI from the
    evaluated system: `specialisation.<name>.configuration` is the child's config, as NixOS
    (and the harness) type it through extendModules, not a module to evaluate again."""
    farm = nix_eval(
        f"let h = {harness()}; in (import {REPO}/tests/nixos/presets-keys.nix {{"
        f" inherit (h) pkgs; nixosSystem = h.eval [ {ALL} {LLAMAMPERE_SRC} {CPU} {ENGINES} ]; }}).entries"
    )
    cpu = summary(ALL, LLAMAMPERE_SRC, CPU, ENGINES)
    configs = {"base": cpu, **cpu["specialised"]}
    assert {e["name"]: e["path"] for e in farm} == {
        f"{name}.ini": config["etc"]["presetsIni"]["sourcePath"] for name, config in configs.items()
    }
    assert len({e["path"] for e in farm}) == 3  # three packages, three checked INIs


def test_the_harness_types_specialisations_as_nixos_does() -> None:
    """The control: feeding a specialisation's configuration back into extendModules as a
    module (the flake's former `configOf`) defines every option twice, so a read-only one
    fails, as it does in NixOS; the harness no longer models a deferred module."""
    with pytest.raises(NixError, match="presetsIni' is read-only, but it's set multiple times"):
        nix_eval(
            f"let h = {harness()}; base = h.eval [ {ALL} {LLAMAMPERE_SRC} {NVIDIA} {ENGINES} ]; in"
            ' (base.extendModules { modules = [ base.config.specialisation.llm-fa86.configuration'
            " { specialisation = h.lib.mkOverride 0 { }; } ]; }).config.services.llama-cpp.presetsIni"
        )


def test_llm_fa86(full: dict) -> None:
    spec = full["specialised"]["llm-fa86"]
    assert spec["options"]["specialisation"] == "llm-fa86"
    assert spec["package"]["pname"] == "llama-cpp-fa86"
    flags = spec["package"]["cmakeFlags"]
    assert "-DGGML_CUDA:BOOL=TRUE" in flags
    # The real recipe adds its own CMAKE_CUDA_ARCHITECTURES list; exactly one, ours, remains.
    assert [f for f in flags if f.startswith("-DCMAKE_CUDA_ARCHITECTURES")] == ["-DCMAKE_CUDA_ARCHITECTURES:STRING=86"]
    assert "-DGGML_CUDA_FA_ALL_QUANTS:BOOL=TRUE" in flags
    assert spec["presetsIni"] == (EXPECTED / "llm-fa86.ini").read_text()
    assert spec["etc"]["presetsIni"]["sourceText"] == spec["presetsIni"]
    marker = json.loads(spec["etc"]["activeJson"])
    assert marker["specialisation"] == "llm-fa86" and marker["package"]["name"] == "llama-cpp-fa86"
    assert marker["presets"] == sorted(BASE_PRESETS + ["qwen3.8-27b-kv84"])
    # A new package and a new INI: the unit changes, so switching restarts it.
    assert spec["execStart"] != full["execStart"]
    assert exec_args(spec["execStart"])[0].startswith(spec["package"]["path"])
    assert spec["serviceConfig"]["StateDirectory"] == "llama-cpp"
    assert spec["restartTriggers"] == [spec["etc"]["presetsIni"]["sourcePath"]] != full["restartTriggers"]
    assert spec["options"]["port"] == 48123


def test_llm_llamampere(full: dict) -> None:
    spec = full["specialised"]["llm-llamampere"]
    pkg = spec["package"]
    assert spec["options"]["specialisation"] == "llm-llamampere"
    assert (pkg["pname"], pkg["version"]) == ("llamampere", "0-unstable-2026-06-14")
    assert pkg["src"] == "/nix/store/aaaa-llamampere-src"
    assert pkg["llamampereRev"] == FORK_REV
    flags = pkg["cmakeFlags"]
    # The recipe's LLAMA_BUILD_NUMBER is its version through the finalAttrs fixpoint ("0.5.1",
    # which would not compile); exactly one, the integer, remains.
    assert [f for f in flags if f.startswith("-DLLAMA_BUILD_NUMBER")] == ["-DLLAMA_BUILD_NUMBER:STRING=0"]
    assert "-DLLAMA_BUILD_COMMIT:STRING=0123456" in flags
    assert [f for f in flags if f.startswith("-DCMAKE_CUDA_ARCHITECTURES")] == ["-DCMAKE_CUDA_ARCHITECTURES:STRING=86"]
    assert "-DGGML_CUDA_FA_QUANTS:STRING=all" in flags
    assert "-DLLAMA_BUILD_UI:BOOL=FALSE" in flags and "-DLLAMA_USE_PREBUILT_UI:BOOL=FALSE" in flags
    # Decided, not inherited: no recipe patches, no postPatch, the CPU variants kept with the
    # CUDA backend loaded at run time (so llama-server runs in the sandbox for the key check).
    assert pkg["patches"] == [] and pkg["postPatch"] == ""
    assert "-DGGML_BACKEND_DL:BOOL=TRUE" in flags and "-DGGML_CPU_ALL_VARIANTS:BOOL=TRUE" in flags
    # No COMMIT file and no npm web UI build in the fork's source.
    assert "COMMIT" not in pkg["preConfigure"] and "npm" not in pkg["preConfigure"]
    assert pkg["npmDeps"] is None
    assert not any("npm" in p or p.startswith("nodejs") for p in pkg["nativeBuildInputs"])
    assert "cmake-3.31.6" in pkg["nativeBuildInputs"]  # the rest of the recipe's inputs stay
    assert spec["presetsIni"] == (EXPECTED / "llm-llamampere.ini").read_text()
    marker = json.loads(spec["etc"]["activeJson"])
    # The fork's revision is recorded with the package (llm-bench copies it into its results).
    assert marker["package"] == {"name": "llamampere", "version": "0-unstable-2026-06-14", "path": pkg["path"],
                                 "rev": FORK_REV, "build_number": "0", "build_commit": FORK_REV[:7]}
    assert not any(p.startswith("qwen3.8") for p in marker["presets"])


def test_llamampere_without_source_is_an_assertion() -> None:
    result = summary(ALL, NVIDIA, ENGINES)
    assert result["failedAssertions"] == []
    assert any("llmBench.llamampere.src" in m for m in result["specialised"]["llm-llamampere"]["failedAssertions"])


USER = """{
  services.llama-cpp.presets.mine = { model = "/srv/models/mine.gguf"; ctx-size = 4096; };
  services.llama-cpp.presets."*" = { ctx-size = 32768; cache-type-v = null; };
}"""


def test_user_presets_and_global_settings_reach_every_specialisation() -> None:
    result = summary(ALL, LLAMAMPERE_SRC, NVIDIA, ENGINES, USER)
    for name, config in [("base", result), *result["specialised"].items()]:
        assert config["failedAssertions"] == [] and config["warnings"] == [], name
        flags = exec_flags(config["execStart"])
        assert (flags["--models-preset"], flags["--models-max"], flags["--sleep-idle-seconds"], flags["--port"]) == (
            "/etc/llama-cpp/presets.ini", "1", "300", "48123"), (name, flags)
        assert "mine" in config["presets"], (name, config["presets"])
        ini = config["presetsIni"]
        assert "[mine]\nctx-size = 4096\nmodel = /srv/models/mine.gguf\n" in ini, (name, ini)
        global_section = ini.split("[*]\n", 1)[1].split("\n\n", 1)[0]
        # The user's "*" wins over the module's, and null removes the module's key.
        assert "ctx-size = 32768" in global_section and "cache-type-v" not in global_section, (name, global_section)
        assert "cache-type-k = q8_0" in global_section, (name, global_section)
        assert "mine" in json.loads(config["etc"]["activeJson"])["presets"], name
    # Each specialisation still adds its own and only its own.
    assert "qwen3.8-27b-kv84" in result["specialised"]["llm-fa86"]["presets"]
    assert "ampere-none" in result["specialised"]["llm-llamampere"]["presets"]
    assert "qwen3.8-27b-base" not in result["specialised"]["llm-llamampere"]["presets"]


def test_user_settings_of_the_service_reach_every_specialisation() -> None:
    port = "settings.port" if generation() == "settings" else "port"
    result = summary(ALL, LLAMAMPERE_SRC, NVIDIA, ENGINES,
                     f'{{ services.llama-cpp = {{ {port} = 9000; sleepIdleSeconds = -1; }}; }}')
    assert result["warnings"] == []
    for config in [result, *result["specialised"].values()]:
        assert config["options"]["port"] == 9000 and config["options"]["sleepIdleSeconds"] == -1
        assert exec_flags(config["execStart"])["--port"] == "9000"
        assert json.loads(config["etc"]["activeJson"])["url"] == "http://127.0.0.1:9000"


def test_an_engine_may_keep_the_base_presets_or_not() -> None:
    result = summary(ALL, LLAMAMPERE_SRC, NVIDIA, ENGINES, "{ llmBench.engines.llamampere.inheritBasePresets = true; }"
                     '{ llmBench.presets.extra.model = "/x.gguf"; }')
    ampere = result["specialised"]["llm-llamampere"]["presets"]
    assert set(BASE_PRESETS) | {"extra", "ampere-none"} <= set(ampere)
    # llmBench.presets adds to the base presets instead of replacing them.
    assert set(BASE_PRESETS) | {"extra"} <= set(result["presets"])
    assert "extra" not in summary(ALL, LLAMAMPERE_SRC, NVIDIA, ENGINES)["specialised"]["llm-llamampere"]["presets"]


def test_an_engines_own_presets_are_overridden_key_by_key() -> None:
    """A definition of one key of an engine's preset (or of its "*") replaces that key only."""
    result = summary(ALL, LLAMAMPERE_SRC, NVIDIA, ENGINES, """{
      llmBench.engines.fa86.presets."qwen3.8-27b-kv84".spec-draft-n-max = 3;
      llmBench.engines.llamampere.presets."*".ctx-size = 4096;
    }""")
    fa86 = result["specialised"]["llm-fa86"]
    assert fa86["failedAssertions"] == []
    expected = (EXPECTED / "llm-fa86.ini").read_text()
    old = "[qwen3.8-27b-kv84]\ncache-type-k = q8_0\ncache-type-v = q4_0\nhf-repo = unsloth/Qwen3.8-27B-GGUF:UD-Q4_K_XL\nspec-draft-n-max = 2\n"
    assert old in expected
    assert fa86["presetsIni"] == expected.replace(old, old.replace("spec-draft-n-max = 2", "spec-draft-n-max = 3"))
    ampere = result["specialised"]["llm-llamampere"]
    expected = (EXPECTED / "llm-llamampere.ini").read_text()
    assert "ctx-size = 65536\n" in expected
    assert ampere["presetsIni"] == expected.replace("ctx-size = 65536\n", "ctx-size = 4096\n", 1)


def test_an_unknown_engine_is_an_assertion_not_a_broken_specialisation() -> None:
    """`default` and `active` name only stock, fa86 and llamampere: another engine is refused
    when the base system evaluates, and gets no specialisation that would fail to build."""
    result = summary(ALL, LLAMAMPERE_SRC, NVIDIA, ENGINES, '{ llmBench.engines.mine.presets.p.model = "/m.gguf"; }')
    assert result["specialisations"] == ["llm-fa86", "llm-llamampere"]
    assert any("llmBench.engines: no engine named `mine`" in m for m in result["failedAssertions"]), \
        result["failedAssertions"]
    assert summary(ALL, LLAMAMPERE_SRC, NVIDIA, ENGINES)["failedAssertions"] == []


def test_default_engine_llamampere_is_the_base_system() -> None:
    alone = summary(ALL, LLAMAMPERE_SRC, NVIDIA, '{ llmBench.default = "llamampere"; }')
    assert alone["failedAssertions"] == [] and alone["package"]["pname"] == "llamampere"
    assert alone["specialisations"] == []  # stock is then opt-in like the others
    result = summary(ALL, LLAMAMPERE_SRC, NVIDIA, '{ llmBench.default = "llamampere"; }',
                     "{ llmBench.engines = { stock.enable = true; fa86.enable = true; }; }")
    assert result["failedAssertions"] == []
    assert result["package"]["pname"] == "llamampere"
    assert result["options"]["specialisation"] == "base"
    assert result["presetsIni"] == (EXPECTED / "llm-llamampere.ini").read_text()
    assert result["specialisations"] == ["llm-fa86", "llm-stock"]
    stock = result["specialised"]["llm-stock"]
    assert stock["failedAssertions"] == []
    assert stock["package"]["pname"] == "llama-cpp" and stock["options"]["specialisation"] == "llm-stock"
    assert stock["presetsIni"] == (EXPECTED / "base.ini").read_text()
    assert result["specialised"]["llm-fa86"]["package"]["pname"] == "llama-cpp-fa86"
    marker = json.loads(result["etc"]["activeJson"])
    assert marker["specialisation"] == "base" and marker["package"]["name"] == "llamampere"


def test_engines_can_be_turned_on_one_by_one() -> None:
    # On: a specialisation; the other stays off, and its package is never evaluated (the
    # missing fork source raises no assertion).
    result = summary(ALL, NVIDIA, "{ llmBench.engines.fa86.enable = true; }")
    assert result["specialisations"] == ["llm-fa86"]
    assert result["failedAssertions"] == [] and result["specialised"]["llm-fa86"]["failedAssertions"] == []
    messages = failed_assertions(ALL, LLAMAMPERE_SRC, NVIDIA,
                                 '{ llmBench.default = "fa86"; llmBench.engines.fa86.enable = false; }')
    assert any('llmBench.default = "fa86"' in m and "enable is false" in m for m in messages), messages


def test_engine_packages_keep_their_old_option_names() -> None:
    result = summary(ALL, NVIDIA, ENGINES, '{ llmBench.packages.llamampere = (import '
                     f'{REPO}/tests/nix/stand-ins.nix {{ lib = import {nixpkgs_root()}/lib; nixpkgsRoot = {nixpkgs_root()}; }})'
                     '.llama-cpp.overrideAttrs (old: { pname = "my-fork"; }); }')
    assert result["specialised"]["llm-llamampere"]["package"]["pname"] == "my-fork"


def test_model_sources_are_options() -> None:
    result = summary(ALL, LLAMAMPERE_SRC, NVIDIA, ENGINES, '{ llmBench.models.qwen38 = "/srv/models/q.gguf"; }')
    assert "model = /srv/models/q.gguf" in result["presetsIni"]
    assert "model = /srv/models/q.gguf" in result["specialised"]["llm-llamampere"]["presetsIni"]


def test_preset_grids_option() -> None:
    result = summary(ALL, LLAMAMPERE_SRC, NVIDIA, ENGINES, """{ services.llama-cpp.presetGrids.tiny = {
        base = { model = "/m.gguf"; };
        axes = [ { q8 = { cache-type-k = "q8_0"; }; f16 = { cache-type-k = "f16"; }; }
                 { d1 = { spec-draft-n-max = 1; }; d3 = { spec-draft-n-max = 3; }; } ];
    }; }""")
    grid = {"tiny-q8-d1", "tiny-q8-d3", "tiny-f16-d1", "tiny-f16-d3"}
    for config in [result, *result["specialised"].values()]:
        assert grid <= set(config["presets"])
        assert "[tiny-f16-d3]\ncache-type-k = f16\nmodel = /m.gguf\nspec-draft-n-max = 3\n" in config["presetsIni"]


def test_nixpkgs_style_single_model_configuration_still_works() -> None:
    if generation() == "settings":
        user = ('{ services.llama-cpp = { enable = true; openFirewall = true; settings = { model = "/models/m.gguf";'
                ' port = 8080; c = 4096; host = "0.0.0.0"; }; }; }')
        model = "--model"
    else:
        user = ('{ services.llama-cpp = { enable = true; model = "/models/m.gguf"; port = 8080;'
                ' extraFlags = [ "-c" "4096" ]; openFirewall = true; host = "0.0.0.0"; }; }')
        model = "-m"
    result = summary(GENERIC, user)
    assert result["failedAssertions"] == [] and result["warnings"] == []
    assert exec_flags(result["execStart"]) == {"--host": "0.0.0.0", "--port": "8080", model: "/models/m.gguf",
                                               "-c": "4096"}
    assert result["firewall"] == [8080]
    assert result["etc"]["presetsIni"] is None
    assert json.loads(result["etc"]["activeJson"])["presets_file"] is None


def test_generic_module_has_nixpkgs_defaults() -> None:
    """Alone, services.llama-cpp behaves as nixpkgs' module: port 8080, no idle sleep, all devices."""
    result = summary(GENERIC, single_model('"/models/m.gguf"'))
    assert result["options"]["port"] == 8080
    assert result["options"]["sleepIdleSeconds"] is None
    assert "--sleep-idle-seconds" not in result["execStart"]
    assert result["options"]["deviceAllow"] is None
    sc = result["serviceConfig"]
    assert "DevicePolicy" not in sc and "DeviceAllow" not in sc and sc["PrivateDevices"] is False
    # Router mode alone does not sleep either unless asked.
    router = summary(GENERIC, '{ services.llama-cpp = { enable = true; presets.m.model = "/m.gguf"; }; }')
    assert "--sleep-idle-seconds" not in router["execStart"] and router["options"]["port"] == 8080


def test_a_path_model_enters_the_store(tmp_path) -> None:
    model = tmp_path / "single.gguf"
    model.write_bytes(b"GGUF")
    # nixpkgs' newer `settings` renders strings, so the path is interpolated (which copies it).
    value = f'"${{{model}}}"' if generation() == "settings" else str(model)
    result = summary(GENERIC, single_model(value))
    args = exec_args(result["execStart"])
    stored = args[args.index("--model" if generation() == "settings" else "-m") + 1]
    assert stored.startswith("/nix/store/") and stored.endswith("-single.gguf"), stored
    assert any(c.endswith("-single.gguf") for c in result["execStartContext"]), result["execStartContext"]


def test_enabled_without_anything_to_serve_is_an_assertion() -> None:
    """nixpkgs' older module asserts a model or a directory; the newer one starts an empty router."""
    messages = failed_assertions(GENERIC, "{ services.llama-cpp.enable = true; }")
    if generation() == "settings":
        assert messages == []
    else:
        assert any("Either 'model' or 'modelDir' must be set" in m for m in messages), messages  # nixpkgs' own


def test_model_and_presets_together_is_an_assertion() -> None:
    messages = failed_assertions(
        GENERIC,
        single_model('"/m.gguf"').replace("enable = true;", 'enable = true; presets.p.model = "/n.gguf";'),
    )
    assert any("cannot be combined" in m for m in messages), messages


def test_nixpkgs_renamed_model_is_explained_under_settings() -> None:
    """With nixpkgs' `settings`, a definition of the renamed `model` reaches `settings.model` with the
    rename's override wrapper, which ExecStart cannot render: the assertion says what to write."""
    old_style = '{ services.llama-cpp = { enable = true; model = "/models/m.gguf"; }; }'
    messages = failed_assertions(GENERIC, old_style)
    if generation() == "settings":
        assert any("services.llama-cpp.model: this nixpkgs renamed it to services.llama-cpp.settings.model" in m
                   and "Set services.llama-cpp.settings.model instead" in m for m in messages), messages
        # The control: the wrapper really breaks the rendering the assertion warns of.
        with pytest.raises(NixError):
            summary(GENERIC, old_style)
    else:
        assert messages == []


def test_a_models_directory_under_either_name() -> None:
    """The router's models directory: nixpkgs' `modelsDir`, or `settings.models-dir` (which this
    module types, so nixpkgs' rename of `modelsDir` reaches it too)."""
    name = "settings.models-dir" if generation() == "settings" else "modelsDir"
    result = summary(GENERIC, f'{{ services.llama-cpp = {{ enable = true; {name} = "/srv/gguf"; }}; }}')
    assert result["failedAssertions"] == [] and result["warnings"] == []
    flags = exec_flags(result["execStart"])
    assert (flags["--models-dir"], flags["--models-max"]) == ("/srv/gguf", "1"), flags
    assert "--models-preset" not in flags
    if generation() == "settings":
        # The old name still works here, with nixpkgs' own rename warning for the user's definition.
        renamed = summary(GENERIC, '{ services.llama-cpp = { enable = true; modelsDir = "/srv/gguf"; }; }')
        assert exec_flags(renamed["execStart"])["--models-dir"] == "/srv/gguf"
        assert renamed["failedAssertions"] == []
        assert any("modelsDir" in w and "settings.models-dir" in w for w in renamed["warnings"]), renamed["warnings"]


@pytest.mark.parametrize(
    "preset,section,words",
    [
        ("bad\nname", "{ c = 1; }", ['preset "bad\\nname"', "line break"]),
        ("bad]name", "{ c = 1; }", ['preset "bad]name"', "`]`"]),
        ("p", '{ chat-template = "a\\nb"; }', ['preset "p", key "chat-template"', "line break"]),
    ],
    ids=["newline-in-name", "bracket-in-name", "newline-in-value"],
)
def test_bad_preset_data_fails_the_assertions(preset: str, section: str, words: list[str]) -> None:
    module = f"{{ services.llama-cpp = {{ enable = true; presets.{nix_string(preset)} = {section}; }}; }}"
    messages = failed_assertions(GENERIC, module)
    joined = "\n".join(messages)
    assert all(m.startswith("services.llama-cpp.presets: ") for m in messages), joined
    for word in words:
        assert word in joined, joined
    # The rendered INI itself refuses to exist.
    with pytest.raises(NixError) as info:
        nix_eval(f"({harness()}.eval [ {GENERIC} {module} ]).config.services.llama-cpp.presetsIni")
    assert words[0] in info.value.args[0]


def test_unsupported_type_is_an_option_type_error_naming_preset_and_key() -> None:
    with pytest.raises(NixError) as info:
        summary(GENERIC, "{ services.llama-cpp = { enable = true; presets.mypreset.ctx-size = [ 1 2 ]; }; }")
    message = info.value.args[0]
    assert "services.llama-cpp.presets.mypreset.ctx-size" in message, message
    assert "is not of type" in message, message


def test_a_package_set_on_the_service_is_warned_about() -> None:
    """services.llama-cpp.package outranks every engine's package, so each specialisation runs it."""
    plain = summary(ALL, LLAMAMPERE_SRC, NVIDIA, ENGINES)
    assert plain["warnings"] == [] and all(s["warnings"] == [] for s in plain["specialised"].values())
    direct = summary(ALL, LLAMAMPERE_SRC, NVIDIA, ENGINES, '{ services.llama-cpp.package = (import '
                     f'{REPO}/tests/nix/stand-ins.nix {{ lib = import {nixpkgs_root()}/lib; nixpkgsRoot = {nixpkgs_root()}; }})'
                     '.llama-cpp.overrideAttrs (old: { pname = "mine"; }); }')
    assert direct["specialised"]["llm-fa86"]["package"]["pname"] == "mine"
    assert any("llmBench.engines.fa86.package in specialisation llm-fa86" in w
               for w in direct["specialised"]["llm-fa86"]["warnings"]), direct["specialised"]["llm-fa86"]["warnings"]
    assert any("services.llama-cpp.package is set directly" in w for w in direct["warnings"])


def test_reference_presets_can_be_turned_off() -> None:
    """llmBench.referencePresets.enable = false serves only the user's presets, in the base system
    and in every specialisation: no reference preset and no shipped `[*]` defaults."""
    mine = '{ llmBench.referencePresets.enable = false; services.llama-cpp.presets.mine.model = "/srv/m.gguf"; }'
    result = summary(ALL, LLAMAMPERE_SRC, NVIDIA, ENGINES, mine)
    for name, config in [("base", result), *result["specialised"].items()]:
        assert config["failedAssertions"] == [] and config["warnings"] == [], name
        assert config["presets"] == ["mine"], (name, config["presets"])
        ini = config["presetsIni"]
        assert ini.endswith("\n[mine]\nmodel = /srv/m.gguf\n") and ini.count("[") == 1, (name, ini)
        assert json.loads(config["etc"]["activeJson"])["presets"] == ["mine"]
    # The control: on (the default), the same user preset joins the reference ones.
    default = summary(ALL, LLAMAMPERE_SRC, NVIDIA, ENGINES, mine.replace("enable = false", "enable = true"))
    assert set(default["presets"]) == {"*", "mine", *BASE_PRESETS}
    assert "qwen3.8-27b-kv84" in default["specialised"]["llm-fa86"]["presets"]


def test_llm_bench_can_be_installed_on_the_system() -> None:
    """programs.llm-bench puts llm-bench into the system's packages (so `sudo llm-bench sweep` finds
    it); off by default."""
    assert summary(ALL, NVIDIA)["systemPackages"] == []
    installed = summary(ALL, NVIDIA, "{ programs.llm-bench.enable = true; }")["systemPackages"]
    version = nix_eval(f'builtins.head (builtins.match ".*__version__ = \\"([^\\"]+)\\".*"'
                       f" (builtins.readFile {REPO}/llm_bench/__init__.py))")
    assert installed == [f"llm-bench-{version}"]


def test_cuda_engines_use_nixpkgs_llama_cpp_cuda_where_it_exists() -> None:
    """The stock engine is nixpkgs' `llama-cpp-cuda` and fa86 a rebuild of it, where nixpkgs has the
    attribute; the control replaces it with a throw, which the evaluation must then reach."""
    has_cuda = (nixpkgs_root() / "pkgs/by-name/ll/llama-cpp-cuda/package.nix").is_file()
    assert has_cuda == (generation() == "settings")  # unstable has it, 26.05 has not
    overlay = '(_: { llama-cpp-cuda = throw "llama-cpp-cuda was read"; })'
    root = nixpkgs_root()
    for engine in ("stock", "fa86"):
        expr = (f"(import {HARNESS} {{ libPath = {root}/lib; overlay = {overlay}; }}).summary"
                f' [ {ALL} {NVIDIA} {{ llmBench.default = "{engine}"; }} ]')
        with pytest.raises(NixError, match="llama-cpp-cuda was read"):
            nix_eval(expr)
        cpu = expr.replace(f'llmBench.default = "{engine}";', f'llmBench.default = "{engine}"; llmBench.cuda = false;')
        assert "-DGGML_CUDA:BOOL=FALSE" in nix_eval(cpu)["package"]["cmakeFlags"]  # type: ignore[index]
