"""Put the lean step under a loaded target: ``model(...)`` runs it for the step's caches.

The model object stays what every front knows (its config, its layers for ``layers:N``
drafts, export); its ``forward`` gains one branch: a pass whose cache is the step's — one
request's, or a packed pass's over several (:mod:`serving.batch.ragged`) — runs the step:
:class:`~serving.lean.step.LeanStep` (C++ ops, :class:`~serving.lean.cache.LeanCache`) on
the CPU, :class:`~serving.lean.graphed.GraphedStep` (CUDA graphs,
:class:`~serving.lean.graphed.GraphedCache`) on a GPU. Any other call (a ``DynamicCache``,
training, a draft's own cache) runs transformers' forward as before.
:func:`serving.kv.new_cache` hands out the step's caches for a model that has one.

``SPECOPS_LEAN``: ``auto`` (default) uses the step where it can and logs, once, why not
where it cannot; ``on`` makes that an error; ``off`` keeps transformers' forward.
"""

from __future__ import annotations

import logging
import os
from typing import Any

import torch
from transformers.modeling_outputs import CausalLMOutputWithPast

from serving.errors import BadInputError
from serving.lean.build import LeanUnavailable, load_ops
from serving.lean.cache import LeanCache
from serving.lean.graphed import GraphedCache, GraphedStep
from serving.lean.graphed import unsupported_reason as graphed_unsupported
from serving.lean.step import LeanStep, unsupported_reason

log = logging.getLogger(__name__)
MODES = ("auto", "on", "off")
_said: set[str] = set()


def lean_mode(mode: str | None = None) -> str:
    chosen = mode or os.environ.get("SPECOPS_LEAN", "auto")
    if chosen not in MODES:
        raise BadInputError(f"SPECOPS_LEAN={chosen!r}: choose one of {MODES}")
    return chosen


def _fallback(reason: str, mode: str) -> None:
    if mode == "on":
        raise LeanUnavailable(f"SPECOPS_LEAN=on but {reason}")
    if reason not in _said:
        _said.add(reason)
        log.warning("decoding through transformers' forward: %s", reason)


def preflight(kernels: str, device: str, mode: str | None = None) -> bool:
    """Before any weights are read: whether the lean step will be tried for a target
    loaded with ``kernels`` on ``device`` (builds the ops once). With ``on``, what stops it
    is an error naming what is missing."""
    mode = lean_mode(mode)
    if mode == "off":
        return False
    if device == "cuda" and kernels == "stock":  # the graphed step: torch's own kernels
        return True
    if kernels not in ("onednn", "int8", "int4") or device != "cpu":
        if mode == "auto":  # a target chosen off the CPU kernels: nothing to say
            log.info("the lean step covers onednn, int8 and int4 on the CPU and stock on "
                     "CUDA, not %s on %s", kernels, device)  # fmt: skip
            return False
        _fallback(
            "the lean step covers onednn, int8 and int4 on the CPU and stock on CUDA, not "
            f"{kernels} on {device}",
            mode,
        )
        return False
    try:
        load_ops()
    except LeanUnavailable as error:
        _fallback(str(error), mode)
        return False
    return True


def lean_step(model: torch.nn.Module) -> LeanStep | None:
    """The CPU lean step of ``model`` (``None`` where it has none, or has the graphed one)."""
    step = getattr(model, "specops_lean", None)
    return step if isinstance(step, LeanStep) else None


def install(model: torch.nn.Module, mode: str | None = None) -> LeanStep | GraphedStep | None:
    """Give ``model`` the lean step — :class:`LeanStep` on the CPU, :class:`GraphedStep`
    on a GPU — (see the module docstring); ``None`` where it cannot run (logged, or raised
    with ``on``)."""
    mode = lean_mode(mode)
    if mode == "off":
        return None
    on_gpu = next(model.parameters()).device.type == "cuda"
    reason = graphed_unsupported(model) if on_gpu else unsupported_reason(model)
    if reason is not None:
        _fallback(f"the lean step does not cover this model: {reason}", mode)
        return None
    return attach(model, GraphedStep(model) if on_gpu else LeanStep(model))


def attach(model: torch.nn.Module, step: LeanStep | GraphedStep) -> LeanStep | GraphedStep:
    """Route ``model``'s passes over ``step``'s caches through ``step`` (what
    :func:`install` does once it has chosen the step)."""
    kind: type = GraphedCache if isinstance(step, GraphedStep) else LeanCache
    transformers_forward = model.forward

    def forward(input_ids: Any = None, *args: Any, **kwargs: Any) -> Any:
        cache = kwargs.get("past_key_values")
        ragged = kwargs.get("specops_ragged")
        if ragged is not None and all(isinstance(c, kind) for c in ragged.caches):
            caches = list(ragged.caches)
            rows = [b - a for a, b in ragged.bounds]
        elif isinstance(cache, kind):
            caches, rows = [cache], [int(input_ids.shape[-1])]
        else:
            return transformers_forward(input_ids, *args, **kwargs)
        if args or input_ids is None or input_ids.dim() != 2 or input_ids.shape[0] != 1:
            raise BadInputError("the lean step takes input_ids [1, rows] by keyword arguments")
        keep = kwargs.get("logits_to_keep", 0)
        want_hidden = bool(kwargs.get("output_hidden_states"))
        out = step.forward(
            input_ids[0],
            caches,
            rows,
            keep=int(keep),
            want_hidden=want_hidden,  # type: ignore[arg-type]
        )
        hidden = (out.hidden[None],) if out.hidden is not None else None
        return CausalLMOutputWithPast(
            logits=out.logits[None],  # type: ignore[arg-type]
            past_key_values=cache,
            hidden_states=hidden,  # type: ignore[arg-type]
        )

    model.forward = forward  # type: ignore[method-assign]
    model.specops_lean = step  # type: ignore[assignment]
    return step
