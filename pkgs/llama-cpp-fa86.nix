# nixpkgs' llama-cpp with CUDA, rebuilt for compute capability 8.6 only (RTX 3090) and with
# every FlashAttention K/V quant pair compiled, so mixed caches such as q8_0 K / q4_0 V run
# on a FlashAttention kernel instead of being converted to f16.
#
# The recipe's own release decides which option it reads: NixOS 26.05's llama.cpp (9608)
# documents GGML_CUDA_FA_ALL_QUANTS; newer releases (the b11393 of unstable) take
# GGML_CUDA_FA_QUANTS=all and keep the other as a deprecated alias (ggml/cmake/common.cmake).
# Both are passed, so every recipe builds the same kernels; CMake ignores the one it lacks.
#
# With CUDA, nixpkgs' `llama-cpp-cuda` where it has one (unstable, 26.11), so this is a
# rebuild of exactly the package nixpkgs ships. The recipe's `src` is a literal tag there, so
# overriding `version` would not change the source: this package keeps the recipe's.
{
  lib,
  llama-cpp,
  llama-cpp-cuda ? null,
  cuda ? true,
}:

let
  # The recipe adds CMAKE_CUDA_ARCHITECTURES from cudaPackages' capability list.
  dropCmakeFlags = import ./lib/drop-cmake-flags.nix { inherit lib; };
in
(
  if cuda && llama-cpp-cuda != null then llama-cpp-cuda else llama-cpp.override { cudaSupport = cuda; }
).overrideAttrs
  (old: {
  pname = "llama-cpp-fa86";
  cmakeFlags =
    dropCmakeFlags [
      "CMAKE_CUDA_ARCHITECTURES"
      "GGML_CUDA_FA_ALL_QUANTS"
      "GGML_CUDA_FA_QUANTS"
    ] (old.cmakeFlags or [ ])
    ++ lib.optionals cuda [
      (lib.cmakeFeature "CMAKE_CUDA_ARCHITECTURES" "86")
      (lib.cmakeBool "GGML_CUDA_FA_ALL_QUANTS" true)
      (lib.cmakeFeature "GGML_CUDA_FA_QUANTS" "all")
    ];
  meta = (old.meta or { }) // {
    description = "llama.cpp (nixpkgs' recipe) built for sm_86 with all FlashAttention KV quants";
  };
})
