"""Helpers of the Nix tests (tests/test_nix_*.py): run Debian's nix-instantiate on this repo."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
EXPECTED = REPO / "tests" / "nix" / "expected"
RENDERER = REPO / "modules" / "lib" / "presets-ini.nix"

# The builtins-only preset data files.
PRESET_FILES = {
    "base": REPO / "modules" / "presets" / "base.nix",
    "fa86": REPO / "specialisations" / "llm-fa86-presets.nix",
    "llamampere": REPO / "specialisations" / "llm-llamampere-presets.nix",
}

# Each engine's full preset set (name of the expected INI -> the data files it layers, as
# modules/base-presets.nix does: an engine's presets over the base ones, key by key).
PRESET_SETS = {
    "base": ["base"],
    "llm-fa86": ["base", "fa86"],
    "llm-llamampere": ["llamampere"],
}


def nix_instantiate() -> str:
    """The nix-instantiate binary; without it, skip, or fail when CI is set (CI installs nix-bin)."""
    found = shutil.which("nix-instantiate")
    if found:
        return found
    message = "nix-instantiate not found: install Nix (Debian/Ubuntu: apt-get install nix-bin)"
    if os.environ.get("CI"):
        pytest.fail(message + "; CI must run these tests")
    pytest.skip(message)


def nix_eval(expr: str, *, args: dict[str, str] | None = None) -> object:
    """Evaluate a Nix expression strictly and return it as JSON data; raise NixError on failure."""
    cmd = [nix_instantiate(), "--eval", "--strict", "--json", "-E", expr]
    for name, value in (args or {}).items():
        cmd += ["--argstr", name, value]
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=REPO, timeout=120)
    if proc.returncode != 0:
        raise NixError(proc.stderr)
    return json.loads(proc.stdout)


class NixError(RuntimeError):
    pass


def nix_string(s: str) -> str:
    """A Nix string literal for s."""
    return json.dumps(s).replace("${", "\\${")


def renderer() -> str:
    """A Nix expression for modules/lib/presets-ini.nix applied to nixpkgs' lib."""
    return f"(import {RENDERER} {{ lib = import {nixpkgs_lib()}; }})"


def preset_set_expr(name: str, models: dict[str, str] | None = None) -> str:
    models_nix = "{ " + " ".join(f"{k} = {nix_string(v)};" for k, v in (models or {}).items()) + " }"
    layers = [f"(import {PRESET_FILES[f]} {{ models = {models_nix}; }})" for f in PRESET_SETS[name]]
    expr = layers[0]
    for layer in layers[1:]:
        expr = f"((import {nixpkgs_lib()}).recursiveUpdate {expr} {layer})"
    return expr


def render_expr(name: str, models: dict[str, str] | None = None) -> str:
    return f"{renderer()}.render {preset_set_expr(name, models)}"


def render_preset_set(name: str, models: dict[str, str] | None = None) -> str:
    return nix_eval(render_expr(name, models))  # type: ignore[return-value]


def _missing(message: str) -> None:
    """Skip saying what is missing; in CI (CI set), fail: CI has ../shared/nixpkgs."""
    if os.environ.get("CI"):
        pytest.fail(message + "; CI must run these tests (.ci/run sets NIXPKGS_LIB when ../shared/nixpkgs exists)")
    pytest.skip(message)


def nixpkgs_lib() -> Path:
    """nixpkgs' lib directory from NIXPKGS_LIB, or skip (fail in CI) saying what is missing."""
    value = os.environ.get("NIXPKGS_LIB")
    if not value:
        _missing(
            "NIXPKGS_LIB is not set: the renderer and the module tests need nixpkgs' lib "
            "(../shared/nixpkgs, a nixpkgs checkout, or nix-community/nixpkgs.lib: the directory holding lib/); "
            "see docs/nixos.md"
        )
    root = Path(value).resolve()
    for candidate in (root / "lib", root):
        if (candidate / "default.nix").is_file() and (candidate / "modules.nix").is_file():
            return candidate
    pytest.fail(f"NIXPKGS_LIB={value} holds neither lib/default.nix nor default.nix+modules.nix of nixpkgs' lib")


NIXPKGS_MODULE = Path("nixos/modules/services/misc/llama-cpp.nix")
NIXPKGS_LITELLM_MODULE = Path("nixos/modules/services/misc/litellm.nix")
NIXPKGS_RECIPE = Path("pkgs/by-name/ll/llama-cpp/package.nix")


def nixpkgs_root() -> Path:
    """The nixpkgs tree around NIXPKGS_LIB's lib, with nixpkgs' llama-cpp and litellm modules and llama-cpp recipe."""
    root = nixpkgs_lib().parent
    missing = [str(p) for p in (NIXPKGS_MODULE, NIXPKGS_LITELLM_MODULE, NIXPKGS_RECIPE) if not (root / p).is_file()]
    if missing:
        _missing(
            f"{root} lacks {', '.join(missing)}: the module tests evaluate with nixpkgs' own "
            "llama-cpp and litellm modules and llama-cpp recipe (a full nixpkgs checkout, or ../shared/nixpkgs)"
        )
    return root


def litellm_config(module: str) -> str:
    """The config file that nixpkgs' services.litellm unit runs with (its ExecStart's --config)
    when modules/fleet.nix is evaluated with `module`, as text (JSON, which is YAML: see
    stand-ins.nix). Raises NixError when the configuration fails an assertion."""
    harness = REPO / "tests" / "nix" / "eval-module.nix"
    found = nix_eval(
        f"let h = import {harness} {{ libPath = {nixpkgs_root()}/lib; }};"
        f" e = h.eval [ {REPO}/modules/fleet.nix ({module}) ];"
        ' file = (h.pkgs.formats.yaml { }).generate "config.yaml" e.config.services.litellm.settings;'
        " failed = h.failedAssertions e.config; in"
        ' if failed != [ ] then throw (builtins.concatStringsSep "\n" failed)'
        " else { execStart = e.config.systemd.services.litellm.serviceConfig.ExecStart;"
        " path = file.outPath; inherit (file) text; }"
    )
    assert isinstance(found, dict) and found["execStart"].endswith(f" --config {found['path']}"), found
    return found["text"]
