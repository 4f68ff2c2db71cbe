#!/usr/bin/env bash
# The GPU proof (issue #56): a CUDA llama-server from the CPU bed's pinned source, and llm-bench's real
# NVML paths, on a lent NVIDIA card. docs/gpu.md ("The GPU proof") says how a session runs it.
#
#   scripts/gpu-proof.sh pack      # CPU machine with network, once: the pinned sdist and the wheels the GPU
#                                  # machine lacks into .gpu-proof/ (ignored; the device call carries it)
#   scripts/gpu-proof.sh build     # GPU machine: llama-server with CUDA for this card's architecture only
#   scripts/gpu-proof.sh measure   # GPU machine: router with three presets fully on the GPU, llm-bench run,
#                                  # doctor, telemetry, every NVML fact; exits 1 naming each failed check
#   scripts/gpu-proof.sh all       # build, then measure, in one call
#
# Everything lands in $OUT (the device call's output folder; else /tmp/llm-bench-gpu-proof/out). Nothing is
# downloaded there, and no accelerator setting is written: a --set-style argument is refused.
set -euo pipefail
cd "$(dirname "$0")/.."

PACK=.gpu-proof
export GPU_PROOF_WORK="${GPU_PROOF_WORK:-/tmp/llm-bench-gpu-proof}"
export OUT="${OUT:-$GPU_PROOF_WORK/out}"
PYTHON="${PYTHON:-python3}"

refuse() {
  echo "gpu-proof: refused $1: gpu-proof changes no accelerator setting (power limit, clocks, persistence" \
       "mode, application clocks); it has no --set path" >&2
  exit 2
}

for arg in "$@"; do
  case "$arg" in
    set|-set|--set|--set=*|-pl|-pm|-ac|-rac|-lgc|-rgc|-lmc|-rmc|--power-limit*|--persistence-mode*|\
    --applications-clocks*|--lock-gpu-clocks*|--lock-memory-clocks*|--reset-*) refuse "$arg" ;;
  esac
done

# The wheels the GPU machine's python3 lacks, installed beside it (never into it), then this checkout first on
# the path: `python3 -m llm_bench` is the llm-bench under test.
python_env() {
  local site="$GPU_PROOF_WORK/site"
  if [ ! -f "$site/.installed" ]; then
    if ! compgen -G "$PACK/wheels/*.whl" >/dev/null; then
      echo "gpu-proof: no wheels in $PACK/wheels: run \`scripts/gpu-proof.sh pack\` on a CPU machine with" \
           "network and carry $PACK" >&2
      exit 2
    fi
    mkdir -p "$site"
    if ! "$PYTHON" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$site" \
      "$PACK"/wheels/*.whl; then
      echo "gpu-proof: the wheels in $PACK/wheels are for CPython 3.12 (the GPU image's python3); this one is" \
           "$("$PYTHON" -V 2>&1): pack them again for it (WHEEL_PYTHON in scripts/gpu-proof.py)" >&2
      exit 2
    fi
    touch "$site/.installed"
  fi
  export PYTHONPATH="$PWD:$site${PYTHONPATH:+:$PYTHONPATH}"
  export PYTHONUNBUFFERED=1
}

step="${1:-}"
[ $# -gt 0 ] && shift
mkdir -p "$OUT"
case "$step" in
  pack)
    # here, the project's own environment (./dev made it) holds everything pack needs
    exec "${PACK_PYTHON:-.venv/bin/python}" scripts/gpu-proof.py pack "$@"
    ;;
  build)
    # stdlib and this checkout only: the build goes on even where the wheels would not install
    export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
    exec "$PYTHON" scripts/gpu-proof.py build "$@"
    ;;
  measure)
    python_env
    exec "$PYTHON" scripts/gpu-proof.py measure "$@"
    ;;
  all)
    # the compile stops at 450 s, so that measuring (about 2 minutes) still fits a 10-minute call
    PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1 "$PYTHON" scripts/gpu-proof.py build --timeout 450
    python_env
    exec "$PYTHON" scripts/gpu-proof.py measure "$@"
    ;;
  *)
    echo "usage: scripts/gpu-proof.sh pack|build|measure|all [options of scripts/gpu-proof.py]" >&2
    exit 2
    ;;
esac
