"""Choose the lean step for a loaded target: whether it can run, and which.

:class:`~serving.lean.step.LeanStep` (C++ ops, :class:`~serving.lean.cache.LeanCache`) on
the CPU, :class:`~serving.lean.graphed.GraphedStep` (CUDA graphs,
:class:`~serving.lean.graphed.GraphedCache`) on a GPU. The model object stays what every
front knows (its config, its layers for ``layers:N`` drafts, export) and is not changed:
the step is held by the :class:`serving.target.LoadedTarget` over it, whose passes over the
step's caches — one request's, or a packed pass's over several
(:mod:`serving.engine.batch.ragged`) — run the step; any other pass (a ``DynamicCache``,
training, a draft's own cache) runs transformers' forward.

``SPECOPS_LEAN``: ``auto`` (default) uses the step where it can and logs, once, why not
where it cannot; ``on`` makes that an error; ``off`` keeps transformers' forward.
"""

from __future__ import annotations

import logging
import os

from transformers import PreTrainedModel

from serving.errors import BadInputError
from serving.lean.build import LeanUnavailable, load_ops
from serving.lean.graphed import GraphedStep
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
            log.info(
                "the lean step covers onednn, int8 and int4 on the CPU and stock on "
                "CUDA, not %s on %s",
                kernels,
                device,
            )
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


def make_step(model: PreTrainedModel, mode: str | None = None) -> LeanStep | GraphedStep | None:
    """The lean step for ``model`` — :class:`LeanStep` on the CPU, :class:`GraphedStep` on
    a GPU — or ``None`` where it cannot run (logged, or raised with ``on``). The model is
    left as it is: the step lives on the :class:`serving.target.LoadedTarget` built over
    it, which routes the passes over the step's caches through it."""
    mode = lean_mode(mode)
    if mode == "off":
        return None
    on_gpu = next(model.parameters()).device.type == "cuda"
    reason = graphed_unsupported(model) if on_gpu else unsupported_reason(model)
    if reason is not None:
        _fallback(f"the lean step does not cover this model: {reason}", mode)
        return None
    return GraphedStep(model) if on_gpu else LeanStep(model)


def step_like(step: object, model: PreTrainedModel) -> LeanStep | GraphedStep | None:
    """A step of ``step``'s kind over ``model`` (a draft cut from the layers ``step``
    runs): a graphed one captured as ``step`` is, or the CPU's where it covers ``model``."""
    if isinstance(step, GraphedStep):
        return GraphedStep(model, capture=step.capture)
    if isinstance(step, LeanStep):
        return make_step(model, "auto")
    return None
