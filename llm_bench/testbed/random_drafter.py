"""A random-weight draft model that shares a real model's vocabulary.

llama.cpp only lets a model draft for a target whose vocabulary matches token for token, so the
drafter copies every ``tokenizer.*`` key of the target GGUF. Its weights are random: it proposes
tokens the target would not choose, which is what a drafter that is always rejected looks like,
and what llama.cpp's synthetic acceptance (``spec-synth-len``) then forces into the output.
"""

from __future__ import annotations

import hashlib
import os
import shutil
from pathlib import Path

# Part of the cache key: change it when write_random_drafter writes a different file.
_FORMAT = 1


def cached_random_drafter(target: Path, path: Path, cache: Path) -> Path:
    """write_random_drafter's file for ``target`` at ``path``, made once into ``cache`` and copied from there:
    gguf's reader takes 4 s to read a real vocabulary, a copy milliseconds. A changed target file gets a new one."""
    stat = target.stat()
    key = hashlib.sha256(f"{target.resolve()}:{stat.st_size}:{stat.st_mtime_ns}:{_FORMAT}".encode()).hexdigest()[:16]
    made = cache / f"{target.stem}-random-drafter-{key}.gguf"
    if not made.exists():
        cache.mkdir(parents=True, exist_ok=True)
        # Written aside and renamed: a process reading the cache never sees half a file.
        partial = made.with_name(f"{made.name}.{os.getpid()}.partial")
        write_random_drafter(target, partial)
        partial.replace(made)
    path.parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(made, path)
    return path


def write_random_drafter(target: Path, path: Path, *, seed: int = 3, n_embd: int = 32, n_layer: int = 1,
                         n_ctx: int = 8192) -> Path:
    import gguf
    import numpy as np

    reader = gguf.GGUFReader(str(target))
    rng = np.random.default_rng(seed)
    n_head, n_ff = 4, 2 * n_embd

    def weights(*shape: int) -> "np.ndarray":
        return (rng.standard_normal(shape) * 0.5).astype(np.float32)

    path.parent.mkdir(parents=True, exist_ok=True)
    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_name("random-drafter")
    writer.add_block_count(n_layer)
    writer.add_context_length(n_ctx)
    writer.add_embedding_length(n_embd)
    writer.add_feed_forward_length(n_ff)
    writer.add_head_count(n_head)
    writer.add_head_count_kv(n_head)
    writer.add_rope_dimension_count(n_embd // n_head)
    writer.add_layer_norm_rms_eps(1e-5)
    writer.add_file_type(gguf.LlamaFileType.ALL_F32)
    n_vocab = 0
    for key, field in reader.fields.items():
        if not key.startswith("tokenizer."):
            continue
        value = field.contents()
        if key == "tokenizer.ggml.tokens":
            n_vocab = len(value)
        main_type = field.types[0]
        sub_type = field.types[-1] if main_type == gguf.GGUFValueType.ARRAY else None
        writer.add_key_value(key, value, main_type, sub_type=sub_type)
    if not n_vocab:
        raise ValueError(f"{target} has no tokenizer.ggml.tokens; cannot copy its vocabulary")

    # No output.weight: llama.cpp then ties the output to the token embedding, halving the file.
    writer.add_tensor("token_embd.weight", weights(n_vocab, n_embd))
    writer.add_tensor("output_norm.weight", np.ones(n_embd, dtype=np.float32))
    for i in range(n_layer):
        block = f"blk.{i}"
        writer.add_tensor(f"{block}.attn_norm.weight", np.ones(n_embd, dtype=np.float32))
        for name in ("attn_q", "attn_k", "attn_v", "attn_output"):
            writer.add_tensor(f"{block}.{name}.weight", weights(n_embd, n_embd))
        writer.add_tensor(f"{block}.ffn_norm.weight", np.ones(n_embd, dtype=np.float32))
        writer.add_tensor(f"{block}.ffn_gate.weight", weights(n_ff, n_embd))
        writer.add_tensor(f"{block}.ffn_up.weight", weights(n_ff, n_embd))
        writer.add_tensor(f"{block}.ffn_down.weight", weights(n_embd, n_ff))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path
