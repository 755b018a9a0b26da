#!/usr/bin/env bash
# The Python 3.12 environment (.venv-py312) from requirements/lock-py312.txt; torch is
# PyPI's CUDA build there, which runs on the CPU (docs/install.md). SPECOPS_PY312_PYTHON
# names the interpreter (default: pyenv's 3.12, else python3.12 on PATH). Called by
# scripts/test_py312.sh, and by scripts/test.sh in the background while the suite runs.
set -euo pipefail
cd "$(dirname "$0")/.."
python312=${SPECOPS_PY312_PYTHON:-$(ls -d "$HOME"/.pyenv/versions/3.12*/bin/python3.12 2>/dev/null | tail -1)}
python312=${python312:-$(command -v python3.12 || true)}
if [ -z "$python312" ]; then
  echo "no Python 3.12 found: set SPECOPS_PY312_PYTHON, or SPECOPS_PY312=0 to skip" >&2
  exit 1
fi
echo "== Python 3.12 environment ($python312)"
PYTHON="$python312" SPECOPS_VENV=.venv-py312 bash scripts/setup.sh
