#!/usr/bin/env bash
# Python 3.12: its own environment from requirements/lock-py312.txt (.venv-py312; torch is
# PyPI's CUDA build there, which runs on the CPU), then a smoke subset of the suite: the
# lock, the registry, the command line, the server and distributed decoding
# (docs/install.md has the full-suite run). SPECOPS_PY312=0 skips it; SPECOPS_PY312_PYTHON
# names the interpreter (default: pyenv's 3.12, else python3.12 on PATH).
set -euo pipefail
cd "$(dirname "$0")/.."
if [ "${SPECOPS_PY312:-1}" = "0" ]; then
  echo "== Python 3.12 smoke: skipped (SPECOPS_PY312=0)"
  exit 0
fi
python312=${SPECOPS_PY312_PYTHON:-$(ls -d "$HOME"/.pyenv/versions/3.12*/bin/python3.12 2>/dev/null | tail -1)}
python312=${python312:-$(command -v python3.12 || true)}
if [ -z "$python312" ]; then
  echo "no Python 3.12 found: set SPECOPS_PY312_PYTHON, or SPECOPS_PY312=0 to skip" >&2
  exit 1
fi
echo "== Python 3.12 smoke ($python312)"
PYTHON="$python312" SPECOPS_VENV=.venv-py312 bash scripts/setup.sh
source scripts/env.sh
.venv-py312/bin/python -m serving.lean.build  # its own torch: its own build of the lean ops
cores=$(nproc)
workers=${SPECOPS_TEST_WORKERS:-$((cores < 4 ? cores : 4))}
.venv-py312/bin/python -m pytest -q -p no:cacheprovider -m "not real_model" \
  -n "$workers" --dist loadfile --no-loadscope-reorder \
  tests/test_lock.py tests/registry tests/specops tests/serving/server tests/serving/distributed
