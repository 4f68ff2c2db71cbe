# The llamAmpere fork (github:JakeATX/llamAmpere) built with nixpkgs' llama-cpp recipe.
#
# What the recipe assumes and the fork's source (a flake input) does not provide:
#   - a COMMIT file, written by the recipe's fetchFromGitHub postFetch, which preConfigure
#     reads into LLAMA_BUILD_COMMIT: the commit comes from the input's `rev` instead;
#   - LLAMA_BUILD_NUMBER = the package version: it is compiled into
#     `int LLAMA_BUILD_NUMBER = @LLAMA_BUILD_NUMBER@;`, so "X.Y.Z" would not compile; an
#     integer (`buildNumber`) is passed instead;
#   - the web UI, built with npm from a fetchNpmDeps whose hash belongs to nixpkgs' own
#     source: dropped (npmDeps, the npm hooks, `npm run build`), with LLAMA_BUILD_UI and
#     LLAMA_USE_PREBUILT_UI off (the prebuilt one would be downloaded at build time, which
#     the sandbox forbids). The API is unaffected; the server has no browser UI.
# CUDA: compute capability 8.6 only, and every FlashAttention K/V quant pair. The fork's
# CMake spells that GGML_CUDA_FA_QUANTS=all (GGML_CUDA_FA_ALL_QUANTS is a deprecated alias
# there); its turbo KV types have their own kernels.
#
# `version` comes from ./llamampere-version.nix (the input's commit date) and `rev` from the
# input itself, so both name the source really built; `passthru.llamampereRev` keeps the commit.
{
  lib,
  llama-cpp,
  src,
  version,
  rev ? src.rev or null,
  buildNumber ? 0,
  cuda ? true,
}:

let
  shortRev = if rev == null then "unknown" else builtins.substring 0 7 rev;
  dropCmakeFlags = import ./lib/drop-cmake-flags.nix { inherit lib; };
  isNpm =
    p:
    let
      n = p.name or p.pname or "";
    in
    lib.hasInfix "npm" n || lib.hasPrefix "nodejs" n;
in
(llama-cpp.override {
  cudaSupport = cuda;
  # Kept on, although the fork's build instructions do not use them: GGML_BACKEND_DL loads the
  # CUDA backend at run time, so llama-server starts in the build sandbox, which has no
  # libcuda.so.1 (the recipe's postInstall runs `llama-server --completion-bash` there, and
  # the presets' key check runs `llama-server --help`); GGML_CPU_ALL_VARIANTS picks the
  # host's best SIMD for what `fit` leaves on the CPU instead of the x86-64 baseline that
  # GGML_NATIVE=OFF would give.
  cpuArchDynamicDispatch = true;
}).overrideAttrs
  (old: {
    pname = "llamampere";
    inherit version src;

    # The recipe's patches and postPatch are written against nixpkgs' llama.cpp release, not
    # the fork; none applies to it (the recipe has none today, which must not silently change).
    patches = [ ];
    postPatch = "";

    npmDeps = null;
    npmRoot = null;
    nativeBuildInputs = lib.filter (p: !(isNpm p)) (old.nativeBuildInputs or [ ]);
    # Replaces the recipe's preConfigure (`$(cat COMMIT)` and `npm run build`).
    preConfigure = "";

    cmakeFlags =
      dropCmakeFlags [
        "CMAKE_CUDA_ARCHITECTURES"
        "GGML_CUDA_FA_ALL_QUANTS"
        "GGML_CUDA_FA_QUANTS"
        "LLAMA_BUILD_NUMBER"
        "LLAMA_BUILD_COMMIT"
        "LLAMA_BUILD_UI"
        "LLAMA_USE_PREBUILT_UI"
      ] (old.cmakeFlags or [ ])
      ++ [
        (lib.cmakeFeature "LLAMA_BUILD_NUMBER" (toString buildNumber))
        (lib.cmakeFeature "LLAMA_BUILD_COMMIT" shortRev)
        (lib.cmakeBool "LLAMA_BUILD_UI" false)
        (lib.cmakeBool "LLAMA_USE_PREBUILT_UI" false)
      ]
      ++ lib.optionals cuda [
        (lib.cmakeFeature "CMAKE_CUDA_ARCHITECTURES" "86")
        (lib.cmakeFeature "GGML_CUDA_FA_QUANTS" "all")
      ];

    # The graft above is what a nixpkgs update is most likely to break (a recipe with other
    # hooks, flags or inputs; the fork is llama.cpp 0.6.0 with its own CMake). A failed build
    # takes the whole rebuild down; stdenv runs failureHook when a build fails, so the log ends
    # naming the engine and the way back.
    failureHook = ''
      echo "llm-bench: the llamampere engine (llamAmpere ${version}, built with nixpkgs' llama-cpp ${old.version or "?"} recipe) failed to build. It is opt-in: set llmBench.engines.llamampere.enable = false; (and llmBench.default back to \"stock\" if it is the default) and rebuild; the other engines are unaffected. docs/nixos.md, The llamAmpere source." >&2
    '';

    passthru = (old.passthru or { }) // {
      llamampereRev = rev;
    };
    meta = (old.meta or { }) // {
      description = "llamAmpere ${version}: llama.cpp fork tuned for Ampere GPUs, built for sm_86";
      homepage = "https://github.com/JakeATX/llamAmpere";
    };
  })
