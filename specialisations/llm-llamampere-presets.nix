# The llm-llamampere engine's presets (builtins-only data). The engine does not inherit the
# base presets (llmBench.engines.llamampere.inheritBasePresets = false): the llamAmpere fork
# turns its MTP drafter on by default for Qwen3.8 GGUFs that carry the MTP head, so a base
# preset without `spec-type` would not be a control on this build.
#
#   ampere-none        spec-type none: the true control
#   ampere-mtp2        MTP depth 2, KV q8_0/q8_0 (from [*])
#   ampere-mtp4        MTP depth 4, KV q8_0/q8_0
#   ampere-turbo4      MTP depth 4, KV turbo4/turbo4 (the fork's 4-bit "turbo" cache type)
#   ampere-turbo2      MTP depth 2, KV turbo4/turbo4
#   ampere-auto        nothing set: whatever the fork does by default
#   ampere-turboN-dD   the report's fine sweep: KV turbo3..turbo6 at MTP depth 1 and 3 (a grid)
#
# The report's third axis, adaptive MTP with turbo4, is not here: it names no llama-server
# key for it, and a guessed key would fail the build of the INI (check-preset-keys). Add it
# with `services.llama-cpp.presetGrids` once the fork's `llama-server --help` shows it.
#
# `turbo*` and the fork's default drafting exist only in llamAmpere; stock llama.cpp lists
# these presets but cannot run the turbo ones (see tests/test_nix_router.py).
{
  models ? { },
}:
let
  src = import ../modules/presets/sources.nix;
  grid = import ../modules/lib/preset-grid.nix;
  m = import ../modules/presets/models.nix // models;
  qwen = src.modelSource m.qwen38;
  mtp = depth: {
    spec-type = "draft-mtp";
    spec-draft-n-max = depth;
  };
  turbo = bits: {
    cache-type-k = "turbo${toString bits}";
    cache-type-v = "turbo${toString bits}";
  };
in
{
  "*" = import ../modules/presets/common.nix;
  "ampere-none" = qwen // {
    spec-type = "none";
  };
  "ampere-mtp2" = qwen // mtp 2;
  "ampere-mtp4" = qwen // mtp 4;
  "ampere-turbo4" = qwen // mtp 4 // turbo 4;
  "ampere-turbo2" = qwen // mtp 2 // turbo 4;
  "ampere-auto" = qwen;
}
// grid {
  prefix = "ampere";
  base = qwen;
  axes = [
    {
      turbo3 = turbo 3;
      turbo4 = turbo 4;
      turbo5 = turbo 5;
      turbo6 = turbo 6;
    }
    {
      d1 = mtp 1;
      d3 = mtp 3;
    }
  ];
}
