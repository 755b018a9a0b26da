"""Traffic capture: records land in the store as parts; replicas never collide."""

from __future__ import annotations

import multiprocessing
import re
import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from pathlib import Path

import pytest

from serving.engine.decoder import SpeculativeDecoder
from serving.engine.drafters.prompt_lookup import PromptLookupDrafter
from serving.engine.policy import FixedK
from serving.errors import BadInputError
from serving.hardware import hardware_target
from serving.records import store
from serving.server.capture import Capture, capture_run_id, host_label
from tasks.data.validate import validate_store

NOW = 1_750_000_000.0  # 2025-06-15T15:06:40Z
CPU = hardware_target("cpu")


def detailed_record(loaded, prompt):
    decoder = SpeculativeDecoder(loaded, drafter=PromptLookupDrafter(), policy=FixedK(3))
    return decoder.generate(prompt, max_new_tokens=24, mode="detailed").record


def test_captured_requests_land_in_the_store_and_validate(tmp_path, loaded, prompt):
    capture = Capture(root=tmp_path, share=1.0, hardware=CPU, chunk_size=2)
    for i in range(3):
        capture.add(
            detailed_record(loaded, prompt[i:]),
            prompt_text=f"prompt {i}",
            output_text="text",
            drafter_version="7",
        )
    assert len(store.part_files(tmp_path)) == 1  # two records flushed as one part
    assert capture.flush() == 1
    parts = store.part_files(tmp_path)
    assert len(parts) == 2 and all("hardware=cpu" in str(p) for p in parts)
    result = validate_store(tmp_path, known_hardware=["cpu"], run_id="t")
    assert result.summary.valid == 3 and result.summary.quarantined == 0
    assert {r.workload for r in result.valid} == {"live"}
    assert {r.drafter_version for r in result.valid} == {"7"}


def test_the_share_decides_how_many_requests_are_captured(tmp_path):
    assert not any(Capture(root=tmp_path, share=0.0, hardware=CPU).wants() for _ in range(50))
    assert all(Capture(root=tmp_path, share=1.0, hardware=CPU).wants() for _ in range(50))
    some = Capture(root=tmp_path, share=0.3, hardware=CPU, seed=1)
    taken = sum(some.wants() for _ in range(1000))
    assert 230 < taken < 370


def test_old_records_are_flushed_by_age(tmp_path, loaded, prompt):
    capture = Capture(root=tmp_path, share=1.0, hardware=CPU, chunk_size=100, max_age_s=0.0)
    capture.add(detailed_record(loaded, prompt), prompt_text="p", output_text="o")
    capture.flush_if_old()
    assert len(store.part_files(tmp_path)) == 1


# ------------------------------------------------------------------ replicas sharing a store


def _capture_many(root, record, replica, count, start=None) -> list[str]:
    """Capture ``count`` requests (one part each) as one replica would; return its parts."""
    capture = Capture(root=root, share=1.0, hardware=CPU, chunk_size=1, replica=replica)
    if start is not None:
        start.wait()
    for i in range(count):
        request = replace(record, request_id=f"request-{i}")
        capture.add(request, prompt_text=f"prompt {i}", output_text="text")
    capture.flush()
    return capture.parts


def _replica_process(root, record, replica, count, start, results) -> None:
    results.put(_capture_many(root, record, replica, count, start))


def _read_back(root) -> list:
    return [row for _, row in store.read_raw(root)]


def test_replicas_in_one_process_write_disjoint_parts(tmp_path, loaded, prompt):
    """Same host, same pid, same second: what the old ``serve-<start>-<pid>`` run id
    collided on."""
    record = detailed_record(loaded, prompt)
    start = threading.Barrier(2)
    with ThreadPoolExecutor(2) as pool:
        futures = [pool.submit(_capture_many, tmp_path, record, None, 12, start) for _ in range(2)]
        parts = [future.result() for future in futures]
    assert len(parts[0]) == len(parts[1]) == 12 and not set(parts[0]) & set(parts[1])
    rows = _read_back(tmp_path)
    assert len(rows) == 24 and len({row["id"] for row in rows}) == 24
    assert len({row["run_id"] for row in rows}) == 2


@pytest.mark.slow  # replica processes
def test_replica_processes_write_disjoint_parts_and_lose_nothing(tmp_path, loaded, prompt):
    record = detailed_record(loaded, prompt)
    context = multiprocessing.get_context("spawn")  # a fresh interpreter, like a replica
    start, results = context.Barrier(2), context.Queue()
    processes = [
        context.Process(
            target=_replica_process, args=(tmp_path, record, replica, 10, start, results)
        )
        for replica in ("eu-1", "eu-2")
    ]
    for process in processes:
        process.start()
    parts = [results.get(timeout=120) for _ in processes]
    for process in processes:
        process.join(30)
        assert process.exitcode == 0
    assert not set(parts[0]) & set(parts[1])
    assert sorted(map(str, store.part_files(tmp_path))) == sorted(parts[0] + parts[1])
    rows = _read_back(tmp_path)
    assert len(rows) == 20 and len({row["id"] for row in rows}) == 20
    assert sorted({row["run_id"].split("-")[1] for row in rows}) == ["eu"]
    assert {row["run_id"].split("-")[2] for row in rows} == {"1", "2"}


def test_a_taken_part_name_is_retried_under_the_next_number(tmp_path, loaded, prompt, caplog):
    """Even with one run id forced on two writers, no part is replaced and no row lost."""
    record = detailed_record(loaded, prompt)
    first = Capture(root=tmp_path, share=1.0, hardware=CPU, chunk_size=1)
    second = Capture(root=tmp_path, share=1.0, hardware=CPU, chunk_size=10)
    second.run_id = first.run_id
    for i in range(2):
        first.add(replace(record, request_id=f"a{i}"), prompt_text="a", output_text="a")
    second.add(replace(record, request_id="b"), prompt_text="b", output_text="b")
    before = {path: path.read_bytes() for path in store.part_files(tmp_path)}
    assert [second.flush() for _ in range(3)] == [0, 0, 1]  # parts 0 and 1 are taken
    assert "already exists: refusing to replace it" in caplog.text
    assert all(path.read_bytes() == data for path, data in before.items())
    assert [Path(p).name for p in second.parts] == [f"part-{first.run_id}-00002.jsonl"]
    assert len(_read_back(tmp_path)) == 3


def test_run_ids_are_unique_and_name_files_safely():
    # Two containers on two hosts of one name, both pid 1, started in the same second.
    same = dict(hostname="Web_01.prod-cluster.example.com", pid=1, started=NOW)
    ids = {capture_run_id(**same) for _ in range(50)}  # the random token tells them apart
    assert len(ids) == 50
    pattern = r"serve-web-01-prod-cluster-exam-20250615T150640-1-[0-9a-f]{6}"  # host: 24 chars
    assert all(re.fullmatch(pattern, i) for i in ids)
    assert capture_run_id("eu-1", **same).startswith("serve-eu-1-web-01-prod-cluster-exam-")
    assert host_label("..") == "host" and host_label("ÄÖ-box") == "box"


@pytest.mark.parametrize("replica", ["", "-lead", "a/b", "a.b", "x" * 41, "eu 1", "eu-1\n"])
def test_a_replica_name_that_cannot_name_a_file_is_refused(tmp_path, replica):
    with pytest.raises(BadInputError, match="cannot name capture parts"):
        Capture(root=tmp_path, share=1.0, hardware=CPU, replica=replica)
