# services.llama-cpp: llama.cpp's llama-server, as a single-model server or as a router of
# model presets.
#
# This replaces nixpkgs' nixos/modules/services/misc/llama-cpp.nix (disabledModules below)
# and keeps every option it has (enable, package, model, modelsDir, extraFlags, host, port,
# openFirewall) with nixpkgs' defaults, so configurations written for it keep working: port
# 8080, no idle sleep, no device restriction (a ROCm or Vulkan package reaches its GPU). This
# project's choices (port 48123, 300 s idle sleep, the NVIDIA device nodes) are set by the
# base module, ./base-presets.nix, at mkDefault priority.
#
# It adds router mode: `presets` (and `presetGrids`) are rendered to the INI file given to
# `--models-preset`; models load on the first request that names them and, with
# `sleepIdleSeconds`, sleep after that long without requests; at most `modelsMax` are loaded
# at once. Downloads (`hf-repo`) go to /var/cache/llama-cpp (LLAMA_CACHE), which every
# specialisation shares, so switching builds re-downloads nothing. The INI is built by a
# derivation that runs the package's own `llama-server --help` and refuses keys it does not
# know (../pkgs/check-preset-keys), so a misspelled key fails the build, not the service.
#
# The rendered INI is also installed as /etc/llama-cpp/presets.ini, next to a marker,
# /etc/llama-cpp/active.json, that says which specialisation, package and version are active
# (format: docs/nixos.md). The unit's ExecStart names the INI by its store path, so a change
# of presets or package changes the unit and `switch-to-configuration` restarts it.
#
# The pure parts (the preset type, INI rendering, checks, grids, command line, marker) are in
# ./lib/presets-ini.nix.
{
  config,
  lib,
  pkgs,
  ...
}:

let
  cfg = config.services.llama-cpp;
  ini = import ./lib/presets-ini.nix { inherit lib; };
  inherit (ini) presetType;
  cuda = import ./lib/cuda-unit.nix;
  inherit (lib) mkOption types;

  gridPresets = lib.mapAttrsToList (
    prefix: g:
    ini.grid {
      inherit prefix;
      inherit (g) base axes;
    }
  ) cfg.presetGrids;

  presetNames = ini.presetNames cfg.presets;
  hasPresets = presetNames != [ ];
  routerMode = hasPresets || cfg.modelsDir != null;
  cacheDir = "/var/cache/llama-cpp";

  keyChecker = pkgs.callPackage ../pkgs/check-preset-keys { };

  # The INI, checked against the keys this configuration's own llama-server accepts: a
  # specialisation with another package (a fork with other options) is checked against it.
  # The checker names the file it reads in its messages, so it reads presets.ini, not the
  # passAsFile temporary (/build/.attr-0).
  presetsFile =
    if cfg.checkPresetKeys then
      pkgs.runCommand "llama-cpp-presets.ini"
        {
          nativeBuildInputs = [ keyChecker ];
          text = cfg.presetsIni;
          passAsFile = [ "text" ];
        }
        ''
          cp "$textPath" presets.ini
          check-preset-keys --server ${cfg.package}/bin/llama-server presets.ini
          cp presets.ini "$out"
        ''
    else
      pkgs.writeText "llama-cpp-presets.ini" cfg.presetsIni;

  serverArgs = ini.serverArgs {
    inherit (cfg)
      host
      port
      model
      modelsDir
      extraFlags
      sleepIdleSeconds
      ;
    presetsFile = if hasPresets then presetsFile else null;
    modelsMax = if routerMode then cfg.modelsMax else null;
  };

  deviceAccess =
    if cfg.deviceAllow != null then
      cuda.gpuAccess cfg.deviceAllow
    else
      removeAttrs (cuda.gpuAccess [ ]) [
        "DevicePolicy"
        "DeviceAllow"
      ];

  # A wildcard listen address is reached on the loopback one.
  localHost = if cfg.host == "0.0.0.0" || cfg.host == "::" then "127.0.0.1" else cfg.host;

  marker = ini.marker {
    inherit (cfg) specialisation presets;
    packageName = cfg.package.pname or (lib.getName cfg.package);
    packageVersion = cfg.package.version or (lib.getVersion cfg.package);
    packagePath = "${cfg.package}";
    presetsFile = if hasPresets then "/etc/llama-cpp/presets.ini" else null;
    url = "http://${localHost}:${toString cfg.port}";
  };
