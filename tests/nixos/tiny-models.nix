# Tiny llama-architecture GGUF models with random weights, written inside the Nix sandbox by
# the same generator the Python test bed uses (llm_bench.testbed.tiny_gguf), with nixpkgs'
# gguf package. Two models with one vocabulary, so the small one can draft for the other.
# The target has 128/4 = 32-wide heads: the presets' q8_0 K/V cache needs a head size that
# q8_0's 32-value block divides (the generator's default, 64/4, is refused).
{ pkgs, llmBenchSrc }:

pkgs.runCommand "llm-bench-tiny-models"
{
  nativeBuildInputs = [ (pkgs.python3.withPackages (ps: [ ps.gguf ps.numpy ])) ];
}
  ''
    mkdir -p $out
    export PYTHONPATH=${llmBenchSrc}
    python -m llm_bench.testbed.tiny_gguf $out/target.gguf --seed 1 --embd 128 --name tiny-target
    python -m llm_bench.testbed.tiny_gguf $out/draft.gguf --seed 2 --embd 32 --layers 1 --name tiny-draft
  ''
