"""Teacher caches built from collected records: the target's answers are already there.

A collected request record (:mod:`serving.records.schema`) holds the prompt the target saw
(``prompt_token_ids``) and what the target answered (``output_token_ids``: in speculative
decoding every output token is the target's own choice, whichever drafter proposed it).
Replaying that answer needs no generation, only the one teacher-forced pass of
:func:`tasks.train.teacher_build.build_teacher_cache` (its ``answers=``), which records the
target's features and its top-k next-token distribution at every position. The labels the
trainers learn from come from that pass, so an answer that was sampled rather than greedy
still teaches the target's own distribution at each of its positions.

A record with an empty answer (or prompt) has nothing to teach and is skipped, as is a
second record with an id already seen. Below ``min_sequences`` sequences or
``min_answer_tokens`` answer tokens, :class:`TooLittleDataError` is raised before the target
runs: the retraining loop skips that challenger with the error's message as its reason.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, fields
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

from serving.errors import BadInputError
from tasks.train.teacher import TeacherConfig
from tasks.train.teacher_build import TeacherPrompt, TeacherReport, build_teacher_cache

if TYPE_CHECKING:
    from transformers import PreTrainedModel

# The tiny-target trainer tests learn from 24 answers of at most 24 tokens (~500 tokens);
# with less, the held-out slice (at least one sequence) scores one or two answers and a
# retrained draft would be judged on noise.
MIN_SEQUENCES = 8
MIN_ANSWER_TOKENS = 512


class Answered(Protocol):
    """A prompt and the target's answer to it: a collected request record
    (:class:`serving.records.schema.RequestRecord`) or a pair captured in front of vLLM
    (:class:`tasks.data.vllm_pairs.Pair`)."""

    @property
    def id(self) -> str: ...

    @property
    def prompt_token_ids(self) -> list[int]: ...

    @property
    def output_token_ids(self) -> list[int]: ...


class TooLittleDataError(BadInputError):
    """The records hold too few usable sequences or answer tokens to train a draft on."""


@dataclass(frozen=True)
class StoreTeacherReport(TeacherReport):
    answer_tokens: int = 0  # answer tokens over the sequences kept
    skipped_empty: int = 0  # records with no answer (or no prompt) tokens
    skipped_duplicate: int = 0  # records whose id was already seen


@dataclass(frozen=True)
class UsableRecords:
    """What of the records a teacher cache is built from."""

    prompts: list[TeacherPrompt]
    answers: dict[str, list[int]]
    skipped_empty: int
    skipped_duplicate: int

    @property
    def answer_tokens(self) -> int:
        return sum(map(len, self.answers.values()))


def usable_records(records: Iterable[Answered]) -> UsableRecords:
    """The records' prompts and answers, sorted by id (a re-run over the same records, in any
    order, cuts the same shards and so resumes), without empty or repeated ones."""
    prompts: dict[str, TeacherPrompt] = {}
    answers: dict[str, list[int]] = {}
    empty = duplicate = 0
    for record in records:
        record_id = record.id
        prompt = list(record.prompt_token_ids)
        answer = list(record.output_token_ids)
        if not prompt or not answer:
            empty += 1
        elif record_id in prompts:
            duplicate += 1
        else:
            prompts[record_id] = TeacherPrompt(record_id, prompt)
            answers[record_id] = answer
    ordered = [prompts[record_id] for record_id in sorted(prompts)]
    return UsableRecords(ordered, answers, empty, duplicate)


def check_enough(usable: UsableRecords, *, min_sequences: int, min_answer_tokens: int) -> None:
    """Raise :class:`TooLittleDataError` saying what there is and what is needed."""
    sequences, tokens = len(usable.prompts), usable.answer_tokens
    if sequences >= min_sequences and tokens >= min_answer_tokens:
        return
    skipped = usable.skipped_empty + usable.skipped_duplicate
    raise TooLittleDataError(
        f"too little data to train a draft: {sequences} sequences with {tokens} answer tokens "
        f"({skipped} records skipped: {usable.skipped_empty} empty, "
        f"{usable.skipped_duplicate} repeated ids); at least {min_sequences} sequences and "
        f"{min_answer_tokens} answer tokens are needed. Collect more records first"
    )


def build_store_teacher(
    records: Iterable[Answered],
    target: PreTrainedModel,
    cache_dir: str | Path,
    *,
    eos_token_ids: Sequence[int],
    top_k: int = 8,
    min_sequences: int = MIN_SEQUENCES,
    min_answer_tokens: int = MIN_ANSWER_TOKENS,
    mask_token_id: int | None = None,
    progress: bool = True,
) -> StoreTeacherReport:
    """A teacher cache at ``cache_dir`` from collected ``records`` (request records or
    captured pairs: ``id``, ``prompt_token_ids``, ``output_token_ids``), teacher-forcing each
    answer
    (nothing is generated; see the module docstring). Resumable as
    :func:`~tasks.train.teacher_build.build_teacher_cache` is: a re-run over the same records
    skips the shards already written.

    ``max_new_tokens`` of the cache's :class:`TeacherConfig` is the longest answer kept, so
    a cache built from other records is refused rather than mixed (use a new folder).
    ``mask_token_id``: the token redaction masked secrets with (captured traffic), left out
    of the trainers' losses."""
    if min_sequences < 1 or min_answer_tokens < 1:
        raise BadInputError(
            f"min_sequences and min_answer_tokens must be >= 1, got {min_sequences} and "
            f"{min_answer_tokens}"
        )
    usable = usable_records(records)
    check_enough(usable, min_sequences=min_sequences, min_answer_tokens=min_answer_tokens)
    config = TeacherConfig(
        max_new_tokens=max(map(len, usable.answers.values())),
        top_k=top_k,
    )
    report = build_teacher_cache(
        target,
        usable.prompts,
        cache_dir,
        eos_token_ids=eos_token_ids,
        config=config,
        answers=usable.answers,
        mask_token_id=mask_token_id,
        progress=progress,
    )
    return StoreTeacherReport(
        **{field.name: getattr(report, field.name) for field in fields(report)},
        answer_tokens=usable.answer_tokens,
        skipped_empty=usable.skipped_empty,
        skipped_duplicate=usable.skipped_duplicate,
    )
