"""``specops profile``: measure what a target pass over n tokens costs on a hardware target.

The cost-aware draft-length policy needs the shape of ``t_verify(n) / t_verify(1)``; the
simulator needs absolute per-pass times. Both come from here: a warm KV cache of
``context`` tokens, passes over n = 1..max_n new tokens (and over the first-N-layer
drafts), repeated in shuffled order so that machine noise spreads evenly, medians kept.

``specops profile --batch`` measures the batch planner's ``C(n)`` the same way: packed
passes (:func:`serving.engine.batch.ragged.packed_pass`) over n rows shared by B sequences, each
with its own warm cache, relative to a packed pass over one row of one sequence.

The model is measured where it runs: on the device, in the dtype and with the kernels of
its hardware target (``configs/hardware.yaml``). On CUDA a forward pass only queues
kernels, so every timed pass is fenced by ``torch.cuda.synchronize`` on both sides.
"""

from __future__ import annotations

import random
import statistics
import time
from collections.abc import Callable, Sequence
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, TypedDict

import torch

from serving.engine.kv import rewind
from serving.models.truncated import first_layers
from serving.target import Cache, LoadedTarget

if TYPE_CHECKING:
    from serving.hardware import HardwareTarget


class PassProfile(TypedDict):
    """What :func:`profile_model` measured (and ``specops profile`` writes as JSON)."""

    context: int  # tokens in the warm KV cache
    repeats: int  # timings per size; medians kept
    threads: int
    device: str  # where the passes ran, e.g. "cpu" or "cuda:0"
    device_name: str  # the GPU's name on CUDA, "cpu" otherwise
    dtype: str  # the target's weights, e.g. "float32"
    target_pass_s: dict[int, float]  # n new tokens -> seconds of one target pass
    # n -> [25th, 75th percentile] of those seconds: the spread around each median
    target_pass_iqr_s: dict[int, list[float]]
    verify_curve: list[float]  # t_verify(n) / t_verify(1), n = 1..max_n
    # verify_curve made non-decreasing (a longer pass never costs less): what
    # configs/hardware.yaml takes, as the cost-aware policy reads it
    config_curve: list[float]
    draft_cost: dict[str, float]  # "layers:N" -> one draft pass / one target pass


class BatchCell(TypedDict):
    rows: int  # n: rows in the packed pass, all sequences together
    sequences: int  # B: sequences sharing them (rows split as evenly as possible)
    pass_s: float  # median seconds of one packed pass
    cost: float  # pass_s / the pass over one row of one sequence


class BatchProfile(TypedDict):
    """What :func:`profile_batch` measured (and ``specops profile --batch`` writes as JSON)."""

    context: list[int]  # tokens in each sequence's warm KV cache (sequence i = index i)
    repeats: int
    threads: int
    device: str
    device_name: str
    dtype: str
    table: list[BatchCell]  # every (n, B) measured, B <= n
    # (n, cost) at B = min(max sequences, n), made non-decreasing: the serving regime (many
    # requests, few drafts each), what configs/hardware.yaml takes as batch_curve
    batch_curve: list[tuple[int, float]]
    # (tokens, seconds): one prompt's prefill from an empty cache (what a request joining a
    # batch costs its server; the simulator prices prefills with it)
    prefill: list[tuple[int, float]]


PREFILL_TOKENS = (16, 32, 64, 128, 256, 512)
BATCH_ROWS = (1, 2, 4, 8, 12, 16, 24, 32, 48, 64)
BATCH_SEQUENCES = (1, 2, 4, 8)


