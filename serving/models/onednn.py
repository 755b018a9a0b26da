"""oneDNN-packed linear layers for CPU inference.

On this machine's CPUs, torch's default fp32 matmul (MKL sgemm) handles the small row
counts of decoding badly: a pass over 2-4 tokens costs 1.5-2x a pass over one, and the
49152x576 output head alone takes 7-18 ms. oneDNN's inner product on a weight reordered
once into its blocked layout (the same kernels torch.compile's CPU backend uses) keeps a
pass over 1-8 tokens near the cost of one and roughly halves a one-token pass - it makes
verification almost free, which is what speculative decoding needs. It is also
batch-invariant: each row's result does not depend on how many rows share the call, so a
verification pass computes exactly what a one-token pass would — for inputs of up to 1024
features. Over that (SmolLM2's 1536-wide down projection) oneDNN reduces a one-row call
differently from a several-row one (measured: every row count from 2 to 16 differed), so
wider layers are packed as equal slices of at most 1024 inputs whose row results are summed.

Inference only: packed layers hold no ``nn.Parameter`` (nothing to train or save). Where
the ops are missing (a torch build without oneDNN), ``pack_linear_layers`` raises a clear
error and callers fall back to the stock layers.
"""

from __future__ import annotations

import itertools

import torch

from serving.errors import SpecOpsError


def onednn_available() -> bool:
    if not torch.backends.mkldnn.is_available():
        return False
    try:
        torch.ops.mkldnn._reorder_linear_weight  # noqa: B018 - probe the op
        torch.ops.mkldnn._linear_pointwise  # noqa: B018
    except (AttributeError, RuntimeError):
        return False
    return True


MAX_INVARIANT_INPUTS = 1024  # measured: 576, 768 and 1024 inputs are batch-invariant, 1536 not


def _even_bounds(size: int, parts: int) -> list[tuple[int, int]]:
    edges = [size * i // parts for i in range(parts + 1)]
    return list(itertools.pairwise(edges))


class PackedLinear(torch.nn.Module):
    """``y = x @ W.T + b`` through oneDNN with ``W`` reordered once into its blocked layout."""

    def __init__(self, linear: torch.nn.Linear) -> None:
        super().__init__()
        self.in_features = linear.in_features
        self.out_features = linear.out_features
        weight = linear.weight.detach().float().contiguous()
        slices = -(-self.in_features // MAX_INVARIANT_INPUTS)
        self.bounds = _even_bounds(self.in_features, slices)
        # The second argument is oneDNN's row-count hint for choosing the blocked layout;
        # 4 measured best for 1-12-row passes here (1 was ~10 % slower and, like 1, not
        # batch-invariant at 768-1024 inputs; 16 no better).
        self.packed_weights = [
            torch.ops.mkldnn._reorder_linear_weight(weight[:, a:b].contiguous(), 4)
            for a, b in self.bounds
        ]
        self.bias = None if linear.bias is None else linear.bias.detach().float()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        shape = x.shape  # [..., in_features]
        flat = x.reshape(-1, self.in_features).float()  # [rows, in_features]
        out = None
        for (a, b), packed in zip(self.bounds, self.packed_weights, strict=True):
            part = torch.ops.mkldnn._linear_pointwise(
                flat[:, a:b].contiguous(), packed, None, "none", [], ""
            )  # [rows, out_features]
            out = part if out is None else out + part
        assert out is not None
        if self.bias is not None:
            out = out + self.bias
        return out.reshape(*shape[:-1], self.out_features)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, onednn"


def pack_linear_layers(model: torch.nn.Module) -> int:
    """Replace every plain ``nn.Linear`` of ``model`` in place; return how many were
    replaced. Subclasses are left alone: a bitsandbytes 8-bit or 4-bit layer is one, and
    its weight holds quantised codes without their scales (packing it would serve garbage
    drafts, silently: the target would just reject them all)."""
    if not onednn_available():
        raise SpecOpsError(
            "this torch build has no oneDNN linear kernels; load the model with kernels='stock'"
        )
    if next(model.parameters()).device.type != "cpu":
        raise SpecOpsError("oneDNN packing is for CPU models; use kernels='stock' elsewhere")
    replaced = 0
    for module in list(model.modules()):
        for name, child in list(module.named_children()):
            if type(child) is torch.nn.Linear:
                setattr(module, name, PackedLinear(child))
                replaced += 1
    return replaced
