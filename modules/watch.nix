# llmBench.watch: measure the router on the box itself after every engine change, so that a
# regression shows the day it lands (`llm-bench history /var/lib/llm-bench/history`).
#
# llm-bench-watch.service runs a short fixed protocol (`llm-bench run --strict` on the chosen
# presets, unloading each) and then `llm-bench history --keep N` over the folder, whose exit
# code 4 and journal line name a regression. When it runs:
#   - after a switch that changes the engine: its restartTriggers are the marker
#     /etc/llama-cpp/active.json (package path, version, presets) and the presets INI, so
#     switch-to-configuration restarts it exactly then. It is Type=exec with RemainAfterExit, so
#     the switch's job ends when the script has started: a rebuild never waits on it;
#   - at boot it starts too, and exits at once when the marker is the one it last measured;
#   - optionally on a timer (llm-bench-watch-timer.service, which measures even when nothing
#     changed, for twins that show the noise; a regression fails that unit, for OnFailure= alerts).
# Bounds: `timeout` (`timeLimitSec`: the unit itself stays active, see above, so the limit is the
# script's), idle CPU and I/O scheduling, Nice 19. It gives way: it
# writes a skip record (`llm-bench history --skipped`) instead of measuring while a unit the
# arbiter gives the GPU to (llmBench.arbiter, training) is active; `llm-bench run --strict`
# records a preset whose GPU memory is already busy beyond the protocol's threshold as not
# comparable instead of measuring it. `llm-bench run` unloads every preset it measured; should
# the time limit stop it partway, the script unloads the watch's presets itself.
{
  config,
  lib,
  pkgs,
  ...
}:

let
  cfg = config.llmBench.watch;
  inherit (lib) mkOption types;
  router = config.services.llama-cpp;
  marker = builtins.fromJSON config.environment.etc."llama-cpp/active.json".text;
  inherit (marker) url;
  # Each engine (specialisation) measures the chosen presets it serves.
  served = lib.filter (p: lib.elem p marker.presets) cfg.presets;
  llmBench = lib.getExe' config.programs.llm-bench.package "llm-bench";
  givesWayTo = lib.attrNames (
    lib.filterAttrs (_: t: lib.elem "llama-cpp" t.engines) (config.llmBench.arbiter or { })
  );
  script = pkgs.writeShellScript "llm-bench-watch" (
    import ./lib/watch-script.nix {
      inherit
        lib
        llmBench
        url
        givesWayTo
        ;
      presets = served;
      inherit (cfg)
        directory
        runs
        maxTokens
        keep
        timeLimitSec
        ;
      systemctl = lib.getExe' config.systemd.package "systemctl";
      sha256sum = lib.getExe' pkgs.coreutils "sha256sum";
      curl = lib.getExe pkgs.curl;
      marker = "/etc/llama-cpp/active.json";
    }
  );

  bounded = {
    Type = "exec";
    # Idle scheduling: an agent's request to the router always goes first.
    Nice = 19;
    CPUSchedulingPolicy = "idle";
    IOSchedulingClass = "idle";
    StateDirectory = "llm-bench";
  };
  unitBase = {
    after = [ "llama-cpp.service" ];
    wants = [ "llama-cpp.service" ];
    path = [ config.programs.llm-bench.package ];
  };
in
{
  options.llmBench.watch = {
    enable = lib.mkEnableOption "measuring the router after every engine change (llm-bench-watch.service; `llm-bench history /var/lib/llm-bench/history` reads the results)";

    presets = mkOption {
      type = types.nonEmptyListOf types.str;
      example = [ "qwen3.8-27b-mtp2" ];
      description = "The presets to measure after each engine change (each loads once; keep the list short). Each engine measures those of them it serves.";
    };

    runs = mkOption {
      type = types.ints.positive;
      default = 3;
      description = "Measured runs per preset (`llm-bench run --runs`): what the verdict's interval is made of.";
    };

    maxTokens = mkOption {
      type = types.ints.positive;
      default = 256;
      description = "Output tokens per request (`llm-bench run --max-tokens`).";
    };

    keep = mkOption {
      type = types.ints.positive;
      default = 20;
      description = "Results kept per configuration: older ones are deleted (`llm-bench history --keep`).";
    };

    timer = mkOption {
      type = types.nullOr types.str;
      default = null;
      example = "Sun 04:00";
      description = "Also measure on this systemd calendar (OnCalendar=), changed engine or not; null: only after a change.";
    };

    timeLimitSec = mkOption {
      type = types.ints.positive;
      default = 1800;
      description = "The most seconds one measurement may take; then it is stopped, its presets unloaded and a skip recorded.";
    };

    directory = mkOption {
      type = types.str;
      default = "/var/lib/llm-bench/history";
      readOnly = true;
      description = "Where the results and skip records go (under the unit's StateDirectory).";
    };
  };

  config = lib.mkIf cfg.enable {
    assertions = [
      {
        assertion = router.enable;
        message = "llmBench.watch measures services.llama-cpp, which is not enabled.";
      }
    ];

    # `llm-bench` on PATH for the person reading the history.
    programs.llm-bench.enable = lib.mkDefault true;

    systemd.services.llm-bench-watch = unitBase // {
      description = "Measure the llama.cpp router after an engine change (llm-bench history)";
      wantedBy = [ "multi-user.target" ];
      restartTriggers = [
        config.environment.etc."llama-cpp/active.json".text
      ]
      ++ lib.optional (config.environment.etc ? "llama-cpp/presets.ini") config.environment.etc."llama-cpp/presets.ini".source;
      serviceConfig = bounded // {
        RemainAfterExit = true;
        # 4: the newest step is a regression. The journal has its line; the unit stays active,
        # so the next engine change restarts it (switch-to-configuration restarts active units).
        SuccessExitStatus = "4";
        ExecStart = "${script} --on-change";
      };
    };

    systemd.services.llm-bench-watch-timer = lib.mkIf (cfg.timer != null) (
      unitBase
      // {
        description = "Measure the llama.cpp router on a schedule (llm-bench history)";
        serviceConfig = bounded // {
          ExecStart = "${script} --always";
        };
      }
    );

    systemd.timers.llm-bench-watch-timer = lib.mkIf (cfg.timer != null) {
      wantedBy = [ "timers.target" ];
      timerConfig = {
        OnCalendar = cfg.timer;
        Persistent = true;
      };
    };
  };
}
