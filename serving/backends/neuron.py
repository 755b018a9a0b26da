"""AWS Neuron (Trainium / Inferentia): transformers-neuronx's speculative decoding.

Written against transformers-neuronx's API — ``LlamaForSampling`` compiled with
``to_neuron()``, the target's ``enable_speculative_decoder(k)`` and ``SpeculativeGenerator``
— and NEVER RUN: this project has no Neuron device, and PyPI's ``transformers-neuronx`` /
``torch-neuronx`` are placeholders that raise on import (the real packages come from AWS's
own index). Importing this module off a Neuron instance fails, which
:func:`serving.backends.open_backend` turns into a clear error.

The generator returns token ids only, so this backend reports ids and time; its draft
counters stay zero (acceptance on Neuron is not measured: a stated gap).
"""

from __future__ import annotations

import time

import torch
from transformers import AutoTokenizer
from transformers_neuronx import LlamaForSampling  # type: ignore[import-not-found]
from transformers_neuronx.speculation import (  # type: ignore[import-not-found]
    SpeculativeGenerator,
)

from serving.backends.base import Backend, BackendOutput, Speculation

BATCH = 1
N_POSITIONS = 2048


def _compile(path: str, threads: int, dtype: str, speculate: int = 0):
    amp = {"float32": "f32", "bfloat16": "bf16", "float16": "f16"}[dtype]
    model = LlamaForSampling.from_pretrained(
        path, batch_size=BATCH, n_positions=N_POSITIONS, tp_degree=threads, amp=amp
    )
    if speculate:
        model.enable_speculative_decoder(speculate)  # a k-token verification graph
    model.to_neuron()
    return model


class NeuronBackend(Backend):
    name = "neuron"

    def __init__(self, target_path: str, speculation: Speculation, **options) -> None:
        super().__init__(target_path, speculation, **options)
        k = speculation.num_speculative_tokens if speculation.speculative else 0
        self.target = _compile(target_path, self.threads, self.dtype, speculate=k)
        tokenizer = AutoTokenizer.from_pretrained(target_path)
        self.eos = tokenizer.eos_token_id
        self.generator = None
        if speculation.method == "draft_model":
            assert speculation.draft_path is not None
            draft = _compile(speculation.draft_path, self.threads, self.dtype)
            self.generator = SpeculativeGenerator(draft, self.target, k)

    def _generate(self, prompt: list[int], max_new_tokens: int) -> BackendOutput:
        ids = torch.tensor([prompt])
        started = time.perf_counter()
        if self.generator is None:
            out = self.target.sample(ids, sequence_length=len(prompt) + max_new_tokens, top_k=1)
        else:
            out = self.generator.sample(
                ids, sequence_length=len(prompt) + max_new_tokens, eos_token_id=self.eos
            )
        seconds = time.perf_counter() - started
        tokens = [int(t) for t in out[0][len(prompt) :]]
        return BackendOutput(
            token_ids=tokens,
            seconds=seconds,
            checks=len(tokens),
            draft_tokens=0,
            accepted_tokens=0,
        )


BACKEND = NeuronBackend