def sync(device: torch.device) -> None:
    """Wait for what is queued on ``device`` (a no-op on the CPU)."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _clock(run: Callable[[], object], device: torch.device) -> float:
    """Seconds ``run()`` takes on ``device``, fenced on both sides: nothing queued before the
    clock starts, and the work has run (not only been queued) when it stops."""
    sync(device)
    started = time.perf_counter()
    run()
    sync(device)
    return time.perf_counter() - started


@torch.inference_mode()
def _time_pass(
    target: LoadedTarget, cache: Cache, base: int, n: int, vocab: int, generator: torch.Generator
) -> float:
    device = target.device
    # Drawn on the CPU generator whatever the device: the same blocks for a seed everywhere.
    block = torch.randint(0, vocab, (1, n), generator=generator).to(device)
    try:
        return _clock(
            lambda: target(input_ids=block, past_key_values=cache, use_cache=True), device
        )
    finally:
        rewind(cache, base)


def _quartiles(values: list[float]) -> list[float]:
    """[25th, 75th percentile] of ``values`` (both the value itself for a single one)."""
    if len(values) < 2:
        return [values[0], values[0]]
    low, _, high = statistics.quantiles(values, n=4)
    return [low, high]


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
    target: LoadedTarget,
    *,
    max_n: int = 16,
    context: int = 256,
    repeats: int = 15,
    draft_layers: tuple[int, ...] = (1, 2, 4, 8),
    drafts: Sequence[str] = (),
    seed: int = 0,
    progress: bool = True,
) -> PassProfile:
    """Profile ``target`` on the device its weights are on; its first-N-layer drafts run
    the same kind of step as it (:meth:`LoadedTarget.over`). ``drafts``: drafter specs
    (a head, ``head:PATH``, say) whose drafting cost is measured as the lookups' is."""
    from tqdm.auto import tqdm

    device = target.device
    vocab = target.vocab_size
    generator = torch.Generator().manual_seed(seed)
    prompt = torch.randint(0, vocab, (1, context), generator=generator).to(device)
    subjects: dict[str, tuple[LoadedTarget, list[int]]] = {
        "target": (target, list(range(1, max_n + 1)))
    }
    for layers in draft_layers:
        if layers < target.config.num_hidden_layers:
            subjects[f"layers:{layers}"] = (target.over(first_layers(target.model, layers)), [1])
    caches = {}
    for name, (subject, _) in subjects.items():
        cache = subject.new_cache()
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
    lookups = _lookup_costs(target, prompt[0], config_curve(curve), progress, drafts)
    return {
        "context": context,
        "repeats": repeats,
        "threads": torch.get_num_threads(),
        "device": str(device),
        "device_name": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
        "dtype": str(target.dtype).removeprefix("torch."),
        "target_pass_s": {n: median[("target", n)] for n in range(1, max_n + 1)},
        "target_pass_iqr_s": {n: _quartiles(times[("target", n)]) for n in range(1, max_n + 1)},
        "verify_curve": curve,
        "config_curve": config_curve(curve),
        "draft_cost": {
            **{name: round(median[(name, 1)] / unit, 3) for name in subjects if name != "target"},
            **lookups,
        },
    }


LOOKUP_KINDS = ("pld", "ngram", "suffix")


