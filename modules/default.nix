# Everything: the router module, the base module with the stock engine, the fa86 and
# llamampere engines (each off until enabled, or made the default), and programs.llm-bench. The flake's `nixosModules.default` is this plus the llamAmpere source
# from the flake input.
{
  imports = [
    ./llama-cpp.nix
    ./base-presets.nix
    ./llm-bench-program.nix
    ../specialisations/llm-fa86.nix
    ../specialisations/llm-llamampere.nix
  ];
}
