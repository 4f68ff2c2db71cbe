# The fleet: several inference boxes behind one LiteLLM proxy, and the arbiter that frees a
# box's GPU for a training job.
#
# llmBench.fleet (on the proxy's machine) writes nixpkgs' own `services.litellm.settings`
# from a short declaration: model groups, the boxes serving each (their OpenAI-compatible URL,
# the alias they serve it under, an order: 1 = first choice, 2, 3, ... = fallbacks) and
# LiteLLM's retry and cooldown settings. Backends' API keys are never values here: a backend
# names an environment variable, rendered as LiteLLM's `os.environ/VAR` reference, and the
# variable comes from `services.litellm.environmentFile` (outside the store).
#
# Orders become LiteLLM model groups chained by `router_settings.fallbacks`, not LiteLLM's
# per-deployment `order` key: LiteLLM 1.80 applies `order` only with `enable_pre_call_checks`,
# and a request that meets a stopped first choice then fails (500) instead of moving on; a
# fallback group answers it. Group `qwen` holds the order-1 boxes, `qwen@box2` the order-2
# box(es), and `router_settings.fallbacks = [ { qwen = [ "qwen@box2" ... ]; } ]`
# (docs/fleet.md).
#
# llmBench.arbiter (on an inference box): while a declared training unit runs, the box's
# engine units are stopped, and started again when it ends. The training unit stops them in
# a privileged ExecStartPre, starts them again through OnSuccess=/OnFailure=, and each engine
# gets an ExecCondition= that skips its start while the training unit is active, so neither a
# `systemctl start` by hand nor `nixos-rebuild switch` (which starts every unit its targets
# want) brings the engine back under a running training job. Conflicts= is not used: it works
# both ways, so starting the engine would stop the training job (docs/fleet.md).
{ config, options, lib, pkgs, ... }:

