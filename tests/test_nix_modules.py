"""The NixOS modules evaluated with nixpkgs' lib.evalModules (needs NIXPKGS_LIB).

tests/nix/eval-module.nix declares, loosely, the NixOS options the modules set
(systemd.services, environment.etc, assertions, specialisation, ...) and gives them a stub
`pkgs` whose llama-cpp has the shape of nixpkgs' recipe; it returns, for the base system and
for every specialisation, the option values, the unit's ExecStart and serviceConfig, the
/etc files, the package (name, version, CMake flags) and the failed assertions. Without
NIXPKGS_LIB these tests skip and say so.
"""

from __future__ import annotations

import json
import shlex

import pytest

from tests.nix.helpers import EXPECTED, REPO, NixError, nix_eval, nix_string, nixpkgs_lib

HARNESS = REPO / "tests" / "nix" / "eval-module.nix"
ALL = f"{REPO}/modules/default.nix"
LLAMAMPERE_SRC = '{ llmBench.llamampere.src = { rev = "0123456789abcdef0123"; outPath = "/nix/store/aaaa-llamampere-src"; }; }'


def summary(*modules: str) -> dict:
    lib = nixpkgs_lib()
    return nix_eval(f"(import {HARNESS} {{ libPath = {lib}; }}).summary [ {' '.join(modules)} ]")  # type: ignore[return-value]


def failed_assertions(*modules: str) -> list[str]:
    lib = nixpkgs_lib()
    return nix_eval(f"(import {HARNESS} {{ libPath = {lib}; }}).assertionsOf [ {' '.join(modules)} ]")  # type: ignore[return-value]


@pytest.fixture(scope="module")
def full() -> dict:
    return summary(ALL, LLAMAMPERE_SRC)


def exec_args(exec_start: str) -> list[str]:
    return shlex.split(exec_start)


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
        "package": {"name": "llama-cpp", "version": "7777", "path": full["package"]["path"]},
        "presets": ["qwen3.8-27b-base", "qwen3.8-27b-dflash2-4", "qwen3.8-27b-mtp2", "qwen3.8-27b-turbo-coder-mtp2"],
        "presets_file": "/etc/llama-cpp/presets.ini",
        "url": "http://127.0.0.1:48123",
    }


def test_base_package_is_nixpkgs_llama_cpp_with_cuda(full: dict) -> None:
    assert full["package"]["pname"] == "llama-cpp"
    assert "-DGGML_CUDA:BOOL=TRUE" in full["package"]["cmakeFlags"]
    cpu = summary(ALL, LLAMAMPERE_SRC, "{ llmBench.cuda = false; }")
    assert "-DGGML_CUDA:BOOL=FALSE" in cpu["package"]["cmakeFlags"]


def test_hardened_unit_reaches_the_gpu_and_shares_the_cache(full: dict) -> None:
    sc = full["serviceConfig"]
    assert sc["PrivateDevices"] is False
    assert sc["DevicePolicy"] == "closed"
    assert {"char-nvidiactl", "char-nvidia-frontend", "char-nvidia-uvm", "char-nvidia-caps"} <= set(sc["DeviceAllow"])
    assert sc["MemoryDenyWriteExecute"] is False
    assert sc["ProcSubset"] == "all"
    assert sc["CacheDirectory"] == "llama-cpp"
    assert sc["DynamicUser"] is True and sc["ProtectSystem"] == "strict" and sc["NoNewPrivileges"] is True
    assert full["environment"]["LLAMA_CACHE"] == "/var/cache/llama-cpp"


def test_specialisations_are_declared(full: dict) -> None:
    assert full["specialisations"] == ["llm-fa86", "llm-llamampere"]
    assert set(full["specialised"]) == {"llm-fa86", "llm-llamampere"}
    for spec in full["specialised"].values():
        assert spec["specialisations"] == []  # no nesting
        assert spec["failedAssertions"] == []


def test_llm_fa86(full: dict) -> None:
    spec = full["specialised"]["llm-fa86"]
    assert spec["options"]["specialisation"] == "llm-fa86"
    assert spec["package"]["pname"] == "llama-cpp-fa86"
    flags = spec["package"]["cmakeFlags"]
    assert "-DGGML_CUDA:BOOL=TRUE" in flags
    assert [f for f in flags if f.startswith("-DCMAKE_CUDA_ARCHITECTURES")] == ["-DCMAKE_CUDA_ARCHITECTURES:STRING=86"]
    assert "-DGGML_CUDA_FA_ALL_QUANTS:BOOL=TRUE" in flags
    assert spec["presetsIni"] == (EXPECTED / "llm-fa86.ini").read_text()
    assert spec["etc"]["presetsIni"]["sourceText"] == spec["presetsIni"]
    marker = json.loads(spec["etc"]["activeJson"])
    assert marker["specialisation"] == "llm-fa86" and marker["package"]["name"] == "llama-cpp-fa86"
    assert "qwen3.8-27b-kv84" in marker["presets"]
    # A new package and a new INI: the unit changes, so switching restarts it.
    assert spec["execStart"] != full["execStart"]
    assert exec_args(spec["execStart"])[0].startswith(spec["package"]["path"])
    assert spec["serviceConfig"]["CacheDirectory"] == "llama-cpp"
    assert spec["options"]["port"] == 48123


