"""check-preset-keys (pkgs/check-preset-keys), the build-time check of a presets INI, run against
the test bed's real CPU llama-server: what it accepts the real router accepts, and what it
refuses the real router refuses.

The NixOS module runs the same script while building the INI, with `--server` set to the
configuration's own package (tests/test_nix_modules.py checks that wiring for every
specialisation); here a fork is a wrapper around the real binary whose `--help` lists one
option more, as a fork with its own options would.
"""

from __future__ import annotations

import socket
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from llm_bench.support.poll import poll_until
from tests.nix.helpers import EXPECTED, REPO, command_line_options, nix_eval, nix_string, nixpkgs_root

CHECKER = REPO / "pkgs" / "check-preset-keys" / "check-preset-keys.py"


def check(server: Path, ini: Path | str, tmp_path: Path, *extra: str) -> subprocess.CompletedProcess:
    if isinstance(ini, str):
        path = tmp_path / "presets.ini"
        path.write_text(ini)
        ini = path
    return subprocess.run([sys.executable, str(CHECKER), "--server", str(server), *extra, str(ini)],
                          capture_output=True, text=True, timeout=120)


def router_refusal(server: Path, ini_text: str, tmp_path: Path) -> str:
    """What the real router says when it refuses a presets file at start; "" once it serves /models."""
    path = tmp_path / "router.ini"
    path.write_text(ini_text)
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    log = tmp_path / "router.log"
    with log.open("w") as out:
        proc = subprocess.Popen([str(server), "--models-preset", str(path), "--host", "127.0.0.1", "--port", str(port)],
                                stdout=out, stderr=subprocess.STDOUT)
    def served_or_exited() -> str | None:
        if proc.poll() is not None:
            return log.read_text() or f"exited with {proc.returncode}"
        try:
            return "" if httpx.get(f"http://127.0.0.1:{port}/models", timeout=2).status_code == 200 else None
        except httpx.HTTPError:
            return None

    try:
        said = poll_until(served_or_exited, timeout=60, interval=0.2)
        if said is None:
            raise AssertionError(f"the router neither served /models nor exited:\n{log.read_text()[-2000:]}")
        return said
    finally:
        if proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


@pytest.mark.parametrize("name", ["base", "llm-fa86", "llm-llamampere"])
def test_rendered_inis_pass(llama_server_bin: Path, tmp_path: Path, name: str) -> None:
    result = check(llama_server_bin, EXPECTED / f"{name}.ini", tmp_path)
    assert result.returncode == 0, result.stderr


BAD = """\
[*]
ctx-size = 8192

[x]
model = /m.gguf
ctx_sise = 4096

[y]
model = /m.gguf
spec-draft-nmax = 2
"""


def test_misspelled_key_fails_naming_preset_key_and_nearest(llama_server_bin: Path, tmp_path: Path) -> None:
    result = check(llama_server_bin, BAD, tmp_path)
    assert result.returncode == 1, result
    assert f'preset "x", key "ctx_sise": not an option of {llama_server_bin}; did you mean "ctx-size"?' in result.stderr
    assert 'preset "y", key "spec-draft-nmax"' in result.stderr and 'did you mean "spec-draft-n-max"?' in result.stderr
    assert "ctx-size = 8192" not in result.stderr  # the good keys are not reported


def test_the_real_router_refuses_what_the_check_refuses(llama_server_bin: Path, tmp_path: Path) -> None:
    bad = "[x]\nmodel = /m.gguf\nctx_sise = 4096\n"
    assert check(llama_server_bin, bad, tmp_path).returncode == 1
    said = router_refusal(llama_server_bin, bad, tmp_path)
    assert "ctx_sise" in said and "not recognized in preset" in said, said


# Every spelling the router takes for a key: long, short, negated, environment variable (and
# its LLAMA_ARG_NO_ form), router-only preset keys.
SPELLINGS = """\
[*]
c = 4096
LLAMA_ARG_N_PARALLEL = 1
no-mmproj = true
LLAMA_ARG_NO_MMPROJ_AUTO = 1

[p]
model = /m.gguf
load-on-startup = false
stop-timeout = 5
fa = on
temp = 5e-07
version = 1
"""


