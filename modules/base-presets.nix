# The base system's llama.cpp router: nixpkgs' llama-cpp (with CUDA unless `llmBench.cuda`
# is false) and the Qwen3.8-27B presets of ./presets/base.nix.
{ config, lib, pkgs, ... }:

let
  cfg = config.llmBench;
  inherit (lib) mkOption types;
  defaults = import ./presets/models.nix;
  source = name: description: mkOption {
    type = types.either types.str types.path;
    default = defaults.${name};
    description = ''
      ${description} A Hugging Face repository with a quant tag ("owner/repo:QUANT"),
      downloaded into /var/cache/llama-cpp on first load, or an absolute path to a GGUF file.
    '';
  };
in
{
  imports = [ ./llama-cpp.nix ];

  options.llmBench = {
    models = {
      qwen38 = source "qwen38" "Qwen3.8-27B, the model of every preset except the Turbo-Coder one.";
      turboCoder = source "turboCoder" "The Turbo-Coder finetune of Qwen3.8-27B.";
      dflash2Draft = source "dflash2Draft" "The DFlash2 draft model for Qwen3.8-27B.";
    };

    cuda = mkOption {
      type = types.bool;
      default = true;
      description = ''
        Build the llama.cpp packages of the base system and of the specialisations with CUDA
        (the reference machine has one RTX 3090). CUDA is unfree: the system's nixpkgs needs
        `nixpkgs.config.allowUnfree = true` (or an allowUnfreePredicate for the CUDA packages).
      '';
    };
  };

  config.services.llama-cpp = {
    enable = lib.mkDefault true;
    package = lib.mkDefault (if cfg.cuda then pkgs.llama-cpp.override { cudaSupport = true; } else pkgs.llama-cpp);
    presets = import ./presets/base.nix { inherit (cfg) models; };
  };
}
