"""Helpers of the Nix tests (tests/test_nix_*.py): run Debian's nix-instantiate on this repo."""

from __future__ import annotations

import functools
import json
import os
import shlex
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
# Read where it exists (unstable, 26.11); NixOS 26.05 has no llama-cpp-cuda.
NIXPKGS_CUDA_RECIPE = Path("pkgs/by-name/ll/llama-cpp-cuda/package.nix")
# The files of nixpkgs the flake reads in every tree.
NIXPKGS_FILES = (NIXPKGS_MODULE, NIXPKGS_LITELLM_MODULE, NIXPKGS_RECIPE)


def nixpkgs_root() -> Path:
    """The nixpkgs tree around NIXPKGS_LIB's lib, with nixpkgs' llama-cpp and litellm modules and
    llama-cpp recipe. A tree without one of them fails the test (it would evaluate less than the
    flake reads), wherever it runs."""
    root = nixpkgs_lib().parent
    missing = [str(p) for p in NIXPKGS_FILES if not (root / p).is_file()]
    if missing:
        pytest.fail(
            f"{root} lacks {', '.join(missing)}: the Nix tests evaluate with nixpkgs' own "
            "llama-cpp and litellm modules and llama-cpp recipe (a full nixpkgs checkout, ../shared/nixpkgs or "
            "../shared/nixpkgs-unstable)"
        )
    return root


@functools.cache
def _generation(root: Path) -> str:
    harness = REPO / "tests" / "nix" / "eval-module.nix"
    found = nix_eval(f"(import {harness} {{ libPath = {root}/lib; }}).generation")
    assert found in ("settings", "flags"), found
    return str(found)


def generation() -> str:
    """Which services.llama-cpp the tree's nixpkgs has: "settings" (since NixOS/nixpkgs#528626:
    unstable, 26.11, the flake's lock) or "flags" (NixOS 26.05: host, port, model, extraFlags)."""
    return _generation(nixpkgs_root())


def service_settings(**values: object) -> str:
    """A module setting llama-server's command-line options the way the tree's nixpkgs takes them:
    `services.llama-cpp.settings` (a value True is a bare flag) or `extraFlags`."""
    return f"{{ services.llama-cpp = {{ {command_line_options(**values)} }}; }}"


def command_line_options(**values: object) -> str:
    """The definition inside services.llama-cpp that service_settings makes."""
    if generation() == "settings":
        body = " ".join(f"{json.dumps(k)} = {_nix_value(v)};" for k, v in values.items())
        return f"settings = {{ {body} }};"
    flags: list[str] = []
    for k, v in values.items():
        flag = f"-{k}" if len(k) == 1 else f"--{k}"
        flags += [flag] if v is True else [flag, str(v)]
    return f"extraFlags = [ {' '.join(nix_string(f) for f in flags)} ];"


def _nix_value(v: object) -> str:
    if v is True:
        return "true"
    if isinstance(v, int | float):
        return repr(v) if not (isinstance(v, float) and v < 0) else f"({v!r})"
    return nix_string(str(v))


def exec_flags(exec_start: str) -> dict[str, str | None]:
    """ExecStart's options (after the program) as flag -> value (None for a bare flag), in
    either generation's rendering: nixpkgs' older module quotes each argument, the newer one writes
    `--flag value` unquoted, in the settings' attribute order."""
    args = shlex.split(exec_start)[1:]
    flags: dict[str, str | None] = {}
    i = 0
    while i < len(args):
        flag = args[i]
        assert flag.startswith("-") and flag not in flags, (flag, args)
        has_value = i + 1 < len(args) and not (args[i + 1].startswith("-") and not _is_number(args[i + 1]))
        flags[flag] = args[i + 1] if has_value else None
        i += 2 if has_value else 1
    return flags


def _is_number(s: str) -> bool:
    try:
        float(s)
    except ValueError:
        return False
    return True


def effective_environment(unit: dict) -> dict[str, str]:
    """The environment systemd gives the service: NixOS writes the unit's `environment` as
    Environment= lines first, then serviceConfig's Environment= lines; each line's assignments
    are words with systemd's quoting, and the last assignment of a name wins."""
    lines = [f"{k}={v}" for k, v in unit["environment"].items()]
    value = unit["serviceConfig"].get("Environment", [])
    for line in value if isinstance(value, list) else [value]:
        lines += shlex.split(line)
    env: dict[str, str] = {}
    for assignment in lines:
        name, _, val = assignment.partition("=")
        env[name] = val
    return env


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
