"""Put the lean step under a loaded target: ``model(...)`` runs it for lean caches.

The model object stays what every front knows (its config, its layers for ``layers:N``
drafts, export); its ``forward`` gains one branch: a pass whose cache is a
:class:`~serving.lean.cache.LeanCache` — one request's, or a packed pass's over several
(:mod:`serving.batch.ragged`) — runs :class:`~serving.lean.step.LeanStep`; any other call
(a ``DynamicCache``, training, a draft's own cache) runs transformers' forward as before.
:func:`serving.kv.new_cache` hands out lean caches for a model that has the step.

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
    if kernels not in ("onednn", "int8", "int4") or device != "cpu":
        if mode == "auto":  # a target chosen off the CPU kernels: nothing to say
            log.info("the lean step covers onednn, int8 and int4 on the CPU, not %s", kernels)
            return False
        _fallback(
            f"the lean step covers onednn, int8 and int4 on the CPU, not {kernels} on {device}",
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
    return getattr(model, "specops_lean", None)


def install(model: torch.nn.Module, mode: str | None = None) -> LeanStep | None:
    """Give ``model`` the lean step (see the module docstring); ``None`` where it cannot
    run (logged, or raised with ``on``)."""
    mode = lean_mode(mode)
    if mode == "off":
        return None
    reason = unsupported_reason(model)
    if reason is not None:
        _fallback(f"the lean step does not cover this model: {reason}", mode)
        return None
    step = LeanStep(model)
    transformers_forward = model.forward

    def forward(input_ids: Any = None, *args: Any, **kwargs: Any) -> Any:
        cache = kwargs.get("past_key_values")
        ragged = kwargs.get("specops_ragged")
        if ragged is not None and all(isinstance(c, LeanCache) for c in ragged.caches):
            caches = list(ragged.caches)
            rows = [b - a for a, b in ragged.bounds]
        elif isinstance(cache, LeanCache):
            caches, rows = [cache], [int(input_ids.shape[-1])]
        else:
            return transformers_forward(input_ids, *args, **kwargs)
        if args or input_ids is None or input_ids.dim() != 2 or input_ids.shape[0] != 1:
            raise BadInputError("the lean step takes input_ids [1, rows] by keyword arguments")
        keep = kwargs.get("logits_to_keep", 0)
        want_hidden = bool(kwargs.get("output_hidden_states"))
        out = step.forward(input_ids[0], caches, rows, keep=int(keep), want_hidden=want_hidden)
        hidden = (out.hidden[None],) if out.hidden is not None else None
        return CausalLMOutputWithPast(
            logits=out.logits[None],  # type: ignore[arg-type]
            past_key_values=cache,
            hidden_states=hidden,  # type: ignore[arg-type]
        )

    model.forward = forward  # type: ignore[method-assign]
    model.specops_lean = step  # type: ignore[assignment]
    return step
