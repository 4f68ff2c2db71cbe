"""The NixOS modules evaluated with nixpkgs' lib.evalModules (needs NIXPKGS_LIB).

tests/nix/eval-module.nix declares, loosely, the NixOS options the modules set
(systemd.services, environment.etc, assertions, specialisation, ...), puts nixpkgs' own
services.llama-cpp module in the module list (as NixOS does; our `disabledModules` must remove
it), and gives the modules a `pkgs` whose llama-cpp is nixpkgs' real recipe called with
stand-ins. It returns, for the base system and for every specialisation, the option values, the
unit's ExecStart and serviceConfig, the /etc files (with the derivation that checks the INI),
the package (name, version, CMake flags, hooks) and the failed assertions. Without NIXPKGS_LIB
these tests skip and say so (in CI they fail: CI has ../shared/nixpkgs).
"""

from __future__ import annotations

import json
import shlex

import pytest

from tests.nix.helpers import EXPECTED, REPO, NixError, nix_eval, nix_string, nixpkgs_root

HARNESS = REPO / "tests" / "nix" / "eval-module.nix"
ALL = f"{REPO}/modules/default.nix"
GENERIC = f"{REPO}/modules/llama-cpp.nix"
LLAMAMPERE_SRC = ('{ llmBench.llamampere = { version = "0.5.1"; src = { rev = "0123456789abcdef0123";'
                  ' outPath = "/nix/store/aaaa-llamampere-src"; }; }; }')
RECIPE_VERSION = "9608"  # of ../shared/nixpkgs' llama-cpp recipe

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
    return summary(ALL, LLAMAMPERE_SRC)


def exec_args(exec_start: str) -> list[str]:
    return shlex.split(exec_start)


def test_nixpkgs_module_is_in_the_module_list_and_disabled() -> None:
    """Our module replaces nixpkgs' own (disabledModules), as NixOS's module-list would have it."""
    files = nix_eval(f"({harness()}.eval [ {GENERIC} ]).options.services.llama-cpp.port.files")
    assert files == [GENERIC], files
    # The control: the same evaluation with modulesPath elsewhere, so `disabledModules` no
    # longer names the file in the list, declares every option twice.
    with pytest.raises(NixError, match="services.llama-cpp.port' in .*nixos/modules/services/misc/llama-cpp.nix' is already declared"):
        nix_eval(f"({harness(modulesPath=nix_string('/nonexistent/nixos/modules'))}"
                 f".eval [ {GENERIC} ]).options.services.llama-cpp.port.files")


def test_defaults(full: dict) -> None:
    assert full["failedAssertions"] == []
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


def test_exec_start_runs_the_router(full: dict) -> None:
    args = exec_args(full["execStart"])
    assert args[0] == f"{full['package']['path']}/bin/llama-server"
    ini_path = full["etc"]["presetsIni"]["sourcePath"]
    assert args[1:] == ["--host", "127.0.0.1", "--port", "48123", "--models-preset", ini_path,
                        "--models-max", "1", "--sleep-idle-seconds", "300"]


def test_ini_file_and_marker_in_etc(full: dict) -> None:
    expected = (EXPECTED / "base.ini").read_text()
    assert full["presetsIni"] == expected
    assert full["etc"]["presetsIni"]["sourceText"] == expected
    marker = json.loads(full["etc"]["activeJson"])
    assert marker == {
        "format": "llm-bench-llama-cpp-active/1",
        "specialisation": "base",
        "package": {"name": "llama-cpp", "version": RECIPE_VERSION, "path": full["package"]["path"]},
        "presets": BASE_PRESETS,
        "presets_file": "/etc/llama-cpp/presets.ini",
        "url": "http://127.0.0.1:48123",
    }


def check_command(config: dict) -> str:
    ini = config["etc"]["presetsIni"]
    assert "check-preset-keys-1" in ini["nativeBuildInputs"], ini
    return ini["buildCommand"]