def _lookup_costs(
    target: LoadedTarget,
    context: torch.Tensor,
    curve: list[float],
    progress: bool,
    drafts: Sequence[str] = (),
) -> dict[str, float]:
    """The drafting cost per drafted token, in one-token target passes, of the drafter
    kinds that run no model and of ``drafts`` (what :mod:`tasks.evaluate.costs` measures
    for each contender of an evaluation), on the profile's context repeated so that a
    lookup finds what to draft. Each decodes its token budget (no end-of-sequence ids)."""
    from serving.engine.build import build_decoder
    from serving.engine.drafters.plan import DraftPlan
    from tasks.evaluate.costs import profile_draft_cost

    k = min(8, len(curve) - 1) or 1
    ids = context.tolist()
    half = ids[: max(len(ids) // 4, 8)]
    prompt = (half * 4)[: len(ids)]
    costs: dict[str, float] = {}
    for kind in (*LOOKUP_KINDS, *drafts):
        plan = DraftPlan.parse(kind, policy="fixed", k=k)
        decoder = build_decoder(target, plan, eos_token_ids=())
        cost, _ = profile_draft_cost(decoder, [prompt] * 3, curve=curve, k=k, max_new_tokens=32)
        if cost is not None:
            costs[kind] = round(cost, 5)
        elif progress:
            print(f"{kind}: drafted nothing on the profile's context, no cost measured")
    return costs


def split_rows(rows: int, sequences: int) -> list[int]:
    """``rows`` shared by ``sequences`` blocks as evenly as possible, larger blocks first."""
    if not 1 <= sequences <= rows:
        raise ValueError(f"{sequences} sequences cannot share {rows} rows (need 1 <= B <= n)")
    size, extra = divmod(rows, sequences)
    return [size + 1] * extra + [size] * (sequences - extra)


@torch.inference_mode()
def _time_packed(
    target: LoadedTarget,
    caches: list[Cache],
    lengths: list[int],
    sizes: list[int],
    vocab: int,
    generator: torch.Generator,
) -> float:
    from serving.engine.batch.ragged import packed_pass

    device = target.device
    blocks = [torch.randint(0, vocab, (size,), generator=generator).to(device) for size in sizes]
    used = caches[: len(sizes)]
    try:
        return _clock(lambda: packed_pass(target, used, blocks), device)
    finally:
        for cache, length in zip(used, lengths[: len(sizes)], strict=True):
            rewind(cache, length)


def batch_yaml(curve: list[tuple[int, float]]) -> str:
    """The ``batch_curve:`` line to paste under a target in ``configs/hardware.yaml``."""
    return "batch_curve: [" + ", ".join(f"[{n}, {float(c)}]" for n, c in curve) + "]"


@torch.inference_mode()
def profile_batch(
    target: LoadedTarget,
    *,
    rows: tuple[int, ...] = BATCH_ROWS,
    sequences: tuple[int, ...] = BATCH_SEQUENCES,
    context: int = 200,
    repeats: int = 15,
    seed: int = 0,
    progress: bool = True,
) -> BatchProfile:
    """Time packed passes over every ``n`` in ``rows`` shared by every ``B`` in
    ``sequences`` with ``B <= n`` (``rows`` must start at 1), on the device the weights are
    on. Sequence i's cache holds a random context of about ``context`` tokens (spread over
    ±25%, since each sequence attends to its own keys). Makes the target's model take
    packed passes (:func:`serving.engine.batch.ragged.use_ragged_attention`, in place)."""
    from tqdm.auto import tqdm

    from serving.engine.batch.ragged import use_ragged_attention

    if not rows or rows[0] != 1 or list(rows) != sorted(set(rows)):
        raise ValueError(f"rows must rise from 1, got {rows}")
    if not sequences or min(sequences) < 1:
        raise ValueError(f"sequences must be >= 1, got {sequences}")
    use_ragged_attention(target.model)
    device = target.device
    vocab = target.vocab_size
    generator = torch.Generator().manual_seed(seed)
    spread = context // 4
    width = max(sequences)
    # evenly over context ± 25% (150..250 for 200), in shuffled order
    lengths = [context - spread + (2 * spread * i) // max(width - 1, 1) for i in range(width)]
    random.Random(seed).shuffle(lengths)
    caches = []
    for length in lengths:
        cache = target.new_cache()
        prompt = torch.randint(0, vocab, (1, length), generator=generator).to(device)
        target(input_ids=prompt, past_key_values=cache, use_cache=True, logits_to_keep=1)
        caches.append(cache)
    cells = [(n, b) for n in rows for b in sorted(set(sequences)) if b <= n]
    # Warm-up: every shape once (a GPU picks and caches its kernels per shape on first use).
    for n, b in cells:
        _time_packed(target, caches, lengths, split_rows(n, b), vocab, generator)
    jobs = cells * repeats
    random.Random(seed).shuffle(jobs)
    times: dict[tuple[int, int], list[float]] = {}
    for n, b in tqdm(jobs, desc="profiling batches", disable=not progress):
        times.setdefault((n, b), []).append(
            _time_packed(target, caches, lengths, split_rows(n, b), vocab, generator)
        )
    median = {cell: statistics.median(values) for cell, values in times.items()}
    prefill = _time_prefills(
        target, vocab, generator, repeats=max(3, repeats // 5), progress=progress
    )
    unit = median[(1, 1)]
    table: list[BatchCell] = [
        {
            "rows": n,
            "sequences": b,
            "pass_s": median[(n, b)],
            "cost": round(median[(n, b)] / unit, 3),
        }
        for n, b in cells
    ]
    widest = [max((c for c in table if c["rows"] == n), key=lambda c: c["sequences"]) for n in rows]
    smoothed = config_curve([cell["cost"] for cell in widest])
    return {
        "context": lengths,
        "repeats": repeats,
        "threads": torch.get_num_threads(),
        "device": str(device),
        "device_name": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
        "dtype": str(target.dtype).removeprefix("torch."),
        "table": table,
        "batch_curve": [(n, cost) for n, cost in zip(rows, smoothed, strict=True)],
        "prefill": prefill,
    }


def _prefill(target: LoadedTarget, prompt: torch.Tensor, cache: Cache) -> object:
    return target(input_ids=prompt, past_key_values=cache, use_cache=True, logits_to_keep=1)


@torch.inference_mode()
def _time_prefills(
    target: LoadedTarget, vocab: int, generator: torch.Generator, *, repeats: int, progress: bool
) -> list[tuple[int, float]]:
    """Median seconds of a prefill of each of :data:`PREFILL_TOKENS` tokens into an empty
    cache, keeping one row of logits (as the engine prefills a prompt)."""
    from tqdm.auto import tqdm

    device = target.device
    limit = int(getattr(target.config, "max_position_embeddings", PREFILL_TOKENS[-1]))
    sizes = [n for n in PREFILL_TOKENS if n <= limit]
    jobs = [n for n in sizes for _ in range(repeats + 1)]  # the first of each: a warm-up
    random.Random(0).shuffle(jobs)
    times: dict[int, list[float]] = {}
    warmed: set[int] = set()
    for n in tqdm(jobs, desc="profiling prefills", disable=not progress):
        prompt = torch.randint(0, vocab, (1, n), generator=generator).to(device)
        cache = target.new_cache()
        seconds = _clock(partial(_prefill, target, prompt, cache), device)
        if n in warmed:
            times.setdefault(n, []).append(seconds)
        warmed.add(n)
    return [(n, statistics.median(times[n])) for n in sizes]


def plot_batch(result: BatchProfile, path: str | Path, *, title: str = "") -> Path:
    """Packed-pass cost against rows, one line per sequence count (PNG, atomic)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from serving.atomic import atomic_path

    figure, axes = plt.subplots(figsize=(6.4, 4.2))
    for b in sorted({cell["sequences"] for cell in result["table"]}):
        cells = [cell for cell in result["table"] if cell["sequences"] == b]
        axes.plot(
            [cell["rows"] for cell in cells],
            [cell["cost"] for cell in cells],
            marker="o",
            label=f"B = {b} sequence{'s' if b > 1 else ''}",
        )
    axes.set(
        xlabel="rows in the packed pass (n, all sequences)",
        ylabel="cost (one-row pass = 1)",
        title=title or "packed target pass cost",
    )
    axes.grid(alpha=0.3)
    axes.legend()
    figure.tight_layout()
    with atomic_path(path) as temporary:
        figure.savefig(temporary, dpi=110, format="png")
    plt.close(figure)
    return Path(path)


def load_for(
    hardware: HardwareTarget, source: str | None, kernels: str | None, threads: int | None
) -> LoadedTarget:
    """``source`` (default: the shipped model) loaded as ``hardware`` loads it, with its
    threads set (``kernels``/``threads`` override)."""
    from serving.loader import load_target, set_threads
    from serving.target import DEFAULT_TARGET

    if kernels is not None:
        hardware = hardware.model_copy(update={"kernels": kernels})
    set_threads(threads if threads is not None else hardware.threads)
    return load_target(source or DEFAULT_TARGET, hardware)


def profile_hardware(
    hardware: HardwareTarget,
    *,
    source: str | None = None,
    kernels: str | None = None,
    threads: int | None = None,
    max_n: int = 16,
    context: int = 256,
    repeats: int = 15,
    drafts: Sequence[str] = (),
    progress: bool = True,
) -> PassProfile:
    """Load ``source`` (default: the shipped model) as ``hardware`` loads it (device,
    dtype, kernels, threads; ``kernels``/``threads`` override) and profile it, with the
    drafting cost of ``drafts`` (drafter specs, checked before anything loads).

    The target's verify curve need not exist yet: this is what measures it (resolve it with
    ``engine_target(name, require_curve=False)``). Raises :class:`BadInputError` for a
    device this machine does not have, before any model is loaded."""
    from serving.engine.drafters.plan import DraftPlan

    for spec in drafts:
        DraftPlan.parse(spec, policy="fixed", k=1)
    target = load_for(hardware, source, kernels, threads)
    return profile_model(
        target, max_n=max_n, context=context, repeats=repeats, drafts=drafts, progress=progress
    )


def profile_batch_hardware(
    hardware: HardwareTarget,
    *,
    source: str | None = None,
    kernels: str | None = None,
    threads: int | None = None,
    context: int = 200,
    repeats: int = 15,
    progress: bool = True,
) -> BatchProfile:
    """:func:`profile_batch` on ``source`` loaded as :func:`profile_hardware` loads it."""
    target = load_for(hardware, source, kernels, threads)
    return profile_batch(target, context=context, repeats=repeats, progress=progress)
