# The base presets (builtins-only data, rendered by modules/lib/presets-ini.nix): the stock
# and llm-fa86 engines serve them (llmBench.presets); llm-llamampere has its own.
#
# Qwen3.8-27B for one 24 GB card: text only, 65,536 tokens of context, `fit = on` (llama.cpp
# sizes the GPU offload itself), K and V cache at q8_0, FlashAttention on (a quantised V
# cache needs it). The settings every preset shares live in `[*]`; each preset adds its model
# and its speculative decoding.
#
# `models` overrides the model sources (see ./models.nix for the defaults).
{
  models ? { },
}:
let
  src = import ./sources.nix;
  m = import ./models.nix // models;
in
{
  "*" = import ./common.nix;

  # The control: no speculative decoding (stock llama.cpp's default spec-type is `none`).
  "qwen3.8-27b-base" = src.modelSource m.qwen38;

  # Multi-token prediction from the model's own MTP head, 2 draft tokens per step.
  "qwen3.8-27b-mtp2" = src.modelSource m.qwen38 // {
    spec-type = "draft-mtp";
    spec-draft-n-max = 2;
  };

  # The Turbo-Coder finetune, same MTP depth.
  "qwen3.8-27b-turbo-coder-mtp2" = src.modelSource m.turboCoder // {
    spec-type = "draft-mtp";
    spec-draft-n-max = 2;
  };

  # DFlash2: a block-diffusion draft model, 4 draft tokens per step.
  "qwen3.8-27b-dflash2-4" = src.modelSource m.qwen38 // src.draftSource m.dflash2Draft // {
    spec-type = "draft-dflash";
    spec-draft-n-max = 4;
  };
}
