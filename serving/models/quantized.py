"""Weight-only quantised linear layers for CPU inference: int8 per channel, int4 per group.

Plain decoding of SmolLM2-135M streams every weight once per token, and a verification pass
over a few tokens streams them once for all. Smaller weights read faster, and the kernels
that read them best here are torch's own weight-packed matmuls for the CPU
(``_weight_int4pack_mm_for_cpu``, ``_weight_int8pack_mm``); measured against oneDNN fp32
and bf16 and bitsandbytes in docs/quantised.md. Both take bfloat16 activations: their
float32 paths are scalar and 10x slower. Activations are rounded to bfloat16 on the way in
and the output returned in float32, so everything around the linear layers stays float32.

- ``int4``: asymmetric round-to-nearest codes in groups of 32 along the input, a scale and
  a zero point per group (``w = (q - 8) * scale + zero``, stored in bfloat16 as the kernel
  wants). The shipped GGUF is Q4_1 — the same scheme, groups of 32 — so on the shipped
  model this recovers the GGUF's own integer codes; only its fp16 scales are rounded to
  bfloat16.
- ``int8``: symmetric codes per output channel with a bfloat16 scale. The int4 scheme
  keeps the output head in int8, as the GGUF keeps its output matrix in Q8_0.

On a target with the lean decode step (:mod:`serving.lean`), the layers move to its
integer kernels instead, which round activations to int8 in groups of 32 (llama.cpp's
Q4_1 x Q8_1 and Q8_0 x Q8_0) and read each weight once per pass whatever its rows
(:mod:`serving.lean.tiles`); every forward of that model then computes with them.

Verification stays exact with respect to the quantised model being served: each output row
of these kernels does not depend on how many rows share the call (tested), so a pass over
a block computes exactly what one-token passes would. Inference only: quantised layers hold
buffers, not ``nn.Parameter``s.
"""

from __future__ import annotations

import platform
from typing import Literal

import torch

from serving.errors import SpecOpsError
from serving.models.fused import fuse_norms, fuse_projections, unfuse_projections

Scheme = Literal["int8", "int4"]
SCHEMES: tuple[Scheme, ...] = ("int8", "int4")
INT4_GROUP = 32  # Q4_1's block: the shipped GGUF's own codes are recovered exactly
_ACT = torch.bfloat16  # the kernels' fast path


class QuantisedKernelsUnavailable(SpecOpsError):
    """The quantised kernels cannot run here; the message says what is missing."""


def _probe(scheme: Scheme) -> None:
    x = torch.ones(2, INT4_GROUP, dtype=_ACT)
    if scheme == "int4":
        codes = torch.full((16, INT4_GROUP), 9, dtype=torch.int32)
        packed = torch.ops.aten._convert_weight_to_int4pack_for_cpu(codes, 1)
        scales = torch.ones(1, 16, 2, dtype=_ACT)
        torch.ops.aten._weight_int4pack_mm_for_cpu(x, packed, INT4_GROUP, scales)
    else:
        codes8 = torch.ones(16, INT4_GROUP, dtype=torch.int8)
        torch.ops.aten._weight_int8pack_mm(x, codes8, torch.ones(16, dtype=_ACT))


def check_kernels(scheme: str) -> None:
    """Raise :class:`QuantisedKernelsUnavailable` naming what is missing (the torch op or
    the CPU's vector units) before any model work; return if ``scheme`` runs here."""
    if scheme not in SCHEMES:
        raise SpecOpsError(f"unknown quantisation scheme {scheme!r}; choose one of {SCHEMES}")
    capability = torch.backends.cpu.get_cpu_capability()
    if capability not in ("AVX2", "AVX512"):
        raise QuantisedKernelsUnavailable(
            f"the {scheme} weight kernels need a CPU with AVX2 or AVX-512 (torch reports "
            f"{capability!r} on {platform.machine()} {platform.processor() or ''}); use the "
            "float32 'cpu' target here"
        )
    try:
        _probe(scheme)  # a torch build without these ops fails here, in a few microseconds
    except (AttributeError, RuntimeError, NotImplementedError) as error:
        raise QuantisedKernelsUnavailable(
            f"torch {torch.__version__} cannot run the {scheme} weight kernels for the CPU "
            f"({error}); install torch>=2.6 for the CPU: pip install 'torch>=2.6' --index-url "
            "https://download.pytorch.org/whl/cpu"
        ) from None


def quantisable(linear: torch.nn.Linear, scheme: Scheme) -> bool:
    """The kernels' shape rules: int4 wants whole groups of 32 inputs and outputs in
    multiples of 16; int8 takes any shape."""
    if scheme == "int8":
        return True
    return linear.in_features % INT4_GROUP == 0 and linear.out_features % 16 == 0


