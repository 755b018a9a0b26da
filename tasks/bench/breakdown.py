"""Where a target pass's time goes (``specops profile --breakdown``).

A one-token and a ``k``-token pass over the same cached context, each run two ways on the
same loaded model: through transformers' forward ("before": a ``DynamicCache``) and through
the lean step ("after": its own cache; :mod:`serving.lean`). Each pass's wall time is the
median of plain timed runs. The matmuls are timed by themselves, without the profiler: the
same kernel calls on inputs of the pass's shapes (both paths call the same kernels).
torch's profiler gives the time of the attention ops (with rotary embeddings and the KV
write where one op does all three) and of the norms and activations (with the residual
adds); on the quantised kernels the lean step runs its stack as one C++ call, which the
profiler cannot see into, so those are attributed from the same ops called one by one.
"The rest" is the wall time none of those account for: Python, dispatch and framework
bookkeeping. (With a model the lean step does not cover, the profiler times the matmuls
too.) Beside them, the physical limit: the bytes of weights a token reads over the memory
bandwidth measured in the same run (:mod:`tasks.bench.limits`).
"""

from __future__ import annotations

import statistics
import time
from dataclasses import asdict, dataclass

import torch
from torch.profiler import ProfilerActivity, profile

from serving.errors import BadInputError
from serving.hardware import HardwareTarget
from serving.target import LoadedTarget

CATEGORIES = ("matmuls", "attention", "norms/activations", "rest")
_MATMULS = (
    "int4pack_mm",
    "int8pack_mm",
    "linear_pointwise",
    "aten::mm",
    "aten::addmm",
    "aten::bmm",
)
_ATTENTION = ("scaled_dot_product", "flash_attention", "rope_attend", "softmax")
_ELEMENTWISE = (
    "rms_norm",
    "silu",
    "add_into",
    "aten::mul",
    "aten::add",
    "aten::rsqrt",
    "aten::pow",
    "aten::mean",
    "aten::neg",
    "aten::cat",
    "aten::sigmoid",
)


def category(op: str) -> str | None:
    """The category of a profiled op's name; ``None`` for the rest."""
    if any(part in op for part in _MATMULS):
        return "matmuls"
    if any(part in op for part in _ATTENTION):
        return "attention"
    if any(part in op for part in _ELEMENTWISE):
        return "norms/activations"
    return None


@dataclass(frozen=True)
class PassBreakdown:
    path: str  # "transformers" or "lean"
    rows: int
    wall_ms: float
    ms: dict[str, float]  # by category; "rest" = wall − the others

    def share(self, name: str) -> float:
        return self.ms[name] / self.wall_ms


@dataclass(frozen=True)
class Breakdown:
    passes: list[PassBreakdown]
    limit_ms: float  # weight bytes per token ÷ measured bandwidth
    weight_bytes_per_token: int
    bandwidth_gb_per_s: float
    threads: int
    context: int

    def to_dict(self) -> dict:
        return asdict(self)


def _profiled(run, repeats: int) -> dict[str, float]:
    """Milliseconds per pass of the ops in each category, as the profiler saw them."""
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for _ in range(repeats):
            run()
    totals = dict.fromkeys(CATEGORIES[:3], 0.0)
    for event in prof.key_averages():
        name = category(event.key)
        if name is not None:
            totals[name] += event.self_cpu_time_total / 1000 / repeats
    return totals


