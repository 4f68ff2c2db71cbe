# Pure logic of the vLLM module (../vllm.nix), written with builtins only so that the tests
# can evaluate it without nixpkgs:
#
#   nix-instantiate --eval --strict --json -E \
#     '(import ./modules/lib/vllm-args.nix).serveArgs { model = "Qwen/Qwen3-8B"; }'
#
# `serveArgs` is the command line after the `vllm` binary (`serve MODEL --flag value ...`);
# every flag is one of `vllm serve`'s own (vLLM's engine arguments, docs.vllm.ai
# "serve" CLI reference). A null option leaves its flag out, so vLLM's own default applies.
let
  inherit (builtins)
    elem
    isFloat
    toJSON
    toString
    ;

  systemd = import ./systemd-args.nix;

  optional = cond: list: if cond then list else [ ];
  flag =
    name: value:
    optional (value != null) [
      name
      (render value)
    ];

  # Floats through toJSON: `toString 0.9` is "0.900000", toJSON gives "0.9".
  render = v: if isFloat v then toJSON v else toString v;

  # Target dtypes that make a bf16 drafter useless (see `speculationWarning`).
  fp16Dtypes = [
    "half"
    "float16"
  ];
in
rec {
  dtypes = [
    "auto"
    "bfloat16"
    "half"
    "float16"
    "float"
    "float32"
  ];

  serveArgs =
    {
      model,
      host ? "127.0.0.1",
      port ? 8000,
      servedModelName ? null,
      tensorParallelSize ? null,
      gpuMemoryUtilization ? null,
      maxModelLen ? null,
      dtype ? null,
      prefixCaching ? null,
      speculativeConfig ? null,
      reasoningParser ? null,
      toolCallParser ? null,
      enforceEager ? false,
      extraArgs ? [ ],
    }:
    [
      "serve"
      (toString model)
      "--host"
      host
      "--port"
      (toString port)
    ]
    ++ flag "--served-model-name" servedModelName
    ++ flag "--tensor-parallel-size" tensorParallelSize
    ++ flag "--gpu-memory-utilization" gpuMemoryUtilization
    ++ flag "--max-model-len" maxModelLen
    ++ flag "--dtype" dtype
    ++ optional (prefixCaching == true) [ "--enable-prefix-caching" ]
    ++ optional (prefixCaching == false) [ "--no-enable-prefix-caching" ]
    # One argument holding the JSON object, as `--speculative-config '{"method": ...}'`.
    ++ optional (speculativeConfig != null) [
      "--speculative-config"
      (toJSON speculativeConfig)
    ]
    ++ flag "--reasoning-parser" reasoningParser
    # vLLM refuses `tool_choice: "auto"` unless both flags are given.
    ++ optional (toolCallParser != null) [
      "--enable-auto-tool-choice"
      "--tool-call-parser"
      toolCallParser
    ]
    # Never by default: eager mode gives up CUDA graphs and costs decode speed.
    ++ optional enforceEager [ "--enforce-eager" ]
    ++ extraArgs;

  # The acceptance trap of the second report: with `--dtype half` the target ran in fp16
  # while the drafter was trained and shipped in bf16, and the target rejected every draft
  # token. Nothing failed; the only trace was "Mean acceptance length: 1.00" in the log.
  speculationBreaks =
    {
      dtype ? null,
      speculativeConfig ? null,
      ...
    }:
    speculativeConfig != null && elem dtype fp16Dtypes;

  speculationWarning =
    args@{
      dtype ? null,
      speculativeConfig ? null,
      ...
    }:
    if !(speculationBreaks args) then
      null
    else
      "services.vllm: speculativeConfig (method ${toJSON (speculativeConfig.method or null)}) "
      + "is combined with dtype = ${toJSON dtype}. This is a known trap: the target running in "
      + "float16 rejects every draft token of a bfloat16 drafter, so speculative decoding "
      + "silently does nothing (vLLM logs \"Mean acceptance length: 1.00\" and no error). "
      + "Use dtype = \"bfloat16\" (or \"auto\" for a bf16 checkpoint).";

  escapeSystemdArgs = systemd.escapeSystemdArgs;

  execStart = binary: args: "${binary} ${systemd.escapeSystemdArgs (serveArgs args)}";
}
