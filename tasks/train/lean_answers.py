"""The serving target's greedy answers in the lean step's packed batches: the corpus a base
head trains on, at the speed the CPU serves (``specops teacher answers``).

Each prompt is decoded by its own :class:`~serving.engine.decoder.SpeculativeDecoder` (no
drafter) and the requests share packed passes (:func:`serving.engine.batch.batch.decode_together`).
The lean step computes a row the same whatever rows share its pass, so every answer equals
the request's served greedy output, token for token (tested); each is cut after its first
end-of-sequence id, which is kept, as :func:`tasks.train.teacher_answers.greedy_answers` cuts.
Resumable as :func:`tasks.train.teacher_answers.write_answers` is.
"""

from __future__ import annotations

from collections.abc import Sequence

from serving.curves import BatchLimits
from serving.engine.batch.batch import decode_together
from serving.engine.decoder import SpeculativeDecoder
from serving.errors import BadInputError
from serving.target import LoadedTarget


def lean_answers(
    target: LoadedTarget,
    prompts: Sequence[list[int]],
    *,
    max_new_tokens: int,
    limits: BatchLimits,
) -> list[list[int]]:
    """``target``'s greedy answer to each of ``prompts``, decoded together within
    ``limits``, in order."""
    if max_new_tokens < 1:
        raise BadInputError(f"max_new_tokens must be >= 1, got {max_new_tokens}")
    too_long = [len(p) for p in prompts if len(p) + max_new_tokens > target.context_limit]
    if too_long:
        raise BadInputError(
            f"a prompt of {too_long[0]} tokens and {max_new_tokens} new tokens run past the "
            f"target's {target.context_limit} positions; keep prompts shorter"
        )
    decodings = [
        SpeculativeDecoder(target).begin(list(prompt), max_new_tokens=max_new_tokens)
        for prompt in prompts
    ]
    return [list(result.token_ids) for result in decode_together(decodings, target, limits=limits)]
