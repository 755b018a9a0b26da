#!/usr/bin/env bash
# The local team stack (docs/team.md): `bash scripts/stack.sh up|down|status|env|loop`.
# PostgreSQL, an MLflow server with proxied artifacts, a Prefect server with a work pool and
# a worker, and sshd serving the DVC remote, each on loopback; the set-up runs first when the
# project's environment is missing.
set -euo pipefail
cd "$(dirname "$0")/.."
if [ ! -x .venv/bin/specops ]; then
  bash scripts/setup.sh
fi
source scripts/env.sh
exec .venv/bin/specops stack "$@"
