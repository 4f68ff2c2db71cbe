# Everything: the router module, the base module with the stock engine, the fa86 and
# llamampere engines (each off until enabled, or made the default), programs.llm-bench, and llmBench.watch (off until enabled). The flake's `nixosModules.default` is this plus the llamAmpere source
# from the flake input.
{
  imports = [
    ./llama-cpp.nix
    ./base-presets.nix
    ./llm-bench-program.nix
    ./watch.nix
    ../specialisations/llm-fa86.nix
    ../specialisations/llm-llamampere.nix
  ];
}
