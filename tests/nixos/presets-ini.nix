# The builtins-only parts inside Nix: each preset set renders to its checked-in expected INI.
{ pkgs, ... }:

let
  ini = import ../../modules/lib/presets-ini.nix;
  sets = {
    base = import ../../modules/presets/base.nix { };
    llm-fa86 = import ../../specialisations/llm-fa86-presets.nix { };
    llm-llamampere = import ../../specialisations/llm-llamampere-presets.nix { };
  };
  rendered = pkgs.linkFarm "llm-bench-rendered-presets"
    (pkgs.lib.mapAttrsToList (name: set: { name = "${name}.ini"; path = pkgs.writeText "${name}.ini" (ini.render set); }) sets);
in
pkgs.runCommand "llm-bench-presets-ini" { } ''
  for name in ${toString (builtins.attrNames sets)}; do
    diff -u ${../nix/expected}/$name.ini ${rendered}/$name.ini
  done
  touch $out
''
