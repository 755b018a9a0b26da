"""How each bench method generates for one prompt, timed: Hugging Face ``generate`` (greedy,
assisted, prompt lookup, static cache) of the stock model, the specops decoder of its
hardware target's model, and llama.cpp in its own process."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, cast

import torch

from serving.engine.build import build_decoder
from serving.engine.decoder import SpeculativeDecoder
from serving.models.truncated import first_layers
from serving.target import LoadedTarget
from tasks.bench.bench_config import BenchConfig, MethodConfig, engine_key, method_plan
from tasks.bench.llamacpp import LlamaCppProcess
from tasks.bench.profile import sync

if TYPE_CHECKING:
    from transformers import PreTrainedModel


@dataclass
class Outcome:
    token_ids: list[int]
    seconds: float
    stats: dict[str, object] | None = None


Runner = Callable[[list[int]], Outcome]


def _hf_runner(
    model: PreTrainedModel, *, max_new_tokens: int, pad_id: int, **generate_kwargs: object
) -> Runner:
    """HF ``generate`` of ``model`` (a causal LM: it has transformers' generation mixin)."""
    device = next(model.parameters()).device
    generate = cast("Callable[..., torch.Tensor]", model.generate)

    def run(prompt_ids: list[int]) -> Outcome:
        input_ids = torch.tensor([prompt_ids], device=device)
        sync(device)
        started = time.perf_counter()
        with torch.inference_mode():
            out = generate(
                input_ids,
                attention_mask=torch.ones_like(input_ids),
                max_new_tokens=max_new_tokens,
                do_sample=False,
                pad_token_id=pad_id,
                **generate_kwargs,
            )
        sync(device)
        seconds = time.perf_counter() - started
        return Outcome(out[0, len(prompt_ids) :].tolist(), seconds)

    return run


def _specops_runner(decoder: SpeculativeDecoder, *, max_new_tokens: int) -> Runner:
    def run(prompt_ids: list[int]) -> Outcome:
        started = time.perf_counter()
        result = decoder.generate(prompt_ids, max_new_tokens=max_new_tokens)
        seconds = time.perf_counter() - started
        return Outcome(result.token_ids, seconds, result.stats.to_dict())

    return run


def _llamacpp_runner(
    process: LlamaCppProcess, method: MethodConfig, *, max_new_tokens: int, eos: list[int]
) -> Runner:
    lookup = method.mode == "prompt_lookup"

    def run(prompt_ids: list[int]) -> Outcome:
        out = process.generate(
            prompt_ids,
            max_new_tokens=max_new_tokens,
            mode=str(method.mode),
            num_pred_tokens=method.num_pred_tokens if lookup else None,
            eos=eos,
        )
        return Outcome(out.token_ids, out.seconds)

    return run


def make_runners(
    stock: LoadedTarget,
    engine_targets: dict[str, LoadedTarget],
    config: BenchConfig,
    *,
    llamacpp: LlamaCppProcess | None = None,
) -> dict[str, Runner]:
    """HF methods run ``stock``'s model (stock kernels); a specops method runs the target
    loaded for its hardware target (``engine_targets[engine_key(method, config)]``);
    llama.cpp methods run in ``llamacpp``, and are left out when it is ``None`` (skipped).
    Every method stops at ``stock``'s end-of-sequence ids."""
    model = stock.model
    draft_model = None
    runners: dict[str, Runner] = {}
    eos = list(stock.eos_token_ids)
    pad_id = eos[0]
    for method in config.methods:
        if method.engine == "hf":
            kwargs: dict[str, object] = {}
            if method.mode == "assisted":
                if draft_model is None:
                    draft_model = first_layers(model, config.draft_layers)
                kwargs["assistant_model"] = draft_model
            elif method.mode == "prompt_lookup":
                kwargs["prompt_lookup_num_tokens"] = method.prompt_lookup_num_tokens
            elif method.mode == "static":
                kwargs["cache_implementation"] = "static"
            runners[method.name] = _hf_runner(
                model, max_new_tokens=config.max_new_tokens, pad_id=pad_id, **kwargs
            )
        elif method.engine == "specops":
            target = engine_targets[str(engine_key(method, config))]
            decoder = build_decoder(
                target, method_plan(method, config), relax_lambda=method.relax_lambda
            )
            runners[method.name] = _specops_runner(decoder, max_new_tokens=config.max_new_tokens)
        elif llamacpp is not None:
            runners[method.name] = _llamacpp_runner(
                llamacpp, method, max_new_tokens=config.max_new_tokens, eos=eos
            )
    return runners
