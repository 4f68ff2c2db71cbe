# Evaluates the NixOS modules of this repository with nixpkgs' `lib.evalModules` and a stub
# of the NixOS options they set, and returns a JSON-friendly summary (used by
# tests/test_nix_*.py). Needs nixpkgs' lib, and, beside it (`nixpkgsRoot`), nixpkgs' own
# services.llama-cpp module and llama-cpp recipe (../shared/nixpkgs has all three):
#
#   nix-instantiate --eval --strict --json \
#     -E '(import ./tests/nix/eval-module.nix { libPath = ../shared/nixpkgs/lib; }).summary [ ./modules/default.nix ]'
#
# As NixOS's module-list does, every evaluation has nixpkgs' own llama-cpp module in its module
# list: ../../modules/llama-cpp.nix extends it (adds options next to nixpkgs' and sets nixpkgs'
# own), so both must evaluate together, under whichever generation of it the tree has.
# nixpkgs' own services.litellm module is in the list too, for ../../modules/fleet.nix, which
# only sets its options.
{
  libPath,
  nixpkgsRoot ? dirOf libPath,
  nixpkgsModule ? nixpkgsRoot + "/nixos/modules/services/misc/llama-cpp.nix",
  # nixpkgs' own services.litellm, which the fleet module (../../modules/fleet.nix) configures.
  litellmModule ? nixpkgsRoot + "/nixos/modules/services/misc/litellm.nix",
  modulesPath ? nixpkgsRoot + "/nixos/modules",
  # Replaces attributes of the stand-in package set (see ./stand-ins.nix).
  overlay ? _: { },
}:

