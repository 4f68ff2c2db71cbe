"""flake.nix's outputs, evaluated with Debian's Nix 2.8 (which cannot fetch the flake's inputs):
its `outputs` function is called with stand-in inputs, a nixpkgs whose `import` gives the
stand-ins of tests/nix/stand-ins.nix (nixpkgs' real llama-cpp recipe) and whose `lib` is
nixpkgs' lib, and a llamAmpere input with the attributes a locked GitHub input has (`rev`,
`shortRev`, `lastModifiedDate`, `outPath`).

What it proves: the CUDA builds are not checks but a package set of their own; the fork's
version and revision come from the input itself (so `--override-input` names what is built);
the flake's NixOS module hands that input to the engine, and the marker records its revision.
`flake.lock` has no llamAmpere entry (it needs the network): tests/test_nix_real_box.py pins that as
an expected failure, and checks that CI evaluates without rewriting the lock.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.nix.helpers import REPO, nix_eval, nix_string, nixpkgs_root

FORK_REV = "89abcdef0123456789abcdef0123456789abcdef"
NVIDIA = '{ services.xserver.videoDrivers = [ "nvidia" ]; }'


@pytest.fixture(scope="module")
def fake_nixpkgs(tmp_path_factory) -> Path:
    """A directory that `import nixpkgs { system; config; }` reads: the stand-in package set."""
    root = nixpkgs_root()
    folder = tmp_path_factory.mktemp("nixpkgs")
    (folder / "default.nix").write_text(
        f"{{ system ? null, config ? {{ }} }}:\n"
        f"import {REPO}/tests/nix/stand-ins.nix {{ lib = import {root}/lib; nixpkgsRoot = {root}; }}\n")
    return folder


def flake(fake_nixpkgs: Path, date: str = "20260614093000", rev: str = FORK_REV) -> str:
    """The flake's outputs (a Nix expression), with the stand-in inputs."""
    root = nixpkgs_root()
    llamampere = (f'{{ outPath = "/nix/store/ffff-source"; rev = {nix_string(rev)}; shortRev = {nix_string(rev[:7])};'
                  f" lastModifiedDate = {nix_string(date)}; }}")
    return (f"(let outputs = (import {REPO}/flake.nix).outputs {{"
            f" self = outputs // {{ outPath = {REPO}; }};"
            f" nixpkgs = {{ outPath = {nix_string(str(fake_nixpkgs))}; lib = import {root}/lib; }};"
            f" llamampere = {llamampere}; }}; in outputs)")


def test_cuda_builds_are_not_checks_but_a_package_set(fake_nixpkgs) -> None:
    outputs = flake(fake_nixpkgs)
    checks = nix_eval(f"builtins.attrNames {outputs}.checks.x86_64-linux")
    assert checks == ["fleet", "llm-bench", "presets-ini", "presets-keys", "router", "specialisation-boot",
                      "specialisation-switch", "watch"]
    entries = nix_eval(f"map (e: {{ inherit (e) name; flags = e.path.cmakeFlags; }})"
                       f" {outputs}.packages.x86_64-linux.cuda-engines.entries")
    assert [e["name"] for e in entries] == ["llama-cpp-cuda", "llama-cpp-fa86", "llamampere"]
    assert all("-DGGML_CUDA:BOOL=TRUE" in e["flags"] for e in entries), entries


def test_the_forks_version_and_revision_come_from_the_input(fake_nixpkgs) -> None:
    pkg = nix_eval(f"let p = {flake(fake_nixpkgs)}.packages.x86_64-linux.llamampere; in"
                   " { inherit (p) version llamampereRev cmakeFlags; src = p.src.outPath; }")
    assert pkg["version"] == "0-unstable-2026-06-14"
    assert pkg["llamampereRev"] == FORK_REV and pkg["src"] == "/nix/store/ffff-source"
    assert f"-DLLAMA_BUILD_COMMIT:STRING={FORK_REV[:7]}" in pkg["cmakeFlags"]
    # Another input (what --override-input gives): its own version and commit, whatever
    # flake.nix's line says.
    other = nix_eval(f"{flake(fake_nixpkgs, '20270101000000', 'f' * 40)}.packages.x86_64-linux.llamampere.version")
    assert other == "0-unstable-2027-01-01"
    assert "flakeText" not in (REPO / "flake.nix").read_text()


def test_the_flakes_module_records_the_forks_revision(fake_nixpkgs) -> None:
    """nixosModules.default hands the input to the llamampere engine; its marker names the commit."""
    root = nixpkgs_root()
    marker = nix_eval(
        f"let h = import {REPO}/tests/nix/eval-module.nix {{ libPath = {root}/lib; }};"
        f" c = (h.eval [ {flake(fake_nixpkgs)}.nixosModules.default {NVIDIA}"
        " { llmBench.engines.llamampere.enable = true; } ]).config;"
        ' in c.specialisation.llm-llamampere.configuration.environment.etc."llama-cpp/active.json".text')
    package = json.loads(marker)["package"]  # type: ignore[arg-type]
    assert (package["name"], package["version"], package["rev"]) == ("llamampere", "0-unstable-2026-06-14", FORK_REV)


def test_the_flakes_module_installs_its_own_llm_bench(fake_nixpkgs) -> None:
    """programs.llm-bench under the flake's modules installs the flake's packages.llm-bench (its
    build is stood in for by a marker: Debian's Nix 2.8 cannot evaluate lib.fileset)."""
    root = nixpkgs_root()
    mine = '{ type = "derivation"; name = "llm-bench-of-the-flake"; outPath = "/nix/store/flake-llm-bench"; }'
    outputs = flake(fake_nixpkgs).replace(
        f"self = outputs // {{ outPath = {REPO}; }};",
        f"self = outputs // {{ outPath = {REPO}; packages.x86_64-linux.llm-bench = {mine}; }};")
    assert outputs != flake(fake_nixpkgs)
    for module in ("default", "llm-bench"):
        installed = nix_eval(
            f"let h = import {REPO}/tests/nix/eval-module.nix {{ libPath = {root}/lib; }};"
            f" c = (h.eval [ {outputs}.nixosModules.{module} {NVIDIA} {{ programs.llm-bench.enable = true; }} ]).config;"
            " in map (p: p.outPath) c.environment.systemPackages")
        assert installed == ["/nix/store/flake-llm-bench"], (module, installed)
