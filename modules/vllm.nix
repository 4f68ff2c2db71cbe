# services.vllm: vLLM's OpenAI-compatible server (`vllm serve`) as a systemd unit, shaped
# like nixpkgs' services.llama-cpp since NixOS/nixpkgs#528626: a freeform `settings` holds
# `vllm serve`'s flags (keys without dashes, rendered with lib.cli.toCommandLine by
# ./lib/vllm-args.nix), so every flag of the pinned vLLM is reachable and none is copied here.
# Typed options only where this project adds meaning: `model` (the positional argument),
# `settings.host`/`port` (the firewall and the fleet read them), `speculativeConfig` (the
# dtype warning reads it), `cuda` (the driver, hardware.graphics and the CPU-build check).
#
# nixpkgs has a `vllm` package but no services.vllm module, so the name is free. Evaluation
# warns when speculation is combined with dtype "half"/"float16" (vLLM issue #55250: a
# bf16-trained drafter overflows in fp16 and every draft is rejected), and, with `cuda`, fails
# when `package` is a CPU build: nixpkgs' vllm is one unless the system's nixpkgs has
# `config.cudaSupport = true` (or the package is given as a CUDA build).
#
# The pure parts (command line, warning text) are in ./lib/vllm-args.nix. See docs/vllm.md.
{
  config,
  options,
  lib,
  pkgs,
  ...
}:

let
  cuda = import ./lib/cuda-unit.nix;
  cfg = config.services.vllm;
  vllmArgs = import ./lib/vllm-args.nix { inherit lib; };
  inherit (lib) mkOption types;

  cacheDir = "/var/cache/vllm";

  # The settings the unit renders: the user's, with `speculativeConfig` as `speculative-config`.
  settings =
    cfg.settings // lib.optionalAttrs (cfg.speculativeConfig != null) { speculative-config = cfg.speculativeConfig; };
  args = {
    inherit (cfg) model;
    inherit settings;
  };

  warning = vllmArgs.speculationWarning settings;

  # nixpkgs' vllm recipe sets env.VLLM_TARGET_DEVICE ("cuda", "rocm" or "cpu"), which a
  # derivation without structured attributes carries as a top-level attribute. A package
  # without it is judged by where it came from: nixpkgs' default follows
  # `config.cudaSupport`; one the user gave is taken at its word.
  targetDevice = cfg.package.VLLM_TARGET_DEVICE or cfg.package.env.VLLM_TARGET_DEVICE or null;
  packageGiven = options.services.vllm.package.highestPrio < (lib.mkOptionDefault { }).priority;
  cpuBuild =
    if targetDevice != null then
      targetDevice == "cpu"
    else
      !packageGiven && !(pkgs.config.cudaSupport or false);

  # The options of the previous, typed module: where a setting now lives.
  renamed = lib.mapAttrsToList (old: new: lib.mkRenamedOptionModule [ "services" "vllm" old ] [ "services" "vllm" "settings" new ]) {
    host = "host";
    port = "port";
    servedModelName = "served-model-name";
    tensorParallelSize = "tensor-parallel-size";
    gpuMemoryUtilization = "gpu-memory-utilization";
    maxModelLen = "max-model-len";
    dtype = "dtype";
    prefixCaching = "enable-prefix-caching";
    reasoningParser = "reasoning-parser";
    enforceEager = "enforce-eager";
  };