class _QuantisedLinear(torch.nn.Module):
    scheme: Scheme
    bias: torch.Tensor | None

    def __init__(self, linear: torch.nn.Linear) -> None:
        super().__init__()
        self.in_features = linear.in_features
        self.out_features = linear.out_features
        bias = None if linear.bias is None else linear.bias.detach().float().clone()
        self.register_buffer("bias", bias)

    def dequantized_weight(self) -> torch.Tensor:
        """The float32 weight these codes stand for (what an export writes)."""
        raise NotImplementedError

    def _matmul(self, flat: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        shape = x.shape  # [..., in_features]
        flat = x.reshape(-1, self.in_features)  # [rows, in_features]
        out = self._matmul(flat).float()  # [rows, out_features]
        if self.bias is not None:
            out = out + self.bias
        return out.reshape(*shape[:-1], self.out_features)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, {self.scheme}"


class Int8Linear(_QuantisedLinear):
    """Symmetric int8 codes per output channel, bfloat16 scales; on a target with the lean
    step, multiplied by its integer kernel (activations rounded to int8 in groups of 32)."""

    scheme: Scheme = "int8"
    codes: torch.Tensor
    scale: torch.Tensor
    tiles: torch.Tensor | None
    tile_scales: torch.Tensor | None

    def __init__(self, linear: torch.nn.Linear) -> None:
        super().__init__(linear)
        weight = linear.weight.detach().float()  # [out, in]
        scale = (weight.abs().amax(dim=1) / 127).clamp(min=1e-12).to(_ACT)  # [out]
        codes = torch.round(weight / scale.float()[:, None]).clamp(-127, 127).to(torch.int8)
        self.register_buffer("codes", codes.contiguous())  # [out, in]
        self.register_buffer("scale", scale)
        self.register_buffer("tiles", None, persistent=False)
        self.register_buffer("tile_scales", None, persistent=False)

    def use_tiles(self, tiles: torch.Tensor, scales: torch.Tensor) -> None:
        """Compute with the lean step's integer kernel over ``tiles`` from now on (see
        :func:`serving.lean.tiles.int8_tiles`); the tiles become the one copy of the codes
        (:meth:`int8_codes` reads them back for export)."""
        self.tiles, self.tile_scales = tiles, scales
        self.codes = torch.empty(0, dtype=torch.int8)

    def int8_codes(self) -> torch.Tensor:
        """The ``[out, in]`` codes, from the tiles once the layer is on them (tiles of 16
        outputs x 32 inputs, ``V_k[4 i + b] = codes[16 t + i, 32 g + 4 k + b]``)."""
        if self.tiles is None:
            return self.codes
        tiles, groups = self.tiles.shape[:2]
        v = self.tiles.reshape(tiles, groups, 8, 16, 4).permute(0, 3, 1, 2, 4)
        return v.reshape(self.out_features, self.in_features)

    def dequantized_weight(self) -> torch.Tensor:
        return self.int8_codes().float() * self.scale.float()[:, None]

    def _matmul(self, flat: torch.Tensor) -> torch.Tensor:
        if self.tiles is not None:
            x = flat.to(torch.float32).contiguous()
            return torch.ops.specops_lean.int8_mm(x, self.tiles, self.tile_scales, False)
        return torch.ops.aten._weight_int8pack_mm(flat.to(_ACT), self.codes, self.scale)


def int4_codes(weight: torch.Tensor, group: int = INT4_GROUP):
    """Asymmetric round-to-nearest int4 codes of ``weight`` ([out, in], float32) in groups
    of ``group`` inputs: ``(codes [out, in] int32 in 0..15, scale [out, in/group],
    minimum [out, in/group])`` with ``w ≈ codes * scale + minimum`` (GGUF's Q4_1 rule)."""
    out_features, in_features = weight.shape
    grouped = weight.float().reshape(out_features, in_features // group, group)
    low = grouped.amin(dim=-1)  # [out, groups]
    high = grouped.amax(dim=-1)
    scale = ((high - low) / 15).clamp(min=1e-12)
    codes = torch.round((grouped - low[..., None]) / scale[..., None]).clamp(0, 15)
    return codes.reshape(out_features, in_features).to(torch.int32), scale, low


class Int4Linear(_QuantisedLinear):
    """Asymmetric int4 codes in groups of 32 inputs, packed for the CPU kernel: torch's, or
    (once the target has the lean step, :mod:`serving.lean.tiles`) the lean step's integer
    kernel, which rounds activations to int8 in groups of 32 as llama.cpp does."""

    scheme: Scheme = "int4"
    codes: torch.Tensor
    packed: torch.Tensor
    scales_and_zeros: torch.Tensor
    tiles: torch.Tensor | None
    tile_scales: torch.Tensor | None

    def __init__(self, linear: torch.nn.Linear) -> None:
        super().__init__(linear)
        if not quantisable(linear, "int4"):
            raise SpecOpsError(
                f"a {linear.out_features}x{linear.in_features} layer cannot take int4 codes: "
                f"inputs must be a multiple of {INT4_GROUP}, outputs of 16"
            )
        codes, scale, low = int4_codes(linear.weight.detach())
        # The kernel's rule is w = (q - 8) * scale + zero, so zero = minimum + 8 * scale.
        scales_and_zeros = torch.stack([scale, low + 8 * scale], dim=-1)  # [out, groups, 2]
        self.register_buffer(
            "scales_and_zeros", scales_and_zeros.transpose(0, 1).contiguous().to(_ACT)
        )  # [groups, out, 2]
        self.register_buffer("packed", torch.ops.aten._convert_weight_to_int4pack_for_cpu(codes, 1))
        self.register_buffer("codes", _nibbles(codes), persistent=False)  # for export only
        self.register_buffer("tiles", None, persistent=False)
        self.register_buffer("tile_scales", None, persistent=False)

    def use_tiles(self, tiles: torch.Tensor, scales: torch.Tensor) -> None:
        """Compute with the lean step's integer kernel over ``tiles`` from now on (see
        :func:`serving.lean.tiles.int4_tiles`); torch's packed copy is dropped."""
        self.tiles, self.tile_scales = tiles, scales
        self.packed = torch.empty(0, dtype=torch.uint8)

    def dequantized_weight(self) -> torch.Tensor:
        codes = unnibble(self.codes, self.in_features).float()  # [out, in]
        scale = self.scales_and_zeros[..., 0].float().t()  # [out, groups]
        zero = self.scales_and_zeros[..., 1].float().t()
        grouped = codes.reshape(self.out_features, -1, INT4_GROUP)
        return ((grouped - 8) * scale[..., None] + zero[..., None]).reshape(
            self.out_features, self.in_features
        )

    def _matmul(self, flat: torch.Tensor) -> torch.Tensor:
        if self.tiles is not None:
            x = flat.to(torch.float32).contiguous()
            return torch.ops.specops_lean.int4_mm(x, self.tiles, self.tile_scales, False)
        return torch.ops.aten._weight_int4pack_mm_for_cpu(
            flat.to(_ACT), self.packed, INT4_GROUP, self.scales_and_zeros
        )


def _nibbles(codes: torch.Tensor) -> torch.Tensor:
    """Two 4-bit codes per byte (the kernel's packed layout is opaque, so export keeps its
    own copy: 0.5 bytes per weight, never read while decoding)."""
    return (codes[:, 0::2] | (codes[:, 1::2] << 4)).to(torch.uint8)


def unnibble(packed: torch.Tensor, in_features: int) -> torch.Tensor:
    """The ``[out, in]`` int32 codes of :func:`_nibbles`' bytes."""
    codes = torch.empty(packed.shape[0], in_features, dtype=torch.int32)
    codes[:, 0::2] = (packed & 0xF).to(torch.int32)
    codes[:, 1::2] = (packed >> 4).to(torch.int32)
    return codes


QUANTISED_LAYERS: dict[str, type[_QuantisedLinear]] = {"int8": Int8Linear, "int4": Int4Linear}


def quantize_linear_layers(model: torch.nn.Module, scheme: str, *, fuse: bool = True) -> int:
    """Replace every plain ``nn.Linear`` of ``model`` (the output head included) with its
    ``scheme`` layer in place; return how many were replaced. ``fuse`` first stacks each
    layer's q/k/v and gate/up projections (:mod:`serving.models.fused`; same codes, fewer
    calls). Layers the kernels cannot shape stay float32. Subclasses (bitsandbytes layers)
    are left alone, as in :func:`serving.models.onednn.pack_linear_layers`."""
    check_kernels(scheme)
    if next(model.parameters()).device.type != "cpu":
        raise SpecOpsError(f"{scheme} weight kernels are for CPU models; load it on the CPU")
    if fuse:
        fuse_projections(model)
        fuse_norms(model)
    # The output head keeps 8-bit codes under int4, as the GGUF keeps its output matrix in
    # Q8_0. Measured (measurements/quality*.json): with a 4-bit head, top-1 agreement with fp32 was
    # 94.5 % and no output matched fp32's; with this one 98.9 % and 16 % matched.
    get_head = getattr(model, "get_output_embeddings", None)
    head = get_head() if callable(get_head) else None
    replaced = 0
    for module in list(model.modules()):
        for name, child in list(module.named_children()):
            if type(child) is not torch.nn.Linear:
                continue
            layer = QUANTISED_LAYERS["int8" if child is head else scheme]
            if quantisable(child, layer.scheme):  # type: ignore[arg-type]
                setattr(module, name, layer(child))
                replaced += 1
    return replaced


def dequantize_linear_layers(model: torch.nn.Module) -> int:
    """The inverse, for export: every quantised layer back to a float32 ``nn.Linear``
    holding the weight its codes stand for, fused projections split again. Quantising that
    again gives the same codes."""
    restored = 0
    for module in list(model.modules()):
        for name, child in list(module.named_children()):
            if isinstance(child, _QuantisedLinear):
                linear = torch.nn.Linear(
                    child.in_features, child.out_features, bias=child.bias is not None
                )
                with torch.no_grad():
                    linear.weight.copy_(child.dequantized_weight())
                    if child.bias is not None:
                        linear.bias.copy_(child.bias)  # type: ignore[arg-type]
                setattr(module, name, linear)
                restored += 1
    unfuse_projections(model)
    config = getattr(model, "config", None)
    if restored and getattr(config, "tie_word_embeddings", False):
        # The output layer now holds its own (quantised) values, no longer the embedding's:
        # a saved copy must say so, or loading it would tie them back.
        config.tie_word_embeddings = False  # type: ignore[union-attr]
    return restored
