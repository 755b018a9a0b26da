"""Pairs captured in front of vLLM read back as training sequences; bad lines are skipped
with their reason, a repeated id counts once."""

from __future__ import annotations

from serving.gateway.sink import PAIRS, PartSink
from serving.hardware import hardware_target
from tasks.data.vllm_pairs import read_pairs

CPU_VLLM = hardware_target("cpu-vllm")


def pair(pid, when, prompt=(1, 2), output=(3, 4)):
    return {"id": pid, "timestamp": when, "hardware": "cpu-vllm", "champion": "suffix/1",
            "prompt_token_ids": list(prompt), "output_token_ids": list(output)}  # fmt: skip


def test_valid_pairs_oldest_first_and_bad_lines_named(tmp_path):
    sink = PartSink(tmp_path, PAIRS, hardware=CPU_VLLM, run_id="r")
    for row in [pair("b", 2.0), pair("a", 1.0), pair("a", 1.0), pair("c", 3.0, output=()),
                pair("d", 4.0, prompt=(-1,))]:  # fmt: skip
        sink.add(row)
    sink.close()
    part = next((tmp_path / PAIRS).rglob("part-*.jsonl"))
    part.write_text(part.read_text() + "{broken\n")
    pairs, rejected = read_pairs(tmp_path, CPU_VLLM)
    assert [p.id for p in pairs] == ["a", "b"]
    assert len(rejected) == 3
    assert any("output_token_ids" in r for r in rejected)
    assert any("negative token id" in r for r in rejected)
    assert all(r.startswith(part.name) for r in rejected)
    assert read_pairs(tmp_path, hardware_target("cuda-vllm")) == ([], [])