in
{
  imports = renamed ++ [
    (lib.mkRemovedOptionModule [ "services" "vllm" "toolCallParser" ] ''
      Set services.vllm.settings.tool-call-parser = "NAME"; and
      services.vllm.settings.enable-auto-tool-choice = true; (vLLM refuses tool_choice "auto"
      without both).
    '')
    (lib.mkRemovedOptionModule [ "services" "vllm" "extraArgs" ] ''
      Every `vllm serve` flag is a key of services.vllm.settings (without its dashes:
      settings.max-num-seqs = 8;).
    '')
  ];

  options.services.vllm = {
    enable = lib.mkEnableOption "vLLM, an OpenAI-compatible LLM server (`vllm serve`)";

    package = lib.mkPackageOption pkgs "vllm" {
      extraDescription = ''
        nixpkgs' vllm is a CPU build unless the system's nixpkgs has `config.cudaSupport = true`
        (`nixpkgs.config.cudaSupport`); with `cuda` on, a CPU build fails evaluation.
      '';
    };

    cuda = mkOption {
      type = types.bool;
      default = true;
      description = ''
        vLLM runs on NVIDIA GPUs: evaluation asserts the NVIDIA driver and
        `hardware.graphics.enable` (set by default), and refuses a CPU build of `package`
        (nixpkgs' vllm without `nixpkgs.config.cudaSupport = true`), which would serve on the
        CPU at a fraction of the speed. false for a CPU machine.
      '';
    };

    model = mkOption {
      type = types.str;
      example = "Qwen/Qwen3.8-27B";
      description = "Hugging Face repository or local directory of the model (`vllm serve MODEL`).";
    };

    settings = mkOption {
      default = { };
      example = lib.literalExpression ''
        {
          port = 8001;
          served-model-name = "qwen3.8-27b";
          "-tp" = 4;
          gpu-memory-utilization = 0.9;
          max-model-len = 65536;
          dtype = "bfloat16";
          enable-prefix-caching = true;
          reasoning-parser = "qwen3"; # the reasoning in the message's `reasoning` field
          tool-call-parser = "qwen3_coder";
          enable-auto-tool-choice = true;
        }
      '';
      description = ''
        Flags of `vllm serve`, each a key without its leading dashes (a short flag with its
        dash: `"-tp" = 4;`), rendered with `lib.cli.toCommandLine`: null leaves a flag out
        (vLLM's own default applies: `gpu-memory-utilization` 0.92 in vLLM 0.32), true gives
        `--KEY`, false `--no-KEY` (vLLM's negation of every boolean flag), an attribute set one
        JSON argument (`compilation-config = { mode = 0; };`), a list the flag once per element.
        `vllm serve --help` of the package lists them; the project checks the rendered line
        against that of the vLLM it is proven against (tests/test_nix_vllm_help.py).
      '';
      type = types.submodule {
        freeformType = types.attrsOf types.anything;
        options = {
          host = mkOption {
            type = types.str;
            default = "127.0.0.1";
            example = "0.0.0.0";
            description = "Address vLLM listens on (`--host`).";
          };
          port = mkOption {
            type = types.port;
            default = 8000;
            description = "Port vLLM listens on (`--port`).";
          };
        };
      };
    };

    openFirewall = mkOption {
      type = types.bool;
      default = false;
      description = "Open `settings.port` in the firewall. Set an API key (`environmentFile` with VLLM_API_KEY) first.";
    };

    speculativeConfig = mkOption {
      type = types.nullOr (types.attrsOf types.anything);
      default = null;
      example = lib.literalExpression ''
        # DFlash2 block drafter
        { method = "dflash"; model = "incoai/Qwen3.8-27B-DFlash2"; num_speculative_tokens = 7; }
        # or the checkpoint's own MTP head
        # { method = "mtp"; num_speculative_tokens = 3; }
      '';
      description = ''
        Speculative decoding, rendered as JSON for `--speculative-config`. null = none.
        Typed here because evaluation warns when it is combined with `settings.dtype` "half" or
        "float16": vLLM issue #55250 found that a drafter trained in bfloat16 overflows in
        float16, and the target then rejects every draft token without an error. (The same
        warning reads `settings.speculative-config`, `"-sc"` and the `spec-*` shorthands.)
      '';
    };

    environment = mkOption {
      type = types.attrsOf types.str;
      default = { };
      example = {
        CUDA_VISIBLE_DEVICES = "0,1,2,3";
      };
      description = "Extra environment variables of the service (HOME and HF_HOME point to ${cacheDir}).";
    };

    environmentFile = mkOption {
      type = types.nullOr types.path;
      default = null;
      example = "/run/secrets/vllm.env";
      description = "File with secrets as environment variables (VLLM_API_KEY=..., HF_TOKEN=...), outside the Nix store.";
    };

    deviceAllow = mkOption {
      type = types.listOf types.str;
      default = cuda.nvidiaDevices;
      description = "Devices the unit may open (systemd DeviceAllow=, with DevicePolicy=closed): the NVIDIA device nodes.";
    };
  };

  config = lib.mkIf cfg.enable {
    warnings = lib.optional (warning != null) warning;

    assertions = [
      {
        assertion = !(cfg.speculativeConfig != null && (cfg.settings.speculative-config or null) != null);
        message = "services.vllm: speculativeConfig and settings.speculative-config are both set; keep one (speculativeConfig is rendered as --speculative-config).";
      }
    ]
    ++ lib.optionals cfg.cuda [
      {
        assertion = !cpuBuild;
        message = ''
          services.vllm.package is a CPU build of vLLM${
            lib.optionalString (targetDevice != null) " (VLLM_TARGET_DEVICE = \"${targetDevice}\")"
          }: nixpkgs builds vllm with CUDA only when its config has cudaSupport. Set
          nixpkgs.config.cudaSupport = true; (with allowUnfree: CUDA is unfree; every package with
          a CUDA variant is then built with it), or give a CUDA build as services.vllm.package; for a
          CPU machine set services.vllm.cuda = false.
        '';
      }
      {
        assertion = config.hardware.nvidia.enabled;
        message = cuda.driverMessage "services.vllm";
      }
      {
        assertion = config.hardware.graphics.enable;
        message = cuda.graphicsMessage "services.vllm";
      }
    ];
    hardware.graphics.enable = lib.mkIf cfg.cuda (lib.mkDefault true);

    systemd.services.vllm = {
      description = "vLLM OpenAI-compatible server";
      after = [ "network-online.target" ];
      wants = [ "network-online.target" ];
      wantedBy = [ "multi-user.target" ];

      environment = {
        HOME = cacheDir; # torch.compile, Triton and FlashInfer caches
        HF_HOME = "${cacheDir}/huggingface";
        VLLM_CACHE_ROOT = "${cacheDir}/vllm";
      }
      // cfg.environment;

      serviceConfig = cuda.gpuAccess cfg.deviceAllow // {
        Type = "exec";
        ExecStart = vllmArgs.execStart "${cfg.package}/bin/vllm" args;
        # Model download, weight loading, torch.compile and CUDA graph capture.
        TimeoutStartSec = "30min";
        TimeoutStopSec = 60;
        KillSignal = "SIGINT";
        Restart = "on-failure";
        RestartSec = 30;
        EnvironmentFile = lib.mkIf (cfg.environmentFile != null) cfg.environmentFile;

        DynamicUser = true;
        CacheDirectory = "vllm";
        WorkingDirectory = cacheDir;

        # Hardening that tensor-parallel workers (shared memory, NCCL over loopback) survive.
        NoNewPrivileges = true;
        PrivateTmp = true;
        ProtectHome = true;
        ProtectSystem = "strict";
        ProtectClock = true;
        ProtectControlGroups = true;
        ProtectKernelLogs = true;
        ProtectKernelModules = true;
        ProtectKernelTunables = true;
        ProtectHostname = true;
        RestrictRealtime = true;
        RestrictSUIDSGID = true;
        LockPersonality = true;
        RestrictAddressFamilies = [
          "AF_INET"
          "AF_INET6"
          "AF_UNIX"
          "AF_NETLINK"
        ];
      };
    };

    networking.firewall = lib.mkIf cfg.openFirewall {
      allowedTCPPorts = [ cfg.settings.port ];
    };
  };
}