let
  lib = import libPath;
  inherit (lib) mkOption types;
  pkgs = import ./stand-ins.nix { inherit lib nixpkgsRoot overlay; };

  # nixpkgs' nixos/lib/utils.nix, the one function nixpkgs' llama-cpp module takes from it.
  utils.escapeSystemdExecArgs = (import ../../modules/lib/systemd-args.nix).escapeSystemdArgs;

  # nixos/modules/system/activation/no-clone.nix: a specialisation has none of its own.
  noClone = {
    specialisation = lib.mkOverride 0 { };
  };

  # nixos/lib/systemd-unit-options.nix's type of a serviceConfig value: list definitions
  # (ExecStartPre, ExecCondition, ...) are concatenated, other values must agree.
  unitOption = lib.mkOptionType {
    name = "systemd option";
    merge =
      loc: defs:
      if lib.any (def: lib.isList def.value) defs then
        lib.concatMap (def: lib.toList def.value) defs
      else
        lib.mergeEqualOption loc defs;
  };

  # The NixOS options that the modules set, declared loosely.
  nixosStub =
    { config, extendModules, ... }:
    {
      options = {
        assertions = mkOption {
          type = types.listOf types.unspecified;
          default = [ ];
        };
        warnings = mkOption {
          type = types.listOf types.str;
          default = [ ];
        };
        # nixpkgs modules set meta.maintainers; never read here (its list is not in ../shared/nixpkgs).
        meta = mkOption {
          type = types.lazyAttrsOf types.raw;
          default = { };
        };
        environment.etc = mkOption {
          default = { };
          type = types.attrsOf (
            types.submodule {
              options = {
                text = mkOption {
                  type = types.nullOr types.lines;
                  default = null;
                };
                source = mkOption {
                  type = types.nullOr types.unspecified;
                  default = null;
                };
              };
            }
          );
        };
        systemd.services = mkOption {
          default = { };
          type = types.attrsOf (
            types.submodule {
              freeformType = types.attrsOf types.anything;
              options = {
                serviceConfig = mkOption {
                  type = types.attrsOf unitOption;
                  default = { };
                };
                onSuccess = mkOption {
                  type = types.listOf types.str;
                  default = [ ];
                };
                onFailure = mkOption {
                  type = types.listOf types.str;
                  default = [ ];
                };
                environment = mkOption {
                  type = types.attrsOf types.str;
                  default = { };
                };
                wantedBy = mkOption {
                  type = types.listOf types.str;
                  default = [ ];
                };
                after = mkOption {
                  type = types.listOf types.str;
                  default = [ ];
                };
                # As nixos/lib/systemd-unit-options.nix declares them (the freeform type
                # would make a definition that reads the unit's own serviceConfig recursive).
                restartTriggers = mkOption {
                  type = types.listOf types.unspecified;
                  default = [ ];
                };
                startLimitBurst = mkOption {
                  type = types.nullOr types.int;
                  default = null;
                };
                startLimitIntervalSec = mkOption {
                  type = types.nullOr types.int;
                  default = null;
                };
              };
            }
          );
        };
        environment.systemPackages = mkOption {
          type = types.listOf types.package;
          default = [ ];
        };
        systemd.timers = mkOption {
          default = { };
          type = types.attrsOf (types.attrsOf types.anything);
        };
        boot.kernelModules = mkOption {
          type = types.listOf types.str;
          default = [ ];
        };
        # As nixos/modules/hardware/video/nvidia.nix declares them: the driver is selected
        # through services.xserver.videoDrivers (or the data-centre switch), and
        # hardware.nvidia.enabled is read only.
        services.xserver.videoDrivers = mkOption {
          type = types.listOf types.str;
          default = [
            "modesetting"
            "fbdev"
          ];
        };
        hardware.nvidia.datacenter.enable = mkOption {
          type = types.bool;
          default = false;
        };
        hardware.nvidia.enabled = mkOption {
          type = types.bool;
          readOnly = true;
          default =
            lib.elem "nvidia" config.services.xserver.videoDrivers || config.hardware.nvidia.datacenter.enable;
        };
        # As nixos/modules/hardware/graphics.nix declares it: off unless set (nixpkgs' NVIDIA
        # module does not set it), and what puts libcuda.so.1 in /run/opengl-driver/lib.
        hardware.graphics.enable = mkOption {
          type = types.bool;
          default = false;
        };
        systemd.package = mkOption {
          type = types.package;
          default = pkgs.systemd;
        };
        systemd.tmpfiles.rules = mkOption {
          type = types.listOf types.str;
          default = [ ];
        };
        networking.firewall.allowedTCPPorts = mkOption {
          type = types.listOf types.port;
          default = [ ];
        };
        # As nixos/modules/system/activation/specialisation.nix declares it: `configuration`
        # is typed by `extendModules`, so its value is the child's evaluated config (the
        # parent's modules, the specialisation's definitions, and no specialisations of its
        # own), not a module. inheritParentConfig = false (NixOS then evaluates without the
        # user's modules) is used by none of ours, so it is not declared.
        specialisation = mkOption {
          default = { };
          type = types.attrsOf (
            types.submodule {
              options.configuration = mkOption {
                default = { };
                inherit (extendModules { modules = [ noClone ]; }) type;
              };
            }
          );
        };
      };
    };

  eval =
    modules:
    lib.evalModules {
      modules = [
        nixosStub
        { _module.args = { inherit pkgs utils; }; }
        nixpkgsModule
        litellmModule
      ]
      ++ modules;
      specialArgs = { inherit modulesPath; };
    };

  failedAssertions = config: map (a: a.message) (lib.filter (a: !a.assertion) config.assertions);

  # nixpkgs' module since NixOS/nixpkgs#528626 has `settings` (see ../../modules/llama-cpp.nix).
  hasSettings = options: options.services.llama-cpp ? settings;

  describe =
    { config, options }:
    let
      cfg = config.services.llama-cpp;
      unit = config.systemd.services.llama-cpp;
      etc = config.environment.etc;
      orNull = v: if v == null then null else toString v;
    in
    {
      failedAssertions = failedAssertions config;
      warnings = config.warnings;
      generation = if hasSettings options then "settings" else "flags";
      # The same names under both generations, read where each declares them.
      options = {
        inherit (cfg)
          enable
          cuda
          openFirewall
          modelsMax
          sleepIdleSeconds
          specialisation
          deviceAllow
          ;
      }
      // (
        if hasSettings options then
          {
            inherit (cfg.settings) host port;
            model = orNull (cfg.settings.model or null);
            modelsDir = orNull cfg.settings.models-dir;
            settings = builtins.mapAttrs (_: v: if builtins.isPath v then toString v else v) cfg.settings;
          }
        else
          {
            inherit (cfg) host port extraFlags;
            model = orNull cfg.model;
            modelsDir = orNull cfg.modelsDir;
          }
      );
      package = {
        inherit (cfg.package) pname version;
        path = cfg.package.outPath;
        cmakeFlags = cfg.package.cmakeFlags or [ ];
        preConfigure = cfg.package.preConfigure or "";
        npmDeps = cfg.package.npmDeps or null;
        nativeBuildInputs = map (p: p.name) (cfg.package.nativeBuildInputs or [ ]);
        src = toString (cfg.package.src.outPath or cfg.package.src.rev or cfg.package.src);
        patches = cfg.package.patches or null;
        postPatch = cfg.package.postPatch or null;
        llamampereRev = cfg.package.llamampereRev or null;
      };
      presets = builtins.attrNames cfg.presets;
      checkPresetKeys = cfg.checkPresetKeys;
      default = config.llmBench.default or null;
      presetsIni = cfg.presetsIni;
      execStart = unit.serviceConfig.ExecStart;
      execStartPre = unit.serviceConfig.ExecStartPre or null;
      restartTriggers = map toString (unit.restartTriggers or [ ]);
      startLimit = {
        burst = unit.startLimitBurst or null;
        intervalSec = unit.startLimitIntervalSec or null;
      };
      kernelModules = config.boot.kernelModules;
      execStartContext = builtins.attrNames (builtins.getContext unit.serviceConfig.ExecStart);
      serviceConfig = unit.serviceConfig;
      environment = unit.environment;
      wantedBy = unit.wantedBy;
      etc = {
        presetsIni =
          if etc ? "llama-cpp/presets.ini" then
            let
              src = etc."llama-cpp/presets.ini".source;
            in
            {
              sourcePath = src.outPath;
              sourceText = src.text;
              buildCommand = src.buildCommand or null;
              preferLocalBuild = src.preferLocalBuild or false;
              nativeBuildInputs = map (p: p.name) (src.nativeBuildInputs or [ ]);
              context = builtins.attrNames (builtins.getContext src.text);
            }
          else
            null;
        activeJson = etc."llama-cpp/active.json".text;
      };
      firewall = config.networking.firewall.allowedTCPPorts;
      graphics = config.hardware.graphics.enable;
      specialisations = builtins.attrNames config.specialisation;
      systemPackages = map (p: p.name) config.environment.systemPackages;
    };
in
{
  inherit
    lib
    pkgs
    eval
    failedAssertions
    describe
    ;

  # Whether this tree's nixpkgs module has `settings`.
  generation = if hasSettings (eval [ ]).options then "settings" else "flags";

  # Summary of the base system and of every specialisation.
  summary =
    modules:
    let
      base = eval modules;
      # A specialisation's `configuration` is its evaluated config; its options are those of
      # the same module list.
      child = s: describe { config = s.configuration; inherit (base) options; };
    in
    describe { inherit (base) config options; }
    // {
      specialised = lib.mapAttrs (_: child) base.config.specialisation;
    };

  # Just the failed assertions (for configurations with bad preset data, whose INI throws).
  assertionsOf = modules: failedAssertions (eval modules).config;
}
