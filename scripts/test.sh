#!/usr/bin/env bash
# The test command: set-up, lint, the whole suite (tiny models and the real model), then the
# vLLM and MLX backend tests in their own environments (scripts/test_backends.sh).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
source scripts/env.sh
.venv/bin/ruff check .
.venv/bin/ruff format --check .
.venv/bin/mypy serving registry serving/records/schema.py serving/records/store.py tasks/data/collect.py tasks/data/validate.py \
  tasks/data/curate.py tasks/data/dataset.py tasks/ops/loadtest.py tasks/ops/server_process.py tasks/evaluate/evaluate.py \
  tasks/evaluate/gates.py tasks/loop/steps.py tasks/distill*.py tasks/train/suffix_index.py tasks/train/train_head.py \
  tasks/train/checkpoints.py tasks/evaluate/export.py tasks/evaluate/targets.py tasks/loop/target_promotion.py \
  tasks/train/teacher.py tasks/train/teacher_answers.py tasks/evaluate/offline_acceptance.py tasks/bench/draft_curves.py \
  tasks/bench/curves_report.py
.venv/bin/python -m pytest -q "$@"
bash scripts/test_backends.sh
