"""The committed generated modules are what grpcio-tools makes of the committed .proto."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
PROTO = Path("serving/distributed/proto/specops_distributed.proto")
GENERATED = ["specops_distributed_pb2.py", "specops_distributed_pb2.pyi",
             "specops_distributed_pb2_grpc.py"]  # fmt: skip


def test_generated_modules_match_the_proto(tmp_path):
    protoc = pytest.importorskip("grpc_tools.protoc")
    (tmp_path / PROTO.parent).mkdir(parents=True)
    shutil.copy(ROOT / PROTO, tmp_path / PROTO)
    args = ["protoc", f"-I{tmp_path}", f"--python_out={tmp_path}", f"--pyi_out={tmp_path}",
            f"--grpc_python_out={tmp_path}", str(tmp_path / PROTO)]  # fmt: skip
    assert protoc.main(args) == 0
    for name in GENERATED:
        made = (tmp_path / PROTO.parent / name).read_text()
        committed = (ROOT / PROTO.parent / name).read_text()
        assert made == committed, f"{name} is stale: run bash scripts/gen_proto.sh"
