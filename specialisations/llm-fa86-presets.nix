# The llm-fa86 specialisation's presets (builtins-only data): the base presets plus a mixed
# q8_0 K / q4_0 V cache. That pair has a FlashAttention kernel only in a build with
# GGML_CUDA_FA_ALL_QUANTS (llama.cpp compiles q4_0-q4_0, q8_0-q8_0, f16-f16 and bf16-bf16 by
# default and otherwise converts K and V to f16 on the fly), which is why it lives here.
{ models ? { } }:
let
  ini = import ../modules/lib/presets-ini.nix;
  m = import ../modules/presets/models.nix // models;
in
import ../modules/presets/base.nix { inherit models; } // {
  "qwen3.8-27b-kv84" = ini.modelSource m.qwen38 // {
    spec-type = "draft-mtp";
    spec-draft-n-max = 2;
    cache-type-k = "q8_0";
    cache-type-v = "q4_0";
  };
}
