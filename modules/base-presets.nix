# The base module of this project (nixosModules.presets-base): the llama.cpp router with this
# project's choices and the engines it compares.
#
# An engine is a llama.cpp build with the presets it serves: `stock` (nixpkgs' llama-cpp, with
# CUDA unless `llmBench.cuda` is false) is declared here, `fa86` and `llamampere` by the
# specialisation modules. `llmBench.default` picks the engine of the base system (the only
# engine enabled by default); every other engine you enable becomes a specialisation
# (`llm-stock`, `llm-fa86`, `llm-llamampere`). The specialisations are part of the system
# that every `nixos-rebuild` builds, so an engine that is not enabled is never built, and an
# engine that fails to build fails only the rebuilds of a system that enabled it. With
# services.llama-cpp off there are no specialisations. A
# specialisation sets only which engine is active: the package and the presets follow from
# that, and everything a user put in services.llama-cpp (presets, `"*"` settings, port, ...)
# reaches every specialisation, because the module's own values are all mkDefault.
#
# `llmBench.referencePresets.enable` (on by default) serves the reference presets this project
# ships (./presets/base.nix with the shared `[*]`, fa86's kv84, llamampere's ampere grid); off,
# the router serves only the user's own presets.
#
# This project's settings of the generic module, each mkDefault: port 48123 (nixpkgs'
# `settings.port` or, before NixOS/nixpkgs#528626, `port`), models sleep after 300 s idle, CUDA (the NVIDIA driver asserted, the unit opens the NVIDIA device nodes
# only, and refuses to start without a CUDA device) unless `llmBench.cuda` is false.
{
  config,
  options,
  lib,
  pkgs,
  ...
}:

let
  cfg = config.llmBench;
  inherit (lib) mkOption types;
  inherit (import ./lib/presets-ini.nix { inherit lib; }) presetType yielding;
  defaults = import ./presets/models.nix;

  presetsType = types.attrsOf presetType;

  engineNames = [
    "stock"
    "fa86"
    "llamampere"
  ];

  # `default` and `active` can name only these, so another name in `engines` would give a
  # specialisation whose evaluation fails; it is an assertion instead.
  unknownEngines = lib.subtractLists engineNames (lib.attrNames cfg.engines);

  # The enabled engines other than the default, each a specialisation; none when the router is
  # off (a specialisation would then differ from the base in nothing but its build).
  specialised = lib.optionalAttrs config.services.llama-cpp.enable (
    lib.filterAttrs (name: e: e.enable && name != cfg.default) (removeAttrs cfg.engines unknownEngines)
  );

  engine =
    cfg.engines.${cfg.active}
      or (throw "llmBench: engine `${cfg.active}` is not declared; import its module (nixosModules.llm-${cfg.active}, or nixosModules.default)");

  # An engine's own presets over the base ones, key by key (or alone).
  presetsOf = e: lib.recursiveUpdate (if e.inheritBasePresets then cfg.presets else { }) e.presets;

  # The stock engine for `cudaCapabilities`: only its CMake architectures change (the recipe
  # passes nixpkgs' list as CMAKE_CUDA_ARCHITECTURES, "86" for "8.6").
  dropCmakeFlags = import ../pkgs/lib/drop-cmake-flags.nix { inherit lib; };
  forCapabilities =
    package:
    if cfg.cudaCapabilities == null then
      package
    else
      package.overrideAttrs (old: {
        cmakeFlags = dropCmakeFlags [ "CMAKE_CUDA_ARCHITECTURES" ] (old.cmakeFlags or [ ]) ++ [
          (lib.cmakeFeature "CMAKE_CUDA_ARCHITECTURES" (
            lib.concatMapStringsSep ";" (lib.replaceStrings [ "." ] [ "" ]) cfg.cudaCapabilities
          ))
        ];
      });

  pinnedSource = types.submodule {
    options = {
      repo = mkOption {
        type = types.str;
        example = "unsloth/Qwen3.8-27B-GGUF";
        description = "The Hugging Face repository.";
      };
      file = mkOption {
        type = types.str;
        example = "Qwen3.8-27B-UD-Q4_K_XL.gguf";
        description = "The GGUF file in the repository (the first part, for a split model).";
      };
      revision = mkOption {
        type = types.strMatching "[0-9a-f]{40}";
        description = "The commit of the repository to download the file from.";
      };
    };
  };

  source =
    name: description:
    mkOption {
      type = types.oneOf [
        types.str
        types.path
        pinnedSource
      ];
      default = defaults.${name};
      example = lib.literalExpression ''
        {
          repo = "unsloth/Qwen3.8-27B-GGUF";
          file = "Qwen3.8-27B-UD-Q4_K_XL.gguf";
          revision = "0123456789abcdef0123456789abcdef01234567";
        }
      '';
      description = ''
        ${description} A Hugging Face repository with a quant tag ("owner/repo:QUANT"),
        downloaded into /var/lib/llama-cpp on first load from the repository's main branch;
        a file of a repository pinned to a commit (`{ repo; file; revision; }`, downloaded
        from that commit with `model-url`; not for a draft model, which llama-server can only
        take from a repository or a path); or a GGUF file: an absolute path string, or a path
        value, which is copied to the Nix store.
      '';
    };

  engineModule =
    { name, ... }:
    {
      options = {
        enable = mkOption {
          type = types.bool;
          default = name == cfg.default;
          defaultText = lib.literalExpression "<name> == config.llmBench.default";
          description = ''
            Build this engine: as the base system when `llmBench.default` names it, else as
            the specialisation `specialisation`. Only the default engine is on unless you turn
            another on: each is a llama.cpp build of its own (CUDA builds that no binary cache
            has; docs/nixos.md has what each costs), and every rebuild of the system builds
            every enabled engine, so one that fails to build fails the rebuild.
          '';
        };
        specialisation = mkOption {
          type = types.str;
          default = "llm-${name}";
          description = "Name of the specialisation that runs this engine when it is not the default.";
        };
        package = mkOption {
          type = types.nullOr types.package;
          default = null;
          description = "The llama.cpp package of this engine (its llama-server runs the presets).";
        };
        presets = mkOption {
          type = presetsType;
          default = { };
          description = ''
            The presets this engine adds (over the base presets, when it inherits them).
            The engine modules define theirs key by key at mkDefault priority, so a
            definition of one key overrides just that key.
          '';
        };
        inheritBasePresets = mkOption {
          type = types.bool;
          default = true;
          description = ''
            Serve `llmBench.presets` (the base presets) next to this engine's own. An engine
            on which the base presets would mean something else turns this off.
          '';
        };
      };
    };