def test_every_spelling_the_router_takes_passes(llama_server_bin: Path, tmp_path: Path) -> None:
    result = check(llama_server_bin, SPELLINGS, tmp_path)
    assert result.returncode == 0, result.stderr
    # The real router starts with the same file: the check refuses nothing it takes.
    assert router_refusal(llama_server_bin, SPELLINGS, tmp_path) == ""


@pytest.fixture
def fork_server(llama_server_bin: Path, tmp_path: Path) -> Path:
    """A stand-in for a fork: the real llama-server, whose --help lists one option more."""
    fork = tmp_path / "fork" / "llama-server"
    fork.parent.mkdir()
    fork.write_text(f"""#!/bin/sh
"{llama_server_bin}" "$@" || exit $?
if [ "$1" = "--help" ]; then
  printf '%s\\n' '--spec-mtp-adaptive [on|off]                adaptive MTP draft depth (fork only)' '(env: LLAMA_ARG_SPEC_MTP_ADAPTIVE)'
fi
""")
    fork.chmod(0o755)
    return fork


FORK_INI = "[ampere-turbo4-adaptive]\nmodel = /m.gguf\ncache-type-k = turbo4\nspec-mtp-adaptive = on\n"


def test_each_ini_is_checked_against_its_own_package(llama_server_bin: Path, fork_server: Path,
                                                     tmp_path: Path) -> None:
    """A fork-only key passes for the fork and fails for the stock build (values are not keys)."""
    assert check(fork_server, FORK_INI, tmp_path).returncode == 0
    stock = check(llama_server_bin, FORK_INI, tmp_path)
    assert stock.returncode == 1
    assert 'preset "ampere-turbo4-adaptive", key "spec-mtp-adaptive"' in stock.stderr
    assert "cache-type-k" not in stock.stderr
    assert check(llama_server_bin, FORK_INI, tmp_path, "--allow-key", "spec-mtp-adaptive").returncode == 0


def test_a_server_that_cannot_run_is_an_error(tmp_path: Path) -> None:
    missing = check(tmp_path / "nope", "[p]\nc = 1\n", tmp_path)
    assert missing.returncode == 2 and "cannot run" in missing.stderr
    not_llama = tmp_path / "true"
    not_llama.write_text("#!/bin/sh\necho usage: nothing\n")
    not_llama.chmod(0o755)
    result = check(not_llama, "[p]\nc = 1\n", tmp_path)
    assert result.returncode == 1 and "lists no options" in result.stderr


def module_ini_build(package: Path, presets: str, settings: str = "") -> dict:
    """The presets INI derivation of services.llama-cpp (evaluated with tests/nix/eval-module.nix)
    for `presets` (and more of the service's `settings`), with a package whose outPath is `package`."""
    root = nixpkgs_root()
    pkg = ('{ type = "derivation"; pname = "llama-cpp"; version = "1"; name = "llama-cpp-1"; src = "none";'
           f" outPath = {nix_string(str(package))}; }}")
    module = (f"{{ services.llama-cpp = {{ enable = true; package = {pkg}; presets = {presets};"
              f" sleepIdleSeconds = 300; {settings} }}; }}")
    source = (f"(import {REPO}/tests/nix/eval-module.nix {{ libPath = {root}/lib; }}).eval"
              f' [ {REPO}/modules/llama-cpp.nix {module} ]).config.environment.etc."llama-cpp/presets.ini".source')
    return nix_eval(f"let s = ({source}; in {{ inherit (s) text buildCommand; }}")  # type: ignore[return-value]


