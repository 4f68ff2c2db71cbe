"""Write tiny llama-architecture GGUF models with random weights.

They exist so that a real llama-server can be exercised without a GPU or a download:
a byte-level BPE vocabulary (every byte is a token, plus one merge because the loader
refuses a BPE vocabulary without merges), a ChatML template so that
``/v1/chat/completions`` works, and a few hundred KB of f32 weights.

Models written with the same ``vocab`` share token ids, so one can draft for another.
Run as ``python -m llm_bench.testbed.tiny_gguf OUT.gguf [--seed N] [--embd N] [--layers N]``;
the NixOS VM test uses the same entry point.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from pathlib import Path

CHATML_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)

SPECIAL_TOKENS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")


@dataclass(frozen=True)
class TinyModelSpec:
    seed: int = 1
    n_embd: int = 64
    n_layer: int = 2
    n_head: int = 4
    n_ff: int = 128
    n_ctx: int = 4096
    name: str = "tiny-llama"


def byte_tokens() -> list[str]:
    """GPT-2's byte-to-unicode table: every byte gets one printable token."""
    printable = (
        list(range(ord("!"), ord("~") + 1))
        + list(range(ord("¡"), ord("¬") + 1))
        + list(range(ord("®"), ord("ÿ") + 1))
    )
    mapping: dict[int, str] = {b: chr(b) for b in printable}
    extra = 0
    for b in range(256):
        if b not in mapping:
            mapping[b] = chr(256 + extra)
            extra += 1
    return [mapping[b] for b in range(256)]


def vocabulary() -> tuple[list[str], list[int], list[str]]:
    """Tokens, token types and merges shared by every tiny model."""
    import gguf

    tokens = byte_tokens()
    merges = ["Ġ t"]
    tokens.append("Ġt")
    types = [gguf.TokenType.NORMAL] * len(tokens)
    tokens.extend(SPECIAL_TOKENS)
    types.extend([gguf.TokenType.CONTROL] * len(SPECIAL_TOKENS))
    return tokens, [int(t) for t in types], merges


def write_tiny_model(path: Path, spec: TinyModelSpec = TinyModelSpec()) -> Path:
    import gguf
    import numpy as np

    tokens, types, merges = vocabulary()
    n_vocab = len(tokens)
    rng = np.random.default_rng(spec.seed)

    def weights(*shape: int) -> "np.ndarray":
        return (rng.standard_normal(shape) * 0.5).astype(np.float32)

    path.parent.mkdir(parents=True, exist_ok=True)
    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_name(spec.name)
    writer.add_block_count(spec.n_layer)
    writer.add_context_length(spec.n_ctx)
    writer.add_embedding_length(spec.n_embd)
    writer.add_feed_forward_length(spec.n_ff)
    writer.add_head_count(spec.n_head)
    writer.add_head_count_kv(spec.n_head)
    writer.add_rope_dimension_count(spec.n_embd // spec.n_head)
    writer.add_layer_norm_rms_eps(1e-5)
    writer.add_file_type(gguf.LlamaFileType.ALL_F32)
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("default")
    writer.add_token_list(tokens)
    writer.add_token_types(types)
    writer.add_token_merges(merges)
    eos = tokens.index("<|im_end|>")
    writer.add_bos_token_id(tokens.index("<|endoftext|>"))
    writer.add_eos_token_id(eos)
    writer.add_add_bos_token(False)
    writer.add_chat_template(CHATML_TEMPLATE)

    writer.add_tensor("token_embd.weight", weights(n_vocab, spec.n_embd))
    writer.add_tensor("output_norm.weight", np.ones(spec.n_embd, dtype=np.float32))
    writer.add_tensor("output.weight", weights(n_vocab, spec.n_embd))
    for i in range(spec.n_layer):
        block = f"blk.{i}"
        writer.add_tensor(f"{block}.attn_norm.weight", np.ones(spec.n_embd, dtype=np.float32))
        for name in ("attn_q", "attn_k", "attn_v", "attn_output"):
            writer.add_tensor(f"{block}.{name}.weight", weights(spec.n_embd, spec.n_embd))
        writer.add_tensor(f"{block}.ffn_norm.weight", np.ones(spec.n_embd, dtype=np.float32))
        writer.add_tensor(f"{block}.ffn_gate.weight", weights(spec.n_ff, spec.n_embd))
        writer.add_tensor(f"{block}.ffn_up.weight", weights(spec.n_ff, spec.n_embd))
        writer.add_tensor(f"{block}.ffn_down.weight", weights(spec.n_embd, spec.n_ff))

    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--embd", type=int, default=64)
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--name", default="tiny-llama")
    args = parser.parse_args(argv)
    spec = TinyModelSpec(seed=args.seed, n_embd=args.embd, n_layer=args.layers, name=args.name)
    print(write_tiny_model(args.out, spec))


if __name__ == "__main__":
    main()
