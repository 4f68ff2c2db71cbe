# The recipe's -D flags for the CMake variables `names`, removed, so that an override that
# sets one of them passes it once instead of relying on the last -D winning.
#
#   dropCmakeFlags [ "CMAKE_CUDA_ARCHITECTURES" ] old.cmakeFlags ++ [ (lib.cmakeFeature ...) ]
{ lib }:

names:
lib.filter (
  flag: !(lib.any (name: lib.hasPrefix "-D${name}:" flag || lib.hasPrefix "-D${name}=" flag) names)
)
