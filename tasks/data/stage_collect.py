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

from serving.loader import DecoderOptions, build_decoder
from serving.records.schema import DEFAULT_FAILURE_THRESHOLD
from tasks.data.collect import CollectSummary, collect
from tasks.data.prompts import Prompt

log = logging.getLogger(__name__)


def collect_stages(
    prompts: Sequence[Prompt],
    *,
    stages: Sequence[str],
    model,
    tokenizer,
    hardware: str,
    store_root,
    run_id: str,
    k: int = 8,
    max_new_tokens: int = 128,
    failure_threshold: float = DEFAULT_FAILURE_THRESHOLD,
    chunk_size: int = 8,
    progress: bool = True,
) -> dict[str, CollectSummary]:
    """One detailed collection per stage (drafter spec), each with ``fixed(k)``."""
    options = [
        DecoderOptions(drafter=stage, k=k, policy="fixed", hardware=hardware) for stage in stages
    ]
    for option in options:
        option.check()  # every stage spec is checked before the first generation
    summaries: dict[str, CollectSummary] = {}
    for stage, option in zip(stages, options, strict=True):
        log.info("collecting %d prompts with stage %s", len(prompts), stage)
        summaries[stage] = collect(
            prompts,
            decoder=build_decoder(model, tokenizer, option),
            tokenizer=tokenizer,
            store_root=store_root,
            run_id=run_id,
            hardware=hardware,
            max_new_tokens=max_new_tokens,
            failure_threshold=failure_threshold,
            chunk_size=chunk_size,
            progress=progress,
        )
    return summaries
