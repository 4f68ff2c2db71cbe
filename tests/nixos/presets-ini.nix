# The renderer inside Nix: each engine's preset set renders to its checked-in expected INI
# (as tests/test_nix_pure.py checks with nix-instantiate).
{ pkgs, ... }:

let
  inherit (pkgs) lib;
  ini = import ../../modules/lib/presets-ini.nix { inherit lib; };
  base = import ../../modules/presets/base.nix { };
  sets = {
    inherit base;
    llm-fa86 = lib.recursiveUpdate base (import ../../specialisations/llm-fa86-presets.nix { });
    llm-llamampere = import ../../specialisations/llm-llamampere-presets.nix { };
  };
  rendered = pkgs.linkFarm "llm-bench-rendered-presets" (
    lib.mapAttrsToList (name: set: {
      name = "${name}.ini";
      path = pkgs.writeText "${name}.ini" (ini.render set);
    }) sets
  );
in
pkgs.runCommand "llm-bench-presets-ini" { } ''
  for name in ${toString (builtins.attrNames sets)}; do
    diff -u ${../nix/expected}/$name.ini ${rendered}/$name.ini
  done
  touch $out
''
