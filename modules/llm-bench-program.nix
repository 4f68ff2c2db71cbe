# programs.llm-bench: llm-bench on the system's PATH, so that `sudo llm-bench sweep` (which
# reads /etc/llama-cpp/active.json and switches specialisations) runs the same build as the
# flake's `nix run .#llm-bench`. The flake's nixosModules set the package to its own build.
{
  config,
  lib,
  pkgs,
  ...
}:

let
  cfg = config.programs.llm-bench;
in
{
  options.programs.llm-bench = {
    enable = lib.mkEnableOption "llm-bench, the benchmark of the llama.cpp router, in the system's packages";

    package = lib.mkOption {
      type = lib.types.package;
      default = pkgs.callPackage ../pkgs/llm-bench.nix { src = ../.; };
      defaultText = lib.literalExpression "pkgs.callPackage ./pkgs/llm-bench.nix { src = ./.; } (the flake's modules: its packages.llm-bench)";
      description = "The llm-bench package to install.";
    };
  };

  config = lib.mkIf cfg.enable {
    environment.systemPackages = [ cfg.package ];
  };
}