def run_build(build: dict, llama_server_bin: Path, tmp_path: Path) -> subprocess.CompletedProcess:
    """Run the derivation's build script as the builder would: the INI in $textPath (passAsFile),
    a writable working directory, check-preset-keys on PATH."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(parents=True)
    (bin_dir / "check-preset-keys").write_text(f'#!/bin/sh\nexec "{sys.executable}" "{CHECKER}" "$@"\n')
    (bin_dir / "check-preset-keys").chmod(0o755)
    text = tmp_path / ".attr-0"
    text.write_text(build["text"])
    work = tmp_path / "build"
    work.mkdir()
    env = {"PATH": f"{bin_dir}:/usr/bin:/bin", "textPath": str(text), "out": str(tmp_path / "out")}
    return subprocess.run(["bash", "-euo", "pipefail", "-c", build["buildCommand"]], cwd=work, env=env,
                          capture_output=True, text=True, timeout=120)


@pytest.fixture
def package(llama_server_bin: Path, tmp_path: Path) -> Path:
    """A package directory whose bin/llama-server is the real CPU llama-server."""
    (tmp_path / "pkg" / "bin").mkdir(parents=True)
    (tmp_path / "pkg" / "bin" / "llama-server").symlink_to(llama_server_bin)
    return tmp_path / "pkg"


def test_the_modules_ini_build_checks_keys_and_names_presets_ini(package: Path, llama_server_bin: Path,
                                                                  tmp_path: Path) -> None:
    """The module's own build script, run against the real CPU llama-server: a good INI comes out
    as rendered; a misspelled key fails the build with a message that names presets.ini (not the
    passAsFile temporary), the preset, the key and the nearest known key."""
    good = module_ini_build(package, '{ x = { model = "/m.gguf"; ctx-size = 4096; }; }')
    result = run_build(good, llama_server_bin, tmp_path / "good")
    assert result.returncode == 0, result.stderr
    assert (tmp_path / "good" / "out").read_text() == good["text"]

    bad = module_ini_build(package, '{ x = { model = "/m.gguf"; ctx_sise = 4096; }; }')
    result = run_build(bad, llama_server_bin, tmp_path / "bad")
    assert result.returncode == 1, result
    assert result.stderr.startswith(
        "check-preset-keys: presets.ini: llama-server would refuse these presets or flags:"), result.stderr
    assert f'preset "x", key "ctx_sise": not an option of {package}/bin/llama-server; did you mean "ctx-size"?' \
        in result.stderr
    assert ".attr-0" not in result.stderr
    assert not (tmp_path / "bad" / "out").exists()


# --- the unit's own flags, against the same --help ---------------------------------------------


@pytest.fixture
def fork_without_sleep(llama_server_bin: Path, tmp_path: Path) -> Path:
    """A package whose llama-server is a fork stand-in: the real server, whose --help lacks
    --sleep-idle-seconds and which refuses that flag, as a fork from before the option would."""
    server = tmp_path / "fork-pkg" / "bin" / "llama-server"
    server.parent.mkdir(parents=True)
    server.write_text(f"""#!/bin/sh
for arg in "$@"; do
  if [ "$arg" = "--sleep-idle-seconds" ]; then echo "error: invalid argument: $arg" >&2; exit 1; fi
done
if [ "$1" = "--help" ]; then
  "{llama_server_bin}" --help | grep -v -- '--sleep-idle-seconds'
  exit 0
