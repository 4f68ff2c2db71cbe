# Stand-ins for the parts of nixpkgs the modules touch, for evaluating them with nixpkgs' `lib`
# alone (tests/test_nix_modules.py). `llama-cpp` is nixpkgs' real recipe
# (pkgs/by-name/ll/llama-cpp/package.nix of `nixpkgsRoot`), called with stand-ins for its
# inputs: so the overrides in ../../pkgs are evaluated against the recipe's real cmakeFlags,
# hooks, finalAttrs fixpoint and override arguments, and a change of the recipe shows here.
#
# mkDerivation keeps the recipe's attributes on the result (as a real derivation does) and
# implements both overrideAttrs styles (`old: { }` and `final: old: { }`) over the finalAttrs
# fixpoint, as stdenv's make-derivation.nix does. Store paths are fake: a hash of the
# attributes that decide a build (name, cmakeFlags, src, build script).
#
# Each tree's recipe asks for its own inputs (unstable's also `buildPackages`, and CUDA's
# `cccl` where 26.05's has `cuda_cccl`); a tree that has `llama-cpp-cuda` (unstable) gets it,
# called from its own file, as nixpkgs does. `overlay` replaces attributes (a test's control).
{
  lib,
  nixpkgsRoot,
  overlay ? _: { },
}:

