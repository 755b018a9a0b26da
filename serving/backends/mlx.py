"""mlx-lm: ``stream_generate(..., draft_model=, num_draft_tokens=)``.

On this machine MLX runs on its CPU device (``mlx[cpu]``); on Apple silicon the same code
runs on the GPU. Targets and drafts are safetensors folders mlx-lm loads directly (the
export writes them, :mod:`tasks.evaluate.export`); mlx-lm cannot read GGUF. Each generated token
says whether it was an accepted draft (``from_draft``), from which the verification passes
and acceptance by position follow exactly (:func:`serving.backends.base.checks_from_flags`).

Runs in its own environment (``scripts/setup_backend.sh mlx``; no torch there).
"""

from __future__ import annotations

import time

import mlx.core as mx
from mlx_lm import load
from mlx_lm.generate import stream_generate
from mlx_lm.sample_utils import make_sampler

from serving.backends.base import Backend, BackendOutput, Speculation, checks_from_flags
from serving.errors import ModelSourceError

_DTYPES = {"float32": mx.float32, "bfloat16": mx.bfloat16, "float16": mx.float16}


def _load(path: str, dtype: str):
    try:
        model, tokenizer = load(path)
    except (OSError, ValueError, FileNotFoundError) as error:
        raise ModelSourceError(f"mlx-lm cannot load {path!r}: {error}") from None
    if dtype != "float32":
        model.set_dtype(_DTYPES[dtype])
    return model, tokenizer


class MLXBackend(Backend):
    name = "mlx"

    def __init__(self, target_path: str, speculation: Speculation, **options) -> None:
        super().__init__(target_path, speculation, **options)
        mx.set_default_device(mx.cpu if self.device == "cpu" else mx.gpu)
        mx.random.seed(self.seed)
        self.model, self.tokenizer = _load(target_path, self.dtype)
        self.draft = None
        if speculation.method == "draft_model":
            assert speculation.draft_path is not None
            self.draft, _ = _load(speculation.draft_path, self.dtype)
        self.sampler = make_sampler(temp=0.0)

    def _generate(self, prompt: list[int], max_new_tokens: int) -> BackendOutput:
        options: dict = {}
        if self.draft is not None:
            options = {
                "draft_model": self.draft,
                "num_draft_tokens": self.speculation.num_speculative_tokens,
            }
        tokens: list[int] = []
        flags: list[bool] = []
        started = time.perf_counter()
        for response in stream_generate(
            self.model,
            self.tokenizer,
            prompt=prompt,
            max_tokens=max_new_tokens,
            sampler=self.sampler,
            **options,
        ):
            tokens.append(int(response.token))
            flags.append(bool(response.from_draft))
        seconds = time.perf_counter() - started
        k = self.speculation.num_speculative_tokens if self.draft is not None else 0
        counts = checks_from_flags(flags, k)
        counts.token_ids = tokens
        counts.seconds = seconds
        if k == 0:
            counts.checks = len(tokens)
        return counts


BACKEND = MLXBackend
