# The llm-llamampere specialisation's presets (builtins-only data). They replace the base
# presets: the llamAmpere fork turns its MTP drafter on by default for Qwen3.8 GGUFs that
# carry the MTP head, so a preset without `spec-type` is not a control on this build.
#
#   ampere-none    spec-type none: the true control
#   ampere-mtp2    MTP depth 2, KV q8_0/q8_0 (from [*])
#   ampere-mtp4    MTP depth 4, KV q8_0/q8_0
#   ampere-turbo4  MTP depth 4, KV turbo4/turbo4 (the fork's 4-bit "turbo" cache type)
#   ampere-turbo2  MTP depth 2, KV turbo4/turbo4
#   ampere-auto    nothing set: whatever the fork does by default
#
# `turbo4` and the fork's default drafting exist only in llamAmpere; stock llama.cpp lists
# these presets but cannot run ampere-turbo4/ampere-turbo2 (see tests/test_nix_router.py).
{ models ? { } }:
let
  ini = import ../modules/lib/presets-ini.nix;
  m = import ../modules/presets/models.nix // models;
  qwen = ini.modelSource m.qwen38;
  mtp = depth: { spec-type = "draft-mtp"; spec-draft-n-max = depth; };
  turbo4 = { cache-type-k = "turbo4"; cache-type-v = "turbo4"; };
in
{
  "*" = import ../modules/presets/common.nix;
  "ampere-none" = qwen // { spec-type = "none"; };
  "ampere-mtp2" = qwen // mtp 2;
  "ampere-mtp4" = qwen // mtp 4;
  "ampere-turbo4" = qwen // mtp 4 // turbo4;
  "ampere-turbo2" = qwen // mtp 2 // turbo4;
  "ampere-auto" = qwen;
}
