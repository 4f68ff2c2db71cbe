# check-preset-keys: refuses a presets INI with keys the given llama-server does not know (see
# the script). Python's standard library only, so the check adds nothing but python3 to the
# build of the INI.
{
  lib,
  stdenvNoCC,
  python3,
}:

stdenvNoCC.mkDerivation {
  pname = "check-preset-keys";
  version = "1";

  src = ./check-preset-keys.py;
  dontUnpack = true;

  # patchShebangs (fixup) points the script's interpreter at this python3.
  buildInputs = [ python3 ];

  installPhase = ''
    runHook preInstall
    install -Dm755 $src $out/bin/check-preset-keys
    runHook postInstall
  '';

  meta = {
    description = "Check a llama.cpp router presets INI against a llama-server's --help";
    license = lib.licenses.mit;
    mainProgram = "check-preset-keys";
    platforms = lib.platforms.all;
  };
}
