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
# Optionally (`unit.enable`), HyperQwen is a specialisation of its own, `llm-hyperqwen`: there
# a oneshot unit `hyperqwen.service` runs `docker compose up -d` / `down` in the HyperQwen
# checkout, and the llama.cpp router is off, so the two never hold the GPU at once. The unit
# is not restarted by a rebuild (restartIfChanged = false): a `nixos-rebuild test
# --specialisation llm-hyperqwen` leaves a running HyperQwen alone, where a Conflicts= with
# llama-cpp.service in one system would let every rebuild (which starts the router again)
# stop it. `llm-bench engine hyperqwen up|down` switches without the unit and also waits for
# a real completion (docs/hyperqwen.md).
{
  config,
  lib,
  pkgs,
  ...
}:

let
  cfg = config.llmBench.hyperqwen;
  inherit (lib) mkOption types;

  dockerVersion = config.virtualisation.docker.package.version or "0";

  compose =
    action:
    lib.escapeShellArgs (
      [
        "${config.virtualisation.docker.package}/bin/docker"
        "compose"
      ]
      ++ lib.optionals (cfg.unit.envFile != null) [
        "--env-file"
        cfg.unit.envFile
      ]
      ++ lib.concatMap (f: [
        "-f"
        f
      ]) cfg.unit.composeFiles
      ++ [
        "--profile"
        cfg.unit.profile
      ]
      ++ action
    );
in
{
  imports = [
    (lib.mkRemovedOptionModule [
      "llmBench"
      "hyperqwen"
      "unit"
      "conflictsWith"
    ] ''
      hyperqwen.service now runs in a specialisation of its own (llmBench.hyperqwen.unit.specialisation),
      where the llama.cpp router is off: a Conflicts= with llama-cpp.service let every rebuild stop
      a running HyperQwen.
    '')
  ];

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
        description = ''
          Add the specialisation `unit.specialisation`, which runs the compose project as
          `hyperqwen.service` (started when you switch to it) and has the llama.cpp router off.
        '';
      };

      specialisation = mkOption {
        type = types.str;
        default = "llm-hyperqwen";
        description = "Name of the specialisation that runs HyperQwen instead of the llama.cpp router.";
      };

      active = mkOption {
        type = types.bool;
        default = false;
        internal = true;
        description = "Set in the HyperQwen specialisation: this configuration runs hyperqwen.service.";
      };

      directory = mkOption {
        type = types.str;
        example = "/srv/HyperQwen";
        description = "The HyperQwen checkout: its docker-compose.yml, .env and models/.";
      };

      composeFiles = mkOption {
        type = types.listOf types.str;
        default = [
          "docker-compose.yml"
          "docker-compose.override.yml"
        ];
        description = "Compose files, relative to `directory` (HyperQwen's, then this repository's CDI override).";
      };

      envFile = mkOption {
        type = types.nullOr types.str;
        default = ".env";
        description = "Env file for compose's variable substitution (SPEC, GPU_UTIL, KV_MEM, MAX_LEN, PORT, BIND).";
      };

      profile = mkOption {
        type = types.enum [
          "single"
          "batch"
        ];
        default = "single";
        description = "HyperQwen's compose profile: `single` (low latency, speculative decoding) or `batch`.";
      };
    };
  };

  config = lib.mkIf cfg.enable (
    lib.mkMerge [
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

      (lib.mkIf (cfg.unit.enable && !cfg.unit.active) {
        specialisation.${cfg.unit.specialisation}.configuration = {
          llmBench.hyperqwen.unit.active = true;
          # The GPU is HyperQwen's here; the router would take it back at every rebuild.
          services.llama-cpp.enable = lib.mkForce false;
        };
      })

      (lib.mkIf cfg.unit.active {
        systemd.services.hyperqwen = {
          description = "HyperQwen (vLLM in Docker Compose)";
          requires = [ "docker.service" ];
          after = [
            "docker.service"
            "nvidia-container-toolkit-cdi-generator.service"
          ];
          wants = [ "nvidia-container-toolkit-cdi-generator.service" ];
          # Started by the switch into the specialisation (and at boot from its boot entry).
          wantedBy = [ "multi-user.target" ];
          # A rebuild must not take down a running engine mid-measurement; `systemctl restart
          # hyperqwen` applies a changed unit.
          restartIfChanged = false;
          serviceConfig = {
            Type = "oneshot";
            RemainAfterExit = true;
            WorkingDirectory = cfg.unit.directory;
            ExecStart = compose [
              "up"
              "-d"
            ];
            ExecStop = compose [ "down" ];
            # The first `up` pulls a ~9.5 GB image and downloads the model.
            TimeoutStartSec = "2h";
          };
        };
      })
    ]
  );
}
