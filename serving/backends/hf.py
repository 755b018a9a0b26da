"""The reference backend: specops's own transformers engine (:mod:`serving.engine.decoder`).

It runs the same :class:`~serving.backends.base.Speculation` the other backends run —
prompt lookup or a draft model folder, a fixed number of drafts per step — so all
targets are compared on equal terms. (The engine's own adaptive policies and its other
drafters are evaluated by :mod:`tasks.evaluate.evaluate`.)
"""

from __future__ import annotations

import time
from typing import Any

from serving.backends.base import Backend, BackendOutput, Speculation
from serving.engine.build import build_decoder
from serving.engine.drafters.base import Drafter
from serving.engine.drafters.factory import build_drafter
from serving.engine.drafters.plan import PLAIN, DraftPlan
from serving.engine.drafters.prompt_lookup import PromptLookupDrafter
from serving.engine.metrics import position_counts
from serving.hardware import cpu_target_for
from serving.loader import load_target, set_threads


class TransformersBackend(Backend):
    name = "transformers"

    def __init__(
        self,
        target_path: str,
        speculation: Speculation,
        *,
        kernels: str = "onednn",
        **options: Any,
    ) -> None:
        """``kernels``: the CPU kernels the target's layers run on; the model is loaded for
        the engine's CPU target with those kernels (:func:`serving.hardware.cpu_target_for`,
        which carries its verify curve): this backend's options come from a request file."""
        super().__init__(target_path, speculation, **options)
        set_threads(self.threads)
        target = load_target(target_path, cpu_target_for(kernels))
        k = speculation.num_speculative_tokens
        plan: DraftPlan = PLAIN
        drafter: Drafter | None = None
        if speculation.method == "ngram":
            plan = DraftPlan.parse(f"pld:{speculation.prompt_lookup_max}", policy="fixed", k=k)
            drafter = PromptLookupDrafter(
                max_ngram=speculation.prompt_lookup_max, min_ngram=speculation.prompt_lookup_min
            )
        elif speculation.method == "draft_model":
            plan = DraftPlan.parse(f"model:{speculation.draft_path}", policy="fixed", k=k)
            drafter = build_drafter(plan.drafter, target)
        self.decoder = build_decoder(target, plan, drafter=drafter)

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
