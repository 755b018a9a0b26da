"""Tiny targets on the lean step and their transformers twins (same weights, same kernels)."""

from __future__ import annotations

from serving.hardware import engine_target
from serving.lean.build import load_ops
from serving.lean.install import make_step
from serving.lean.tiles import adopt_tiles
from serving.models.kernels import apply_kernels
from serving.models.tiny import tiny_llama
from serving.target import LoadedTarget

KERNELS = ("onednn", "int8", "int4")
# The hardware target of each kernel family (configs/hardware.yaml).
HARDWARE = {"onednn": "cpu", "int8": "cpu-int8", "int4": "cpu-int4"}


def tiny_target(kernels: str, *, lean: bool = True, seed: int = 0, **shape) -> LoadedTarget:
    """A tiny Llama whose shapes every kernel family takes (inputs a multiple of 32,
    outputs of 16), loaded as ``load_target`` loads a target: fused, on ``kernels``, and on
    the lean step when ``lean`` (without it, int4 and int8 layers still take the lean step's
    integer kernels, as they do under it). No end-of-sequence ids: decoding runs to its
    budget."""
    shape = {"hidden_size": 64, "intermediate_size": 128, "vocab_size": 96, **shape}
    model = tiny_llama(seed=seed, **shape)
    apply_kernels(model, kernels, fuse=True)
    step = None
    if lean:
        step = make_step(model, "on")
        assert step is not None
    elif kernels in ("int4", "int8"):  # the twin multiplies as the lean step does
        load_ops()
        adopt_tiles(model)
    return LoadedTarget.of(model, hardware=engine_target(HARDWARE[kernels]), step=step)
