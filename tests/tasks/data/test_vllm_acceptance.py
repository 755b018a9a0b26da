"""A vLLM target's rolling acceptance, pooled from the scraped windows of its champion."""

from __future__ import annotations

import json

from serving.gateway.sink import ACCEPTANCE, PartSink
from serving.hardware import hardware_target
from tasks.data.vllm_acceptance import read_windows, vllm_groups

CPU_VLLM = hardware_target("cpu-vllm")


def write_windows(store, rows, *, run_id="r"):
    sink = PartSink(store, ACCEPTANCE, hardware=CPU_VLLM, run_id=run_id, flush_rows=1)
    for row in rows:
        sink.add(row)
    sink.close()


def row(end, champion, requests, drafted, accepted):
    return {"timestamp": end, "end": end, "champion": champion, "requests": requests,
            "draft_tokens": drafted, "accepted_tokens": accepted}  # fmt: skip


def test_newest_windows_of_the_champion_covering_the_window(tmp_path):
    write_windows(tmp_path, [
        row(1.0, "old/1", 40, 100, 90),
        row(2.0, "new/2", 30, 100, 10),
        row(3.0, "new/2", 30, 100, 30),
        row(4.0, "new/2", 30, 100, 50),
    ])  # fmt: skip
    [group] = vllm_groups(tmp_path, CPU_VLLM, champion="new/2", window=50)
    # the newest two windows (60 requests >= 50); the old champion's never count
    assert (group.requests, group.draft_tokens, group.accepted_tokens) == (60, 200, 80)
    assert group.acceptance == 0.4 and group.workload == "live"
    assert vllm_groups(tmp_path, CPU_VLLM, champion="other/9") == []


def test_unreadable_lines_are_skipped(tmp_path):
    write_windows(tmp_path, [row(1.0, "c/1", 1, 10, 5)])
    part = next((tmp_path / ACCEPTANCE).rglob("part-*.jsonl"))
    part.write_text(part.read_text() + "not json\n" + json.dumps({"x": 1}) + "\n")
    assert len(read_windows(tmp_path, CPU_VLLM)) == 1
