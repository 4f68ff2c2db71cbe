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

# Each preset set: (name of the expected INI, the builtins-only file that returns it).
PRESET_SETS = {
    "base": REPO / "modules" / "presets" / "base.nix",
    "llm-fa86": REPO / "specialisations" / "llm-fa86-presets.nix",
    "llm-llamampere": REPO / "specialisations" / "llm-llamampere-presets.nix",
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


def render_expr(preset_file: Path, models: dict[str, str] | None = None) -> str:
    models_nix = "{ " + " ".join(f"{k} = {nix_string(v)};" for k, v in (models or {}).items()) + " }"
    return f"(import {RENDERER}).render (import {preset_file} {{ models = {models_nix}; }})"


def render_preset_set(name: str, models: dict[str, str] | None = None) -> str:
    return nix_eval(render_expr(PRESET_SETS[name], models))  # type: ignore[return-value]


def nixpkgs_lib() -> Path:
    """nixpkgs' lib directory from NIXPKGS_LIB, or skip saying what is missing."""
    value = os.environ.get("NIXPKGS_LIB")
    if not value:
        pytest.skip(
            "NIXPKGS_LIB is not set: the module evaluation tests need nixpkgs' lib "
            "(a nixpkgs or nix-community/nixpkgs.lib checkout, the directory holding lib/); "
            "see docs/nixos.md"
        )
    root = Path(value)
    for candidate in (root / "lib", root):
        if (candidate / "default.nix").is_file() and (candidate / "modules.nix").is_file():
            return candidate
    pytest.fail(f"NIXPKGS_LIB={value} holds neither lib/default.nix nor default.nix+modules.nix of nixpkgs' lib")
