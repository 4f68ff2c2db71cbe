# Specialisation llm-llamampere: the llamAmpere fork (github:JakeATX/llamAmpere, an
# Ampere-tuned llama.cpp with MTP drafting on by default and turbo/SJ-KVaRN KV cache types),
# built with nixpkgs' llama-cpp recipe (../pkgs/llamampere.nix), and its own presets, which
# replace the base ones (./llm-llamampere-presets.nix).
#
#   nixos-rebuild switch --specialisation llm-llamampere
#
# The fork's source is a flake input; the flake's nixosModules set `llmBench.llamampere.src`.
# Without the flake, set it (or `llmBench.packages.llamampere`) yourself.
{ config, lib, pkgs, ... }:

let
  cfg = config.llmBench;
in
{
  imports = [ ../modules/base-presets.nix ];

  options.llmBench = {
    llamampere = {
      src = lib.mkOption {
        type = lib.types.nullOr (lib.types.either lib.types.path lib.types.package);
        default = null;
        description = "Source tree of llamAmpere (the flake input `llamampere`).";
      };
      version = lib.mkOption {
        type = lib.types.str;
        default = "0.5.5";
        description = "The llamAmpere release the source is (shown as the package version).";
      };
    };

    packages.llamampere = lib.mkOption {
      type = lib.types.nullOr lib.types.package;
      default =
        if cfg.llamampere.src == null then null
        else pkgs.callPackage ../pkgs/llamampere.nix {
          inherit (cfg.llamampere) src version;
          inherit (cfg) cuda;
        };
      defaultText = lib.literalExpression "pkgs.callPackage ./pkgs/llamampere.nix { src = inputs.llamampere; }";
      description = "The llama.cpp build of the llm-llamampere specialisation.";
    };
  };

  config.specialisation.llm-llamampere.configuration = { config, lib, ... }: {
    assertions = [{
      assertion = config.llmBench.packages.llamampere != null;
      message = "specialisation llm-llamampere: set llmBench.llamampere.src (the flake's nixosModules do) or llmBench.packages.llamampere.";
    }];
    services.llama-cpp = {
      specialisation = "llm-llamampere";
      package = lib.mkIf (config.llmBench.packages.llamampere != null) (lib.mkForce config.llmBench.packages.llamampere);
      presets = lib.mkForce (import ./llm-llamampere-presets.nix { inherit (config.llmBench) models; });
    };
  };
}
