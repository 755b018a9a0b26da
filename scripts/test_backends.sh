#!/usr/bin/env bash
# The backend tests, each in its backend's own environment (called by scripts/test.sh).
# Builds .venv-vllm and .venv-mlx (scripts/setup_backend.sh), prepares the models and the
# exported drafts they load with the main environment, then runs tests/backends/test_NAME.py
# where a missing library or fixture fails instead of skipping; after vLLM's, the deployment
# test (tests/backends/test_vllm_deploy.py) from the main environment.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/env.sh
fixtures="${SPECOPS_CACHE:-$HOME/.cache/specops}/backend-fixtures"
mkdir -p .reports
.venv/bin/python scripts/prepare_backend_tests.py "$fixtures"
for backend in ${SPECOPS_BACKENDS:-vllm mlx}; do
  echo "== backend tests: $backend"
  bash scripts/setup_backend.sh "$backend"
  SPECOPS_BACKEND_FIXTURES="$fixtures" SPECOPS_REQUIRE_BACKEND="$backend" \
    ".venv-$backend/bin/python" -m pytest -q -p no:cacheprovider \
    --junitxml=".reports/backend-$backend.xml" --confcutdir=tests/backends \
    "tests/backends/test_$backend.py"
  if [ "$backend" = vllm ]; then
    # `specops deploy vllm` end to end: registry, front and deployment in the main
    # environment, vLLM servers in .venv-vllm.
    echo "== backend tests: vllm deployment"
    SPECOPS_BACKEND_FIXTURES="$fixtures" SPECOPS_REQUIRE_BACKEND=vllm \
      .venv/bin/python -m pytest -q -p no:cacheprovider \
      --junitxml=.reports/backend-vllm-deploy.xml tests/backends/test_vllm_deploy.py
  fi
done