def test_ini_is_checked_against_each_configurations_own_package(full: dict) -> None:
    """Each INI is built by running check-preset-keys on its own package's llama-server."""
    servers = set()
    for config in [full, *full["specialised"].values()]:
        command = check_command(config)
        server = f"{config['package']['path']}/bin/llama-server"
        assert f"check-preset-keys --server {server} " in command, command
        servers.add(server)
    assert len(servers) == 3  # stock, fa86 and the fork: three packages, three checks
    # The INI derivation depends on the package, so a new package gives a new INI path.
    paths = {c["etc"]["presetsIni"]["sourcePath"] for c in [full, *full["specialised"].values()]}
    assert len(paths) == 3


def test_the_key_check_can_be_turned_off() -> None:
    result = summary(ALL, LLAMAMPERE_SRC, "{ services.llama-cpp.checkPresetKeys = false; }")
    assert result["etc"]["presetsIni"]["buildCommand"] is None
    assert result["etc"]["presetsIni"]["sourceText"] == (EXPECTED / "base.ini").read_text()


def test_base_package_is_nixpkgs_llama_cpp_with_cuda(full: dict) -> None:
    assert full["package"]["pname"] == "llama-cpp"
    assert full["package"]["version"] == RECIPE_VERSION
    assert "-DGGML_CUDA:BOOL=TRUE" in full["package"]["cmakeFlags"]
    cpu = summary(ALL, LLAMAMPERE_SRC, "{ llmBench.cuda = false; }")
    assert "-DGGML_CUDA:BOOL=FALSE" in cpu["package"]["cmakeFlags"]
    assert cpu["options"]["deviceAllow"] is None
    assert "DevicePolicy" not in cpu["serviceConfig"]


def test_hardened_unit_reaches_the_gpu_and_shares_the_cache(full: dict) -> None:
    sc = full["serviceConfig"]
    assert sc["PrivateDevices"] is False
    assert sc["DevicePolicy"] == "closed"
    assert set(sc["DeviceAllow"]) == {"char-nvidiactl", "char-nvidia-frontend", "char-nvidia-uvm", "char-nvidia-caps"}
    assert sc["MemoryDenyWriteExecute"] is False
    assert sc["ProcSubset"] == "all"
    assert sc["CacheDirectory"] == "llama-cpp"
    assert sc["DynamicUser"] is True and sc["ProtectSystem"] == "strict" and sc["NoNewPrivileges"] is True
    assert full["environment"]["LLAMA_CACHE"] == "/var/cache/llama-cpp"


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
        f" inherit (h) pkgs; nixosSystem = h.eval [ {ALL} {LLAMAMPERE_SRC} {CPU} ]; }}).entries"
    )
    cpu = summary(ALL, LLAMAMPERE_SRC, CPU)
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
            f"let h = {harness()}; base = h.eval [ {ALL} {LLAMAMPERE_SRC} ]; in"
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
    assert spec["serviceConfig"]["CacheDirectory"] == "llama-cpp"
    assert spec["options"]["port"] == 48123


def test_llm_llamampere(full: dict) -> None:
    spec = full["specialised"]["llm-llamampere"]
    pkg = spec["package"]
    assert spec["options"]["specialisation"] == "llm-llamampere"
    assert (pkg["pname"], pkg["version"]) == ("llamampere", "0.5.1")
    assert pkg["src"] == "/nix/store/aaaa-llamampere-src"
    assert pkg["llamampereRev"] == "0123456789abcdef0123"
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
    assert marker["package"] == {"name": "llamampere", "version": "0.5.1", "path": pkg["path"]}
    assert not any(p.startswith("qwen3.8") for p in marker["presets"])


def test_llamampere_without_source_is_an_assertion() -> None:
    result = summary(ALL)
    assert result["failedAssertions"] == []
    assert any("llmBench.llamampere.src" in m for m in result["specialised"]["llm-llamampere"]["failedAssertions"])


