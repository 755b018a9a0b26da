#!/usr/bin/env bash
# Regenerate the gRPC modules of serving/distributed/proto from its .proto (grpcio-tools,
# pinned with grpcio in pyproject.toml). Run from anywhere; commit the result.
# tests/serving/distributed/test_dist_proto.py fails when the committed modules drift.
set -euo pipefail
cd "$(dirname "$0")/.."
python=${PYTHON:-.venv/bin/python}
"$python" -m grpc_tools.protoc -I. \
  --python_out=. --pyi_out=. --grpc_python_out=. \
  serving/distributed/proto/specops_distributed.proto
