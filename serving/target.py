"""The loaded target: the one object every layer receives for "the target model".

:class:`LoadedTarget` holds the model and its tokenizer, the resolved hardware target it
was loaded for (backend, device, kernels, verify and batch curves), its end-of-sequence
ids and context limit, and the lean step's state (:mod:`serving.lean`). It is built once,
by :func:`serving.loader.load_target` (from a model source) or :func:`prepare_target`
(from a model in memory), and passed down; nothing asks the model for attributes a loader
once hung on it.

A pass is ``target(input_ids=..., past_key_values=cache, ...)``, transformers' calling
convention: a pass over the step's own caches (one request's, or a packed pass's over
several: :mod:`serving.engine.batch.ragged`) runs the step; any other (a
``DynamicCache``, teacher forcing) runs transformers' forward. :meth:`LoadedTarget.over`
gives a draft built from the target's own layers (``layers:N``) the same kind of step;
:meth:`LoadedTarget.with_step` swaps the step, which is how the pre-gate replays a
recording (:mod:`tasks.evaluate.pregate`) through the engine unchanged.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any, Protocol, cast

import torch
from transformers import DynamicCache, PreTrainedModel
from transformers.modeling_outputs import CausalLMOutputWithPast

from serving.defaults import DEFAULT_TARGET
from serving.errors import BadInputError, SpecOpsError
from serving.hardware import HardwareTarget, hardware_target
from serving.lean.cache import Length
from serving.lean.step import LeanOutput
from serving.models.kernels import kernels_of

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

log = logging.getLogger(__name__)

__all__ = ["DEFAULT_TARGET", "Cache", "LoadedTarget", "Step", "eos_ids", "prepare_target"]


class Step(Protocol):
    """A decode step that owns its caches: the lean step on the CPU
    (:class:`serving.lean.step.LeanStep`), the graphed one on a GPU
    (:class:`serving.lean.graphed.GraphedStep`), or a recording (the pre-gate's)."""

    @property
    def cache_type(self) -> type[Length]: ...

    def new_cache(self) -> Length: ...

    def forward(
        self,
        ids: torch.Tensor,
        caches: Any,  # Sequence of this step's caches
        rows: Sequence[int],
        *,
        keep: int = 0,
        want_hidden: bool = False,
    ) -> LeanOutput: ...


# A cache of the engine: transformers', or a step's (serving.lean: the CPU's or the GPU's).
Cache = DynamicCache | Length


def dynamic_cache(config: Any) -> DynamicCache:
    """transformers' cache for a model of ``config``. Only full-attention caches can be
    rewound safely after a rejected draft."""
    if getattr(config, "sliding_window", None) and getattr(config, "use_sliding_window", True):
        raise SpecOpsError(
            f"{config.model_type!r} uses sliding-window attention, whose cache cannot be "
            "rewound after a rejected draft; use a full-attention model"
        )
    return DynamicCache(config=config)


def eos_ids(model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase | None) -> tuple[int, ...]:
    """The ids that end a sequence: the model's generation config's and the tokenizer's."""
    ids: set[int] = set()
    config = getattr(model, "generation_config", None)
    for source in (getattr(config, "eos_token_id", None), getattr(tokenizer, "eos_token_id", None)):
        if source is None:
            continue
        ids.update(source if isinstance(source, list) else [source])
    return tuple(sorted(int(i) for i in ids))


@dataclass(eq=False)
class LoadedTarget:
    """The target as it serves (see the module docstring)."""

    model: PreTrainedModel  # transformers' causal LM, its layers on ``kernels``
    hardware: HardwareTarget  # resolved: its name, backend, device, kernels and curves
    tokenizer: PreTrainedTokenizerBase | None = None
    source: str = ""  # what it was loaded from: DEFAULT_TARGET or a model folder
    eos_token_ids: tuple[int, ...] = ()
    context_limit: int = 0  # positions a request may fill (0: the model config's limit)
    step: Step | None = None  # the lean step's state (None: transformers' forward only)
    # Derived once from the model (never read from attributes hung on it).
    device: torch.device = field(init=False)
    dtype: torch.dtype = field(init=False)
    kernels: str = field(init=False)

    def __post_init__(self) -> None:
        weight = next(self.model.parameters())
        self.device, self.dtype = weight.device, weight.dtype
        self.kernels = kernels_of(self.model)
        limit = int(getattr(self.model.config, "max_position_embeddings", 0) or 0)
        self.context_limit = int(self.context_limit or limit)
        self.eos_token_ids = tuple(int(t) for t in self.eos_token_ids)

    @classmethod
    def of(
        cls,
        model: PreTrainedModel,
        tokenizer: PreTrainedTokenizerBase | None = None,
        *,
        hardware: HardwareTarget | None = None,
        eos_token_ids: Sequence[int] = (),
        step: Step | None = None,
    ) -> LoadedTarget:
        """A model in memory taken as it is (no kernels applied, no lean step unless
        given, no end-of-sequence ids unless given: decoding runs to its token budget), on
        ``hardware`` (default: the stock target of the model's device, ``cpu-stock`` or
        ``cuda``). For tests and tools; a served target comes from
        :func:`serving.loader.load_target` or :func:`prepare_target`."""
        if hardware is None:
            device = next(model.parameters()).device.type
            hardware = hardware_target("cuda" if device == "cuda" else "cpu-stock")
        return cls(
            model=model,
            hardware=hardware,
            tokenizer=tokenizer,
            eos_token_ids=tuple(eos_token_ids),
            step=step,
        )

    # -- what the engine reads ------------------------------------------------------------

    @property
    def config(self) -> Any:
        return self.model.config

    @property
    def vocab_size(self) -> int:
        return int(self.model.config.vocab_size)

    @property
    def hidden_size(self) -> int:
        return int(self.model.config.hidden_size)

    @property
    def name(self) -> str:
        """The hardware target's name, as registry aliases, tags and records carry it."""
        return self.hardware.name

    def new_cache(self) -> Cache:
        """A fresh cache: the step's where the target has one, else transformers'."""
        if self.step is not None:
            return self.step.new_cache()
        return dynamic_cache(self.model.config)

    def __call__(self, input_ids: torch.Tensor | None = None, **kwargs: Any) -> Any:
        """One pass, in transformers' calling convention (see the module docstring)."""
        step = self.step
        cache = kwargs.get("past_key_values")
        ragged = kwargs.get("specops_ragged")
        if step is None:
            return self.model(input_ids=input_ids, **kwargs)
        if ragged is not None and all(isinstance(c, step.cache_type) for c in ragged.caches):
            caches = list(ragged.caches)
            rows = [b - a for a, b in ragged.bounds]
        elif isinstance(cache, step.cache_type):
            caches, rows = [cache], [0]
        else:
            return self.model(input_ids=input_ids, **kwargs)
        if input_ids is None or input_ids.dim() != 2 or input_ids.shape[0] != 1:
            raise BadInputError("the lean step takes input_ids [1, rows] by keyword arguments")
        if ragged is None:
            rows = [int(input_ids.shape[-1])]
        out = step.forward(
            input_ids[0],
            caches,
            rows,
            keep=int(kwargs.get("logits_to_keep") or 0),
            want_hidden=bool(kwargs.get("output_hidden_states")),
        )
        hidden = (out.hidden[None],) if out.hidden is not None else None
        return CausalLMOutputWithPast(
            logits=out.logits[None],  # type: ignore[arg-type]
            past_key_values=cache,
            hidden_states=hidden,  # type: ignore[arg-type]
        )

    # -- targets derived from this one ----------------------------------------------------

    def over(self, model: PreTrainedModel, *, lean: bool = True) -> LoadedTarget:
        """``model`` (a draft cut from this target's layers, or any draft served beside
        it) served like this target: same hardware and end-of-sequence ids, and, with
        ``lean`` where this target has a step, the same kind of step over ``model``."""
        from serving.lean.install import step_like

        step = step_like(self.step, model) if lean and self.step is not None else None
        return LoadedTarget(
            model=model,
            hardware=self.hardware,
            tokenizer=self.tokenizer,
            source=self.source,
            eos_token_ids=self.eos_token_ids,
            step=step,
        )

    def with_step(self, step: Step | None) -> LoadedTarget:
        """This target decoding through ``step`` instead of its own."""
        return replace(self, step=step)


def check_placed(target: LoadedTarget) -> None:
    """A :class:`BadInputError` when the model is not on its hardware target's device
    (its verify curve was measured there: elsewhere it would decode, mis-timed)."""
    if target.device.type != target.hardware.device_type:
        raise BadInputError(
            f"the model is on {target.device}, but hardware target {target.name!r} runs on "
            f"{target.hardware.device!r}; load it with load_target(source, "
            f"engine_target({target.name!r}))"
        )


def prepare_target(
    model: PreTrainedModel,
    hardware: HardwareTarget,
    tokenizer: PreTrainedTokenizerBase | None = None,
    *,
    source: str = "",
    lean_mode: str | None = None,
) -> LoadedTarget:
    """``model`` (transformers' causal LM, just loaded in ``hardware``'s dtype) made the
    target ``hardware`` serves: moved to its device, its linear layers on its kernels
    (:mod:`serving.models.kernels`), and on the lean step where that covers it
    (``lean_mode``: default ``$SPECOPS_LEAN`` or ``auto``)."""
    from serving.lean.install import make_step, preflight
    from serving.models.kernels import apply_kernels

    device = torch.device(hardware.device)
    lean = preflight(hardware.kernels, device.type, lean_mode)
    if device.type != "cpu":
        cast(torch.nn.Module, model).to(device)  # in place: every parameter moves
    apply_kernels(model, hardware.kernels, fuse=lean)
    step = make_step(model, lean_mode) if lean else None
    return LoadedTarget(
        model=model,
        hardware=hardware,
        tokenizer=tokenizer,
        source=source,
        eos_token_ids=eos_ids(model, tokenizer),
        step=step,
    )