USER = """{
  services.llama-cpp.presets.mine = { model = "/srv/models/mine.gguf"; ctx-size = 4096; };
  services.llama-cpp.presets."*" = { ctx-size = 32768; cache-type-v = null; };
}"""


def test_user_presets_and_global_settings_reach_every_specialisation() -> None:
    result = summary(ALL, LLAMAMPERE_SRC, USER)
    for name, config in [("base", result), *result["specialised"].items()]:
        assert config["failedAssertions"] == [], name
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
    result = summary(ALL, LLAMAMPERE_SRC, '{ services.llama-cpp = { port = 9000; sleepIdleSeconds = -1; }; }')
    for config in [result, *result["specialised"].values()]:
        assert config["options"]["port"] == 9000 and config["options"]["sleepIdleSeconds"] == -1


def test_an_engine_may_keep_the_base_presets_or_not() -> None:
    result = summary(ALL, LLAMAMPERE_SRC, "{ llmBench.engines.llamampere.inheritBasePresets = true; }"
                     '{ llmBench.presets.extra.model = "/x.gguf"; }')
    ampere = result["specialised"]["llm-llamampere"]["presets"]
    assert set(BASE_PRESETS) | {"extra", "ampere-none"} <= set(ampere)
    # llmBench.presets adds to the base presets instead of replacing them.
    assert set(BASE_PRESETS) | {"extra"} <= set(result["presets"])
    assert "extra" not in summary(ALL, LLAMAMPERE_SRC)["specialised"]["llm-llamampere"]["presets"]


