#!/usr/bin/env bash
# The main job on embedded defaults. Until the retraining loop lands, it is the benchmark:
# specops vs. HF greedy, HF assisted generation and HF prompt lookup on real workloads.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
source scripts/env.sh
.venv/bin/specops bench "$@"
