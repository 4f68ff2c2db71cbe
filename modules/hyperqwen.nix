# llmBench.hyperqwen: what a NixOS host needs to run HyperQwen (syv-ai/HyperQwen, a patched
# vLLM in Docker) beside the llama.cpp router on the same GPU, through CDI:
#
#   - Docker, with the daemon's CDI feature on (`features.cdi`, Docker >= 25);
#   - hardware.nvidia-container-toolkit, whose generator unit writes the CDI spec
#     (/var/run/cdi/nvidia-container-toolkit.json) naming `nvidia.com/gpu=all`, `=0`, ...
#
# deploy/hyperqwen/docker-compose.override.yml then reserves the GPU with `driver: cdi`
# instead of the legacy NVIDIA runtime that HyperQwen's own compose file asks for.
#
# Optionally (`unit.enable`), a oneshot unit `hyperqwen.service` runs `docker compose up -d`
# / `down` in the HyperQwen checkout and Conflicts= with llama-cpp.service, so
# `systemctl start hyperqwen` frees the GPU by stopping the router, and
# `systemctl start llama-cpp` stops HyperQwen. `llm-bench engine hyperqwen up|down` does the
# same from the command line and also waits for a real completion (docs/hyperqwen.md).
{ config, lib, pkgs, ... }:

let
  cfg = config.llmBench.hyperqwen;
  inherit (lib) mkOption types;

  dockerVersion = config.virtualisation.docker.package.version or "0";

  compose = action: lib.escapeShellArgs (
    [ "${config.virtualisation.docker.package}/bin/docker" "compose" ]
    ++ lib.optionals (cfg.unit.envFile != null) [ "--env-file" cfg.unit.envFile ]
    ++ lib.concatMap (f: [ "-f" f ]) cfg.unit.composeFiles
    ++ [ "--profile" cfg.unit.profile ]
    ++ action
  );
in
{
  options.llmBench.hyperqwen = {
    enable = lib.mkEnableOption "Docker with CDI and the NVIDIA container toolkit, for HyperQwen beside the llama.cpp router";

    dockerUsers = mkOption {
      type = types.listOf types.str;
      default = [ ];
      example = [ "alice" ];
      description = ''
        Users added to the `docker` group, so that `llm-bench engine hyperqwen up` can run
        `docker compose` without sudo. Membership of that group is root-equivalent.
      '';
    };

    unit = {
      enable = mkOption {
        type = types.bool;
        default = false;
        description = "Add `hyperqwen.service`, a oneshot unit running the compose project (not started at boot).";
      };

      directory = mkOption {
        type = types.str;
        example = "/srv/HyperQwen";
        description = "The HyperQwen checkout: its docker-compose.yml, .env and models/.";
      };

      composeFiles = mkOption {
        type = types.listOf types.str;
        default = [ "docker-compose.yml" "docker-compose.override.yml" ];
        description = "Compose files, relative to `directory` (HyperQwen's, then this repository's CDI override).";
      };

      envFile = mkOption {
        type = types.nullOr types.str;
        default = ".env";
        description = "Env file for compose's variable substitution (SPEC, GPU_UTIL, KV_MEM, MAX_LEN, PORT, BIND).";
      };

      profile = mkOption {
        type = types.enum [ "single" "batch" ];
        default = "single";
        description = "HyperQwen's compose profile: `single` (low latency, speculative decoding) or `batch`.";
      };

      conflictsWith = mkOption {
        type = types.listOf types.str;
        default = [ "llama-cpp.service" ];
        description = "Units that hold the GPU; starting hyperqwen.service stops them (and starting them stops it).";
      };
    };
  };

  config = lib.mkIf cfg.enable (lib.mkMerge [
    {
      assertions = [
        {
          assertion = lib.versionAtLeast dockerVersion "25";
          message = "llmBench.hyperqwen: Docker ${dockerVersion} has no CDI support; `driver: cdi` device reservations need Docker >= 25 (virtualisation.docker.package).";
        }
      ];

      virtualisation.docker.enable = true;
      # The toolkit module sets this too (for Docker >= 25); stated here because the compose
      # override depends on it.
      virtualisation.docker.daemon.settings.features.cdi = true;
      hardware.nvidia-container-toolkit.enable = true;

      users.groups.docker.members = cfg.dockerUsers;
    }

    (lib.mkIf cfg.unit.enable {
      systemd.services.hyperqwen = {
        description = "HyperQwen (vLLM in Docker Compose)";
        requires = [ "docker.service" ];
        after = [ "docker.service" "nvidia-container-toolkit-cdi-generator.service" ];
        wants = [ "nvidia-container-toolkit-cdi-generator.service" ];
        conflicts = cfg.unit.conflictsWith;
        serviceConfig = {
          Type = "oneshot";
          RemainAfterExit = true;
          WorkingDirectory = cfg.unit.directory;
          ExecStart = compose [ "up" "-d" ];
          ExecStop = compose [ "down" ];
          # The first `up` pulls a ~9.5 GB image and downloads the model.
          TimeoutStartSec = "2h";
        };
      };
    })
  ]);
}
