#!/usr/bin/env bash
# The test command: set-up, lint, types, import layers, the whole suite (tiny models, the
# real model, and the team stack end to end: SPECOPS_TEAM_STACK=0 skips that one), then a
# Python 3.12 smoke run from its own lock (SPECOPS_PY312=0 skips it), then the vLLM and MLX
# backend tests in their own environments (scripts/test_backends.sh).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
source scripts/env.sh
.venv/bin/ruff check .
.venv/bin/ruff format --check .
# Types of every package (not a hand-kept file list), then the import layers
# (pyproject.toml's import-linter contracts; docs/architecture.md draws them).
.venv/bin/mypy serving registry tasks flows specops scripts benchmarks
.venv/bin/lint-imports
.venv/bin/python -m pytest -q "$@"
bash scripts/test_py312.sh
bash scripts/test_backends.sh
