"""The target model as a command loads it: checked against its hardware target first, with
torch's threads set, then loaded as that target loads it (kernels, device, dtype)."""

from __future__ import annotations

from typing import Any

from serving.hardware import HardwareTarget


def load_engine_target(target: str, hardware: str, threads: int) -> tuple[HardwareTarget, Any, Any]:
    """``(hardware target, model, tokenizer)``; a bad ``hardware`` or ``threads`` raises
    :class:`~serving.errors.BadInputError` before any model is loaded."""
    from serving.hardware import engine_target
    from serving.loader import load_target, set_threads

    spec = engine_target(hardware)
    set_threads(threads)
    model, tokenizer = load_target(target, **spec.load_options())
    return spec, model, tokenizer
