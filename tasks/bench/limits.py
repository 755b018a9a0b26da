"""The physical limit of plain decoding: how fast weights can stream from memory.

Plain decoding of a small model on a CPU is bound by memory bandwidth: every generated token
reads every weight the forward pass touches once, and the arithmetic is cheap beside it. So
for one weight format

    limit tokens/s = measured memory bandwidth (bytes/s) ÷ weight bytes read per token

is the fastest plain decoding that format allows on this machine. A row of ``specops
bench`` shows its tokens/s as a share of that limit: near 100 % means the kernels stream
the weights as fast as memory gives them; above 100 % means the method reads the weights
less than once per token, which is what speculative decoding buys (one verification pass
reads them once for several tokens). The KV cache and activations are not counted: at
these context lengths they are small beside the weights, so the limit is a slight
overestimate.

- **Bandwidth**: :func:`memory_bandwidth` streams a buffer far larger than the last-level
  cache (512 MB by default) through a sum with the bench's thread count, best of a few
  repeats (the least disturbed run).
- **Bytes per token of a torch model**: :func:`weight_bytes_per_token` runs one forward
  pass over a single token and records every parameter, buffer or tensor attribute of any
  module that an operator reads. A tensor read only by ``embedding`` (the token table, when
  the output head is a separate or re-packed matrix) counts the rows it gathered (one);
  any other read counts the whole tensor (a tied output head reads the full table). This
  follows the forward itself, so packed and quantised layers count what their kernels read
  (oneDNN's reordered weight slices kept in a list attribute, int8/int4 codes and scales
  kept as buffers), and copies a layer keeps only for export count nothing.
- **Bytes per token of a GGUF**: :func:`gguf_weights` sums the tensors' stored
  sizes (quantised blocks with their scales); ``token_embd`` counts one row unless the
  file has no ``output.weight``, in which case it is the output head too and read in full.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

BANDWIDTH_MB = 512
BANDWIDTH_REPEATS = 5


@dataclass(frozen=True)
class Bandwidth:
    bytes_per_s: float
    megabytes: int
    repeats: int
    threads: int

    def to_dict(self) -> dict[str, float | int | str]:
        return {
            "bytes_per_s": self.bytes_per_s,
            "gb_per_s": self.bytes_per_s / 1e9,
            "megabytes": self.megabytes,
            "repeats": self.repeats,
            "threads": self.threads,
            "method": "best of `repeats` float32 sums over a buffer of `megabytes` MiB",
        }


def memory_bandwidth(
    megabytes: int = BANDWIDTH_MB, *, repeats: int = BANDWIDTH_REPEATS
) -> Bandwidth:
    """Read bandwidth of main memory in bytes/s, with torch's current thread count."""
    if megabytes < 1 or repeats < 1:
        raise ValueError(f"megabytes and repeats must be >= 1, got {megabytes}, {repeats}")
    buffer = torch.ones(megabytes * 2**20 // 4, dtype=torch.float32)  # [n] float32
    buffer.sum()  # first touch and thread-pool start-up stay out of the timing
    best = float("inf")
    for _ in range(repeats):
        started = time.perf_counter()
        buffer.sum()
        best = min(best, time.perf_counter() - started)
    nbytes = buffer.numel() * buffer.element_size()
    del buffer
    return Bandwidth(nbytes / best, megabytes, repeats, torch.get_num_threads())


def _tensor_bytes(tensor: torch.Tensor) -> int:
    # numel × element size, not storage bytes: oneDNN's opaque tensors have no storage.
    return tensor.numel() * tensor.element_size()


def _module_tensors(model: torch.nn.Module) -> dict[int, torch.Tensor]:
    """Every tensor any module holds, by identity: parameters, buffers, and tensors kept as
    attributes or inside list, tuple or dict attributes (oneDNN's packed slices)."""
    tensors: dict[int, torch.Tensor] = {}
    for module in model.modules():
        for value in vars(module).values():  # _parameters and _buffers are dicts in here
            if isinstance(value, torch.nn.Module):
                continue
            for leaf in tree_leaves(value):
                if isinstance(leaf, torch.Tensor):
                    tensors.setdefault(id(leaf), leaf)
    return tensors


class _WeightReads(TorchDispatchMode):
    """Records which of ``tensors`` each operator reads, and how (gathered rows or whole)."""

    def __init__(self, tensors: dict[int, torch.Tensor]) -> None:
        super().__init__()
        self.tensors = tensors
        self.whole: set[int] = set()
        self.rows: dict[int, int] = {}  # id -> rows gathered by embedding lookups

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is torch.ops.aten.embedding.default:
            table, indices = args[0], args[1]
            if id(table) in self.tensors:
                self.rows[id(table)] = self.rows.get(id(table), 0) + indices.numel()
            others = [*args[2:], *kwargs.values()]
        else:
            others = [*args, *kwargs.values()]
        for leaf in tree_leaves(others):
            if isinstance(leaf, torch.Tensor) and id(leaf) in self.tensors:
                self.whole.add(id(leaf))
        return func(*args, **kwargs)


def weight_bytes_per_token(model: torch.nn.Module, *, token_id: int = 0) -> int:
    """Bytes of model tensors one forward pass over one token reads (see the module doc)."""
    tensors = _module_tensors(model)
    device = next(model.parameters()).device
    reads = _WeightReads(tensors)
    with torch.inference_mode(), reads:
        model(input_ids=torch.tensor([[token_id]], device=device), use_cache=False)
    total = sum(_tensor_bytes(tensors[key]) for key in reads.whole)
    for key, rows in reads.rows.items():
        if key in reads.whole:
            continue  # read in full elsewhere (a tied output head)
        table = tensors[key]
        total += min(rows, table.shape[0]) * _tensor_bytes(table) // table.shape[0]
    return total


@dataclass(frozen=True)
class GgufWeights:
    bytes_per_token: int
    format: str  # the tensor type holding most of the bytes, e.g. ``Q4_1``


def gguf_weights(path: Path) -> GgufWeights:
    """Bytes of a GGUF's tensors one token reads (see the module doc), and its format."""
    from gguf import GGUFReader

    tensors = {t.name: t for t in GGUFReader(str(path)).tensors}
    total = 0
    by_type: dict[str, int] = {}
    for name, tensor in tensors.items():
        size = int(tensor.n_bytes)
        by_type[tensor.tensor_type.name] = by_type.get(tensor.tensor_type.name, 0) + size
        if name == "token_embd.weight" and "output.weight" in tensors:
            size //= int(tensor.shape[-1])  # GGUF shapes run fastest-first: [width, rows]
        total += size
    return GgufWeights(total, max(by_type, key=lambda name: by_type[name]))


def limit_tokens_per_s(bandwidth_bytes_per_s: float, bytes_per_token: int) -> float:
    """The plain-decoding limit of a weight format: bandwidth ÷ bytes read per token."""
    return bandwidth_bytes_per_s / bytes_per_token


ISA_SETTINGS = ("ATEN_CPU_CAPABILITY", "ONEDNN_MAX_CPU_ISA", "SPECOPS_LEAN_MARCH")
_FLAGS_SHOWN = (
    "avx2",
    "fma",
    "f16c",
    "avx512f",
    "avx512bw",
    "avx512_vnni",
    "avx512_bf16",
    "avx_vnni",
    "amx_tile",
    "amx_int8",
    "amx_bf16",
    "neon",
    "asimd",
)


def cpu_description() -> dict[str, object]:
    """The CPU a benchmark ran on (model and the vector flags that decide its kernels), what
    torch dispatches to, and any setting that narrowed the instruction set."""
    import os
    import platform
    from pathlib import Path

    model: str = platform.processor() or platform.machine()
    flags: set[str] = set()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            key, _, value = line.partition(":")
            if key.strip() == "model name":
                model = value.strip()
            elif key.strip() in ("flags", "Features") and not flags:
                flags = set(value.split())
    except OSError:
        pass
    return {
        "model": model,
        "flags": [flag for flag in _FLAGS_SHOWN if flag in flags],
        "torch_capability": torch.backends.cpu.get_cpu_capability(),
        "settings": {name: os.environ[name] for name in ISA_SETTINGS if name in os.environ},
    }