def test_an_engines_own_presets_are_overridden_key_by_key() -> None:
    """A definition of one key of an engine's preset (or of its "*") replaces that key only."""
    result = summary(ALL, LLAMAMPERE_SRC, """{
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
    result = summary(ALL, LLAMAMPERE_SRC, '{ llmBench.engines.mine.presets.p.model = "/m.gguf"; }')
    assert result["specialisations"] == ["llm-fa86", "llm-llamampere"]
    assert any("llmBench.engines: no engine named `mine`" in m for m in result["failedAssertions"]), \
        result["failedAssertions"]
    assert summary(ALL, LLAMAMPERE_SRC)["failedAssertions"] == []


def test_default_engine_llamampere_is_the_base_system() -> None:
    result = summary(ALL, LLAMAMPERE_SRC, '{ llmBench.default = "llamampere"; }')
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


def test_engines_can_be_turned_off() -> None:
    # Off: no specialisation, and its package is never evaluated (the missing fork source
    # raises no assertion).
    result = summary(ALL, "{ llmBench.engines.llamampere.enable = false; }")
    assert result["specialisations"] == ["llm-fa86"]
    assert result["failedAssertions"] == []
    only_base = summary(ALL, "{ llmBench.engines = { llamampere.enable = false; fa86.enable = false; }; }")
    assert only_base["specialisations"] == []
    messages = failed_assertions(ALL, LLAMAMPERE_SRC,
                                 '{ llmBench.default = "fa86"; llmBench.engines.fa86.enable = false; }')
    assert any('llmBench.default = "fa86"' in m and "enable is false" in m for m in messages), messages


def test_engine_packages_keep_their_old_option_names() -> None:
    result = summary(ALL, '{ llmBench.packages.llamampere = (import '
                     f'{REPO}/tests/nix/stand-ins.nix {{ lib = import {nixpkgs_root()}/lib; nixpkgsRoot = {nixpkgs_root()}; }})'
                     '.llama-cpp.overrideAttrs (old: { pname = "my-fork"; }); }')
    assert result["specialised"]["llm-llamampere"]["package"]["pname"] == "my-fork"


def test_model_sources_are_options() -> None:
    result = summary(ALL, LLAMAMPERE_SRC, '{ llmBench.models.qwen38 = "/srv/models/q.gguf"; }')
    assert "model = /srv/models/q.gguf" in result["presetsIni"]
    assert "model = /srv/models/q.gguf" in result["specialised"]["llm-llamampere"]["presetsIni"]


def test_preset_grids_option() -> None:
    result = summary(ALL, LLAMAMPERE_SRC, """{ services.llama-cpp.presetGrids.tiny = {
        base = { model = "/m.gguf"; };
        axes = [ { q8 = { cache-type-k = "q8_0"; }; f16 = { cache-type-k = "f16"; }; }
                 { d1 = { spec-draft-n-max = 1; }; d3 = { spec-draft-n-max = 3; }; } ];
    }; }""")
    grid = {"tiny-q8-d1", "tiny-q8-d3", "tiny-f16-d1", "tiny-f16-d3"}
    for config in [result, *result["specialised"].values()]:
        assert grid <= set(config["presets"])
        assert "[tiny-f16-d3]\ncache-type-k = f16\nmodel = /m.gguf\nspec-draft-n-max = 3\n" in config["presetsIni"]


def test_nixpkgs_style_single_model_configuration_still_works() -> None:
    result = summary(
        GENERIC,
        '{ services.llama-cpp = { enable = true; model = "/models/m.gguf"; port = 8080;'
        ' extraFlags = [ "-c" "4096" ]; openFirewall = true; host = "0.0.0.0"; }; }',
    )
    assert result["failedAssertions"] == []
    args = exec_args(result["execStart"])
    assert args[1:] == ["--host", "0.0.0.0", "--port", "8080", "--model", "/models/m.gguf", "-c", "4096"]
    assert result["firewall"] == [8080]
    assert result["etc"]["presetsIni"] is None
    assert json.loads(result["etc"]["activeJson"])["presets_file"] is None


def test_generic_module_has_nixpkgs_defaults() -> None:
    """Alone, services.llama-cpp behaves as nixpkgs' module: port 8080, no idle sleep, all devices."""
    result = summary(GENERIC, '{ services.llama-cpp = { enable = true; model = "/models/m.gguf"; }; }')
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
    result = summary(GENERIC, f"{{ services.llama-cpp = {{ enable = true; model = {model}; }}; }}")
    args = exec_args(result["execStart"])
    stored = args[args.index("--model") + 1]
    assert stored.startswith("/nix/store/") and stored.endswith("-single.gguf"), stored
    assert any(c.endswith("-single.gguf") for c in result["execStartContext"]), result["execStartContext"]


def test_enabled_without_anything_to_serve_is_an_assertion() -> None:
    messages = failed_assertions(GENERIC, "{ services.llama-cpp.enable = true; }")
    assert any("set `presets`" in m for m in messages)


def test_model_and_presets_together_is_an_assertion() -> None:
    messages = failed_assertions(
        GENERIC,
        '{ services.llama-cpp = { enable = true; model = "/m.gguf"; presets.p.model = "/n.gguf"; }; }',
    )
    assert any("cannot be combined" in m for m in messages)


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
    plain = summary(ALL, LLAMAMPERE_SRC)
    assert plain["warnings"] == [] and all(s["warnings"] == [] for s in plain["specialised"].values())
    direct = summary(ALL, LLAMAMPERE_SRC, '{ services.llama-cpp.package = (import '
                     f'{REPO}/tests/nix/stand-ins.nix {{ lib = import {nixpkgs_root()}/lib; nixpkgsRoot = {nixpkgs_root()}; }})'
                     '.llama-cpp.overrideAttrs (old: { pname = "mine"; }); }')
    assert direct["specialised"]["llm-fa86"]["package"]["pname"] == "mine"
    assert any("llmBench.engines.fa86.package in specialisation llm-fa86" in w
               for w in direct["specialised"]["llm-fa86"]["warnings"]), direct["specialised"]["llm-fa86"]["warnings"]
    assert any("services.llama-cpp.package is set directly" in w for w in direct["warnings"])