let
  inherit (lib) mkOption types;

  # The box side (llmBench.fleetBox): the engines on this machine the proxy must reach.
  box = config.llmBench.fleetBox;
  llamaCpp = config.services.llama-cpp;
  # nixpkgs' services.llama-cpp names its address `settings.host` since NixOS/nixpkgs#528626,
  # `host` before (see ./llama-cpp.nix).
  llamaHasSettings = options.services.llama-cpp ? settings;
  llamaHost = if llamaHasSettings then llamaCpp.settings.host else llamaCpp.host;
  hasVllm = options.services ? vllm;
  vllmOn = hasVllm && config.services.vllm.enable;
  loopback = host: builtins.elem host [ "127.0.0.1" "::1" "localhost" ] || lib.hasPrefix "127." host;
  # The router's key: LLAMA_API_KEY in its environment file, or `--api-key-file` on its line.
  llamaKeyed =
    llamaCpp.environmentFile != null
    || lib.hasInfix "--api-key-file" (config.systemd.services.llama-cpp.serviceConfig.ExecStart or "");

  cfg = config.llmBench.fleet;
  arbiter = config.llmBench.arbiter;
  litellm = config.services.litellm;
  yaml = pkgs.formats.yaml { };

  backendModule = {
    options = {
      url = mkOption {
        type = types.strMatching "https?://.+";
        example = "http://box1.lan:48123/v1";
        description = ''
          The box's OpenAI-compatible base URL as clients use it, `/v1` included (LiteLLM's
          `api_base`): a llama.cpp router (`services.llama-cpp`), a vLLM server
          (`services.vllm`) or any OpenAI-compatible engine. The proxy's
          `x-litellm-model-api-base` response header names it.
        '';
      };

      model = mkOption {
        type = types.str;
        example = "qwen3.8-27b-mtp2";
        description = ''
          The alias the box serves the model under: a preset name of a llama.cpp router, the
          `--served-model-name` of vLLM.
        '';
      };

      order = mkOption {
        type = types.ints.positive;
        default = 1;
        description = ''
          1 = first choice; 2, 3, ... = fallbacks, tried in increasing order once every box of
          the orders before has failed a request `numRetries` + 1 times. Boxes of the same
          order share the load (LiteLLM's simple-shuffle).
        '';
      };

      apiKeyVariable = mkOption {
        type = types.nullOr (types.strMatching "[A-Za-z_][A-Za-z0-9_]*");
        default = null;
        example = "BOX1_API_KEY";
        description = ''
          Name of the environment variable holding the box's API key (its `--api-key`,
          `VLLM_API_KEY`), defined in `services.litellm.environmentFile`; rendered as
          `api_key: os.environ/NAME`. null: the box takes no key (LiteLLM still sends a
          placeholder, which such a box ignores).
        '';
      };

      extraParams = mkOption {
        type = types.attrsOf yaml.type;
        default = { };
        example = {
          timeout = 300;
          stream_timeout = 30;
        };
        description = "More LiteLLM `litellm_params` of this deployment (not `model`, `api_base` or `api_key`: those are the options above).";
      };
    };
  };

  groupModule = {
    options.backends = mkOption {
      type = types.attrsOf (types.submodule backendModule);
      default = { };
      description = "The boxes serving this model group, by name (the name appears in generated group names and deployment ids).";
    };
  };

  # One model group per order: the first keeps the declared name, the others are
  # `<group>@<box>[+<box>...]` and are the first's fallbacks, lowest order first.
  levelsOf =
    group: backends:
    let
      orders = lib.sort lib.lessThan (lib.unique (lib.mapAttrsToList (_: b: b.order) backends));
      boxesAt = order: lib.sort lib.lessThan (lib.attrNames (lib.filterAttrs (_: b: b.order == order) backends));
    in
    lib.imap0 (
      i: order:
      let
        boxes = boxesAt order;
      in
      {
        name = if i == 0 then group else "${group}@${lib.concatStringsSep "+" boxes}";
        inherit boxes;
      }
    ) orders;

  deployment = group: modelName: box: backend: {
    model_name = modelName;
    litellm_params = {
      model = "openai/${backend.model}";
      api_base = backend.url;
      # LiteLLM's OpenAI client refuses to send a request without a key.
      api_key = if backend.apiKeyVariable == null then "no-key" else "os.environ/${backend.apiKeyVariable}";
    }
    // backend.extraParams;
    # Also the proxy's `x-litellm-model-id` response header.
    model_info.id = "${group}@${box}";
  };

  groups = lib.mapAttrs (group: g: levelsOf group g.backends) cfg.models;

  modelList = lib.concatLists (
    lib.mapAttrsToList (
      group: levels:
      lib.concatMap (
        level: map (box: deployment group level.name box cfg.models.${group}.backends.${box}) level.boxes
      ) levels
    ) groups
  );

  fallbacks = lib.concatLists (
    lib.mapAttrsToList (
      group: levels: lib.optional (lib.length levels > 1) { ${group} = map (l: l.name) (lib.tail levels); }
    ) groups
  );

  keyVariables = lib.unique (
    lib.concatLists (
      lib.mapAttrsToList (
        _: g: lib.filter (v: v != null) (lib.mapAttrsToList (_: b: b.apiKeyVariable) g.backends)
      ) cfg.models
    )
  );

  # The litellm_params the backend options write.
  ownParams = [
    "model"
    "api_base"
    "api_key"
  ];

  # LiteLLM treats allowed_fails equal to its default (3) as not set, and then never cools down a
  # group's only deployment on a 5xx or a refused connection (router_utils/cooldown_handlers.py,
  # _is_allowed_fails_set_on_router): so in 1.80.0 and in nixpkgs' 1.100.1; 1.109.3's source no
  # longer has it.
  litellmDefaultAllowedFails = 3;
  litellmVersion = lib.getVersion litellm.package;
  litellmHasTrap = lib.versionOlder litellmVersion "1.109.3";

  systemctl = "${config.systemd.package}/bin/systemctl";

  mayStart =
    engine: unit:
    pkgs.writeShellScript "llm-arbiter-${engine}-after-${unit}" (
      import ./lib/arbiter-condition.nix { inherit systemctl engine unit; }
    );

  # The arbiter's own definitions create the units; a unit someone declared runs something.
  declared =
    name:
    let
      unit = config.systemd.services.${name} or { };
    in
    (unit.serviceConfig or { }) ? ExecStart || (unit.script or "") != "";

  # engine -> the training units it gives way to
  enginesHeldBy = lib.foldAttrs (unit: units: [ unit ] ++ units) [ ] (
    lib.mapAttrsToList (unit: t: lib.genAttrs t.engines (_: unit)) arbiter
  );