def _profiled_by_op(run, step, repeats: int) -> dict[str, float]:
    """:func:`_profiled`, with the lean step's one-call stack (``ops.stack``, opaque to the
    profiler) run op by op for the attribution: the same kernels, called from Python."""
    stacked = step.stack_weights if step is not None else []
    if stacked:
        step.stack_weights = []
    try:
        return _profiled(run, max(3, repeats // 4))
    finally:
        if stacked:
            step.stack_weights = stacked


def _median_ms(run, repeats: int) -> float:
    for _ in range(3):
        run()
    times = []
    for _ in range(repeats):
        started = time.perf_counter()
        run()
        times.append(time.perf_counter() - started)
    return statistics.median(times) * 1000


def _matmuls_alone(step, rows: int, repeats: int) -> float:
    """Milliseconds the pass's matmuls take by themselves, timed without the profiler: the
    lean step's own calls on inputs of the pass's shapes and types."""
    act = torch.bfloat16 if step.bf16 else torch.float32
    width = step.embed.shape[1]
    generator = torch.Generator().manual_seed(1)

    def rand(columns: int, dtype: torch.dtype) -> torch.Tensor:
        return torch.randn(rows, columns, generator=generator).to(dtype)

    hidden = rand(width, act)
    attended = rand(step.heads * step.head_dim, act)
    layer = step.layers[0]
    inner = layer.gate_up(hidden).shape[1] // 2
    activated = rand(inner, act)
    final = rand(width, torch.bfloat16 if step.head_bf16 else torch.float32)

    def run() -> None:
        for layer in step.layers:
            layer.qkv(hidden)
            layer.out(attended)
            layer.gate_up(hidden)
            layer.down(activated)
        step.head(final)

    return _median_ms(run, repeats)


def breakdown(
    target: LoadedTarget,
    *,
    rows: int = 8,
    context: int = 256,
    repeats: int = 20,
    vocab: int | None = None,
) -> Breakdown:
    """Measure :class:`Breakdown` for ``target`` (loaded by ``load_target``; on the CPU's
    lean step, both paths are measured, else only transformers')."""
    from transformers import DynamicCache

    from serving.engine.kv import rewind
    from serving.lean.step import LeanStep
    from serving.target import Cache
    from tasks.bench.limits import memory_bandwidth, weight_bytes_per_token

    if rows < 2 or context < 1 or repeats < 1:
        raise BadInputError(
            f"rows must be >= 2, context and repeats >= 1; got {rows}, {context}, {repeats}"
        )
    vocab = vocab or target.vocab_size
    generator = torch.Generator().manual_seed(0)
    prompt = torch.randint(0, vocab, (1, context), generator=generator)
    blocks = {n: torch.randint(0, vocab, (1, n), generator=generator) for n in (1, rows)}
    step = target.step if isinstance(target.step, LeanStep) else None
    caches: dict[str, Cache] = {"transformers": DynamicCache(config=target.config)}
    if step is not None:
        caches["lean"] = step.new_cache()
    passes = []
    with torch.inference_mode():
        for path, cache in caches.items():
            target(input_ids=prompt, past_key_values=cache, use_cache=True, logits_to_keep=1)
            for n, block in blocks.items():

                def run(block: torch.Tensor = block, cache: Cache = cache) -> None:
                    target(input_ids=block, past_key_values=cache, use_cache=True)
                    rewind(cache, context)

                wall_ms = _median_ms(run, repeats)
                ms = _profiled_by_op(run, step if path == "lean" else None, repeats)
                if step is not None:  # the same kernels on both paths, timed alone, now
                    ms["matmuls"] = _matmuls_alone(step, n, repeats)
                ms["rest"] = max(0.0, wall_ms - sum(ms[c] for c in CATEGORIES[:3]))
                passes.append(PassBreakdown(path, n, wall_ms, ms))
    bandwidth = memory_bandwidth()
    weights = weight_bytes_per_token(target.model)
    return Breakdown(
        passes=passes,
        limit_ms=weights / bandwidth.bytes_per_s * 1000,
        weight_bytes_per_token=weights,
        bandwidth_gb_per_s=bandwidth.bytes_per_s / 1e9,
        threads=torch.get_num_threads(),
        context=context,
    )


def breakdown_report(hardware: HardwareTarget, result: Breakdown) -> str:
    """``result`` as ``specops profile --breakdown`` prints it, headed by the hardware
    target's name."""
    lines = [
        f"{hardware.name}: where a pass's time goes ({result.threads} threads, {result.context} "
        f"tokens cached); physical limit of a one-token pass {result.limit_ms:.2f} ms "
        f"({result.weight_bytes_per_token / 1e6:.1f} MB of weights at "
        f"{result.bandwidth_gb_per_s:.1f} GB/s)",
        f"  {'path':<13}{'rows':>5}{'wall ms':>9}"
        + "".join(f"{c:>19}" for c in CATEGORIES)
        + f"{'limit share':>13}",
    ]
    for p in result.passes:
        cells = "".join(f"{p.ms[c]:>9.2f} ({p.share(c):>4.0%})   " for c in CATEGORIES)
        limit_share = result.limit_ms / p.wall_ms if p.rows == 1 else float("nan")
        shown = f"{limit_share:>12.0%}" if p.rows == 1 else f"{'':>12}"
        lines.append(f"  {p.path:<13}{p.rows:>5}{p.wall_ms:>9.2f}  {cells}{shown}")
    return "\n".join(lines)
