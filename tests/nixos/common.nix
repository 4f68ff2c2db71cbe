# The machine of the VM tests: the flake's modules on CPU, with the presets' model sources
# pointed at tiny local models (the real sources are Hugging Face repositories, and the VM
# has no network). The preset sets themselves are the real ones.
{ pkgs, self, llmBenchSrc }:

let
  tiny = import ./tiny-models.nix { inherit pkgs llmBenchSrc; };

  # A stand-in for a specialisation's llama.cpp build: nixpkgs' CPU llama-cpp under another
  # name, so the marker and the unit change as they do on the real machine, without a CUDA
  # build in a check.
  renamed = pname: pkgs.symlinkJoin {
    name = "${pname}-${pkgs.llama-cpp.version}";
    paths = [ pkgs.llama-cpp ];
    passthru = { inherit pname; inherit (pkgs.llama-cpp) version; };
  };
in
{
  inherit tiny renamed;

  machine = { ... }: {
    imports = [ self.nixosModules.default ];

    virtualisation.memorySize = 3072;
    virtualisation.cores = 2;

    llmBench.cuda = false;
    llmBench.models = {
      qwen38 = "${tiny}/target.gguf";
      turboCoder = "${tiny}/target.gguf";
      dflash2Draft = "${tiny}/draft.gguf";
    };
    llmBench.engines.fa86.enable = true;
    llmBench.engines.llamampere.enable = true;
    llmBench.engines.fa86.package = renamed "llama-cpp-fa86";
    llmBench.engines.llamampere.package = renamed "llamampere";
    # llmBench.cuda = false makes the base package nixpkgs' CPU llama-cpp.

    environment.systemPackages = [ self.packages.${pkgs.stdenv.hostPlatform.system}.llm-bench pkgs.curl pkgs.jq ];
  };
}
