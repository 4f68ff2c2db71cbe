# Default model sources of the presets (builtins-only data). Each is either a Hugging Face
# repository with a quant tag, downloaded into LLAMA_CACHE (/var/lib/llama-cpp) the first
# time a preset loads it, or an absolute path to a GGUF file. The NixOS options
# `llmBench.models.*` (modules/base-presets.nix) default to these values.
{
  # Qwen3.8-27B, Unsloth's dynamic 4-bit quant; carries the MTP head used by `draft-mtp`.
  qwen38 = "unsloth/Qwen3.8-27B-GGUF:UD-Q4_K_XL";
  # The Turbo-Coder finetune of Qwen3.8-27B measured in the report. Check the repository and
  # quant against the report before relying on the number.
  turboCoder = "DavidAU/Qwen3.8-27B-TURBO-CODER-GGUF:Q4_K_M";
  # The DFlash2 block-diffusion drafter trained for Qwen3.8-27B (`draft-dflash`).
  dflash2Draft = "z-lab/Qwen3.8-27B-DFlash2-GGUF:Q8_0";
}
