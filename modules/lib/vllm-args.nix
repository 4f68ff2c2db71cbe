# The command line and the texts of the vLLM module (../vllm.nix), a function of nixpkgs' lib
# only, so that the tests evaluate it without the module system:
#
#   nix-instantiate --eval --strict --json -E \
#     '(import ./modules/lib/vllm-args.nix { lib = import <nixpkgs/lib>; }).serveArgs
#        { model = "Qwen/Qwen3-8B"; settings = { port = 8000; max-model-len = 4096; }; }'
#
# `serveArgs` is the command line after the `vllm` binary: `serve MODEL`, then `settings`
# rendered with lib.cli.toCommandLine, as nixpkgs' services.llama-cpp renders its own since
# NixOS/nixpkgs#528626. Each key is a `vllm serve` flag without its dashes (`max-model-len`),
# or a short one with its dash (`"-tp"`); null leaves it out, so vLLM's own default applies. vLLM's
# argument parser (0.32) gives every boolean flag a `--no-` twin (argparse's
# BooleanOptionalAction), so `true` renders `--KEY` and `false` renders `--no-KEY`: a `false`
# that rendered nothing would leave vLLM's default, which is often on (prefix caching). An
# attribute set (a config such as `speculative-config` or `compilation-config`) renders as one
# JSON argument; a float as JSON (`0.92`, not `0.920000`); a list repeats the flag.
{ lib }:

let
  inherit (builtins)
    elem
    isAttrs
    isFloat
    isBool
    toJSON
    ;

  # Target dtypes that make a bf16 drafter useless (see `speculationWarning`).
  fp16Dtypes = [
    "half"
    "float16"
  ];

  # As nixpkgs' services.llama-cpp since NixOS/nixpkgs#561399: a key that starts with `-` is
  # the flag itself (vLLM's short forms are one dash and several letters: `"-tp" = 2;`), a
  # one-letter key is a short flag, any other key a long one.
  optionName =
    name:
    if lib.hasPrefix "-" name then
      name
    else if builtins.stringLength name > 1 then
      "--${name}"
    else
      "-${name}";

  formatArg = v: if isAttrs v || isFloat v then toJSON v else lib.generators.mkValueStringDefault { } v;

  # `false` becomes the `no-` twin set to true; everything else as given.
  withNegations = lib.mapAttrs' (
    name: value:
    if isBool value && !value then lib.nameValuePair "no-${lib.removePrefix "--" name}" true else lib.nameValuePair name value
  );

  # The keys that switch speculative decoding on in vLLM 0.32 to 0.34: the config as one JSON
  # (`speculative-config`, `sc`), its dotted fields (`speculative-config.method`), or the
  # shorthand flags.
  speculationKeys = [
    "speculative-config"
    "-sc"
    "spec-method"
    "spec-model"
    "spec-tokens"
  ];
in
rec {
  render =
    settings:
    lib.cli.toCommandLine (name: {
      option = optionName name;
      sep = null;
      explicitBool = false;
      inherit formatArg;
    }) (withNegations settings);

  serveArgs =
    {
      model,
      settings ? { },
    }:
    [
      "serve"
      (toString model)
    ]
    ++ render settings;

  # What switched speculation on, or null.
  speculation =
    settings:
    let
      keys = lib.filter (
        k: settings.${k} != null && (elem k speculationKeys || lib.hasPrefix "speculative-config." k)
      ) (lib.attrNames settings);
    in
    if keys == [ ] then null else keys;

  # The acceptance trap: with `--dtype half` (float16) the target rejects every draft token of a
  # drafter trained in bfloat16, whose activations overflow in float16 (vLLM issue #55250).
  # Nothing fails; the only trace is "Mean acceptance length: 1.00" in the log.
  speculationBreaks = settings: speculation settings != null && elem (settings.dtype or null) fp16Dtypes;

  speculationWarning =
    settings:
    if !(speculationBreaks settings) then
      null
    else
      "services.vllm: speculative decoding (${lib.concatStringsSep ", " (speculation settings)}) "
      + "is combined with dtype = ${toJSON settings.dtype}. A drafter trained in bfloat16 "
      + "overflows in float16 (vLLM issue #55250): the target rejects every draft token, so "
      + "speculative decoding silently does nothing (vLLM logs \"Mean acceptance length: 1.00\" "
      + "and no error). Use dtype = \"bfloat16\" (or \"auto\" for a bf16 checkpoint).";

  execStart =
    binary: args: "${binary} ${(import ./systemd-args.nix).escapeSystemdArgs (serveArgs args)}";
}