fi
exec "{llama_server_bin}" "$@"
""")
    server.chmod(0o755)
    return server.parent.parent


PRESETS = '{ x = { model = "/m.gguf"; ctx-size = 4096; }; }'


def test_the_units_flags_pass_against_the_real_server(package: Path, llama_server_bin: Path, tmp_path: Path) -> None:
    """Every flag the module puts on the command line (--host, --port, --models-dir,
    --models-preset, --models-max, --sleep-idle-seconds) and the user's extra flags are options of
    the real llama-server."""
    build = module_ini_build(package, PRESETS, command_line_options(c=4096, metrics=True))
    for flag in ("--flag=--models-preset", "--flag=--models-max", "--flag=--sleep-idle-seconds", "--flag=-c"):
        assert flag in build["buildCommand"], build["buildCommand"]
    result = run_build(build, llama_server_bin, tmp_path)
    assert result.returncode == 0, result.stderr


def test_a_fork_without_a_flag_of_the_unit_fails_the_build(fork_without_sleep: Path, package: Path,
                                                             llama_server_bin: Path, tmp_path: Path) -> None:
    """The build fails naming the flag; the control: the fork itself refuses that command line at
    start, which is the restart loop the check prevents."""
    build = module_ini_build(fork_without_sleep, PRESETS)
    result = run_build(build, llama_server_bin, tmp_path)
    assert result.returncode == 1, result
    assert (f'the service\'s command line, flag "--sleep-idle-seconds": not an option of '
            f"{fork_without_sleep}/bin/llama-server") in result.stderr, result.stderr
    started = subprocess.run([str(fork_without_sleep / "bin" / "llama-server"), "--sleep-idle-seconds", "300"],
                             capture_output=True, text=True, timeout=60)
    assert started.returncode != 0 and "--sleep-idle-seconds" in started.stderr
    # The same configuration on the real server passes: the flag, not the file, is the problem.
    assert run_build(module_ini_build(package, PRESETS), llama_server_bin, tmp_path / "real").returncode == 0


def test_a_misspelled_extra_flag_names_the_nearest(package: Path, llama_server_bin: Path, tmp_path: Path) -> None:
    build = module_ini_build(package, PRESETS, command_line_options(**{"ctx-sise": 4096}))
    result = run_build(build, llama_server_bin, tmp_path)
    assert result.returncode == 1
    assert 'flag "--ctx-sise": not an option of' in result.stderr and 'did you mean "--ctx-size"?' in result.stderr


def test_the_real_server_refuses_an_unknown_flag(llama_server_bin: Path) -> None:
    """What the check stands for: llama-server exits at start on a flag it does not know."""
    started = subprocess.run([str(llama_server_bin), "--ctx-sise", "4096"], capture_output=True, text=True, timeout=60)
    assert started.returncode != 0 and "--ctx-sise" in started.stdout + started.stderr


# --- the ExecStartPre that refuses to start without a CUDA device --------------------------------

def require_cuda(server: Path, tmp_path: Path) -> subprocess.CompletedProcess:
    """modules/lib/cuda-unit.nix's script for `server`, run with bash as systemd would."""
    text = nix_eval(f"(import {REPO}/modules/lib/cuda-unit.nix).requireCudaDevice {nix_string(str(server))}")
    script = tmp_path / "require-cuda"
    script.write_text(f"#!/bin/bash\n{text}")
    script.chmod(0o755)
    return subprocess.run([str(script)], capture_output=True, text=True, timeout=60)


def test_a_server_without_a_cuda_device_does_not_start(llama_server_bin: Path, tmp_path: Path) -> None:
    """The real CPU llama-server lists no device: the unit would run every model on the CPU."""
    listed = subprocess.run([str(llama_server_bin), "--list-devices"], capture_output=True, text=True, timeout=60)
    assert "Available devices:" in listed.stdout and "CUDA" not in listed.stdout
    result = require_cuda(llama_server_bin, tmp_path)
    assert result.returncode == 1
    assert "refusing to start" in result.stderr and "shows no CUDA device" in result.stderr
    assert "Available devices:" in result.stderr  # what llama-server itself said
    assert "nvidia_uvm" in result.stderr and "deviceAllow" in result.stderr


def test_a_server_that_lists_a_cuda_device_starts(tmp_path: Path) -> None:
    """A stand-in printing what a CUDA build prints (common/arg.cpp's format) passes; one that
    fails to run does not."""
    cuda = tmp_path / "cuda-server"
    cuda.write_text("#!/bin/sh\nprintf 'Available devices:\\n  CUDA0: NVIDIA GeForce RTX 3090 (24135 MiB, 23800 MiB free)\\n'\n")
    cuda.chmod(0o755)
    assert require_cuda(cuda, tmp_path).returncode == 0
    broken = tmp_path / "broken-server"
    broken.write_text("#!/bin/sh\necho '  CUDA0: listed but crashed'; exit 3\n")
    broken.chmod(0o755)
    result = require_cuda(broken, tmp_path)
    assert result.returncode == 1 and "exit status 3" in result.stderr
