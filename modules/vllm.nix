# services.vllm: vLLM's OpenAI-compatible server (`vllm serve`) as a systemd service, with
# the settings the second report tuned as typed options: tensor parallelism, GPU memory
# utilisation, context length, dtype, prefix caching, a speculative decoding config
# (DFlash2, MTP, ...), reasoning and tool-call parsers.
#
# nixpkgs (at the pinned revision) has a `vllm` package but no services.vllm module, so the
# name is free. Evaluation warns when a speculative config is combined with dtype
# "half"/"float16" (the target then rejects every draft token); `--enforce-eager` is added
# only when `enforceEager = true`.
#
# The pure parts (command line, warning text) are in ./lib/vllm-args.nix. See docs/vllm.md.
{
  config,
  lib,
  pkgs,
  ...
}:

let
  cuda = import ./lib/cuda-unit.nix;
  cfg = config.services.vllm;
  vllmArgs = import ./lib/vllm-args.nix;
  inherit (lib) mkOption types;

  cacheDir = "/var/cache/vllm";

  args = {
    inherit (cfg)
      model
      host
      port
      servedModelName
      tensorParallelSize
      gpuMemoryUtilization
      maxModelLen
      dtype
      prefixCaching
      speculativeConfig
      reasoningParser
      toolCallParser
      enforceEager
      extraArgs
      ;
  };

  warning = vllmArgs.speculationWarning args;
in
{
  options.services.vllm = {
    enable = lib.mkEnableOption "vLLM, an OpenAI-compatible LLM server (`vllm serve`)";

    package = lib.mkPackageOption pkgs "vllm" {
      extraDescription = "Build it with CUDA support (`config.cudaSupport = true`) for NVIDIA GPUs.";
    };

    model = mkOption {
      type = types.str;
      example = "Qwen/Qwen3.8-27B";
      description = "Hugging Face repository or local directory of the model (`vllm serve MODEL`).";
    };

    servedModelName = mkOption {
      type = types.nullOr types.str;
      default = null;
      example = "qwen3.8-27b";
      description = "Name clients put in `\"model\"` (`--served-model-name`); null = the model argument.";
    };

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

    openFirewall = mkOption {
      type = types.bool;
      default = false;
      description = "Open `port` in the firewall. Set an API key (`environmentFile` with VLLM_API_KEY) first.";
    };

    tensorParallelSize = mkOption {
      type = types.nullOr types.ints.positive;
      default = null;
      example = 4;
      description = "GPUs one model is split across (`--tensor-parallel-size`); the second report used 4 RTX 3090s. null = vLLM's default (1).";
    };

    gpuMemoryUtilization = mkOption {
      type = types.nullOr (types.numbers.between 0 1);
      default = null;
      example = 0.92;
      description = "Fraction of each GPU's memory vLLM may use for weights, activations and KV cache (`--gpu-memory-utilization`). null = vLLM's default (0.9).";
    };

    maxModelLen = mkOption {
      type = types.nullOr types.ints.positive;
      default = null;
      example = 65536;
      description = "Context length (`--max-model-len`). null = the model's own.";
    };

    dtype = mkOption {
      type = types.nullOr (types.enum vllmArgs.dtypes);
      default = null;
      example = "bfloat16";
      description = ''
        Weights and activations dtype (`--dtype`). null leaves the flag out (vLLM's "auto").
        With a speculative config, "half"/"float16" is a trap: a bf16 drafter's tokens are
        all rejected (mean acceptance length 1.00) and nothing fails; evaluation warns.
      '';
    };

    prefixCaching = mkOption {
      type = types.nullOr types.bool;
      default = true;
      description = ''
        Automatic prefix caching: `--enable-prefix-caching` when true,
        `--no-enable-prefix-caching` when false, no flag when null (vLLM's default, which
        depends on the model; hybrid models keep it off). In the second report it cut the
        time to the first token of a repeated 11k-token prompt from 7 s to 0.86 s.
      '';
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
      description = "Speculative decoding, rendered as JSON for `--speculative-config`. null = none.";
    };

    reasoningParser = mkOption {
      type = types.nullOr types.str;
      default = null;
      example = "qwen3";
      description = "Splits the model's reasoning into `reasoning_content` (`--reasoning-parser`).";
    };

    toolCallParser = mkOption {
      type = types.nullOr types.str;
      default = null;
      example = "qwen3_coder";
      description = "Tool-call format of the model; adds `--enable-auto-tool-choice --tool-call-parser NAME`.";
    };

    enforceEager = mkOption {
      type = types.bool;
      default = false;
      description = "Run without CUDA graphs (`--enforce-eager`): only for debugging, it costs decode speed.";
    };

    extraArgs = mkOption {
      type = types.listOf types.str;
      default = [ ];
      example = [
        "--max-num-seqs"
        "8"
        "--kv-cache-dtype"
        "fp8"
      ];
      description = "More `vllm serve` arguments, appended last.";
    };

    environment = mkOption {
      type = types.attrsOf types.str;
      default = { };
      example = {
        VLLM_USE_V1 = "1";
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
      allowedTCPPorts = [ cfg.port ];
    };
  };
}
