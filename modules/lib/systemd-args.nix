# systemd ExecStart quoting (builtins only), shared by services.llama-cpp and services.vllm.
# As nixpkgs' utils.escapeSystemdExecArg: a path is interpolated, so it is copied to the store
# and the unit depends on it (a path literal such as ./model.gguf would otherwise name a file
# outside the store that the unit neither has in its closure nor, with ProtectHome, can read).
let
  inherit (builtins) concatStringsSep isPath replaceStrings toJSON;

  argString = arg: if isPath arg then "${arg}" else toString arg;
in
rec {
  inherit argString;

  # Each argument in double quotes, `\` and `"` escaped, `%` and `$` doubled so systemd
  # expands neither specifiers nor variables.
  escapeSystemdArg = arg: replaceStrings [ "%" "$" ] [ "%%" "$$" ] (toJSON (argString arg));

  escapeSystemdArgs = args: concatStringsSep " " (map escapeSystemdArg args);
}
