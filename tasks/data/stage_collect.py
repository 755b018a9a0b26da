"""Training data for the acceptance predictor: the same traffic through every stage.

A cascade only verifies the stage it chooses, so the records it leaves behind say little
about the stages it passed over. To train (or re-train) the predictor on every stage alike,
this replays the traffic through each stage on its own, always drafting ``k`` tokens
(``fixed`` policy: every block position gets rows), in detailed mode, into one store: the
record ids differ by drafter, so a re-run skips what it wrote.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

from serving.engine.build import build_decoder
from serving.engine.drafters.plan import DraftPlan
from serving.records.schema import DEFAULT_FAILURE_THRESHOLD
from serving.target import LoadedTarget
from tasks.data.collect import CollectSummary, collect
from tasks.data.prompts import Prompt

log = logging.getLogger(__name__)


def collect_stages(
    prompts: Sequence[Prompt],
    *,
    stages: Sequence[str],
    target: LoadedTarget,
    store_root,
    run_id: str,
    k: int = 8,
    max_new_tokens: int = 128,
    failure_threshold: float = DEFAULT_FAILURE_THRESHOLD,
    chunk_size: int = 8,
    progress: bool = True,
) -> dict[str, CollectSummary]:
    """One detailed collection per stage (drafter spec), each with ``fixed(k)``, on
    ``target`` (its records name its hardware target)."""
    # every stage spec is checked before the first generation
    plans = [DraftPlan.parse(stage, policy="fixed", k=k) for stage in stages]
    summaries: dict[str, CollectSummary] = {}
    for stage, plan in zip(stages, plans, strict=True):
        log.info("collecting %d prompts with stage %s", len(prompts), stage)
        summaries[stage] = collect(
            prompts,
            decoder=build_decoder(target, plan),
            tokenizer=target.tokenizer,
            store_root=store_root,
            run_id=run_id,
            hardware=target.hardware,
            max_new_tokens=max_new_tokens,
            failure_threshold=failure_threshold,
            chunk_size=chunk_size,
            progress=progress,
        )
    return summaries
