"""The flake's pure parts, with Debian's Nix and nixpkgs' lib (NIXPKGS_LIB).

Every .nix file parses; the INI renderer (modules/lib/presets-ini.nix, on nixpkgs' lib) and
the preset sets of each engine evaluate and match the checked-in tests/nix/expected/*.ini;
floats render without loss; preset grids expand; bad preset data fails evaluation with a
message naming the preset and the key; the llamAmpere version comes from the input's own date.
"""

from __future__ import annotations

import json
import subprocess

import pytest

from tests.nix.helpers import (
    EXPECTED,
    PRESET_SETS,
    REPO,
    NixError,
    nix_eval,
    nix_instantiate,
    nix_string,
    nixpkgs_lib,
    nixpkgs_root,
    preset_set_expr,
    render_preset_set,
    renderer,
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
    # The llamAmpere input has no lock entry until `nix flake lock` runs with the network
    # (docs/nixos.md, The llamAmpere source); nothing here can compute its narHash.
    assert set(lock["nodes"]["root"]["inputs"]) <= {"nixpkgs", "llamampere"}


VERSION_OF = REPO / "pkgs" / "llamampere-version.nix"


def test_llamampere_version_comes_from_the_inputs_commit_date() -> None:
    """A snapshot without a release number, by nixpkgs' convention; nothing reads flake.nix."""
    assert nix_eval(f'import {VERSION_OF} {{ lastModifiedDate = "20260511093000"; }}') == {
        "version": "0-unstable-2026-05-11"}
    assert nix_eval(f"import {VERSION_OF} {{ }}") == {"version": "0-unstable"}  # a path source has no date
    for path in REPO.rglob("*.nix"):
        if ".venv" in path.parts:
            continue
        text = path.read_text()
        assert "readFile ./flake.nix" not in text, path
        assert "0.5.1" not in text or path.name == "flake.nix", path


@pytest.mark.parametrize("name", sorted(PRESET_SETS))
def test_preset_set_matches_expected_ini(name: str) -> None:
    assert render_preset_set(name) == (EXPECTED / f"{name}.ini").read_text()


BASE_PRESETS = {"qwen3.8-27b-base", "qwen3.8-27b-mtp2", "qwen3.8-27b-turbo-coder-mtp2", "qwen3.8-27b-dflash2-4"}
AMPERE_PRESETS = {"ampere-none", "ampere-mtp2", "ampere-mtp4", "ampere-turbo4", "ampere-turbo2", "ampere-auto"} | {
    f"ampere-turbo{bits}-d{depth}" for bits in (3, 4, 5, 6) for depth in (1, 3)}


def preset_names(name: str) -> set[str]:
    return set(nix_eval(f"{renderer()}.presetNames {preset_set_expr(name)}"))  # type: ignore[arg-type]


def test_preset_sets_have_the_issue_presets() -> None:
    assert preset_names("base") == BASE_PRESETS
    assert preset_names("llm-fa86") == BASE_PRESETS | {"qwen3.8-27b-kv84"}
    assert preset_names("llm-llamampere") == AMPERE_PRESETS


def test_global_section_comes_first_and_values_render() -> None:
    text = nix_eval(f"""{renderer()}.render {{
        zz = {{ model = "/models/m.gguf"; jinja = false; n = 3; p = 0.5; skip = null; }};
        "*" = {{ c = 8192; flag = true; }};
        aa = {{ hf-repo = "org/repo:Q4_K_M"; }};
        "(first)" = {{ c = 1; }};
    }}""")
    sections = [line for line in text.splitlines() if line.startswith("[")]
    # `(` sorts before `*`: [*] is placed first on purpose, not by attribute order.
    assert sections == ["[*]", "[(first)]", "[aa]", "[zz]"]
    assert "flag = true\n" in text and "jinja = false\n" in text
    assert "model = /models/m.gguf\n" in text and "n = 3\n" in text and "p = 0.5\n" in text
    assert "skip" not in text


def test_no_version_line() -> None:
    """Older routers (the fork's base) turn a top-level key into a phantom preset `default`."""
    text = nix_eval(f'{renderer()}.render {{ "*" = {{ c = 1; }}; m = {{ c = 2; }}; }}')
    before_first_section = text.split("[", 1)[0]
    assert [line for line in before_first_section.splitlines() if line and not line.startswith(";")] == []
    for name in PRESET_SETS:
        assert "version" not in render_preset_set(name)


def render_floats(values: list[str]) -> list[str]:
    """Each Nix float literal (or fromJSON text) as the renderer writes it."""
    items = " ".join(f"(builtins.fromJSON {nix_string(v)})" for v in values)
    return nix_eval(f"map {renderer()}.renderValue [ {items} ]")  # type: ignore[return-value]


def test_floats_render_without_loss_small_and_large() -> None:
    text = nix_eval(f"""{renderer()}.render {{
        p = {{ min-p = 0.0000005; temp = 0.7; rope-freq-base = 123456789.125; big = 1.0e20; third = 0.3333333333333333; }};
    }}""")
    assert "min-p = 5e-07\n" in text  # toString gave 0.000000
    assert "temp = 0.7\n" in text  # toString gave 0.700000
    assert "rope-freq-base = 123456789.125\n" in text  # Nix 2.8's toJSON gave 1.23457e+08
    assert "big = 1e+20\n" in text
    assert "third = 0.3333333333333333\n" in text


def test_floats_read_back_exactly_as_python_writes_them() -> None:
    import random
    import struct

    rng = random.Random(12)
    values = [0.0000005, 0.7, 0.1, 1e-05, 0.0001, 1e16, 1e15, 2.5e-308, 5e-324, 1.7976931348623157e308,
              65536.5, 3.0, -2.25, 1e22, 1e23, 0.30000000000000004]
    values += [round(rng.uniform(0, 3), rng.randint(1, 7)) for _ in range(60)]
    while len(values) < 260:
        v = struct.unpack("<d", struct.pack("<Q", rng.getrandbits(64)))[0]
        if v == v and abs(v) != float("inf"):
            values.append(v)
    rendered = render_floats([repr(v) for v in values])

    def digits(text: str) -> str:
        return text.lstrip("-").split("e")[0].replace(".", "").strip("0")

    for value, text in zip(values, rendered):
        assert float(text) == value, (value, text)  # lossless
        assert len(digits(text)) == len(digits(repr(value))), (value, text)  # shortest
        if len(digits(repr(value))) <= 15:  # one shortest decimal: Python's exactly
            assert text == repr(value), (value, text)


def test_grid_expands_axes_into_named_presets() -> None:
    presets = nix_eval(f"""{renderer()}.grid {{
        prefix = "ampere";
        base = {{ model = "/m.gguf"; spec-type = "draft-mtp"; cache-type-k = "q8_0"; }};
        axes = [
          {{ turbo3 = {{ cache-type-k = "turbo3"; }}; turbo4 = {{ cache-type-k = "turbo4"; }}; f16 = {{ cache-type-k = "f16"; }}; }}
          {{ d1 = {{ spec-draft-n-max = 1; }}; d3 = {{ spec-draft-n-max = 3; }}; }}
          {{ "" = {{ }}; adaptive = {{ spec-type = "draft-mtp-adaptive"; }}; }}
        ];
    }}""")
    assert set(presets) == {f"ampere-{kv}-{d}{a}" for kv in ("turbo3", "turbo4", "f16") for d in ("d1", "d3")
                            for a in ("", "-adaptive")}
    assert presets["ampere-turbo3-d1"] == {"model": "/m.gguf", "spec-type": "draft-mtp", "cache-type-k": "turbo3",
                                           "spec-draft-n-max": 1}
    assert presets["ampere-f16-d3-adaptive"]["spec-type"] == "draft-mtp-adaptive"
    # A grid renders like hand-written presets.
    text = nix_eval(f"""{renderer()}.render ({renderer()}.grid {{
        prefix = "g"; axes = [ {{ a = {{ x = 1; }}; b = {{ x = 2; }}; }} ];
    }})""")
    assert "[g-a]\nx = 1\n" in text and "[g-b]\nx = 2\n" in text


def test_model_sources_pick_local_or_hf_keys_and_paths_enter_the_store(tmp_path) -> None:
    model = tmp_path / "local.gguf"
    model.write_bytes(b"GGUF")
    text = nix_eval(f"{renderer()}.render (import {REPO}/modules/presets/base.nix {{ models.qwen38 = {model}; }})")
    stored = [line for line in text.splitlines() if line.startswith("model = ")]
    # A path value is copied to the store (so the INI, and the unit, depend on it).
    assert stored and all(line.startswith("model = /nix/store/") and line.endswith("-local.gguf") for line in stored)
    context = nix_eval(f"builtins.attrNames (builtins.getContext ({renderer()}.render "
                       f"(import {REPO}/modules/presets/base.nix {{ models.qwen38 = {model}; }})))")
    assert len(context) == 1 and context[0].endswith("-local.gguf")  # type: ignore[index,union-attr]


def test_model_sources_pick_local_or_hf_keys() -> None:
    text = render_preset_set("base", {"qwen38": "/srv/models/q.gguf", "dflash2Draft": "/srv/models/d.gguf"})
    assert "model = /srv/models/q.gguf" in text
    assert "spec-draft-model = /srv/models/d.gguf" in text
    assert "hf-repo = DavidAU/" in text  # the Turbo-Coder source kept its default


def test_a_pinned_source_downloads_that_revision() -> None:
    rev = "0123456789abcdef0123456789abcdef01234567"
    source = f'{{ repo = "owner/repo"; file = "m-Q4_K_M.gguf"; revision = "{rev}"; }}'
    sources = f"(import {REPO}/modules/presets/sources.nix)"
    assert nix_eval(f"{sources}.modelSource {source}") == {
        "model-url": f"https://huggingface.co/owner/repo/resolve/{rev}/m-Q4_K_M.gguf"}
    with pytest.raises(NixError, match="owner/repo/m-Q4_K_M.gguf cannot be pinned to a revision"):
        nix_eval(f"{sources}.draftSource {source}")


BAD_DATA = [
    # (preset name, section as Nix, the words the message must contain)
    ("bad\nname", "{ c = 1; }", ['preset "bad\\nname"', "line break"]),
    ("bad]name", "{ c = 1; }", ['preset "bad]name"', "`]`"]),
    ("qwen:q8", "{ c = 1; }", ['preset "qwen:q8"', "`:`", "quantisation tag", "use `-` instead"]),
    ("p", '{ chat-template = "a\\nb"; }', ['preset "p", key "chat-template"', "line break"]),
    ("p", "{ c = [ 1 2 ]; }", ['preset "p", key "c"', "unsupported value type list"]),
    ("p", "{ c = { x = 1; }; }", ['preset "p", key "c"', "unsupported value type set"]),
    ("p", "{ c = x: x; }", ['preset "p", key "c"', "unsupported value type lambda"]),
    ("p", '{ api-key = "a;b"; }', ['preset "p", key "api-key"', "comment"]),
    ("p", '{ "--ctx-size" = 1; }', ['preset "p", key "--ctx-size"', "not a valid INI key"]),
    ("p", '{ alias = " padded"; }', ['preset "p", key "alias"', "blank"]),
    ("p", "{ temp = 1.0e308 * 10.0; }", ['preset "p", key "temp"', "not a finite number"]),
]


@pytest.mark.parametrize("preset,section,words", BAD_DATA, ids=[w[1] for _, _, w in BAD_DATA])
def test_bad_preset_data_fails_naming_preset_and_key(preset: str, section: str, words: list[str]) -> None:
    expr = f"{renderer()}.render {{ {nix_string(preset)} = {section}; ok = {{ c = 1; }}; }}"
    with pytest.raises(NixError) as info:
        nix_eval(expr)
    message = info.value.args[0]
    for word in words:
        assert word in message, message
    assert "invalid preset data" in message
    # The same problem through builtins.tryEval: evaluation fails, it does not render.
    assert nix_eval(f"(builtins.tryEval ({expr})).success") is False
    errors = nix_eval(f"{renderer()}.errors {{ {nix_string(preset)} = {section}; }}")
    assert errors and all('preset "' in e for e in errors)


def test_good_preset_sets_have_no_errors() -> None:
    for name in PRESET_SETS:
        assert nix_eval(f"{renderer()}.errors {preset_set_expr(name)}") == []


def test_router_args_flags_and_systemd_quoting() -> None:
    args = nix_eval(f"""{renderer()}.routerArgs {{
        presetsFile = "/etc/llama-cpp/presets.ini"; modelsMax = 1; sleepIdleSeconds = -1;
    }}""")
    assert args == ["--models-preset", "/etc/llama-cpp/presets.ini", "--models-max", "1", "--sleep-idle-seconds", "-1"]
    assert nix_eval(f"{renderer()}.routerArgs {{ }}") == []
    # The flags the key check compares with --help: values (negative numbers too) are not flags.
    flags = nix_eval(f'{renderer()}.flagsOf [ "--host" "::" "-c" "4096" "--temp" "-0.5" "--jinja=1" "-1" ]')
    assert flags == ["--host", "-c", "--temp", "--jinja"]
    quoted = nix_eval(f'{renderer()}.escapeSystemdArgs [ "a b" "50%" "$HOME" "q\\"uote" ]')
    assert quoted == '"a b" "50%%" "$$HOME" "q\\"uote"'


def test_a_commit_is_recorded_only_when_the_source_names_one() -> None:
    commit = "0123456789abcdef0123456789abcdef01234567"
    assert nix_eval(f'{renderer()}.commitOf "{commit}"') == commit
    for other in ('"b9608"', '"refs/tags/b9608"', "null", '"0123456"'):
        assert nix_eval(f"{renderer()}.commitOf {other}") is None, other


def test_marker_format() -> None:
    marker = nix_eval(f"""{renderer()}.marker {{
        specialisation = "llm-fa86"; packageName = "llama-cpp-fa86"; packageVersion = "7777";
        packagePath = "/nix/store/x-llama-cpp-fa86-7777"; presets = {{ "*" = {{ }}; b = {{ }}; a = {{ }}; }};
        packageRev = "0123456789abcdef0123456789abcdef01234567"; buildNumber = "7777"; buildCommit = "0123456";
        presetsFile = "/etc/llama-cpp/presets.ini"; url = "http://127.0.0.1:48123";
    }}""")
    assert marker == {
        "format": "llm-bench-llama-cpp-active/1",
        "specialisation": "llm-fa86",
        "package": {"name": "llama-cpp-fa86", "version": "7777", "path": "/nix/store/x-llama-cpp-fa86-7777",
                    "rev": "0123456789abcdef0123456789abcdef01234567", "build_number": "7777", "build_commit": "0123456"},
        "presets": ["a", "b"],
        "presets_file": "/etc/llama-cpp/presets.ini",
        "url": "http://127.0.0.1:48123",
    }


def test_the_build_is_read_from_the_recipes_cmake_flags() -> None:
    """The build number and commit llama-server reports, as the recipe passes them to CMake; null
    where the build reads them itself (26.05's recipe: `-DLLAMA_BUILD_COMMIT:STRING=$(cat COMMIT)`
    in preConfigure), never a guess."""
    build = nix_eval(f"{renderer()}.buildOf"
                     ' [ "-DGGML_CUDA:BOOL=TRUE" "-DLLAMA_BUILD_NUMBER:STRING=11393" "-DLLAMA_BUILD_COMMIT=dbe4c3e" ]')
    assert build == {"buildNumber": "11393", "buildCommit": "dbe4c3e"}
    assert nix_eval(f'{renderer()}.buildOf [ "-DLLAMA_BUILD_NUMBER:STRING=9608" ]') == {
        "buildNumber": "9608", "buildCommit": None}
    # A value that is not a plain word (a shell substitution) is not recorded.
    assert nix_eval(f'{renderer()}.buildOf [ "-DLLAMA_BUILD_COMMIT:STRING=$(cat COMMIT)" ]')["buildCommit"] is None


def test_drop_cmake_flags_removes_only_the_named_variables() -> None:
    """pkgs/lib/drop-cmake-flags.nix, shared by the fa86 and llamAmpere packages: both -D spellings
    of a named variable go, a variable whose name merely starts the same stays."""
    flags = nix_eval(f"import {REPO}/pkgs/lib/drop-cmake-flags.nix {{ lib = import {nixpkgs_lib()}; }}"
                     ' [ "CMAKE_CUDA_ARCHITECTURES" "LLAMA_BUILD_UI" ]'
                     ' [ "-DCMAKE_CUDA_ARCHITECTURES:STRING=75;86" "-DLLAMA_BUILD_UI=OFF"'
                     ' "-DLLAMA_BUILD_UI_EXTRA:BOOL=TRUE" "-DGGML_CUDA:BOOL=TRUE" ]')
    assert flags == ["-DLLAMA_BUILD_UI_EXTRA:BOOL=TRUE", "-DGGML_CUDA:BOOL=TRUE"]


def test_a_tree_without_a_file_the_flake_reads_fails(tmp_path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A nixpkgs tree with lib but without nixpkgs' llama-cpp module fails the Nix tests (also outside
    CI) instead of evaluating less than the flake reads."""
    tree = tmp_path / "nixpkgs"
    tree.mkdir()
    (tree / "lib").symlink_to(nixpkgs_lib())
    for name in ("pkgs/by-name/ll/llama-cpp/package.nix", "nixos/modules/services/misc/litellm.nix"):
        (tree / name).parent.mkdir(parents=True, exist_ok=True)
        (tree / name).write_text("{ }\n")
    monkeypatch.setenv("NIXPKGS_LIB", str(tree))
    monkeypatch.delenv("CI", raising=False)
    with pytest.raises(pytest.fail.Exception, match="lacks nixos/modules/services/misc/llama-cpp.nix"):
        nixpkgs_root()
