#!/usr/bin/env bash
# The test command: set-up, lint, the whole suite (tiny models and the real model), then the
# vLLM and MLX backend tests in their own environments (scripts/test_backends.sh).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
source scripts/env.sh
.venv/bin/ruff check .
.venv/bin/ruff format --check .
.venv/bin/mypy serving registry tasks/records.py tasks/store.py tasks/collect.py tasks/validate.py \
  tasks/curate.py tasks/dataset.py tasks/loadtest.py tasks/server_process.py tasks/evaluate.py \
  tasks/gates.py tasks/loop.py tasks/distill*.py tasks/suffix_index.py tasks/train_head.py \
  tasks/checkpoints.py tasks/export.py tasks/targets.py tasks/target_promotion.py \
  tasks/teacher.py tasks/teacher_answers.py tasks/offline_acceptance.py tasks/draft_curves.py \
  tasks/curves_report.py
.venv/bin/python -m pytest -q "$@"
bash scripts/test_backends.sh
