#!/usr/bin/env bash
# The main job on embedded defaults: the closed loop on a drift scenario (specops loop demo):
# bootstrap a champion, replay drift, retrain, evaluate, gate, promote, report with a plot.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
source scripts/env.sh
.venv/bin/specops loop demo "$@"
