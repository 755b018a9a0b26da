"""Collection on the tiny target: chunked atomic parts, valid records, re-runs and resumes."""

from __future__ import annotations

import os
import time

import pytest

from serving.engine.sampling import SamplingParams
from serving.hardware import hardware_target
from serving.records.schema import RequestRecord, is_failure
from serving.records.store import part_files, partition_dir, read_raw
from tasks.data.collect import acceptance_by_position, collect, summarize_collection

MAX_NEW_TOKENS = 16


def _collect(prompts, decoder, tokenizer, root, **kwargs):
    options = dict(
        store_root=root,
        run_id="run-1",
        hardware=hardware_target("cpu"),
        max_new_tokens=MAX_NEW_TOKENS,
        chunk_size=2,
        progress=False,
    )
    options.update(kwargs)
    return collect(prompts, decoder=decoder, tokenizer=tokenizer, **options)


def _rows(root) -> list[dict]:
    return [row for _, row in read_raw(root)]


def _lines_per_part(root) -> dict[str, int]:
    return {p.name: len(p.read_text().splitlines()) for p in part_files(root)}


def test_records_are_written_in_parts_of_chunk_size(
    tmp_path, pld_decoder, char_tokenizer, make_prompts
):
    prompts = make_prompts()[:5]
    summary = _collect(prompts, pld_decoder, char_tokenizer, tmp_path, drafter_version="v2")
    assert _lines_per_part(tmp_path) == {
        "part-run-1-00000.jsonl": 2,
        "part-run-1-00001.jsonl": 2,
        "part-run-1-00002.jsonl": 1,
    }
    assert summary.parts == [str(p) for p in part_files(tmp_path)]
    assert {p.parent for p in part_files(tmp_path)} == {partition_dir(tmp_path, "cpu", time.time())}
    rows = _rows(tmp_path)
    assert [r["prompt_id"] for r in rows] == [p.id for p in prompts]
    for row, prompt in zip(rows, prompts, strict=True):
        parsed = RequestRecord.model_validate(row)
        assert parsed.model_dump(mode="json") == row
        assert row["prompt"] == prompt.messages[0]["content"]
        assert row["prompt_token_ids"] == char_tokenizer(row["prompt"])["input_ids"]
        assert row["output_text"] == char_tokenizer.decode(row["output_token_ids"])
        assert 1 <= len(row["output_token_ids"]) <= MAX_NEW_TOKENS
        assert (row["workload"], row["split"]) == (prompt.workload, prompt.split)
        assert row["run_id"] == "run-1" and row["hardware"] == "cpu"
        assert row["drafter"] == "pld(n=1..3)" and row["drafter_version"] == "v2"
        assert row["policy"] == "fixed"
    assert summary.prompts == summary.written == 5
    assert summary.skipped_existing == 0
    assert summary.draft_tokens == sum(r["draft_tokens"] for r in rows) > 0
    assert summary.accepted_tokens == sum(r["accepted_tokens"] for r in rows)
    assert summary.acceptance_by_workload == {"grounded": summary.acceptance_rate}


@pytest.mark.parametrize("threshold", [0.0, 0.05, 0.5, 1.0])
def test_failure_flags_follow_the_threshold(
    tmp_path, pld_decoder, char_tokenizer, make_prompts, threshold
):
    summary = _collect(
        make_prompts(), pld_decoder, char_tokenizer, tmp_path, failure_threshold=threshold
    )
    rows = _rows(tmp_path)
    assert all(r["failure_threshold"] == threshold for r in rows)
    assert [r["is_failure"] for r in rows] == [
        is_failure(r["acceptance_rate"], threshold) for r in rows
    ]
    assert summary.failures == sum(r["is_failure"] for r in rows)
    if threshold == 0.0:
        assert summary.failures == 0
    if threshold == 1.0:  # the random target rejects most drafts
        assert summary.failures > 0


def test_rerun_with_the_same_run_id_writes_nothing(
    tmp_path, pld_decoder, char_tokenizer, make_prompts
):
    prompts = make_prompts()
    _collect(prompts, pld_decoder, char_tokenizer, tmp_path)
    before = {p: p.read_bytes() for p in part_files(tmp_path)}
    again = _collect(prompts, pld_decoder, char_tokenizer, tmp_path)
    assert (again.written, again.skipped_existing, again.parts) == (0, len(prompts), [])
    assert again.acceptance_rate is None and again.acceptance_by_position == []
    assert {p: p.read_bytes() for p in part_files(tmp_path)} == before
    # Another collection of the same prompts is new data, with new ids.
    other = _collect(prompts, pld_decoder, char_tokenizer, tmp_path, run_id="run-2")
    assert other.written == len(prompts)
    ids = [r["id"] for r in _rows(tmp_path)]
    assert len(ids) == len(set(ids)) == 2 * len(prompts)


