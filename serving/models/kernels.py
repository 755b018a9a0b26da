"""The CPU kernel families a target's linear layers run on, applied in one place.

``stock`` keeps torch's layers; ``onednn`` packs float32 weights for oneDNN
(:mod:`serving.models.onednn`); ``int8`` and ``int4`` quantise the weights
(:mod:`serving.models.quantized`). Drafts that run their own layers (model drafts, heads)
get their target's kernels through :func:`apply_kernels`, so a draft is as fast, relative to
its target, on every target.
"""

from __future__ import annotations

import torch

from serving.errors import BadInputError

KERNELS = ("onednn", "stock", "int8", "int4")
CPU_ONLY = ("onednn", "int8", "int4")  # float32 models on the CPU only


def check_kernels(kernels: str) -> None:
    """A :class:`BadInputError` for an unknown name; for the quantised families, a clear
    error naming what this machine lacks (before any weights are read)."""
    if kernels not in KERNELS:
        raise BadInputError(f"unknown kernels {kernels!r}; choose one of {KERNELS}")
    if kernels in ("int8", "int4"):
        from serving.models.quantized import check_kernels as check_quantised

        check_quantised(kernels)


def kernels_of(model: torch.nn.Module) -> str:
    """The kernels ``model``'s linear layers run on, read from the layers themselves: the
    family of its first packed or quantised layer in module order (a decoder layer's
    projection before the output layer, which ``int4`` keeps in int8), ``stock`` where
    :func:`apply_kernels` replaced none."""
    from serving.models.onednn import PackedLinear
    from serving.models.quantized import Int4Linear, Int8Linear

    families: tuple[tuple[type, str], ...] = (
        (Int4Linear, "int4"),
        (Int8Linear, "int8"),
        (PackedLinear, "onednn"),
    )
    for module in model.modules():
        for layer_type, name in families:
            if isinstance(module, layer_type):
                return name
    return "stock"


def apply_kernels(
    model: torch.nn.Module, kernels: str, *, exact: bool = True, fuse: bool = False
) -> int:
    """Put ``model``'s plain linear layers on ``kernels`` in place; return how many were
    replaced. ``exact`` (for targets) also makes its attention batch-invariant; drafts
    need no exactness and keep transformers' faster attention. ``fuse`` stacks the
    projections under ``onednn`` too (:mod:`serving.models.fused`; the quantised families
    always do), as the lean step (:mod:`serving.lean`) wants them."""
    check_kernels(kernels)
    if kernels == "stock":
        return 0
    if exact and hasattr(model, "config"):
        # Batch-invariant layers need batch-invariant attention to make verification exact.
        from serving.models.exact_attention import use_exact_attention

        use_exact_attention(model)
    if kernels == "onednn":
        from serving.models.onednn import pack_linear_layers

        if fuse:
            from serving.models.fused import fuse_norms, fuse_projections

            fuse_projections(model)
            fuse_norms(model)

        return pack_linear_layers(model)
    from serving.models.quantized import quantize_linear_layers

    return quantize_linear_layers(model, kernels)
