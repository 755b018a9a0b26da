"""``specops profile``: measure what a target pass over n tokens costs on this hardware.

The cost-aware draft-length policy needs the shape of ``t_verify(n) / t_verify(1)``; the
simulator needs absolute per-pass times. Both come from here: a warm KV cache of
``context`` tokens, passes over n = 1..max_n new tokens (and over the first-N-layer
drafts), repeated in shuffled order so that machine noise spreads evenly, medians kept.
"""

from __future__ import annotations

import random
import statistics
import time
from typing import TypedDict

import torch

from serving.kv import new_cache, rewind
from serving.models.truncated import first_layers


class PassProfile(TypedDict):
    """What :func:`profile_model` measured (and ``specops profile`` writes as JSON)."""

    context: int  # tokens in the warm KV cache
    repeats: int  # timings per size; medians kept
    threads: int
    target_pass_s: dict[int, float]  # n new tokens -> seconds of one target pass
    verify_curve: list[float]  # t_verify(n) / t_verify(1), n = 1..max_n
    draft_cost: dict[str, float]  # "layers:N" -> one draft pass / one target pass


@torch.inference_mode()
def _time_pass(model, cache, base: int, n: int, vocab: int, generator: torch.Generator) -> float:
    block = torch.randint(0, vocab, (1, n), generator=generator)
    started = time.perf_counter()
    model(input_ids=block, past_key_values=cache, use_cache=True)
    elapsed = time.perf_counter() - started
    rewind(cache, base)
    return elapsed


@torch.inference_mode()
def profile_model(
    model,
    *,
    max_n: int = 16,
    context: int = 256,
    repeats: int = 15,
    draft_layers: tuple[int, ...] = (1, 2, 4, 8),
    seed: int = 0,
    progress: bool = True,
) -> PassProfile:
    from tqdm.auto import tqdm

    vocab = int(model.config.vocab_size)
    generator = torch.Generator().manual_seed(seed)
    prompt = torch.randint(0, vocab, (1, context), generator=generator)
    subjects: dict[str, tuple[torch.nn.Module, list[int]]] = {
        "target": (model, list(range(1, max_n + 1)))
    }
    for layers in draft_layers:
        if layers < model.config.num_hidden_layers:
            subjects[f"layers:{layers}"] = (first_layers(model, layers), [1])
    caches = {}
    for name, (subject, _) in subjects.items():
        cache = new_cache(subject)
        subject(input_ids=prompt, past_key_values=cache, use_cache=True, logits_to_keep=1)
        caches[name] = cache
    jobs = [(name, n) for name, (_, sizes) in subjects.items() for n in sizes] * repeats
    random.Random(seed).shuffle(jobs)
    for name, (subject, _) in subjects.items():  # warm-up
        _time_pass(subject, caches[name], context, 1, vocab, generator)
    times: dict[tuple[str, int], list[float]] = {}
    for name, n in tqdm(jobs, desc="profiling", disable=not progress):
        subject = subjects[name][0]
        times.setdefault((name, n), []).append(
            _time_pass(subject, caches[name], context, n, vocab, generator)
        )
    median = {key: statistics.median(values) for key, values in times.items()}
    unit = median[("target", 1)]
    return {
        "context": context,
        "repeats": repeats,
        "threads": torch.get_num_threads(),
        "target_pass_s": {n: median[("target", n)] for n in range(1, max_n + 1)},
        "verify_curve": [round(median[("target", n)] / unit, 3) for n in range(1, max_n + 1)],
        "draft_cost": {
            name: round(median[(name, 1)] / unit, 3) for name in subjects if name != "target"
        },
    }
