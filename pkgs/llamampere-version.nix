# The llamAmpere ref and version, read from the one line of flake.nix that declares the input
# (flake inputs must be literals, so the ref cannot live anywhere else, and the input's
# attributes carry its rev but not its ref). A release tag `vX.Y.Z` is the version X.Y.Z;
# a branch or commit gives `0-unstable-DATE` from the source's last commit date.
#
# `--override-input llamampere ...` changes the source but not flake.nix: the version then
# still names the line's ref, while the build commit (LLAMA_BUILD_COMMIT) and
# `passthru.llamampereRev` name the source really built.
{
  lib,
  flakeText,
  lastModifiedDate ? null,
}:

let
  lines = lib.splitString "\n" flakeText;
  refOf = line: builtins.match "[[:space:]]*llamampere\\.url = \"github:JakeATX/llamAmpere/([^\"]+)\";.*" line;
  refs = lib.concatMap (line: lib.optionals (refOf line != null) (refOf line)) lines;
  ref =
    if lib.length refs == 1 then
      lib.head refs
    else
      throw "llamampere-version.nix: expected one `llamampere.url = \"github:JakeATX/llamAmpere/REF\";` line in flake.nix, found ${toString (lib.length refs)}";
  release = builtins.match "v([0-9]+(\\.[0-9]+)*)" ref;
  date =
    if lastModifiedDate == null then
      "unknown"
    else
      "${builtins.substring 0 4 lastModifiedDate}-${builtins.substring 4 2 lastModifiedDate}-${builtins.substring 6 2 lastModifiedDate}";
in
{
  inherit ref;
  version = if release != null then lib.head release else "0-unstable-${date}";
}