in
{
  disabledModules = [ "services/misc/llama-cpp.nix" ];

  options.services.llama-cpp = {
    enable = lib.mkEnableOption "LLaMA C++ server (llama.cpp's llama-server, optionally as a router of model presets)";

    package = lib.mkPackageOption pkgs "llama-cpp" { };

    model = mkOption {
      type = types.nullOr types.path;
      default = null;
      example = "/models/mistral-instruct-7b/ggml-model-q4_0.gguf";
      description = ''
        Model path, for a single-model server. Leave null in router mode (`presets`). A path
        value (`./model.gguf`) is copied to the Nix store, as with nixpkgs' module; a string
        names the file where it is.
      '';
    };

    modelsDir = mkOption {
      type = types.nullOr types.path;
      default = null;
      example = "/models/";
      description = "Models directory; its GGUF files are offered by the router next to the presets.";
    };

    extraFlags = mkOption {
      type = types.listOf types.str;
      default = [ ];
      example = [
        "--no-webui"
        "--metrics"
      ];
      description = "Extra flags passed to llama-server (the router passes them on to every model it starts).";
    };

    host = mkOption {
      type = types.str;
      default = "127.0.0.1";
      example = "0.0.0.0";
      description = "IP address the LLaMA C++ server listens on.";
    };

    port = mkOption {
      type = types.port;
      default = 8080;
      description = "Listen port for LLaMA C++ server.";
    };

    openFirewall = mkOption {
      type = types.bool;
      default = false;
      description = "Open ports in the firewall for LLaMA C++ server.";
    };

    presets = mkOption {
      type = types.attrsOf presetType;
      default = { };
      example = lib.literalExpression ''
        {
          "*" = { ctx-size = 65536; flash-attn = "on"; };
          "qwen3.8-27b-mtp2" = {
            hf-repo = "unsloth/Qwen3.8-27B-GGUF:UD-Q4_K_XL";
            spec-type = "draft-mtp";
            spec-draft-n-max = 2;
          };
        }
      '';
      description = ''
        Model presets of the router, rendered to the INI file given to `--models-preset`.
        Each attribute is a preset (the name clients put in `"model"`); `"*"` holds settings
        that every preset inherits. Keys are llama-server arguments without leading dashes;
        values are strings, integers, floats, booleans or paths (null leaves the key out).
        Floats are written without loss (as Python's repr: `5e-07`, `0.7`); a path value is
        copied to the Nix store. A name with a line break or `]`, a value with a line break,
        `;` or `#`, or a value of another type fails evaluation with a message that names the
        preset and the key; a key the package's `llama-server --help` does not list fails the
        build of the INI (see `checkPresetKeys`).
      '';
    };

    presetGrids = mkOption {
      type = types.attrsOf (
        types.submodule {
          options = {
            base = mkOption {
              type = presetType;
              default = { };
              description = "Settings every preset of the grid starts from.";
            };
            axes = mkOption {
              type = types.listOf (types.attrsOf presetType);
              description = ''
                The axes, in the order of the name's parts: each maps a label to the
                settings it adds (an empty label adds no part to the name).
              '';
            };
          };
        }
      );
      default = { };
      example = lib.literalExpression ''
        {
          ampere = {
            base.hf-repo = "unsloth/Qwen3.8-27B-GGUF:UD-Q4_K_XL";
            axes = [
              { turbo3 = { cache-type-k = "turbo3"; cache-type-v = "turbo3"; };
                turbo4 = { cache-type-k = "turbo4"; cache-type-v = "turbo4"; }; }
              { d1 = { spec-type = "draft-mtp"; spec-draft-n-max = 1; };
                d3 = { spec-type = "draft-mtp"; spec-draft-n-max = 3; }; }
            ];
          };
        }
      '';
      description = ''
        Presets declared as a grid: every combination of one entry per axis over `base`,
        named `NAME-label1-label2` (`ampere-turbo3-d1`, `ampere-turbo3-d3`, ...), added to
        `presets` and rendered and checked like hand-written ones.
      '';
    };

    checkPresetKeys = mkOption {
      type = types.bool;
      default = pkgs.stdenv.buildPlatform.canExecute pkgs.stdenv.hostPlatform;
      defaultText = lib.literalExpression "pkgs.stdenv.buildPlatform.canExecute pkgs.stdenv.hostPlatform";
      description = ''
        Build the presets INI only if every key is one that `package`'s own
        `llama-server --help` lists (or a router-only preset key); an unknown key fails the
        build with the preset, the key and the nearest known key. llama-server refuses such
        a file at start, so without the check the service would fail and restart. Off when
        the build machine cannot run the package (cross-compiling).
      '';
    };

    presetsIni = mkOption {
      type = types.str;
      readOnly = true;
      description = "The rendered presets INI (read only; installed as /etc/llama-cpp/presets.ini).";
    };

    modelsMax = mkOption {
      type = types.ints.unsigned;
      default = 1;
      description = "Router mode: the most models loaded at once (`--models-max`; 0 = unlimited). One fits a 24 GB card.";
    };

    sleepIdleSeconds = mkOption {
      type = types.nullOr (types.either types.ints.positive (types.enum [ (-1) ]));
      default = null;
      example = 300;
      description = "Seconds without requests after which a loaded model sleeps and frees its memory (`--sleep-idle-seconds`; -1 = never; null passes no flag: llama-server's default, no sleep, as nixpkgs' module).";
    };

    environment = mkOption {
      type = types.attrsOf types.str;
      default = { };
      example = { LLAMA_MTP_GPU_VERIFY = "greedy"; };
      description = "Extra environment variables of the service (LLAMA_CACHE is set to /var/cache/llama-cpp).";
    };

    specialisation = mkOption {
      type = types.str;
      default = "base";
      description = "Name of the active specialisation, written to the marker /etc/llama-cpp/active.json. The specialisation modules set it.";
    };

    deviceAllow = mkOption {
      type = types.nullOr (types.listOf types.str);
      default = null;
      example = lib.literalExpression "(import ./lib/cuda-unit.nix).nvidiaDevices";
      description = ''
        Devices the hardened unit may open (systemd DeviceAllow=, with DevicePolicy=closed).
        null, the default, restricts no device, as nixpkgs' module: CUDA, ROCm and Vulkan
        packages all reach their GPU. The base module sets the NVIDIA device nodes CUDA needs.
      '';
    };
  };

  config = lib.mkIf cfg.enable {
    services.llama-cpp.presetsIni = ini.render cfg.presets;
    services.llama-cpp.presets = lib.mkMerge gridPresets;

    assertions = [
      {
        assertion = cfg.model != null || cfg.modelsDir != null || hasPresets;
        message = "services.llama-cpp: set `presets` (router mode), `modelsDir`, or `model`.";
      }
      {
        assertion = !(cfg.model != null && routerMode);
        message = "services.llama-cpp: `model` starts a single-model server; it cannot be combined with `presets` or `modelsDir` (router mode).";
      }
    ]
    ++ map (e: {
      assertion = false;
      message = "services.llama-cpp.presets: ${e}";
    }) (ini.errors cfg.presets);

    environment.etc = lib.mkMerge [
      (lib.mkIf hasPresets { "llama-cpp/presets.ini".source = presetsFile; })
      { "llama-cpp/active.json".text = builtins.toJSON marker + "\n"; }
    ];

    systemd.services.llama-cpp = {
      description = "LLaMA C++ server";
      after = [ "network.target" ];
      wantedBy = [ "multi-user.target" ];

      environment = {
        LLAMA_CACHE = cacheDir;
        HOME = cacheDir;
      }
      // cfg.environment;

      serviceConfig = deviceAccess // {
        Type = "exec";
        ExecStart = "${cfg.package}/bin/llama-server ${ini.escapeSystemdArgs serverArgs}";
        KillSignal = "SIGINT";
        # The router stops the model processes it started; give them time to exit.
        TimeoutStopSec = 30;
        Restart = "on-failure";
        RestartSec = 10;

        # The model cache, shared by every specialisation: same unit, same directory.
        CacheDirectory = "llama-cpp";
        WorkingDirectory = cacheDir;

        # hardening
        DynamicUser = true;
        CapabilityBoundingSet = "";
        RestrictAddressFamilies = [
          "AF_INET"
          "AF_INET6"
          "AF_UNIX"
        ];
        NoNewPrivileges = true;
        PrivateMounts = true;
        PrivateTmp = true;
        PrivateUsers = true;
        ProtectClock = true;
        ProtectControlGroups = true;
        ProtectHome = true;
        ProtectKernelLogs = true;
        ProtectKernelModules = true;
        ProtectKernelTunables = true;
        ProtectSystem = "strict";
        LockPersonality = true;
        RemoveIPC = true;
        RestrictNamespaces = true;
        RestrictRealtime = true;
        RestrictSUIDSGID = true;
        SystemCallArchitectures = "native";
        SystemCallFilter = [
          "@system-service"
          "~@privileged"
        ];
        SystemCallErrorNumber = "EPERM";
        ProtectProc = "invisible";
        ProtectHostname = true;
      };
    };

    networking.firewall = lib.mkIf cfg.openFirewall {
      allowedTCPPorts = [ cfg.port ];
    };
  };
}
