# A stand-in for the few parts of nixpkgs the modules touch, for evaluating them with
# nixpkgs' `lib` alone (tests/test_nix_modules.py). The fake llama-cpp mimics the shape of
# nixpkgs' recipe that the overrides in ../../pkgs depend on: `override { cudaSupport }`,
# `overrideAttrs`, cmakeFlags built with lib.cmakeBool/cmakeFeature, LLAMA_BUILD_NUMBER =
# version, a preConfigure that reads COMMIT and runs `npm run build`, npm hooks and npmDeps.
{ lib }:

let
  fakeDrv = attrs:
    let
      name = attrs.name or "${attrs.pname}-${attrs.version}";
      hash = builtins.substring 0 32 (builtins.hashString "sha256" (builtins.toJSON {
        inherit name;
        flags = attrs.cmakeFlags or [ ];
        text = attrs.text or null;
      }));
      self = attrs // {
        type = "derivation";
        inherit name;
        outPath = "/nix/store/${hash}-${name}";
        drvPath = "/nix/store/${hash}-${name}.drv";
        outputs = [ "out" ];
        out = self;
        outputName = "out";
        overrideAttrs = f: fakeDrv (attrs // f attrs);
      };
    in
    self;

  llamaCppRecipe = { cudaSupport ? false }:
    fakeDrv {
      pname = "llama-cpp";
      version = "7777";
      inherit cudaSupport;
      src = { rev = "b7777"; };
      nativeBuildInputs = [ { name = "cmake-3.31"; } { name = "npm-config-hook"; } { name = "nodejs-22.1.0"; } ];
      npmRoot = "tools/ui";
      npmDeps = { name = "llama-cpp-7777-npm-deps"; };
      preConfigure = ''
        prependToVar cmakeFlags "-DLLAMA_BUILD_COMMIT:STRING=$(cat COMMIT)"
        pushd tools/ui
        npm run build
        popd
      '';
      cmakeFlags = [
        (lib.cmakeBool "GGML_NATIVE" false)
        (lib.cmakeBool "LLAMA_BUILD_SERVER" true)
        (lib.cmakeBool "GGML_CUDA" cudaSupport)
        (lib.cmakeFeature "LLAMA_BUILD_NUMBER" "7777")
      ] ++ lib.optionals cudaSupport [
        (lib.cmakeFeature "CMAKE_CUDA_ARCHITECTURES" "75;80;86;89;90")
      ];
      meta = { description = "stub llama-cpp"; };
    } // {
      override = args: llamaCppRecipe ({ inherit cudaSupport; } // args);
    };

  pkgs = {
    llama-cpp = llamaCppRecipe { };
    writeText = name: text: fakeDrv { inherit name text; };
    callPackage = fn: args:
      let
        f = if builtins.isFunction fn then fn else import fn;
        wanted = builtins.functionArgs f;
        auto = builtins.intersectAttrs wanted (pkgs // { inherit lib; });
      in
      f (auto // args);
  };
in
pkgs
