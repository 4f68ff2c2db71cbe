"""The flake's pure parts, with Debian's Nix and builtins only (no nixpkgs).

Every .nix file parses; the INI renderer and the preset sets of the base system and of each
specialisation evaluate and match the checked-in tests/nix/expected/*.ini; bad preset data
fails evaluation with a message naming the preset and the key.
"""

from __future__ import annotations

import json
import subprocess

import pytest

from tests.nix.helpers import (
    EXPECTED,
    PRESET_SETS,
    REPO,
    RENDERER,
    NixError,
    nix_eval,
    nix_instantiate,
    nix_string,
    render_preset_set,
)

NIX_FILES = sorted(
    p for p in REPO.rglob("*.nix")
    if not any(part.startswith(".") or part in {"result", "node_modules", "build"} for part in p.relative_to(REPO).parts)
)


def test_there_are_nix_files() -> None:
    names = {p.relative_to(REPO).as_posix() for p in NIX_FILES}
    for required in ("flake.nix", "modules/llama-cpp.nix", "specialisations/llm-fa86.nix",
                     "specialisations/llm-llamampere.nix", "pkgs/llamampere.nix",
                     "tests/nixos/router.nix", "tests/nixos/specialisation-switch.nix"):
        assert required in names


@pytest.mark.parametrize("path", NIX_FILES, ids=lambda p: p.relative_to(REPO).as_posix())
def test_nix_file_parses(path) -> None:
    proc = subprocess.run([nix_instantiate(), "--parse", str(path)], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr


def test_flake_lock_pins_nixpkgs() -> None:
    lock = json.loads((REPO / "flake.lock").read_text())
    locked = lock["nodes"]["nixpkgs"]["locked"]
    assert locked["rev"] == "6774f7bc253789b113a4f39285dc0fa100abeacc"
    assert locked["narHash"] == "sha256-MYiI+CzL0tuWgRPjGsKCDHqYs2T3OzMlMQWOYWG0qso="
    assert locked["lastModified"] == 1790046670
    assert lock["nodes"]["nixpkgs"]["original"]["ref"] == "nixos-unstable"
    # The llamAmpere input is declared on one line and has no lock entry until `nix flake lock`.
    ref_lines = [line for line in (REPO / "flake.nix").read_text().splitlines()
                 if "github:JakeATX/llamAmpere/" in line]
    assert len(ref_lines) == 1, ref_lines


@pytest.mark.parametrize("name", sorted(PRESET_SETS))
def test_preset_set_matches_expected_ini(name: str) -> None:
    assert render_preset_set(name) == (EXPECTED / f"{name}.ini").read_text()


def test_preset_sets_have_the_issue_presets() -> None:
    def names(name: str) -> set[str]:
        return set(nix_eval(f"(import {RENDERER}).presetNames (import {PRESET_SETS[name]} {{ }})"))

    base = {"qwen3.8-27b-base", "qwen3.8-27b-mtp2", "qwen3.8-27b-turbo-coder-mtp2", "qwen3.8-27b-dflash2-4"}
    assert names("base") == base
    assert names("llm-fa86") == base | {"qwen3.8-27b-kv84"}
    assert names("llm-llamampere") == {
        "ampere-none", "ampere-mtp2", "ampere-mtp4", "ampere-turbo4", "ampere-turbo2", "ampere-auto"}


def test_global_section_comes_first_and_values_render() -> None:
    text = nix_eval(f"""(import {RENDERER}).render {{
        zz = {{ model = /models/m.gguf; jinja = false; n = 3; p = 0.5; skip = null; }};
        "*" = {{ c = 8192; flag = true; }};
        aa = {{ hf-repo = "org/repo:Q4_K_M"; }};
    }}""")
    sections = [line for line in text.splitlines() if line.startswith("[")]
    assert sections == ["[*]", "[aa]", "[zz]"]
    assert "flag = true\n" in text and "jinja = false\n" in text
    assert "model = /models/m.gguf\n" in text and "n = 3\n" in text and "p = 0.5" in text
    assert "skip" not in text
    assert text.splitlines()[1] == "version = 1"


def test_model_sources_pick_local_or_hf_keys() -> None:
    text = render_preset_set("base", {"qwen38": "/srv/models/q.gguf", "dflash2Draft": "/srv/models/d.gguf"})
    assert "model = /srv/models/q.gguf" in text
    assert "spec-draft-model = /srv/models/d.gguf" in text
    assert "hf-repo = DavidAU/" in text  # the Turbo-Coder source kept its default


BAD_DATA = [
    # (preset name, section as Nix, the words the message must contain)
    ("bad\nname", "{ c = 1; }", ['preset "bad\\nname"', "line break"]),
    ("bad]name", "{ c = 1; }", ['preset "bad]name"', "`]`"]),
    ("p", '{ chat-template = "a\\nb"; }', ['preset "p", key "chat-template"', "line break"]),
    ("p", "{ c = [ 1 2 ]; }", ['preset "p", key "c"', "unsupported value type list"]),
    ("p", "{ c = { x = 1; }; }", ['preset "p", key "c"', "unsupported value type set"]),
    ("p", "{ c = x: x; }", ['preset "p", key "c"', "unsupported value type lambda"]),
    ("p", '{ api-key = "a;b"; }', ['preset "p", key "api-key"', "comment"]),
    ("p", '{ "--ctx-size" = 1; }', ['preset "p", key "--ctx-size"', "not a valid INI key"]),
    ("p", '{ alias = " padded"; }', ['preset "p", key "alias"', "blank"]),
]


@pytest.mark.parametrize("preset,section,words", BAD_DATA, ids=[w[1] for _, _, w in BAD_DATA])
def test_bad_preset_data_fails_naming_preset_and_key(preset: str, section: str, words: list[str]) -> None:
    expr = f"(import {RENDERER}).render {{ {nix_string(preset)} = {section}; ok = {{ c = 1; }}; }}"
    with pytest.raises(NixError) as info:
        nix_eval(expr)
    message = info.value.args[0]
    for word in words:
        assert word in message, message
    assert "invalid preset data" in message
    # The same problem through builtins.tryEval: evaluation fails, it does not render.
    assert nix_eval(f"(builtins.tryEval ({expr})).success") is False
    errors = nix_eval(f"(import {RENDERER}).errors {{ {nix_string(preset)} = {section}; }}")
    assert errors and all('preset "' in e for e in errors)


def test_good_preset_sets_have_no_errors() -> None:
    for path in PRESET_SETS.values():
        assert nix_eval(f"(import {RENDERER}).errors (import {path} {{ }})") == []


def test_server_args_and_systemd_quoting() -> None:
    args = nix_eval(f"""(import {RENDERER}).serverArgs {{
        host = "127.0.0.1"; port = 48123; presetsFile = "/nix/store/x-presets.ini";
        modelsMax = 1; sleepIdleSeconds = 300; extraFlags = [ "--metrics" ];
    }}""")
    assert args == ["--host", "127.0.0.1", "--port", "48123", "--models-preset", "/nix/store/x-presets.ini",
                    "--models-max", "1", "--sleep-idle-seconds", "300", "--metrics"]
    single = nix_eval(f'(import {RENDERER}).serverArgs {{ host = "::"; port = 8080; model = "/m.gguf"; }}')
    assert single == ["--host", "::", "--port", "8080", "--model", "/m.gguf"]
    quoted = nix_eval(f'(import {RENDERER}).escapeSystemdArgs [ "a b" "50%" "$HOME" "q\\"uote" ]')
    assert quoted == '"a b" "50%%" "$$HOME" "q\\"uote"'


def test_marker_format() -> None:
    marker = nix_eval(f"""(import {RENDERER}).marker {{
        specialisation = "llm-fa86"; packageName = "llama-cpp-fa86"; packageVersion = "7777";
        packagePath = "/nix/store/x-llama-cpp-fa86-7777"; presets = {{ "*" = {{ }}; b = {{ }}; a = {{ }}; }};
        presetsFile = "/etc/llama-cpp/presets.ini"; url = "http://127.0.0.1:48123";
    }}""")
    assert marker == {
        "format": "llm-bench-llama-cpp-active/1",
        "specialisation": "llm-fa86",
        "package": {"name": "llama-cpp-fa86", "version": "7777", "path": "/nix/store/x-llama-cpp-fa86-7777"},
        "presets": ["a", "b"],
        "presets_file": "/etc/llama-cpp/presets.ini",
        "url": "http://127.0.0.1:48123",
    }
