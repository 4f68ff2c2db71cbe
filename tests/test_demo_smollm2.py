"""The demo's SmolLM2 bed: the presets it promises, and a random drafter with its target's vocabulary token for
token, made once per target. The presets are served and measured by tests/test_quality_router.py."""

from __future__ import annotations

import configparser
from pathlib import Path

import pytest

from llm_bench.demo import AGENT_PRESETS, DEMO_PROTOCOL, SMOL_BASELINE, SMOL_CONTEXT, write_smollm2_bed
from llm_bench.workloads.depth import DEPTH


@pytest.fixture(scope="module")
def bed(smollm2: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_smollm2_bed(tmp_path_factory.mktemp("smolbed"), smollm2)


def test_the_bed_has_every_preset_the_readme_describes(smollm2: Path, bed: Path):
    ini = bed
    parser = configparser.ConfigParser()
    text = ini.read_text()
    assert not text.startswith("version")  # older routers turn such a line into a phantom model
    parser.read_string(text)
    presets = {name: dict(parser[name]) for name in parser.sections()}
    assert set(presets) == {"*", SMOL_BASELINE, "smol-self-draft", "smol-kv-q8", "smol-kv-q4",
                            "smol-random-draft", "smol-synth", *AGENT_PRESETS}
    assert all(p["model"] == str(smollm2) for name, p in presets.items() if name != "*")
    assert presets["smol-self-draft"]["model-draft"] == str(smollm2)
    assert presets["smol-kv-q4"]["cache-type-v"] == "q4_0" and presets["smol-kv-q4"]["flash-attn"] == "on"
    assert presets["smol-synth"]["model-draft"] == presets["smol-random-draft"]["model-draft"]
    assert "spec-synth-len" in presets["smol-synth"] and "spec-synth-len" not in presets["smol-random-draft"]
    # the longest recall filler of the demo, with its question and answer, fits the presets' context
    assert max(DEMO_PROTOCOL.recall_lengths) + 96 <= SMOL_CONTEXT == int(presets["*"]["ctx-size"])
    assert DEMO_PROTOCOL.workloads == ("standard", "quality")
    # the depth and session workloads' presets: a template with a tool path and a think block
    for name in AGENT_PRESETS:
        assert presets[name]["jinja"] == "true" and presets[name]["chat-template-file"].endswith("chatml-think.jinja")
    # the deepest demo depth, its prompt and the output tokens fit the context
    assert max(DEPTH.settings_in(DEMO_PROTOCOL).depths) + 300 + DEMO_PROTOCOL.max_tokens <= SMOL_CONTEXT


def test_the_random_drafter_copies_its_targets_vocabulary(tmp_path: Path):
    """Every tokenizer key of the target, value for value, on a tiny target: gguf's reader takes 7 s a file for
    SmolLM2's vocabulary. That llama.cpp accepts the bed's drafter for SmolLM2 itself is shown where it is
    served (smol-random-draft and smol-synth in tests/test_quality_router.py)."""
    import gguf

    from llm_bench.testbed.random_drafter import write_random_drafter
    from llm_bench.testbed.tiny_gguf import write_tiny_model

    target_path = write_tiny_model(tmp_path / "target.gguf")
    drafter = gguf.GGUFReader(str(write_random_drafter(target_path, tmp_path / "drafter.gguf")))
    target = gguf.GGUFReader(str(target_path))
    keys = [key for key in target.fields if key.startswith("tokenizer.")]
    assert {"tokenizer.ggml.tokens", "tokenizer.ggml.merges", "tokenizer.ggml.pre", "tokenizer.ggml.eos_token_id",
            "tokenizer.chat_template"} <= set(keys)
    for key in keys:
        assert drafter.fields[key].contents() == target.fields[key].contents(), key
    assert drafter.fields["llama.block_count"].contents() == 1  # a tiny random model, not a copy


def test_the_demos_default_runs_are_enough_for_a_verdict():
    """With the demo's default run count on each side the exact interval reaches the verdict's minimum
    coverage: clearly separated runs get "slower", not "too few runs" (what every row said with 2 runs)."""
    from llm_bench.report.verdict import SLOWER, verdict

    runs = DEMO_PROTOCOL.runs
    result = verdict([10.0 + 0.1 * i for i in range(runs)], [20.0 + 0.1 * i for i in range(runs)])
    assert result.kind == SLOWER, result


def test_the_random_drafter_is_made_once_per_target_and_copied(tmp_path: Path):
    """The bed's drafter comes from a cache keyed by the target file: the same target reuses the cached file,
    a changed one gets a new drafter, and what is copied is byte for byte write_random_drafter's file."""
    import os

    from llm_bench.testbed.random_drafter import cached_random_drafter, write_random_drafter
    from llm_bench.testbed.tiny_gguf import write_tiny_model

    target = write_tiny_model(tmp_path / "target.gguf")
    cache = tmp_path / "cache"
    first = cached_random_drafter(target, tmp_path / "a" / "drafter.gguf", cache)
    assert first.read_bytes() == write_random_drafter(target, tmp_path / "direct.gguf").read_bytes()
    [made] = cache.iterdir()
    made.write_bytes(b"the cached file")  # reused as it is, not written again
    assert cached_random_drafter(target, tmp_path / "b" / "drafter.gguf", cache).read_bytes() == b"the cached file"
    os.utime(target, ns=(target.stat().st_atime_ns, target.stat().st_mtime_ns + 10**9))
    third = cached_random_drafter(target, tmp_path / "c" / "drafter.gguf", cache)
    assert third.read_bytes() == first.read_bytes() and len(list(cache.iterdir())) == 2


def test_the_served_smollm2_is_the_wheels_q4_1_weights_re_encoded_as_q8_0(tmp_path: Path):
    """Every Q4_1 tensor becomes Q8_0 holding the same weights to within 0.5 % of each block's largest weight (half
    a Q8_0 step, max / 254, plus the rounding of the block's scale to 16 bits), every other tensor and key stays,
    and the file type says Q8_0. On a small file written here: llama.cpp serving the re-encoded SmolLM2 is what
    every router test does."""
    import gguf
    import numpy as np
    from gguf.quants import dequantize, quantize

    from llm_bench.testbed.smollm2 import reencode_q8_0

    rng = np.random.default_rng(7)
    weights = rng.standard_normal((4, 64)).astype(np.float32)
    norm = rng.standard_normal(64).astype(np.float32)
    source = tmp_path / "q4_1.gguf"
    writer = gguf.GGUFWriter(str(source), "llama")
    writer.add_block_count(1)
    writer.add_file_type(gguf.LlamaFileType.MOSTLY_Q4_1)
    writer.add_token_list(["a", "b"])
    q4_1 = quantize(weights, gguf.GGMLQuantizationType.Q4_1)
    writer.add_tensor("blk.0.attn_q.weight", q4_1, raw_dtype=gguf.GGMLQuantizationType.Q4_1)
    writer.add_tensor("blk.0.attn_norm.weight", norm)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()

    made = gguf.GGUFReader(str(reencode_q8_0(source, tmp_path / "q8_0.gguf")))
    before = gguf.GGUFReader(str(source))
    assert made.fields["general.file_type"].contents() == gguf.LlamaFileType.MOSTLY_Q8_0
    for key in ("general.architecture", "llama.block_count", "tokenizer.ggml.tokens"):
        assert made.fields[key].contents() == before.fields[key].contents(), key
    tensors = {t.name: t for t in made.tensors}
    attn = tensors["blk.0.attn_q.weight"]
    assert attn.tensor_type == gguf.GGMLQuantizationType.Q8_0
    held = dequantize(q4_1, gguf.GGMLQuantizationType.Q4_1).reshape(-1, 32)
    served = dequantize(attn.data, attn.tensor_type).reshape(-1, 32)
    largest = np.abs(held).max(axis=1, keepdims=True)
    assert np.all(np.abs(served - held) <= 0.005 * largest) and not np.array_equal(served, held)
    assert tensors["blk.0.attn_norm.weight"].tensor_type == gguf.GGMLQuantizationType.F32
    assert np.array_equal(tensors["blk.0.attn_norm.weight"].data, norm)
