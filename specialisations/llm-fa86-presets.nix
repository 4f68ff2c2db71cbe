# What the llm-fa86 engine adds to the base presets (builtins-only data): a mixed q8_0 K /
# q4_0 V cache. That pair has a FlashAttention kernel only in a build with
# GGML_CUDA_FA_ALL_QUANTS (llama.cpp compiles q4_0-q4_0, q8_0-q8_0, f16-f16 and bf16-bf16 by
# default and otherwise converts K and V to f16 on the fly), which is why it lives here.
{
  models ? { },
}:
let
  src = import ../modules/presets/sources.nix;
  m = import ../modules/presets/models.nix // models;
in
{
  "qwen3.8-27b-kv84" = src.modelSource m.qwen38 // {
    spec-type = "draft-mtp";
    spec-draft-n-max = 2;
    cache-type-k = "q8_0";
    cache-type-v = "q4_0";
  };
}