in
{
  imports = [
    ./llama-cpp.nix
    (lib.mkRenamedOptionModule
      [ "llmBench" "packages" "llama-cpp-fa86" ]
      [ "llmBench" "engines" "fa86" "package" ]
    )
    (lib.mkRenamedOptionModule
      [ "llmBench" "packages" "llamampere" ]
      [ "llmBench" "engines" "llamampere" "package" ]
    )
  ];

  options.llmBench = {
    models = {
      qwen38 = source "qwen38" "Qwen3.8-27B, the model of every preset except the Turbo-Coder one.";
      turboCoder = source "turboCoder" "The Turbo-Coder finetune of Qwen3.8-27B.";
      dflash2Draft = source "dflash2Draft" "The DFlash2 draft model for Qwen3.8-27B.";
    };

    cuda = mkOption {
      type = types.bool;
      default = true;
      description = ''
        Build the llama.cpp packages of the engines with CUDA (the reference machine has one
        RTX 3090), and make the router require the GPU (`services.llama-cpp.cuda`: the NVIDIA
        driver is asserted, nvidia_uvm loaded at boot, and the unit refuses to start unless
        llama-server lists a CUDA device). CUDA is unfree: the system's nixpkgs needs
        `nixpkgs.config.allowUnfree = true` (or an allowUnfreePredicate for the CUDA packages).
      '';
    };

    cudaCapabilities = mkOption {
      type = types.nullOr (types.nonEmptyListOf (types.strMatching "[0-9]+\\.[0-9]+[af]?"));
      default = null;
      example = [ "8.6" ];
      description = ''
        The CUDA capabilities the stock engine is compiled for, as nixpkgs spells them
        (`"8.6"` is the RTX 3090). null keeps nixpkgs' own list (every capability its CUDA
        release supports): the very package nixpkgs builds, which a binary cache of nixpkgs'
        CUDA packages can serve, and the longest build when none does. `[ "8.6" ]` compiles the
        kernels once instead of once per capability, a much shorter first build (docs/nixos.md,
        The first rebuild), for a package no public cache holds. It changes only this engine's
        CMAKE_CUDA_ARCHITECTURES, not `nixpkgs.config.cudaCapabilities`, which would rebuild
        every CUDA package of the system. fa86 and llamampere are always built for 8.6 alone.
      '';
    };

    default = mkOption {
      type = types.enum engineNames;
      default = "stock";
      example = "llamampere";
      description = ''
        The engine of the base system (what runs after boot); the other enabled engines are
        specialisations. `stock`: nixpkgs' llama-cpp; `fa86`: the same recipe for sm_86 with
        every FlashAttention KV pair; `llamampere`: the llamAmpere fork.
      '';
    };

    active = mkOption {
      type = types.enum engineNames;
      default = cfg.default;
      defaultText = lib.literalExpression "config.llmBench.default";
      internal = true;
      description = "The engine this configuration runs: `default` in the base system, the specialisation's own in a specialisation.";
    };

    referencePresets.enable = mkOption {
      type = types.bool;
      default = true;
      example = false;
      description = ''
        Serve the reference presets this project ships: the four Qwen3.8-27B presets
        (`qwen3.8-27b-base`, `-mtp2`, `-dflash2-4`, `-turbo-coder-mtp2`) with their shared `[*]`
        defaults in `llmBench.presets`, and each engine's own (fa86's `qwen3.8-27b-kv84`,
        llamampere's `ampere-*`). Off, the router serves only the presets you declare
        (`services.llama-cpp.presets`, `llmBench.presets`, `llmBench.engines.<engine>.presets`).
      '';
    };

    presets = mkOption {
      type = presetsType;
      default = { };
      description = ''
        The base presets (./presets/base.nix, with `llmBench.models`, when
        `referencePresets.enable`), served by the engines
        that inherit them (stock and fa86). Definitions add to them and override them key by
        key; presets for every engine belong in `services.llama-cpp.presets`.
      '';
    };

    engines = mkOption {
      type = types.attrsOf (types.submodule engineModule);
      default = { };
      description = ''
        The engines (llama.cpp builds with their presets), each declared by its module:
        `stock` (this one), `fa86` and `llamampere`; another name is an assertion. See
        `llmBench.default`.
      '';
    };
  };

  config = {
    llmBench.presets = lib.mkIf cfg.referencePresets.enable (
      yielding (import ./presets/base.nix { inherit (cfg) models; })
    );

    llmBench.engines.stock = {
      # nixpkgs' own CUDA attribute where it has one (unstable, 26.11), so a binary cache that
      # holds it serves this engine.
      package = lib.mkDefault (
        if cfg.cuda then
          forCapabilities (pkgs.llama-cpp-cuda or (pkgs.llama-cpp.override { cudaSupport = true; }))
        else
          pkgs.llama-cpp
      );
    };

    services.llama-cpp = {
      enable = lib.mkDefault true;
      package = lib.mkIf (engine.package != null) (lib.mkDefault engine.package);
      presets = yielding (presetsOf engine);
      sleepIdleSeconds = lib.mkDefault 300;
      cuda = lib.mkDefault cfg.cuda;
    }
    # The port under the name this nixpkgs declares (see ./llama-cpp.nix).
    // (
      if options.services.llama-cpp ? settings then
        { settings.port = lib.mkDefault 48123; }
      else
        { port = lib.mkDefault 48123; }
    );

    specialisation = lib.mapAttrs' (
      name: e:
      lib.nameValuePair e.specialisation {
        configuration = {
          llmBench.active = name;
          services.llama-cpp.specialisation = e.specialisation;
        };
      }
    ) specialised;

    # A package set on the service itself outranks every engine's, so every specialisation
    # would run it (and the marker would name it), which is rarely what was meant.
    warnings = lib.optional (options.services.llama-cpp.package.highestPrio < 1000) ''
      services.llama-cpp.package is set directly, so it replaces llmBench.engines.${cfg.active}.package${
        lib.optionalString (cfg.active != cfg.default) " in specialisation ${engine.specialisation}"
      }: every engine runs that package. Set llmBench.engines.<engine>.package instead.
    '';

    assertions = [
      {
        assertion = unknownEngines == [ ];
        message = "llmBench.engines: no engine named ${lib.concatMapStringsSep ", " (n: "`${n}`") unknownEngines}; the engines are ${lib.concatStringsSep ", " engineNames} (a build of your own goes into llmBench.engines.<engine>.package).";
      }
      {
        assertion = engine.enable || cfg.active != cfg.default;
        message = "llmBench.default = \"${cfg.default}\", but llmBench.engines.${cfg.default}.enable is false.";
      }
      {
        assertion = engine.package != null;
        message = "llmBench.engines.${cfg.active}: no package (for llamampere: set llmBench.llamampere.src, as the flake's nixosModules do, or llmBench.engines.llamampere.package).";
      }
    ];
  };
}