def test_interrupted_run_resumes_with_exactly_the_missing_records(
    tmp_path, pld_decoder, char_tokenizer, make_prompts
):
    prompts = make_prompts()[:5]
    generate = pld_decoder.generate
    calls = []

    def dies_on_the_third_request(*args, **kwargs):
        calls.append(kwargs["request_id"])
        if len(calls) == 3:
            raise RuntimeError("killed")
        return generate(*args, **kwargs)

    pld_decoder.generate = dies_on_the_third_request
    with pytest.raises(RuntimeError, match="killed"):
        _collect(prompts, pld_decoder, char_tokenizer, tmp_path)
    # The first chunk is committed; nothing of the second is visible, no temporary is left.
    assert _lines_per_part(tmp_path) == {"part-run-1-00000.jsonl": 2}
    assert [r["prompt_id"] for r in _rows(tmp_path)] == ["p0", "p1"]
    assert not [name for _, _, names in os.walk(tmp_path) for name in names if name[0] == "."]

    pld_decoder.generate = generate
    resumed = _collect(prompts, pld_decoder, char_tokenizer, tmp_path)
    assert (resumed.skipped_existing, resumed.written) == (2, 3)
    assert _lines_per_part(tmp_path) == {
        "part-run-1-00000.jsonl": 2,
        "part-run-1-00001.jsonl": 2,
        "part-run-1-00002.jsonl": 1,
    }
    rows = _rows(tmp_path)
    assert [r["prompt_id"] for r in rows] == [p.id for p in prompts]
    ids = [r["id"] for r in rows]
    assert len(set(ids)) == len(prompts)
    assert ids[:3] == calls  # the records keep the ids the interrupted run used

    # The resumed store holds what one uninterrupted run writes (greedy is deterministic).
    clean = tmp_path / "clean"
    _collect(prompts, pld_decoder, char_tokenizer, clean)
    fields = ("id", "output_token_ids", "steps", "is_failure")
    assert [{f: r[f] for f in fields} for r in _rows(clean)] == [
        {f: r[f] for f in fields} for r in rows
    ]


def test_a_malformed_copy_is_collected_again(tmp_path, pld_decoder, char_tokenizer, make_prompts):
    prompts = make_prompts()[:2]
    _collect(prompts, pld_decoder, char_tokenizer, tmp_path, chunk_size=8)
    (part,) = part_files(tmp_path)
    first, second = part.read_text().splitlines()
    part.write_text(first + "\n" + second[: len(second) // 2] + "\n")  # a damaged line
    again = _collect(prompts, pld_decoder, char_tokenizer, tmp_path, chunk_size=8)
    assert (again.skipped_existing, again.written) == (1, 1)
    assert again.parts[0].endswith("part-run-1-00001.jsonl")


def test_stale_temporaries_are_removed_before_collecting(
    tmp_path, pld_decoder, char_tokenizer, make_prompts
):
    folder = partition_dir(tmp_path, "cpu", time.time())
    folder.mkdir(parents=True)
    stale = folder / ".part-run-1-00000.jsonl.x.tmp"
    stale.write_text('{"half')
    long_ago = time.time() - 86_400
    os.utime(stale, (long_ago, long_ago))
    _collect(make_prompts()[:1], pld_decoder, char_tokenizer, tmp_path)
    assert not stale.exists()


def test_sampled_collection_is_reproducible_per_prompt(
    tmp_path, pld_decoder, char_tokenizer, make_prompts
):
    prompts = make_prompts()[:3]
    sampling = SamplingParams(temperature=1.0, top_p=0.9, seed=11)
    for run_id in ("a", "b"):
        _collect(prompts, pld_decoder, char_tokenizer, tmp_path, run_id=run_id, sampling=sampling)
    rows = _rows(tmp_path)
    first, second = rows[:3], rows[3:]
    assert [r["output_token_ids"] for r in first] == [r["output_token_ids"] for r in second]
    seeds = [r["sampling"]["seed"] for r in first]
    assert None not in seeds and len(set(seeds)) == 3  # one seed per prompt
    assert first[0]["sampling"]["temperature"] == 1.0
    assert first[0]["id"] != second[0]["id"]  # another run id is another collection


def test_bad_hardware_fails_before_any_write(tmp_path, pld_decoder, char_tokenizer, make_prompts):
    from serving.errors import BadInputError

    bad = hardware_target("cpu").model_copy(update={"name": "a/b"})
    with pytest.raises(BadInputError, match="cannot name a partition"):
        _collect(make_prompts()[:1], pld_decoder, char_tokenizer, tmp_path, hardware=bad)
    assert part_files(tmp_path) == []


# ------------------------------------------------------------------------ summaries


def test_acceptance_by_position_pools_every_check():
    steps = [[[2, 1], [3, 3]], [[1, 0], [0, 0]]]  # two records' checks
    # position 1: reached by 3 checks, kept by 2; position 2: 2 and 1; position 3: 1 and 1.
    assert acceptance_by_position(steps) == pytest.approx([2 / 3, 1 / 2, 1.0])
    assert acceptance_by_position([[[0, 0]]]) == []
    assert acceptance_by_position([]) == []


def test_summary_pools_per_workload_and_keeps_none_for_no_drafts():
    written = [
        {"workload": "sharegpt", "draft_tokens": 4, "accepted_tokens": 1, "is_failure": True,
         "steps": [[4, 1]]},
        {"workload": "sharegpt", "draft_tokens": 4, "accepted_tokens": 3, "is_failure": False,
         "steps": [[4, 3]]},
        {"workload": "humaneval", "draft_tokens": 0, "accepted_tokens": 0, "is_failure": False,
         "steps": [[0, 0]]},
    ]  # fmt: skip
    summary = summarize_collection("r", 5, 2, written, ["a"])
    assert summary.acceptance_by_workload == {"humaneval": None, "sharegpt": 0.5}
    assert (summary.prompts, summary.skipped_existing, summary.written) == (5, 2, 3)
    assert (summary.failures, summary.acceptance_rate) == (1, 0.5)
    assert summary.acceptance_by_position == [1.0, 0.5, 0.5, 0.0]
    assert summary.model_dump(mode="json")["parts"] == ["a"]


def test_a_new_token_budget_in_the_same_run_is_new_data(
    tmp_path, pld_decoder, char_tokenizer, make_prompts
):
    prompts = make_prompts()[:2]
    _collect(prompts, pld_decoder, char_tokenizer, tmp_path)
    again = _collect(prompts, pld_decoder, char_tokenizer, tmp_path, max_new_tokens=5)
    assert again.written == 2 and again.skipped_existing == 0