def test_llm_llamampere(full: dict) -> None:
    spec = full["specialised"]["llm-llamampere"]
    pkg = spec["package"]
    assert spec["options"]["specialisation"] == "llm-llamampere"
    assert (pkg["pname"], pkg["version"]) == ("llamampere", "0.5.5")
    assert pkg["src"] == "/nix/store/aaaa-llamampere-src"
    flags = pkg["cmakeFlags"]
    assert [f for f in flags if f.startswith("-DLLAMA_BUILD_NUMBER")] == ["-DLLAMA_BUILD_NUMBER:STRING=0"]
    assert "-DLLAMA_BUILD_COMMIT:STRING=0123456" in flags
    assert [f for f in flags if f.startswith("-DCMAKE_CUDA_ARCHITECTURES")] == ["-DCMAKE_CUDA_ARCHITECTURES:STRING=86"]
    assert "-DGGML_CUDA_FA_QUANTS:STRING=all" in flags
    assert "-DLLAMA_BUILD_UI:BOOL=FALSE" in flags and "-DLLAMA_USE_PREBUILT_UI:BOOL=FALSE" in flags
    # No COMMIT file and no npm web UI build in the fork's source.
    assert "COMMIT" not in pkg["preConfigure"] and "npm" not in pkg["preConfigure"]
    assert pkg["npmDeps"] is None
    assert not any("npm" in p or p.startswith("nodejs") for p in pkg["nativeBuildInputs"])
    assert spec["presetsIni"] == (EXPECTED / "llm-llamampere.ini").read_text()
    marker = json.loads(spec["etc"]["activeJson"])
    assert marker["package"] == {"name": "llamampere", "version": "0.5.5", "path": pkg["path"]}
    assert not any(p.startswith("qwen3.8") for p in marker["presets"])


def test_llamampere_without_source_is_an_assertion() -> None:
    result = summary(ALL)
    assert result["failedAssertions"] == []
    assert any("llmBench.llamampere.src" in m for m in result["specialised"]["llm-llamampere"]["failedAssertions"])


def test_model_sources_are_options() -> None:
    result = summary(ALL, LLAMAMPERE_SRC, '{ llmBench.models.qwen38 = "/srv/models/q.gguf"; }')
    assert "model = /srv/models/q.gguf" in result["presetsIni"]
    assert "model = /srv/models/q.gguf" in result["specialised"]["llm-llamampere"]["presetsIni"]


def test_nixpkgs_style_single_model_configuration_still_works() -> None:
    result = summary(
        f"{REPO}/modules/llama-cpp.nix",
        '{ services.llama-cpp = { enable = true; model = "/models/m.gguf"; port = 8080;'
        ' extraFlags = [ "-c" "4096" ]; openFirewall = true; host = "0.0.0.0"; }; }',
    )
    assert result["failedAssertions"] == []
    args = exec_args(result["execStart"])
    assert args[1:] == ["--host", "0.0.0.0", "--port", "8080", "--model", "/models/m.gguf",
                        "--sleep-idle-seconds", "300", "-c", "4096"]
    assert result["firewall"] == [8080]
    assert result["etc"]["presetsIni"] is None
    assert json.loads(result["etc"]["activeJson"])["presets_file"] is None


def test_enabled_without_anything_to_serve_is_an_assertion() -> None:
    messages = failed_assertions(f"{REPO}/modules/llama-cpp.nix", "{ services.llama-cpp.enable = true; }")
    assert any("set `presets`" in m for m in messages)


def test_model_and_presets_together_is_an_assertion() -> None:
    messages = failed_assertions(
        f"{REPO}/modules/llama-cpp.nix",
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
    messages = failed_assertions(f"{REPO}/modules/llama-cpp.nix", module)
    joined = "\n".join(messages)
    assert all(m.startswith("services.llama-cpp.presets: ") for m in messages), joined
    for word in words:
        assert word in joined, joined
    # The rendered INI itself refuses to exist.
    with pytest.raises(NixError) as info:
        nix_eval(
            f"((import {HARNESS} {{ libPath = {nixpkgs_lib()}; }}).eval [ {REPO}/modules/llama-cpp.nix {module} ])"
            ".config.services.llama-cpp.presetsIni"
        )
    assert words[0] in info.value.args[0]


def test_unsupported_type_is_an_option_type_error_naming_preset_and_key() -> None:
    with pytest.raises(NixError) as info:
        summary(f"{REPO}/modules/llama-cpp.nix",
                "{ services.llama-cpp = { enable = true; presets.mypreset.ctx-size = [ 1 2 ]; }; }")
    message = info.value.args[0]
    assert "services.llama-cpp.presets.mypreset.ctx-size" in message, message
    assert "is not of type" in message, message
