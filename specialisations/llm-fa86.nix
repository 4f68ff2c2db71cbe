# The fa86 engine: nixpkgs' llama-cpp rebuilt for the RTX 3090 only
# (CMAKE_CUDA_ARCHITECTURES=86) with every FlashAttention K/V quant pair compiled
# (GGML_CUDA_FA_ALL_QUANTS=ON); the base presets plus `qwen3.8-27b-kv84`. Off unless enabled
# (`llmBench.engines.fa86.enable`) or `llmBench.default`; enabled and not the default, it is
# the specialisation llm-fa86:
#
#   sudo /nix/var/nix/profiles/system/specialisation/llm-fa86/bin/switch-to-configuration test
#
# restarts only llama-cpp.service; the downloaded models (/var/lib/llama-cpp) are shared.
{
  config,
  lib,
  pkgs,
  ...
}:

let
  inherit (import ../modules/lib/presets-ini.nix { inherit lib; }) yielding;
in
{
  imports = [ ../modules/base-presets.nix ];

  llmBench.engines.fa86 = {
    package = lib.mkDefault (
      pkgs.callPackage ../pkgs/llama-cpp-fa86.nix { inherit (config.llmBench) cuda; }
    );
    presets = lib.mkIf config.llmBench.referencePresets.enable (
      yielding (import ./llm-fa86-presets.nix { inherit (config.llmBench) models; })
    );
  };
}
