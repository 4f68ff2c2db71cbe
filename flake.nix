{
  description = "llm-bench and the NixOS llama.cpp router it measures: module, presets, specialisations, VM tests";

  inputs = {
    nixpkgs.url = "github:NixOS/nixpkgs/nixos-unstable";

    # The llamAmpere release (a tag the fork publishes). v0.5.1 is the newest release whose
    # tag this project could see (its release notes, docs/llamampere-v0.5.1); the report
    # measured v0.5.5, whose tag could not be checked from where this was written (no access
    # to GitHub), so it is not pinned blind: try it with
    # `--override-input llamampere github:JakeATX/llamAmpere/v0.5.5`. flake.lock has no entry
    # for this input yet (writing one needs the network): the first `nix` command in a clone
    # adds it to flake.lock (a changed file), and CI's `nix flake lock` job writes it for
    # committing (.github/workflows/nix.yml). The package's version and revision come from
    # the input itself (pkgs/llamampere-version.nix). docs/nixos.md, The llamAmpere source.
    llamampere.url = "github:JakeATX/llamAmpere/v0.5.1";
    llamampere.flake = false;
  };

  outputs =
    {
      self,
      nixpkgs,
      llamampere,
    }:
    let
      system = "x86_64-linux";
      inherit (nixpkgs) lib;

      # CUDA is unfree; the llama.cpp packages of this flake are CUDA builds.
      pkgs = import nixpkgs {
        inherit system;
        config.allowUnfree = true;
      };

      # Only what the Python package needs, so unrelated edits do not rebuild it.
      llmBenchSrc = lib.fileset.toSource {
        root = ./.;
        fileset = lib.fileset.unions [
          ./pyproject.toml
          ./llm_bench
          (lib.fileset.maybeMissing ./README.md)
          (lib.fileset.maybeMissing ./LICENSE)
        ];
      };

      llamampereVersion =
        (import ./pkgs/llamampere-version.nix {
          lastModifiedDate = llamampere.lastModifiedDate or null;
        }).version;

      # The CUDA builds of the engines, as the modules build them from the same nixpkgs (so,
      # with `inputs.nixpkgs.follows` in the machine's flake and the same nixpkgs config, the
      # same store paths): an hour or more each, and nixpkgs' CUDA llama-cpp is unfree, so
      # cache.nixos.org has it not. Not in `checks`. Nothing here pushes them to a cache: build
      # them where you like (`nix build .#cuda-engines`, or the machine itself on another host
      # with `nixos-rebuild --build-host`) and `nix copy` them to the machine or a cache you
      # run (docs/nixos.md, The first rebuild).
      cudaEngines = {
        llama-cpp-cuda = pkgs.llama-cpp-cuda or (pkgs.llama-cpp.override { cudaSupport = true; });
        inherit (self.packages.${system}) llama-cpp-fa86 llamampere;
      };

      # The CPU parts of the checks (see `checks` below).
      cpuChecks =
        let
          args = { inherit pkgs self llmBenchSrc; };

          # The machine of the flake's default module on CPU; only its /etc files are built.
          cpuSystem = nixpkgs.lib.nixosSystem {
            inherit system;
            modules = [
              self.nixosModules.default
              {
                llmBench.cuda = false;
                llmBench.engines.fa86.enable = true;
                llmBench.engines.llamampere.enable = true;
                boot.isContainer = true;
                system.stateVersion = "25.11";
              }
            ];
          };

          checks = {
            # The pure parts, as the Python tests check them, but inside Nix.
            presets-ini = import ./tests/nixos/presets-ini.nix args;
            # The router on CPU with tiny models, and llm-bench measuring it.
            router = import ./tests/nixos/router.nix args;
            # switch-to-configuration test into each specialisation and back.
            specialisation-switch = import ./tests/nixos/specialisation-switch.nix args;
            # systemd-boot under EFI: which engine runs after a reboot, for each way of switching.
            specialisation-boot = import ./tests/nixos/specialisation-boot.nix args;
            # llmBench.watch: a switch to a slower engine, and the regression in llm-bench history.
            watch = import ./tests/nixos/watch.nix args;
            # Two boxes behind nixpkgs' LiteLLM proxy (llmBench.fleet) and the training arbiter.
            fleet = import ./tests/nixos/fleet.nix args;
            # Each engine's presets INI, whose build runs check-preset-keys against that engine's
            # own llama-server (the fork's keys against the fork), built without CUDA.
            presets-keys = import ./tests/nixos/presets-keys.nix {
              inherit pkgs;
              nixosSystem = cpuSystem;
            };
            llm-bench = self.packages.${system}.llm-bench;
          };
        in
        pkgs.linkFarm "llm-bench-cpu-checks" (
          lib.mapAttrsToList (name: path: { inherit name path; }) checks
        )
        // {
          inherit checks;
        };

      llamampereSource =
        { lib, ... }:
        {
          llmBench.llamampere.src = lib.mkDefault llamampere;
          llmBench.llamampere.version = lib.mkDefault llamampereVersion;
        };

      # programs.llm-bench installs this flake's own build.
      llmBenchPackage =
        { lib, ... }:
        {
          programs.llm-bench.package = lib.mkDefault self.packages.${system}.llm-bench;
        };
    in
    {
      nixosModules = {
        llama-cpp = ./modules/llama-cpp.nix;
        presets-base = ./modules/base-presets.nix;
        vllm = ./modules/vllm.nix;
        hyperqwen = ./modules/hyperqwen.nix;
        # Several boxes behind nixpkgs' services.litellm, and the training/inference arbiter.
        fleet = ./modules/fleet.nix;
        llm-fa86 = ./specialisations/llm-fa86.nix;
        llm-llamampere = {
          imports = [
            ./specialisations/llm-llamampere.nix
            llamampereSource
          ];
        };
        llm-bench = {
          imports = [
            ./modules/llm-bench-program.nix
            llmBenchPackage
          ];
        };
        default = {
          imports = [
            ./modules/default.nix
            llamampereSource
            llmBenchPackage
          ];
        };
      };

      packages.${system} = {
        llm-bench = pkgs.callPackage ./pkgs/llm-bench.nix { src = llmBenchSrc; };
        llama-cpp-fa86 = pkgs.callPackage ./pkgs/llama-cpp-fa86.nix { };
        llamampere = pkgs.callPackage ./pkgs/llamampere.nix {
          src = llamampere;
          version = llamampereVersion;
        };
        check-preset-keys = pkgs.callPackage ./pkgs/check-preset-keys { };
        cpu-checks = cpuChecks;
        cuda-engines = pkgs.linkFarm "llm-bench-cuda-engines" (
          lib.mapAttrsToList (name: path: { inherit name path; }) cudaEngines
        );
        default = self.packages.${system}.llm-bench;
      };

      apps.${system} = {
        llm-bench = {
          type = "app";
          program = "${self.packages.${system}.llm-bench}/bin/llm-bench";
          meta.description = "Measure llama.cpp router presets with the report's protocol";
        };
        default = self.apps.${system}.llm-bench;
      };

      # The VM tests and each engine built without CUDA, its INI checked against it (also
      # `nix build .#cpu-checks -L`). The CUDA builds are `packages.cuda-engines`, not checks.
      checks.${system} = cpuChecks.checks;

      devShells.${system}.default = pkgs.mkShell {
        packages = [
          (pkgs.python3.withPackages (
            ps: with ps; [
              httpx
              httpx-sse
              click
              nvidia-ml-py
              tomli-w
              matplotlib
              gguf
              tqdm
              pydantic
              pytest
              pytest-randomly
              pyyaml
              mypy
            ]
          ))
          pkgs.ruff
          pkgs.nix
          pkgs.nixfmt
        ];
        shellHook = ''
          # tests/test_nix_*.py render with this nixpkgs' lib and evaluate the modules next to its
          # own llama-cpp module and recipe.
          export NIXPKGS_LIB=${nixpkgs}
        '';
      };

      formatter.${system} = pkgs.nixfmt;
    };
}
