"""``specops profile``: measure what a target pass over n tokens costs on a hardware target.

The cost-aware draft-length policy needs the shape of ``t_verify(n) / t_verify(1)``; the
simulator needs absolute per-pass times. Both come from here: a warm KV cache of
``context`` tokens, passes over n = 1..max_n new tokens (and over the first-N-layer
drafts), repeated in shuffled order so that machine noise spreads evenly, medians kept.

The model is measured where it runs: on the device, in the dtype and with the kernels of
its hardware target (``configs/hardware.yaml``). On CUDA a forward pass only queues
kernels, so every timed pass is fenced by ``torch.cuda.synchronize`` on both sides.
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
    device: str  # where the passes ran, e.g. "cpu" or "cuda:0"
    device_name: str  # the GPU's name on CUDA, "cpu" otherwise
    dtype: str  # the target's weights, e.g. "float32"
    target_pass_s: dict[int, float]  # n new tokens -> seconds of one target pass
    verify_curve: list[float]  # t_verify(n) / t_verify(1), n = 1..max_n
    # verify_curve made non-decreasing (a longer pass never costs less): what
    # configs/hardware.yaml takes, as the cost-aware policy reads it
    config_curve: list[float]
    draft_cost: dict[str, float]  # "layers:N" -> one draft pass / one target pass


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


@torch.inference_mode()
def _time_pass(model, cache, base: int, n: int, vocab: int, generator: torch.Generator) -> float:
    device = next(model.parameters()).device
    # Drawn on the CPU generator whatever the device: the same blocks for a seed everywhere.
    block = torch.randint(0, vocab, (1, n), generator=generator).to(device)
    _sync(device)  # nothing queued before the clock starts (the block's copy included)
    started = time.perf_counter()
    model(input_ids=block, past_key_values=cache, use_cache=True)
    _sync(device)  # the pass has run, not only been queued
    elapsed = time.perf_counter() - started
    rewind(cache, base)
    return elapsed


def config_curve(curve: list[float]) -> list[float]:
    """``curve`` made non-decreasing (running maximum), as ``configs/hardware.yaml`` takes
    it: a pass over more tokens never costs less than one over fewer."""
    out: list[float] = []
    for cost in curve:
        out.append(max(cost, out[-1]) if out else cost)
    return out


def curve_yaml(curve: list[float]) -> str:
    """The ``verify_curve:`` line to paste under a target in ``configs/hardware.yaml``."""
    return "verify_curve: [" + ", ".join(str(float(c)) for c in curve) + "]"


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
    """Profile ``model`` on the device its weights are on."""
    from tqdm.auto import tqdm

    weight = next(model.parameters())
    device = weight.device
    vocab = int(model.config.vocab_size)
    generator = torch.Generator().manual_seed(seed)
    prompt = torch.randint(0, vocab, (1, context), generator=generator).to(device)
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
    # Warm-up: every size once (a GPU picks and caches its kernels per shape on first use).
    for name, (subject, sizes) in subjects.items():
        for n in sizes:
            _time_pass(subject, caches[name], context, n, vocab, generator)
    times: dict[tuple[str, int], list[float]] = {}
    for name, n in tqdm(jobs, desc="profiling", disable=not progress):
        subject = subjects[name][0]
        times.setdefault((name, n), []).append(
            _time_pass(subject, caches[name], context, n, vocab, generator)
        )
    median = {key: statistics.median(values) for key, values in times.items()}
    unit = median[("target", 1)]
    curve = [round(median[("target", n)] / unit, 3) for n in range(1, max_n + 1)]
    return {
        "context": context,
        "repeats": repeats,
        "threads": torch.get_num_threads(),
        "device": str(device),
        "device_name": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
        "dtype": str(weight.dtype).removeprefix("torch."),
        "target_pass_s": {n: median[("target", n)] for n in range(1, max_n + 1)},
        "verify_curve": curve,
        "config_curve": config_curve(curve),
        "draft_cost": {
            name: round(median[(name, 1)] / unit, 3) for name in subjects if name != "target"
        },
    }


def profile_hardware(
    hardware: str = "cpu",
    *,
    source: str | None = None,
    kernels: str | None = None,
    threads: int | None = None,
    max_n: int = 16,
    context: int = 256,
    repeats: int = 15,
    progress: bool = True,
) -> PassProfile:
    """Load ``source`` (default: the shipped model) as hardware target ``hardware`` loads
    it (device, dtype, kernels, threads; ``kernels``/``threads`` override) and profile it.

    The target's verify curve need not exist yet: this is what measures it. Raises
    :class:`BadInputError` for a target off the specops engine, or one whose device this
    machine does not have, before any model is loaded."""
    from serving.hardware import engine_target
    from serving.loader import DEFAULT_TARGET, load_target, set_threads

    target = engine_target(hardware, require_curve=False)
    options = target.load_options()
    if kernels is not None:
        options["kernels"] = kernels
    set_threads(threads if threads is not None else target.threads)
    model, _ = load_target(source or DEFAULT_TARGET, **options)
    return profile_model(model, max_n=max_n, context=context, repeats=repeats, progress=progress)
