# The llamAmpere package version, taken from the source itself (the flake input's own
# attributes), so that it names what is really built, also under `--override-input`. The fork
# publishes no version file and a flake input does not carry its ref, so a snapshot is
# `0-unstable-YYYY-MM-DD` (nixpkgs' convention for a version without a release number), from
# the date of its last commit; the commit itself is the package's `src.rev`, which the marker
# /etc/llama-cpp/active.json (package.rev) and llm-bench's results record.
#
#   import ./llamampere-version.nix { lastModifiedDate = "20260614093000"; }
#   => { version = "0-unstable-2026-06-14"; }
{
  lastModifiedDate ? null,
}:

let
  inherit (builtins) substring;
in
{
  version =
    if lastModifiedDate == null then
      "0-unstable"
    else
      "0-unstable-${substring 0 4 lastModifiedDate}-${substring 4 2 lastModifiedDate}-${substring 6 2 lastModifiedDate}";
}
