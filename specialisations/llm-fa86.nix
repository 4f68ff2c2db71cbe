# Specialisation llm-fa86: nixpkgs' llama-cpp rebuilt for the RTX 3090 only
# (CMAKE_CUDA_ARCHITECTURES=86) with every FlashAttention K/V quant pair compiled
# (GGML_CUDA_FA_ALL_QUANTS=ON), and the base presets plus `qwen3.8-27b-kv84`.
#
#   nixos-rebuild switch --specialisation llm-fa86
#
# restarts only llama-cpp.service; the model cache (/var/cache/llama-cpp) is shared.
{ config, lib, pkgs, ... }:

{
  imports = [ ../modules/base-presets.nix ];

  options.llmBench.packages.llama-cpp-fa86 = lib.mkOption {
    type = lib.types.package;
    default = pkgs.callPackage ../pkgs/llama-cpp-fa86.nix { inherit (config.llmBench) cuda; };
    defaultText = lib.literalExpression "pkgs.callPackage ./pkgs/llama-cpp-fa86.nix { }";
    description = "The llama.cpp build of the llm-fa86 specialisation.";
  };

  config.specialisation.llm-fa86.configuration = { config, lib, ... }: {
    services.llama-cpp = {
      specialisation = "llm-fa86";
      package = lib.mkForce config.llmBench.packages.llama-cpp-fa86;
      presets = lib.mkForce (import ./llm-fa86-presets.nix { inherit (config.llmBench) models; });
    };
  };
}