let
  fakeOutPath =
    name: attrs:
    let
      hash = builtins.substring 0 32 (
        builtins.hashString "sha256" (
          builtins.toJSON {
            inherit name;
            flags = attrs.cmakeFlags or [ ];
            src = toString (attrs.src or "");
            text = attrs.text or null;
            buildCommand = attrs.buildCommand or null;
            version = attrs.version or null;
          }
        )
      );
    in
    "/nix/store/${hash}-${name}";

  fakeDrv =
    attrs:
    let
      name = attrs.name or "${attrs.pname}-${attrs.version}";
      outPath = fakeOutPath name attrs;
      self = attrs // (attrs.passthru or { }) // {
        type = "derivation";
        inherit name outPath;
        drvPath = "${outPath}.drv";
        outputs = attrs.outputs or [ "out" ];
        out = self;
        outputName = "out";
      };
    in
    self;

  # stdenv's mkDerivation: `rattrs` is a function of the final attributes (or an attrset).
  makeDerivationExtensible =
    rattrs:
    let
      args = rattrs (args // { inherit finalPackage overrideAttrs; });
      finalPackage = fakeDrv (removeAttrs args [ "finalPackage" "overrideAttrs" ]) // {
        inherit overrideAttrs;
      };
      overrideAttrs =
        f0:
        let
          f =
            self: super:
            let
              x = f0 super;
            in
            if builtins.isFunction x then f0 self super else x;
        in
        makeDerivationExtensible (
          self:
          let
            super = rattrs self;
          in
          super // f self super
        );
    in
    finalPackage;

  mkDerivation =
    fnOrAttrs: makeDerivationExtensible (if builtins.isFunction fnOrAttrs then fnOrAttrs else _: fnOrAttrs);

  platform = {
    system = "x86_64-linux";
    isDarwin = false;
    isAarch64 = false;
    isLinux = true;
    canExecute = _: true;
  };

  stdenv = {
    inherit mkDerivation;
    hostPlatform = platform;
    buildPlatform = platform;
    cc = tool "gcc" "14";
  };

  tool = pname: version: fakeDrv { inherit pname version; };

  callPackageWith = lib.callPackageWith;

  cudaRecipe = nixpkgsRoot + "/pkgs/by-name/ll/llama-cpp-cuda/package.nix";

  pkgs = {
    inherit lib stdenv;
    buildPackages = pkgs;
    stdenvNoCC = stdenv;
    config = {
      cudaSupport = false;
      rocmSupport = false;
    };

    cmake = tool "cmake" "3.31.6";
    ninja = tool "ninja" "1.12.1";
    pkg-config = tool "pkg-config-wrapper" "0.29.2";
    installShellFiles = tool "install-shell-files" "1";
    autoAddDriverRunpath = tool "auto-add-driver-runpath-hook" "1";
    nodejs_latest = tool "nodejs" "24.1.0";
    npmHooks.npmConfigHook = fakeDrv { name = "npm-config-hook"; };
    spirv-headers = tool "spirv-headers" "1.4";
    openssl = tool "openssl" "3.4.1";
    blas = tool "blas" "3";
    clblast = tool "clblast" "1.6.3";
    shaderc = tool "shaderc" "2025.1";
    vulkan-headers = tool "vulkan-headers" "1.4";
    vulkan-loader = tool "vulkan-loader" "1.4";
    python3 = tool "python3" "3.13.3";
    nix-update-script = _: [ "nix-update" ];

    fetchFromGitHub =
      args:
      fakeDrv {
        name = "source";
        inherit (args) owner repo;
        rev = args.rev or args.tag;
        src = "github:${args.owner}/${args.repo}/${args.rev or args.tag}";
      };
    fetchNpmDeps = args: fakeDrv { inherit (args) name; };

    cudaPackages = {
      backendStdenv = stdenv;
      cuda_nvcc = tool "cuda_nvcc" "12.8";
      cuda_cccl = tool "cuda_cccl" "12.8";
      cccl = tool "cccl" "12.8";
      cuda_cudart = tool "cuda_cudart" "12.8";
      libcublas = tool "libcublas" "12.8";
      flags.cmakeCudaArchitecturesString = "75;80;86;89;90";
    };
    rocmPackages = { };

    writeText =
      name: text:
      fakeDrv {
        inherit name text;
        preferLocalBuild = true;
      };
    writeShellScript =
      name: text:
      fakeDrv {
        inherit name;
        text = "#!/bin/bash\n" + text;
      };
    emptyDirectory = fakeDrv {
      name = "empty-directory";
      buildCommand = "mkdir $out";
    };
    runtimeShell = "${tool "bash" "5.3"}/bin/bash";
    fetchurl = args: fakeDrv { name = baseNameOf args.url; inherit (args) url; };
    systemd = tool "systemd" "258";
    coreutils = tool "coreutils" "9.7";
    curl = tool "curl" "8.14.1" // {
      meta.mainProgram = "curl";
    };
    jq = tool "jq" "1.8.1" // {
      meta.mainProgram = "jq";
    };
    litellm = fakeDrv {
      pname = "litellm";
      version = "1.100.1";
      meta.mainProgram = "litellm";
    };

    # pkgs.formats.yaml's type as nixpkgs declares it. `generate` writes JSON, which is YAML:
    # the real one converts the same JSON to YAML with remarshal, and LiteLLM reads either
    # with PyYAML (tests/test_fleet_litellm.py starts the real proxy with this text).
    formats.yaml =
      { }:
      {
        type =
          let
            valueType =
              with lib.types;
              nullOr (oneOf [
                bool
                int
                float
                str
                path
                (attrsOf valueType)
                (listOf valueType)
              ])
              // {
                description = "YAML value";
              };
          in
          valueType;
        generate = name: value: fakeDrv {
          inherit name;
          text = builtins.toJSON value;
        };
      };
    runCommand =
      name: env: buildCommand:
      fakeDrv (env // { inherit name buildCommand; });
    linkFarm =
      name: entries:
      fakeDrv {
        inherit name entries;
        buildCommand = lib.concatMapStrings (e: "ln -s ${e.path} $out/${e.name}\n") entries;
      };

    callPackage = callPackageWith pkgs;

    # nixpkgs' vllm (pkgs/development/python-modules/vllm): CUDA only with config.cudaSupport,
    # and its env.VLLM_TARGET_DEVICE, which a derivation without structured attributes carries
    # as a top-level attribute, says which build it is.
    vllm = fakeDrv {
      pname = "vllm";
      version = "0.32.0";
      VLLM_TARGET_DEVICE = if pkgs.config.cudaSupport then "cuda" else "cpu";
    };

    llama-cpp = pkgs.callPackage (nixpkgsRoot + "/pkgs/by-name/ll/llama-cpp/package.nix") { };

    # nixpkgs' Python set, as far as pkgs/llm-bench.nix reads it: every attribute a package.
    python3Packages = {
      buildPythonApplication = attrs: fakeDrv attrs;
    }
    // lib.genAttrs [
      "setuptools"
      "httpx"
      "httpx-sse"
      "click"
      "pydantic"
      "nvidia-ml-py"
      "tomli-w"
      "matplotlib"
      "gguf"
      "tqdm"
    ] (name: tool name "1");
  }
  // lib.optionalAttrs (builtins.pathExists cudaRecipe) {
    llama-cpp-cuda = pkgs.callPackage cudaRecipe { };
  }
  // overlay pkgs;
in
pkgs
