# The llamampere engine: the llamAmpere fork (github:JakeATX/llamAmpere, an Ampere-tuned
# llama.cpp with MTP drafting on by default and turbo KV cache types), built with nixpkgs'
# llama-cpp recipe (../pkgs/llamampere.nix), with its own presets instead of the base ones
# (./llm-llamampere-presets.nix). Off unless enabled (`llmBench.engines.llamampere.enable`) or
# `llmBench.default`; enabled and not the default, it is the specialisation llm-llamampere.
#
# The fork's source comes from the flake (its input `llamampere`), and the version from that
# input's commit date; the flake's nixosModules set `llmBench.llamampere.{src,version}`.
# Without the flake, set them (or `llmBench.engines.llamampere.package`) yourself.
{
  config,
  lib,
  pkgs,
  ...
}:

let
  cfg = config.llmBench;
  inherit (import ../modules/lib/presets-ini.nix { inherit lib; }) yielding;
in
{
  imports = [ ../modules/base-presets.nix ];

  options.llmBench.llamampere = {
    src = lib.mkOption {
      type = lib.types.nullOr (lib.types.either lib.types.path lib.types.package);
      default = null;
      description = "Source tree of llamAmpere (the flake input `llamampere`); its `rev`, when it has one, is recorded in the marker.";
    };
    version = lib.mkOption {
      type = lib.types.str;
      default = "0-unstable";
      description = "The package version; the flake derives it from the input's commit date (pkgs/llamampere-version.nix).";
    };
  };

  config.llmBench.engines.llamampere = {
    package = lib.mkIf (cfg.llamampere.src != null) (
      lib.mkDefault (
        pkgs.callPackage ../pkgs/llamampere.nix {
          inherit (cfg.llamampere) src version;
          inherit (cfg) cuda;
        }
      )
    );
    presets = lib.mkIf cfg.referencePresets.enable (
      yielding (import ./llm-llamampere-presets.nix { inherit (cfg) models; })
    );
    inheritBasePresets = lib.mkDefault false;
  };
}
