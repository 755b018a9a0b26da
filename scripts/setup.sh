#!/usr/bin/env bash
# Idempotent set-up on a fresh machine: a .venv holding exactly the committed lock (the
# pinned stack, this project editable, and the shipped model), docs/install.md.
#
#   PYTHON=python3.12 bash scripts/setup.sh    # the interpreter (default python3.11)
#   SPECOPS_VENV=/tmp/venv bash scripts/setup.sh  # another environment (default .venv)
#
# The lock is requirements/lock-pyXY.txt for the interpreter's version (scripts/lock.py
# makes them); uv pip sync installs exactly its lines and removes anything else, so a
# second run with nothing changed only checks (a few seconds).
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/env.sh
PYTHON=${PYTHON:-python3.11}
venv=${SPECOPS_VENV:-.venv}
version=$("$PYTHON" -c 'import sys; print("%d.%d" % sys.version_info[:2])')
lock="requirements/lock-py${version/./}.txt"
if [ ! -f "$lock" ]; then
  echo "no lock for Python $version: the locks are $(ls requirements/lock-py*.txt | xargs)" >&2
  exit 1
fi
# Warn only: the tests fail on a stale lock (tests/test_lock.py); set-up still installs it.
"$PYTHON" scripts/lock.py --check || echo "warning: installing a stale lock" >&2
if [ ! -x "$venv/bin/python" ]; then
  "$PYTHON" -m venv "$venv"
fi
have=$("$venv/bin/python" -c 'import sys; print("%d.%d" % sys.version_info[:2])')
if [ "$have" != "$version" ]; then
  echo "$venv holds Python $have, not $version: remove it or set SPECOPS_VENV" >&2
  exit 1
fi
# uv at the version the lock pins (bootstrapped by pip on a fresh venv; later the lock
# keeps it).
uv_version=$(sed -n 's/^uv==//p' "$lock")
if [ "$("$venv/bin/uv" --version 2>/dev/null)" != "uv $uv_version" ]; then
  "$venv/bin/python" -m pip install --quiet "uv==$uv_version"
fi
# The 3.11 lock pins PyTorch's CPU build (torch==2.13.0+cpu), which PyPI does not carry:
# it lies in /opt/wheels here, elsewhere on PyTorch's CPU index (SPECOPS_TORCH_FIND_LINKS
# overrides both).
sources=()
if grep -q '^torch==.*+cpu$' "$lock"; then
  if [ -z "${SPECOPS_TORCH_FIND_LINKS:-}" ] && [ -d /opt/wheels ]; then
    SPECOPS_TORCH_FIND_LINKS=/opt/wheels
  fi
  sources=(--find-links "${SPECOPS_TORCH_FIND_LINKS:-https://download.pytorch.org/whl/cpu/torch/}")
fi
UV_SYSTEM_CERTS=1 "$venv/bin/uv" pip sync --quiet --python "$venv/bin/python" \
  "${sources[@]}" "$lock"
