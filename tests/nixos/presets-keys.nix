# Each configuration's presets INI (the base system's and every specialisation's), whose
# build runs check-preset-keys against that configuration's own llama-server (the fork's
# keys against the fork). tests/test_nix_modules.py evaluates this file with the module
# harness, so the flake's check and the tests read specialisations the same way.
{
  pkgs,
  nixosSystem,
}:

let
  # NixOS's `specialisation.<name>.configuration` is the specialisation's evaluated config
  # (the option's type comes from `extendModules`), not a module to evaluate again.
  configs = {
    base = nixosSystem.config;
  }
  // builtins.mapAttrs (_: s: s.configuration) nixosSystem.config.specialisation;
in
pkgs.linkFarm "llm-bench-presets-checked" (
  pkgs.lib.mapAttrsToList (name: config: {
    name = "${name}.ini";
    path = config.environment.etc."llama-cpp/presets.ini".source;
  }) configs
)
