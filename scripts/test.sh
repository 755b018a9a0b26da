#!/usr/bin/env bash
# The test command: set-up, lint, types, import layers, the whole suite (tiny models, the
# real model, and the team stack end to end: SPECOPS_TEAM_STACK=0 skips that one), a check
# that no test id went missing (scripts/check_test_ids.py), the lean kernels on their other
# instruction-set paths (scripts/test_lean_paths.sh), then a Python 3.12 smoke run
# from its own lock (SPECOPS_PY312=0 skips it), then the vLLM and MLX backend tests in their
# own environments (scripts/test_backends.sh); those environments install in the background
# from the start. Each pytest run leaves a JUnit file in
# .reports/ (scripts/durations.py makes docs/test-durations.md from them).
#
# The inner loop is the fast tier, a few minutes (docs/install.md, "Tests"):
#   .venv/bin/python -m pytest -q -n 2 -m "not real_model and not slow"
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
source scripts/env.sh
mkdir -p .reports
# The other environments (Python 3.12, vLLM, MLX: gigabytes to download on a fresh machine)
# install in the background while lint and the suite run; their stages wait for them, and a
# failed install shows its log there.
envs_log=.reports/environments.log
(
  if [ "${SPECOPS_PY312:-1}" != "0" ]; then bash scripts/setup_py312.sh; fi
  for backend in ${SPECOPS_BACKENDS:-vllm mlx}; do bash scripts/setup_backend.sh "$backend"; done
) >"$envs_log" 2>&1 &
envs=$!
.venv/bin/ruff check .
.venv/bin/ruff format --check .
# Types of every package (not a hand-kept file list), then the import layers
# (pyproject.toml's import-linter contracts; docs/architecture.md draws them).
.venv/bin/mypy serving registry tasks flows specops scripts benchmarks
.venv/bin/lint-imports
# The lean step's C++ ops, compiled once here rather than inside whichever test first loads them.
.venv/bin/python -m serving.lean.build
# promtool for the alerting rules (configs/monitoring/): required, not skipped, here.
bash scripts/install_promtool.sh
export SPECOPS_REQUIRE_PROMTOOL=1
# One pytest-xdist worker per core, at most four (SPECOPS_TEST_WORKERS overrides; 0 runs in
# one process), a test file to a worker so that a module's fixtures are built once, in the
# collection's order (tests/conftest.py puts the longest module first).
cores=$(nproc)
workers=${SPECOPS_TEST_WORKERS:-$((cores < 4 ? cores : 4))}
.venv/bin/python -m pytest -q -n "$workers" --dist loadfile --no-loadscope-reorder \
  --junitxml=.reports/pytest.xml --collected-ids=.reports/test-ids.txt "$@"
if [ $# -eq 0 ]; then  # the whole suite was collected
  .venv/bin/python scripts/check_test_ids.py --ids .reports/test-ids.txt
  # The lean kernels' other instruction-set paths (AVX2, AVX-VNNI, plain C++) on this CPU.
  bash scripts/test_lean_paths.sh
fi
if ! wait "$envs"; then
  echo "setting up the other environments failed ($envs_log):" >&2
  tail -40 "$envs_log" >&2
  exit 1
fi
bash scripts/test_py312.sh
bash scripts/test_backends.sh
