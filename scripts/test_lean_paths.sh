#!/usr/bin/env bash
# The lean step's kernels on every instruction-set path this CPU can run, not only the one
# its own build takes (-march=native): each build is checked to take the path it names,
# then the kernel tests run on it (every path bit for bit the plain C++ one, every row of a
# pass its one-row pass). The test command runs this after the suite.
set -euo pipefail
cd "$(dirname "$0")/.."
if [ "$(uname -m)" != "x86_64" ]; then
  echo "lean kernels: the other instruction-set paths are x86-64's; $(uname -m) tests its own"
  exit 0
fi
flags=" $(grep -m1 '^flags' /proc/cpuinfo | cut -d: -f2) "
builds=("x86-64:plain")
if [[ $flags == *" avx2 "* && $flags == *" fma "* && $flags == *" f16c "* ]]; then
  builds+=("x86-64-v3:avx2")
fi
if [[ $flags == *" avx_vnni "* ]]; then
  builds+=("alderlake:avx-vnni")  # AVX2 with 256-bit vpdpbusd and no AVX-512
fi
for build in "${builds[@]}"; do
  march=${build%%:*}
  want=${build##*:}
  echo "lean kernels, -march=$march (the $want path):"
  paths=$(SPECOPS_LEAN_MARCH=$march .venv/bin/python -c "
import torch
from serving.lean.build import load_ops
load_ops()
print(torch.ops.specops_lean.int4_path(), torch.ops.specops_lean.int8_path())")
  if [ "$paths" != "$want $want" ]; then
    echo "-march=$march built the '$paths' paths, not '$want'" >&2
    exit 1
  fi
  SPECOPS_LEAN_MARCH=$march .venv/bin/python -m pytest -q -p no:cacheprovider \
    tests/serving/lean/test_tiles.py tests/serving/lean/test_attend.py \
    tests/serving/lean/test_step.py
done
