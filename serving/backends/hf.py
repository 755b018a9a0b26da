"""The reference backend: specops's own transformers engine (:mod:`serving.engine`).

It runs the same :class:`~serving.backends.base.Speculation` the other backends run —
prompt lookup or a draft model folder, a fixed number of drafts per step — so all
targets are compared on equal terms. (The engine's own adaptive policies and its other
drafters are evaluated by :mod:`tasks.evaluate.evaluate`.)
"""

from __future__ import annotations

import time

from serving.backends.base import Backend, BackendOutput, Speculation
from serving.drafters.base import Drafter
from serving.drafters.factory import build_drafter
from serving.drafters.prompt_lookup import PromptLookupDrafter
from serving.engine import SpeculativeDecoder
from serving.loader import eos_ids, load_target, set_threads
from serving.metrics import position_counts
from serving.policy import FixedK


class TransformersBackend(Backend):
    name = "transformers"

    def __init__(
        self, target_path: str, speculation: Speculation, *, kernels: str = "onednn", **options
    ) -> None:
        super().__init__(target_path, speculation, **options)
        set_threads(self.threads)
        model, tokenizer = load_target(target_path, kernels=kernels)
        drafter: Drafter | None = None
        if speculation.method == "ngram":
            drafter = PromptLookupDrafter(
                max_ngram=speculation.prompt_lookup_max, min_ngram=speculation.prompt_lookup_min
            )
        elif speculation.method == "draft_model":
            drafter = build_drafter(f"model:{speculation.draft_path}", model, tokenizer)
        policy = FixedK(speculation.num_speculative_tokens) if drafter else None
        self.decoder = SpeculativeDecoder(
            model, drafter=drafter, policy=policy, eos_token_ids=eos_ids(model, tokenizer)
        )

    def _generate(self, prompt: list[int], max_new_tokens: int) -> BackendOutput:
        started = time.perf_counter()
        result = self.decoder.generate(prompt, max_new_tokens=max_new_tokens)
        seconds = time.perf_counter() - started
        reached, kept = position_counts(result.steps)
        return BackendOutput(
            token_ids=result.token_ids,
            seconds=seconds,
            checks=result.stats.checks,
            draft_tokens=result.stats.draft_tokens,
            accepted_tokens=result.stats.accepted_tokens,
            reached_by_position=reached,
            kept_by_position=kept,
        )


BACKEND = TransformersBackend