in
{
  options.llmBench.fleet = {
    enable = lib.mkEnableOption ''
      a LiteLLM proxy (nixpkgs' `services.litellm`) in front of the fleet's boxes, its
      `settings` written from `llmBench.fleet.models`. Host, port, firewall and the
      environment file with the keys are `services.litellm`'s own options
    '';

    models = mkOption {
      type = types.attrsOf (types.submodule groupModule);
      default = { };
      example = lib.literalExpression ''
        {
          qwen.backends = {
            box1 = { url = "http://box1.lan:48123/v1"; model = "qwen3.8-27b-mtp2"; order = 1; };
            box2 = { url = "http://box2.lan:8000/v1"; model = "qwen3.8-27b"; order = 2;
                     apiKeyVariable = "BOX2_API_KEY"; };
          };
        }
      '';
      description = ''
        Model groups (the name clients put in `"model"`) and the boxes serving each. A group
        with boxes of several orders also gets one fallback group per further order,
        `<group>@<box>`, which clients may call directly to reach that box.
      '';
    };

    numRetries = mkOption {
      type = types.ints.unsigned;
      default = 2;
      description = ''
        Retries of a failed request within its group before the next fallback group
        (`router_settings.num_retries`; LiteLLM's default is 2). A group of one box waits
        between tries (0.5 s, 1 s, ... plus up to 0.75 s of jitter).
      '';
    };

    allowedFails = mkOption {
      type = types.ints.unsigned;
      default = 1;
      description = ''
        Failures a deployment may have within `cooldownTime` before it is cooled down, so that
        requests go straight to the fallback instead of waiting for retries
        (`router_settings.allowed_fails`). Not 3 with LiteLLM before 1.109.3 (nixpkgs ships 1.100.1):
        it takes 3, its own default, as unset and then never cools down a group's only box on a 5xx
        or a refused connection.
      '';
    };

    cooldownTime = mkOption {
      type = types.ints.positive;
      default = 5;
      description = ''
        Seconds a failed deployment is left out (`router_settings.cooldown_time`; LiteLLM's
        default is 5). After it, one request tries the box again: the time a first choice
        that came back waits for traffic, and how often a request pays the retries while it
        is still down.
      '';
    };

    timeout = mkOption {
      type = types.nullOr (types.either types.ints.positive types.float);
      default = null;
      example = 600;
      description = "Seconds one call to a box may take before it counts as failed (`router_settings.timeout`); null = LiteLLM's default.";
    };
  };

  options.llmBench.fleetBox = {
    enable = lib.mkEnableOption ''
      serving this box's engines (the llama.cpp router, and services.vllm when it is on) to
      the fleet's LiteLLM proxy on another machine: they listen on `listenAddress` instead of
      127.0.0.1, their port is opened in the firewall, and evaluation fails unless each has an
      API key kept outside the Nix store (docs/fleet.md, The box side)
    '';

    listenAddress = mkOption {
      type = types.str;
      default = "0.0.0.0";
      example = "192.168.1.20";
      description = ''
        The address the engines listen on (llama.cpp's `--host`, vLLM's `--host`): one the
        proxy reaches, not a loopback address. A LAN address of the box keeps other networks
        out; 0.0.0.0 listens on every interface.
      '';
    };
  };

  options.llmBench.arbiter = mkOption {
    type = types.attrsOf (
      types.submodule {
        options.engines = mkOption {
          type = types.nonEmptyListOf types.str;
          example = [ "vllm" ];
          description = "The engine services (`systemd.services` names) stopped while the training unit runs.";
        };
      }
    );
    default = { };
    example = lib.literalExpression ''{ train-lora.engines = [ "vllm" "llama-cpp" ]; }'';
    description = ''
      Training units (`systemd.services` names) and the inference engines on this box that
      give them the GPU: the engines are stopped before the unit starts, are not started
      while it is active, and are started again when it ends, whether it succeeded or failed.
    '';
  };

  config = lib.mkMerge [
    (lib.mkIf cfg.enable {
      assertions = [
        {
          assertion = cfg.models != { };
          message = "llmBench.fleet.models: declare at least one model group and its boxes.";
        }
        {
          assertion = keyVariables == [ ] || litellm.environmentFile != null;
          message =
            "llmBench.fleet: backends read their API keys from ${lib.concatStringsSep ", " keyVariables}, "
            + "but services.litellm.environmentFile is null; set it to a file outside the store holding "
            + "${lib.concatMapStringsSep ", " (v: "${v}=...") keyVariables}.";
        }
        {
          # A path literal (./litellm.env) is copied into the world-readable store.
          assertion = !(builtins.isPath litellm.environmentFile);
          message =
            "services.litellm.environmentFile is a Nix path (${toString litellm.environmentFile}), which copies the keys "
            + "into the world-readable Nix store; give it as a string, e.g. \"/run/secrets/litellm.env\".";
        }
      ]
      ++ lib.mapAttrsToList (group: g: {
        assertion = g.backends != { };
        message = "llmBench.fleet.models.${group}.backends is empty: name at least one box serving it.";
      }) cfg.models
      ++ lib.concatLists (
        lib.mapAttrsToList (
          group: g:
          lib.mapAttrsToList (
            box: b:
            let
              taken = lib.intersectLists ownParams (lib.attrNames b.extraParams);
            in
            {
              assertion = taken == [ ];
              message =
                "llmBench.fleet.models.${group}.backends.${box}.extraParams sets ${lib.concatStringsSep ", " taken}: "
                + "use the backend's url, model and apiKeyVariable (a key written here would land in the Nix store).";
            }
          ) g.backends
        ) cfg.models
      )
      ++ lib.mapAttrsToList (group: _: {
        assertion = !(lib.hasInfix "@" group);
        message = "llmBench.fleet.models.\"${group}\": a group name may not contain `@` (fallback groups are named <group>@<box>).";
      }) cfg.models;

      warnings = lib.optional (cfg.allowedFails == litellmDefaultAllowedFails && litellmHasTrap) ''
        llmBench.fleet.allowedFails = 3 is LiteLLM's default, which LiteLLM ${litellmVersion} treats as unset:
        a group's only box is then never cooled down on a 5xx or refused connection, and every
        request during its outage waits for all retries before the fallback. Use 2 or 4.
      '';

      services.litellm = {
        enable = true;
        # The reference trees' nixpkgs module declares it without a default (a later text has
        # `default = null`, which this agrees with); a fleet without keys needs no file.
        environmentFile = lib.mkDefault null;
        settings = {
          model_list = modelList;
          router_settings = {
            num_retries = cfg.numRetries;
            allowed_fails = cfg.allowedFails;
            cooldown_time = cfg.cooldownTime;
            inherit fallbacks;
          }
          // lib.optionalAttrs (cfg.timeout != null) { inherit (cfg) timeout; };
        };
      };
      # The model cost map bundled with LiteLLM instead of a download from GitHub at every
      # start (which an offline proxy waits out before it answers).
      systemd.services.litellm.environment.LITELLM_LOCAL_MODEL_COST_MAP = lib.mkDefault "True";
    })

    (lib.mkIf box.enable (
      lib.mkMerge [
        {
          assertions = [
            {
              assertion = llamaCpp.enable -> !(loopback llamaHost);
              message = "llmBench.fleetBox: the llama.cpp router listens on ${llamaHost}, which the fleet's proxy on another machine cannot reach; leave its address to llmBench.fleetBox.listenAddress (services.llama-cpp.${if llamaHasSettings then "settings.host" else "host"} is set elsewhere).";
            }
            {
              assertion = llamaCpp.enable -> llamaKeyed;
              message = "llmBench.fleetBox: the llama.cpp router would answer anyone on the network without an API key: set services.llama-cpp.environmentFile to a file outside the Nix store holding LLAMA_API_KEY=... (the proxy's side: llmBench.fleet...backends.<box>.apiKeyVariable), or pass api-key-file.";
            }
            {
              assertion = vllmOn -> !(loopback config.services.vllm.settings.host);
              message = "llmBench.fleetBox: vLLM listens on ${if vllmOn then config.services.vllm.settings.host else ""}, which the fleet's proxy on another machine cannot reach; leave services.vllm.settings.host to llmBench.fleetBox.listenAddress.";
            }
            {
              assertion = vllmOn -> config.services.vllm.environmentFile != null;
              message = "llmBench.fleetBox: vLLM would answer anyone on the network without an API key: set services.vllm.environmentFile to a file outside the Nix store holding VLLM_API_KEY=....";
            }
          ];
          services.llama-cpp =
            {
              openFirewall = lib.mkDefault true;
            }
            // (
              if llamaHasSettings then
                { settings.host = lib.mkDefault box.listenAddress; }
              else
                { host = lib.mkDefault box.listenAddress; }
            );
        }
        (lib.optionalAttrs hasVllm {
          services.vllm = {
            settings.host = lib.mkDefault box.listenAddress;
            openFirewall = lib.mkDefault true;
          };
        })
      ]
    ))

    (lib.mkIf (arbiter != { }) {
      assertions = lib.concatLists (
        lib.mapAttrsToList (
          unit: t:
          [
            {
              assertion = declared unit;
              message = "llmBench.arbiter.${unit}: no systemd.services.${unit} on this machine (the training unit).";
            }
          ]
          ++ map (engine: {
            assertion = declared engine;
            message = "llmBench.arbiter.${unit}.engines: no systemd.services.${engine} on this machine (an engine unit).";
          }) t.engines
        ) arbiter
      );

      systemd.services = lib.mkMerge (
        lib.mapAttrsToList (
          unit: t:
          let
            engineUnits = map (e: "${e}.service") t.engines;
          in
          {
            ${unit} = {
              # `+`: with full privileges, whatever user the training runs as. Blocks until
              # the engines have stopped, so the job starts with the GPU free.
              serviceConfig.ExecStartPre = lib.mkBefore [ "+${systemctl} stop ${lib.escapeShellArgs engineUnits}" ];
              onSuccess = engineUnits;
              onFailure = engineUnits;
            };
          }
        ) arbiter
        ++ lib.mapAttrsToList (engine: units: {
          ${engine}.serviceConfig.ExecCondition = map (unit: "+${mayStart engine unit}") units;
        }) enginesHeldBy
      );
    })
  ];
}
