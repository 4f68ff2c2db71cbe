# nixpkgs' llama-cpp with CUDA, rebuilt for compute capability 8.6 only (RTX 3090) and with
# every FlashAttention K/V quant pair compiled, so mixed caches such as q8_0 K / q4_0 V run
# on a FlashAttention kernel instead of being converted to f16.
#
# GGML_CUDA_FA_ALL_QUANTS is the option this llama.cpp release documents; newer releases
# treat it as a deprecated alias of GGML_CUDA_FA_QUANTS=all (ggml/cmake/common.cmake).
{
  lib,
  llama-cpp,
  cuda ? true,
}:

let
  # The recipe adds CMAKE_CUDA_ARCHITECTURES from cudaPackages' capability list.
  dropCmakeFlags = import ./lib/drop-cmake-flags.nix { inherit lib; };
in
(llama-cpp.override { cudaSupport = cuda; }).overrideAttrs (old: {
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
    ];
  meta = (old.meta or { }) // {
    description = "llama.cpp (nixpkgs' recipe) built for sm_86 with all FlashAttention KV quants";
  };
})
