"""The base head's prompts: ShareGPT's training split, less what the product itself draws.

A base head trains once on the target's own answers to as many training prompts as there
are (issue 51). Never held-out ones (the split is a hash of the id,
:func:`tasks.data.prompts.split_of`), and never the training prompts that the main job, the
bench or the replicas draw from the same split (``build_workload(..., split="train")``):
their selection is a seeded ranking of which a larger draw extends a smaller one, so
reserving the first ``reserve`` of each (workload, seed) ranking covers every draw of at
most that many. A grounded prompt is reserved by its source conversation, so a corpus
prompt never shares a ShareGPT conversation with a reserved one.
"""

from __future__ import annotations

from collections.abc import Sequence

from serving.errors import BadInputError

# Workloads whose prompts come from ShareGPT conversations (grounded text edits quote a
# ShareGPT reply).
RESERVED_WORKLOADS = ("sharegpt", "grounded")


def source_of(prompt_id: str) -> str:
    """The ShareGPT prompt id a prompt was made from (``sharegpt:CONV:0``), or the id itself
    when it names none (a HumanEval problem)."""
    start = prompt_id.find("sharegpt:")
    return prompt_id[start:] if start >= 0 else prompt_id


def reserved_sources(reserve: int, seeds: Sequence[int]) -> set[str]:
    """The sources of the first ``reserve`` training prompts of each of
    :data:`RESERVED_WORKLOADS` under each of ``seeds``."""
    from tasks.data.traffic import build_workload

    if reserve < 0:
        raise BadInputError(f"reserve must be >= 0, got {reserve}")
    if not reserve:
        return set()
    return {
        source_of(prompt.id)
        for seed in seeds
        for workload in RESERVED_WORKLOADS
        for prompt in build_workload(workload, reserve, seed=seed, split="train")
    }


def corpus_prompts(candidates: Sequence, reserved: set[str]) -> list:
    """``candidates`` (prompts with an ``id``) whose source is not ``reserved``, in order."""
    return [p for p in candidates if source_of(p.id) not in reserved]
