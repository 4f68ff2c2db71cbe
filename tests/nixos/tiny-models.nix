# Tiny llama-architecture GGUF models with random weights, written inside the Nix sandbox by
# the same generator the Python test bed uses (llm_bench.testbed.tiny_gguf), with nixpkgs'
# gguf package. Two models with one vocabulary, so the small one can draft for the other.
{ pkgs, llmBenchSrc }:

pkgs.runCommand "llm-bench-tiny-models"
{
  nativeBuildInputs = [ (pkgs.python3.withPackages (ps: [ ps.gguf ps.numpy ])) ];
}
  ''
    mkdir -p $out
    export PYTHONPATH=${llmBenchSrc}
    python -m llm_bench.testbed.tiny_gguf $out/target.gguf --seed 1 --name tiny-target
    python -m llm_bench.testbed.tiny_gguf $out/draft.gguf --seed 2 --embd 32 --layers 1 --name tiny-draft
  ''
