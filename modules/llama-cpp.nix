# services.llama-cpp, extended with router mode. nixpkgs' own module
# (nixos/modules/services/misc/llama-cpp.nix, in every NixOS system) stays in charge: it
# declares `enable`, `package` and `openFirewall` and the command line's options, writes the
# unit and its hardening, and builds ExecStart. This module adds options next to those and sets
# nixpkgs' options (and a few of the unit's settings) from them; it neither replaces nor copies
# nixpkgs' module, so a change there reaches this one.
#
# nixpkgs has two generations of that module, told apart by what it declares (never by a
# version): NixOS 26.05's has `host`, `port`, `model`, `modelsDir` and `extraFlags`; since
# NixOS/nixpkgs#528626 (unstable, 26.11) they are one freeform `settings` rendered by
# `lib.cli.toCommandLine`, and the old names are renamed or removed. With `settings`, the
# router's flags are keys of it (`models-preset`, `models-max`, `sleep-idle-seconds`,
# `models-dir`), declared here as typed sub-options whose defaults come from this module's
# options, so a user's own `settings.models-max = 2;` wins over them as any definition wins
# over a default (the freeform `types.attrs` would keep a `mkDefault` wrapper in the value).
# Without it, they go to `extraFlags`, before the user's.
#
# Router mode: `presets` (and `presetGrids`) are rendered to the INI file passed with
# `--models-preset` (as /etc/llama-cpp/presets.ini); models load on the first request that
# names them and, with `sleepIdleSeconds`, sleep after that long without requests; at most
# `modelsMax` are loaded at once. The older nixpkgs module asserts that `model` or `modelsDir`
# is set, so with presets the models directory defaults to an empty directory in the store
# under both (the router then serves the presets and nothing else; set it to a folder of GGUF
# files to serve those too).
# Downloads (`hf-repo`, `model-url`) go to the state directory /var/lib/llama-cpp
# (LLAMA_CACHE), which every specialisation shares, so switching builds re-downloads nothing.
# The newer nixpkgs unit sets LLAMA_CACHE=/var/cache/llama-cpp in serviceConfig.Environment,
# which systemd applies after the `environment` lines (the last assignment wins), so ours is
# an Environment= line after nixpkgs' own.
#
# The INI is built by a derivation that runs the package's own `llama-server --help` and
# refuses preset keys and command-line flags it does not know (../pkgs/check-preset-keys), so
# a misspelled key, or a fork without `--sleep-idle-seconds`, fails the build, not the
# service. With `cuda`, the NVIDIA driver is asserted, nvidia_uvm is loaded at boot, the unit
# may open the NVIDIA devices, and it refuses to start unless `llama-server --list-devices`
# shows a CUDA device.
#
# The rendered INI is also installed as /etc/llama-cpp/presets.ini, next to a marker,
# /etc/llama-cpp/active.json, that says which specialisation, package, version and source
# revision are active (format: docs/nixos.md). A change of presets (the unit's restartTriggers)
# or of package (its ExecStart) changes the unit, so `switch-to-configuration` restarts it.
#
# The pure parts (the preset type, INI rendering, checks, grids, command line, marker) are in
# ./lib/presets-ini.nix.
{
  config,
  options,
  lib,
  pkgs,
  ...
}:

