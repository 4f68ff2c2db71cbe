# llm-bench, built from this repository's pyproject (setuptools) with nixpkgs' Python.
{ lib, python3Packages, src }:

let
  # pyproject takes the version from llm_bench.__version__ (tool.setuptools.dynamic).
  versionLine = builtins.match ''.*__version__ = "([^"]+)".*'' (builtins.readFile (src + "/llm_bench/__init__.py"));
in
python3Packages.buildPythonApplication {
  pname = "llm-bench";
  version = if versionLine == null then "0.0.0" else builtins.head versionLine;
  pyproject = true;
  inherit src;

  build-system = [ python3Packages.setuptools ];

  dependencies = with python3Packages; [
    httpx
    httpx-sse
    click
    pydantic # plan values checked against their fields' types (llm_bench/validation.py)
    nvidia-ml-py # the `pynvml` module
    tomli-w
    matplotlib
    gguf # the demo's tiny models
    tqdm # the live progress bar on a terminal
  ];

  # The test suite needs a real llama-server (built from source, ~15 min); the NixOS VM
  # tests in ../tests/nixos exercise the package against nixpkgs' llama-cpp instead.
  doCheck = false;
  pythonImportsCheck = [ "llm_bench" ];

  meta = {
    description = "Benchmark llama.cpp router presets and OpenAI-compatible engines with one protocol";
    license = lib.licenses.mit;
    mainProgram = "llm-bench";
    platforms = lib.platforms.linux;
  };
}
