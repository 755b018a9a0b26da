"""Teacher caches from collected records on the tiny target: what is recorded, what is
skipped, resuming, the minimums, and a head trained on the result. Prompts and answers are
random token ids (tests only)."""

from __future__ import annotations

import pytest
import torch

from serving.errors import BadInputError
from serving.records.schema import RequestRecord, parse_record
from tasks.train.store_teacher import (
    StoreTeacherReport,
    TooLittleDataError,
    build_store_teacher,
)
from tasks.train.teacher import TeacherConfig, load_teacher_data, read_manifest
from tasks.train.teacher_build import TeacherPrompt, build_teacher_cache
from tasks.train.train_head import TrainHeadConfig, train_head
from tests.tasks.data.test_validate import make_record

pytestmark = pytest.mark.usefixtures("one_thread")  # see tests/conftest.py


def records(n: int, *, seed: int = 0, answer_len: int = 12) -> list[RequestRecord]:
    """Request records as validation gives them (only the prompts and answers matter)."""
    generator = torch.Generator().manual_seed(seed)
    rows = []
    for i in range(n):
        prompt = torch.randint(3, 96, (6 + i % 3,), generator=generator).tolist()
        answer = torch.randint(3, 96, (answer_len - i % 4,), generator=generator).tolist()
        rows.append(
            parse_record(
                make_record(
                    i,
                    id=f"r{i:02d}",
                    prompt_token_ids=prompt,
                    output_token_ids=[*answer, 2],  # ends with EOS, as the engine's do
                    acceptance_rate=0.1,
                )
            )
        )
    return rows


def build(rows, target, path, **settings):
    settings = {"min_sequences": 2, "min_answer_tokens": 10, "progress": False, **settings}
    return build_store_teacher(rows, target, path, eos_token_ids=[2], **settings)


def test_each_record_is_teacher_forced_with_its_own_answer(target, tmp_path):
    rows = records(5)
    report = build(list(reversed(rows)), target, tmp_path / "cache", top_k=4)
    assert isinstance(report, StoreTeacherReport)
    assert (report.sequences, report.generated_tokens, report.generate_tokens_per_s) == (5, 0, None)
    assert report.answer_tokens == sum(len(r.output_token_ids) for r in rows)
    manifest, sequences = load_teacher_data(tmp_path / "cache")
    longest = max(len(r.output_token_ids) for r in rows)
    assert (manifest.config.max_new_tokens, manifest.config.top_k) == (longest, 4)
    assert [s.prompt_id for s in sequences] == [r.id for r in rows]  # sorted by id
    for row, sequence in zip(rows, sequences, strict=True):
        assert sequence.tokens.tolist() == row.prompt_token_ids + row.output_token_ids
        assert sequence.prompt_len == len(row.prompt_token_ids)
    # The same as build_teacher_cache given those answers: the target's own pass, recorded.
    prompts = [TeacherPrompt(r.id, r.prompt_token_ids) for r in rows]
    answers = {r.id: r.output_token_ids for r in rows}
    config = TeacherConfig(max_new_tokens=longest, top_k=4)
    build_teacher_cache(
        target, prompts, tmp_path / "direct", eos_token_ids=[2], config=config,
        answers=answers, progress=False,
    )  # fmt: skip
    _, direct = load_teacher_data(tmp_path / "direct")
    for ours, theirs in zip(sequences, direct, strict=True):
        assert torch.equal(ours.features, theirs.features)
        assert torch.equal(ours.top_ids, theirs.top_ids)


def test_empty_and_repeated_records_are_skipped(target, tmp_path):
    rows = records(4)
    rows[1] = rows[1].model_copy(update={"output_token_ids": []})
    rows.append(rows[0].model_copy(update={"output_token_ids": [7, 8, 2]}))  # the same id again
    rows.append(
        rows[0].model_copy(update={"id": "r99", "prompt_token_ids": [], "output_token_ids": [5, 2]})
    )
    report = build(rows, target, tmp_path)
    assert (report.sequences, report.skipped_empty, report.skipped_duplicate) == (3, 2, 1)
    _, sequences = load_teacher_data(tmp_path)
    assert [s.prompt_id for s in sequences] == ["r00", "r02", "r03"]
    first = rows[0].prompt_token_ids + rows[0].output_token_ids
    assert sequences[0].tokens.tolist() == first  # the first record of an id is kept


def test_a_rerun_over_the_same_records_resumes(target, tmp_path):
    rows = records(6)
    first = build(rows, target, tmp_path)
    assert (first.shards_written, first.shards_skipped) == (1, 0)
    again = build(list(reversed(rows)), target, tmp_path)
    assert (again.shards_written, again.shards_skipped) == (0, 1)
    assert again.tokens == first.tokens
    # Other records give another longest answer: refused rather than mixed.
    with pytest.raises(BadInputError, match="use a new folder"):
        build(records(6, answer_len=20), target, tmp_path)


def test_too_little_data_is_refused_before_the_target_runs(target, tmp_path):
    rows = records(3)
    rows[2] = rows[2].model_copy(update={"output_token_ids": []})
    tokens = sum(len(r.output_token_ids) for r in rows)
    with pytest.raises(TooLittleDataError) as caught:
        build(rows, target, tmp_path / "cache", min_sequences=3, min_answer_tokens=10)
    message = str(caught.value)
    assert f"2 sequences with {tokens} answer tokens" in message
    assert "1 empty" in message and "at least 3 sequences and 10 answer tokens" in message
    assert isinstance(caught.value, BadInputError)  # what the loop catches
    with pytest.raises(TooLittleDataError, match=f"at least 1 sequences and {tokens + 1} answer"):
        build(rows, target, tmp_path / "cache", min_sequences=1, min_answer_tokens=tokens + 1)
    with pytest.raises(TooLittleDataError, match="0 sequences with 0 answer tokens"):
        build([], target, tmp_path / "cache")
    assert read_manifest(tmp_path / "cache") is None  # nothing was written


def test_a_head_trains_on_a_store_teacher_cache(target, tmp_path):
    build(records(12), target, tmp_path / "cache")
    config = TrainHeadConfig(
        teacher_dir=tmp_path / "cache", output_dir=tmp_path / "head", max_steps=3,
        batch_size=2, intermediate_size=48, eval_every=3, checkpoint_every=3,
    )  # fmt: skip
    result = train_head(config, target, progress=False)
    assert result.steps == 3 and result.train_sequences + result.heldout_sequences == 12