let
  cfg = config.services.llama-cpp;
  # nixpkgs' module since NixOS/nixpkgs#528626 (see the top of this file).
  hasSettings = options.services.llama-cpp ? settings;
  listen = if hasSettings then { inherit (cfg.settings) host port; } else { inherit (cfg) host port; };
  # What the user serves besides presets. With `settings`, a definition of nixpkgs' renamed
  # `model` reaches `settings.model` wrapped in its override (the freeform type keeps it), so
  # it is asserted against below rather than read.
  renamedModel = hasSettings && options.services.llama-cpp.model.isDefined;
  singleModel =
    if hasSettings then (if renamedModel then null else cfg.settings.model or null) else cfg.model;
  modelsDir = if hasSettings then cfg.settings.models-dir else cfg.modelsDir;
  unit = config.systemd.services.llama-cpp;
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
  routerMode = hasPresets || modelsDir != null;
  stateDir = "/var/lib/llama-cpp";
  server = "${cfg.package}/bin/llama-server";

  keyChecker = pkgs.callPackage ../pkgs/check-preset-keys { };

  # The router's own flags. The INI is named by its /etc path, so that the key check below can
  # read the command line without depending on its own output; `restartTriggers` restarts the
  # unit when the INI changes.
  router = {
    presetsFile = if hasPresets then "/etc/llama-cpp/presets.ini" else null;
    modelsMax = if routerMode then cfg.modelsMax else null;
    inherit (cfg) sleepIdleSeconds;
  };
  emptyModelsDir = if hasPresets then "${pkgs.emptyDirectory}" else null;

  # The router's keys of nixpkgs' `settings`, as a module of that submodule: typed, so their
  # defaults yield to a user's definition (see the top of this file).
  routerSettings =
    { config, ... }:
    let
      nullOr = t: description: mkOption { type = types.nullOr t; inherit description; };
    in
    {
      options = {
        models-preset = nullOr types.str "The router's presets INI (services.llama-cpp.presets).";
        models-max = nullOr types.ints.unsigned "The most models loaded at once (services.llama-cpp.modelsMax).";
        sleep-idle-seconds = nullOr types.int "Seconds without requests before a model sleeps (services.llama-cpp.sleepIdleSeconds).";
        models-dir = nullOr types.str "A directory of GGUF files the router serves besides the presets.";
      };
      config = {
        models-preset = lib.mkDefault router.presetsFile;
        models-dir = lib.mkDefault emptyModelsDir;
        models-max = lib.mkDefault (if hasPresets || config.models-dir != null then cfg.modelsMax else null);
        sleep-idle-seconds = lib.mkDefault router.sleepIdleSeconds;
      };
    };

  # Every flag of the command line nixpkgs' module builds, for the key check. With `settings`,
  # read from the ExecStart that nixpkgs' module rendered (its words after the program), not
  # from a copy of its rule for turning a key into a flag: that rule changed (a key "-ngl" is
  # `---ngl` after NixOS/nixpkgs#528626, `-ngl` since #561399) and may change again, and the
  # check must see what llama-server will be given. The newer module writes the words
  # unquoted; a value that starts with `-` and is not a number would read as a flag, which no
  # llama-server option takes. Before #528626, the arguments nixpkgs' module puts on the line:
  # `--host`, `--port`, `-m`, `--models-dir`, then extraFlags.
  commandLineFlags =
    if hasSettings then
      ini.flagsOf (
        lib.drop 1 (lib.filter (w: w != "") (lib.splitString " " unit.serviceConfig.ExecStart))
      )
    else
      ini.flagsOf (
        [
          "--host"
          "--port"
        ]
        ++ lib.optional (cfg.model != null) "-m"
        ++ lib.optional (cfg.modelsDir != null) "--models-dir"
        ++ cfg.extraFlags
      );

  # LLAMA_CACHE and HOME, which a user may still set through `environment`.
  stateEnvironment = {
    LLAMA_CACHE = stateDir;
    HOME = stateDir;
  }
  // lib.getAttrs (lib.intersectLists [ "LLAMA_CACHE" "HOME" ] (lib.attrNames cfg.environment)) cfg.environment;

  # The INI, checked against the keys and flags this configuration's own llama-server
  # accepts: a specialisation with another package (a fork with other options) is checked
  # against it. The checker names the file it reads in its messages, so it reads presets.ini,
  # not the passAsFile temporary (/build/.attr-0). A few kilobytes of text: built locally.
  presetsFile =
    if cfg.checkPresetKeys then
      pkgs.runCommand "llama-cpp-presets.ini"
        {
          nativeBuildInputs = [ keyChecker ];
          text = cfg.presetsIni;
          passAsFile = [ "text" ];
          preferLocalBuild = true;
          allowSubstitutes = false;
        }
        ''
          cp "$textPath" presets.ini
          check-preset-keys --server ${server} ${
            lib.concatMapStrings (f: "--flag=${lib.escapeShellArg f} ") commandLineFlags
          }presets.ini
          cp presets.ini "$out"
        ''
    else
      pkgs.writeText "llama-cpp-presets.ini" cfg.presetsIni;

  # A wildcard listen address is reached on the loopback one.
  localHost = if listen.host == "0.0.0.0" || listen.host == "::" then "127.0.0.1" else listen.host;

  marker = ini.marker {
    inherit (cfg) specialisation presets;
    packageName = cfg.package.pname or (lib.getName cfg.package);
    packageVersion = cfg.package.version or (lib.getVersion cfg.package);
    packagePath = "${cfg.package}";
    packageRev = ini.commitOf (cfg.package.src.rev or null);
    presetsFile = if hasPresets then "/etc/llama-cpp/presets.ini" else null;
    inherit (ini.buildOf (cfg.package.cmakeFlags or [ ])) buildNumber buildCommit;
    url = "http://${localHost}:${toString listen.port}";
  };

  # The Hugging Face repositories the presets download from (every spelling llama-server
  # takes for a model's or a draft model's repository), for the prefetch unit below.
  repoKeys = [
    "hf-repo"
    "hf"
    "hfr"
    "hf-repo-draft"
    "hfd"
    "hfrd"
    "spec-draft-hf"
  ];
  prefetchRepos = lib.unique (
    lib.concatMap (
      preset:
      lib.concatMap (k: lib.optional (builtins.isString (preset.${k} or null)) preset.${k}) repoKeys
    ) (lib.attrValues cfg.presets)
  );
  prefetch = cfg.prefetchModels && hasPresets && prefetchRepos != [ ];

  # The prefetch unit's script: the router's own download path (llama.cpp's tools/server,
  # server-models.cpp, as of b11434): `POST /models {"model": REPO}` starts a download
  # child that fetches the repository's GGUF into LLAMA_CACHE, the model shows as
  # "downloading" (with progress) and then "downloaded" in `GET /models`; a repository the
  # router already lists (from its cache) is refused as "already exists". The preset that names the repository
  # then loads from the cache. Progress goes to the journal every 30 s.
  # NixOS runs a unit's `script` with bash -e.
  prefetchScript = ''
    set -u
    url=${lib.escapeShellArg "http://${localHost}:${toString listen.port}"}
    auth=()
    if [[ -n "''${LLAMA_API_KEY:-}" ]]; then auth=(-H "Authorization: Bearer $LLAMA_API_KEY"); fi
    curl=${lib.getExe pkgs.curl}
    jq=${lib.getExe pkgs.jq}
    until "$curl" -sf "''${auth[@]}" "$url/health" >/dev/null; do sleep 5; done
    started=()
    for repo in ${lib.escapeShellArgs prefetchRepos}; do
      body=$("$jq" -nc --arg m "$repo" '{model: $m}')
      reply=$("$curl" -s "''${auth[@]}" -H 'Content-Type: application/json' -d "$body" "$url/models")
      if [[ $("$jq" -r '.success // false' <<<"$reply") == true ]]; then
        echo "llama-cpp-prefetch: downloading $repo into the router's cache"
        started+=("$repo")
      elif [[ $reply == *"already exists"* ]]; then
        echo "llama-cpp-prefetch: $repo is already in the router's cache"
      else
        echo "llama-cpp-prefetch: the router refused to download $repo: $reply" >&2
        exit 1
      fi
    done
    while ((''${#started[@]})); do
      sleep 30
      models=$("$curl" -sf "''${auth[@]}" "$url/models") || continue
      still=()
      for repo in "''${started[@]}"; do
        status=$("$jq" -r --arg m "$repo" '[.data[]? | select(.id == $m)][0].status.value // "gone"' <<<"$models")
        if [[ $status == downloading ]]; then
          still+=("$repo")
          echo "llama-cpp-prefetch: $repo: $("$jq" -c --arg m "$repo" '[.data[]? | select(.id == $m)][0].progress // {}' <<<"$models")"
        else
          echo "llama-cpp-prefetch: $repo: $status"
        fi
      done
      started=("''${still[@]}")
    done
  '';

  # A broken engine (a flag or key its llama-server refuses, no GPU) fails at every start;
  # after `startLimitBurst` failed starts within this interval systemd stops restarting it
  # ("start-limit-hit"), and the journal holds each start's reason. The interval covers that
  # many restart delays, so the limit can trip.
  restartSec = unit.serviceConfig.RestartSec or 0;
  startLimitBurst = 3;
in
{
  options.services.llama-cpp = {
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
        build of the INI (see `checkPresetKeys`). To pin a Hugging Face file to a revision,
        give `model-url = "https://huggingface.co/OWNER/REPO/resolve/REVISION/FILE.gguf"`
        instead of `hf-repo` (llama-server's `hf-repo` always takes the repository's main
        branch).
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
        `llama-server --help` lists (or a router-only preset key), and every flag of the
        unit's command line (`--models-preset`, `--models-max`, `--sleep-idle-seconds`, the
        `extraFlags`, ...) is one it lists too; an unknown key or flag fails the build naming
        it and the nearest known one. llama-server refuses either at start, so without the
        check the service would fail at every start. Off when the build machine cannot run
        the package (cross-compiling).
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

    prefetchModels = mkOption {
      type = types.bool;
      default = true;
      description = ''
        Download every Hugging Face repository the presets name (`hf-repo`, `spec-draft-hf`,
        ...) ahead of any request, through the router's own download path, by the oneshot unit
        llama-cpp-prefetch.service, which starts with the router, reruns when the presets name
        other repositories, and writes progress to the journal
        (`journalctl -u llama-cpp-prefetch -f`).
        Without it the first request to a preset downloads its model (15 GB or more) inside
        the request, and the client times out. `model-url` presets are not prefetched.
      '';
    };

    environment = mkOption {
      type = types.attrsOf types.str;
      default = { };
      example = {
        LLAMA_MTP_GPU_VERIFY = "greedy";
      };
      description = "Extra environment variables of the service (LLAMA_CACHE and HOME are /var/lib/llama-cpp unless set here). Secrets belong in `environmentFile`.";
    };

    environmentFile = mkOption {
      type = types.nullOr types.path;
      default = null;
      example = "/run/secrets/llama-cpp.env";
      description = ''
        A file of environment variables read when the unit starts, kept out of the Nix store
        (a string path, not a path value): `HF_TOKEN=hf_...` lets `hf-repo` presets download
        gated or private repositories.
      '';
    };

    specialisation = mkOption {
      type = types.str;
      default = "base";
      description = "Name of the active specialisation, written to the marker /etc/llama-cpp/active.json. The specialisation modules set it.";
    };

    cuda = mkOption {
      type = types.bool;
      default = false;
      description = ''
        The package is a CUDA build that must run on an NVIDIA GPU. Then evaluation asserts
        that the NVIDIA driver is configured, the nvidia_uvm kernel module is loaded at boot,
        the hardened unit may open the NVIDIA devices (`deviceAllow`), and the unit refuses to
        start (ExecStartPre) unless `llama-server --list-devices` shows a CUDA device, instead
        of running every model on the CPU.
      '';
    };

    deviceAllow = mkOption {
      type = types.nullOr (types.listOf types.str);
      default = if cfg.cuda then cuda.nvidiaDevices else null;
      defaultText = lib.literalExpression "if config.services.llama-cpp.cuda then (import ./lib/cuda-unit.nix).nvidiaDevices else null";
      description = ''
        Devices the hardened unit may open (systemd DeviceAllow=, with DevicePolicy=closed).
        null restricts no device, as nixpkgs' module: CUDA, ROCm and Vulkan packages all reach
        their GPU. With `cuda`, the NVIDIA device classes (`char-nvidiactl`, `char-nvidia`,
        `char-nvidia-frontend`, `char-nvidia-uvm`, `char-nvidia-caps`).
      '';
    };
  };

  config = lib.mkIf cfg.enable (
    lib.mkMerge [
      {
        services.llama-cpp = {
          presetsIni = ini.render cfg.presets;
          presets = lib.mkMerge gridPresets;
        }
        # Each generation gets only names its nixpkgs module declares: a definition of a
        # renamed or removed option would warn or fail an assertion (and can only be made
        # below the option set, as `options` decides it).
        // (
          if hasSettings then
            { settings = routerSettings; }
          else
            {
              # nixpkgs' `model` and `modelsDir` have no default; its assertion wants one of them.
              model = lib.mkDefault null;
              modelsDir = lib.mkDefault emptyModelsDir;
              extraFlags = lib.mkBefore (ini.routerArgs router);
            }
        );

        assertions = [
          {
            assertion = !renamedModel;
            message = ''
              services.llama-cpp.model: this nixpkgs renamed it to services.llama-cpp.settings.model, and a
              definition of the old name cannot be rendered on llama-server's command line here (its freeform
              `settings` keeps the rename's override). Set services.llama-cpp.settings.model instead, or serve
              the model as a preset (services.llama-cpp.presets.<name>.model).
            '';
          }
          {
            assertion = !(singleModel != null && routerMode);
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
          environment = removeAttrs cfg.environment (lib.attrNames stateEnvironment);

          restartTriggers = lib.optional hasPresets presetsFile;

          startLimitBurst = startLimitBurst;
          startLimitIntervalSec =
            if builtins.isInt restartSec then (startLimitBurst + 1) * restartSec + 60 else 1800;

          serviceConfig = {
            # Downloaded models are state, not cache: an administrator may wipe /var/cache,
            # and a 16 GB model takes long to fetch again. Shared by every specialisation.
            StateDirectory = "llama-cpp";
            WorkingDirectory = stateDir;
            # After nixpkgs' own Environment= (the newer unit's LLAMA_CACHE=/var/cache/llama-cpp):
            # systemd keeps the last assignment.
            Environment = lib.mkAfter (lib.mapAttrsToList (n: v: builtins.toJSON "${n}=${v}") stateEnvironment);
            EnvironmentFile = lib.mkIf (cfg.environmentFile != null) cfg.environmentFile;
            # The router stops the model processes it started; give them time to exit.
            TimeoutStopSec = 30;
            # llama.cpp's `fit` reads /proc/meminfo, which nixpkgs' ProcSubset=pid hides.
            ProcSubset = lib.mkForce "all";
          };
        };
      }

      (lib.mkIf prefetch {
        systemd.services.llama-cpp-prefetch = {
          description = "Download the llama.cpp router's preset models ahead of use";
          # Wants, not Requires/PartOf: a restart of the router (a switch between engines)
          # does not rerun the downloads; the script waits for the router's /health itself.
          after = [ "llama-cpp.service" ];
          wants = [ "llama-cpp.service" ];
          wantedBy = [ "multi-user.target" ];
          # A rebuild (or a switch) whose presets name other repositories reruns it.
          restartTriggers = [ (builtins.toJSON prefetchRepos) ];
          script = prefetchScript;
          serviceConfig = {
            Type = "oneshot";
            RemainAfterExit = true;
            # 15 GB and more per model.
            TimeoutStartSec = "infinity";
            DynamicUser = true;
            EnvironmentFile = lib.mkIf (cfg.environmentFile != null) cfg.environmentFile;
          };
        };
      })

      (lib.mkIf (cfg.deviceAllow != null) {
        systemd.services.llama-cpp.serviceConfig = {
          DevicePolicy = "closed";
          DeviceAllow = cfg.deviceAllow;
        };
      })

      (lib.mkIf cfg.cuda {
        assertions = [
          {
            assertion = config.hardware.nvidia.enabled;
            message = cuda.driverMessage "services.llama-cpp.cuda";
          }
          {
            assertion = config.hardware.graphics.enable;
            message = cuda.graphicsMessage "services.llama-cpp.cuda";
          }
        ];
        # libcuda.so.1 reaches /run/opengl-driver/lib only with it (see ./lib/cuda-unit.nix).
        hardware.graphics.enable = lib.mkDefault true;
        boot.kernelModules = cuda.kernelModules;
        systemd.services.llama-cpp.serviceConfig = {
          ExecStartPre = "${pkgs.writeShellScript "llama-cpp-require-cuda" (
            cuda.requireCudaDevice server
          )}";
          # nixpkgs' module sets MemoryDenyWriteExecute=true, which CUDA cannot initialise under.
          MemoryDenyWriteExecute = lib.mkForce false;
        };
      })
    ]
  );
}
