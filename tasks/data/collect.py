"""Collect failure cases: run traffic through the engine in detailed mode and append every
request's record to the store, partitioned by hardware target and date.

Re-runnable: a record's id is a hash of the collection's run id, the prompt, the drafter
(its settings and version), the draft-length policy, the token budget, the hardware target
and the sampling settings, so a run killed midway and
started again with the same run id skips what it already wrote. Records are written in
chunks, each an atomic part file: readers never see a partial part.
"""

from __future__ import annotations

import hashlib
import json
import logging
from collections.abc import Iterable, Sequence

from pydantic import BaseModel, ConfigDict

from serving.engine import metrics
from serving.engine.decoder import SpeculativeDecoder
from serving.engine.metrics import StepRecord
from serving.engine.sampling import SamplingParams
from serving.hardware import HardwareTarget
from serving.loader import encode_messages
from serving.records import store
from serving.records.schema import DEFAULT_FAILURE_THRESHOLD, from_detailed, record_id
from tasks.data.prompts import Prompt

log = logging.getLogger(__name__)


class CollectSummary(BaseModel):
    """What one collection wrote (``specops data collect --summary``, the loop's replay)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    run_id: str
    prompts: int
    skipped_existing: int
    written: int
    failures: int
    parts: list[str]
    draft_tokens: int
    accepted_tokens: int
    acceptance_rate: float | None
    acceptance_by_position: list[float | None]
    acceptance_by_workload: dict[str, float | None]


def _request_seed(seed: int | None, prompt_id: str) -> int | None:
    if seed is None:
        return None
    digest = hashlib.sha256(f"{seed}:{prompt_id}".encode()).digest()
    return int.from_bytes(digest[:4], "little")


def collect(
    prompts: Sequence[Prompt],
    *,
    decoder: SpeculativeDecoder,
    tokenizer,
    store_root,
    run_id: str,
    hardware: HardwareTarget,
    drafter_version: str = "builtin",
    sampling: SamplingParams | None = None,
    max_new_tokens: int = 64,
    failure_threshold: float = DEFAULT_FAILURE_THRESHOLD,
    chunk_size: int = 8,
    progress: bool = True,
) -> CollectSummary:
    from tqdm.auto import tqdm

    name = hardware.name  # what the records carry and are partitioned by
    sampling = sampling or SamplingParams()
    described = decoder.describe()
    drafter_info = described["drafter"]
    assert isinstance(drafter_info, dict)
    drafter_name = str(drafter_info.get("name"))
    removed = store.remove_stale_temporaries(store_root)
    if removed:
        log.warning("removed %d partial part(s) left by an interrupted run", removed)
    # Everything that changes what a request produces is part of its id: a collection
    # with another policy, k or token budget in the same run slot is new data.
    settings = json.dumps(
        {"drafter": described["drafter"], "policy": described["policy"], "max": max_new_tokens},
        sort_keys=True,
    )
    done = store.existing_ids(store_root)
    keyed = [
        (
            record_id(run_id, p.id, drafter_name, drafter_version, name, sampling, settings),
            p,
        )
        for p in prompts
    ]
    todo = [(key, p) for key, p in keyed if key not in done]
    part_number = store.next_part_number(store_root, run_id)
    parts: list[str] = []
    buffer: list[dict] = []
    written: list[dict] = []

    def flush() -> None:
        nonlocal part_number
        planned = store.plan_parts(store_root, name, run_id, part_number, buffer)
        for path, rows in planned:
            store.write_part(path, rows)  # write-once: never over another writer's part
            parts.append(str(path))
        part_number += len(planned)
        written.extend(buffer)
        buffer.clear()

    for key, prompt in tqdm(todo, desc=f"collecting ({drafter_name})", disable=not progress):
        prompt_ids = encode_messages(tokenizer, prompt.messages)
        request_sampling = SamplingParams(
            temperature=sampling.temperature,
            top_k=sampling.top_k,
            top_p=sampling.top_p,
            seed=_request_seed(sampling.seed, prompt.id),
        )
        result = decoder.generate(
            prompt_ids,
            max_new_tokens=max_new_tokens,
            sampling=request_sampling,
            mode="detailed",
            request_id=key,
        )
        assert result.record is not None
        buffer.append(
            from_detailed(
                result.record,
                record_key=key,
                prompt_id=prompt.id,
                workload=prompt.workload,
                split=prompt.split,
                prompt=prompt.user_text,
                output_text=tokenizer.decode(result.token_ids, skip_special_tokens=True),
                drafter_version=drafter_version,
                hardware=name,
                run_id=run_id,
                failure_threshold=failure_threshold,
            )
        )
        if len(buffer) >= chunk_size:
            flush()
    if buffer:
        flush()
    return summarize_collection(run_id, len(prompts), len(prompts) - len(todo), written, parts)


def acceptance_by_position(steps: Iterable[Sequence[Sequence[int]]]) -> list[float | None]:
    """Pooled over every check of every record (each record's ``steps``, its
    ``[proposed, accepted]`` per check), as serving.engine.metrics defines it."""
    pooled = [
        StepRecord(proposed, accepted, 0, 0.0, 0.0)
        for record_steps in steps
        for proposed, accepted in record_steps
    ]
    return metrics.acceptance_by_position(pooled)


def summarize_collection(
    run_id: str, prompts: int, skipped: int, written: Sequence[dict], parts: list[str]
) -> CollectSummary:
    drafted = sum(r["draft_tokens"] for r in written)
    accepted = sum(r["accepted_tokens"] for r in written)
    by_workload: dict[str, float | None] = {}
    for workload in sorted({r["workload"] for r in written}):
        rows = [r for r in written if r["workload"] == workload]
        d = sum(r["draft_tokens"] for r in rows)
        by_workload[workload] = sum(r["accepted_tokens"] for r in rows) / d if d else None
    return CollectSummary(
        run_id=run_id,
        prompts=prompts,
        skipped_existing=skipped,
        written=len(written),
        failures=sum(1 for r in written if r["is_failure"]),
        parts=parts,
        draft_tokens=drafted,
        accepted_tokens=accepted,
        acceptance_rate=accepted / drafted if drafted else None,
        acceptance_by_position=acceptance_by_position(r["steps"] for r in written),
        acceptance_by_workload=by_workload,
    )
