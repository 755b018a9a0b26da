"""A LoRA draft stored as its adapter, rebuilt over its target's own first N layers.

A LoRA draft of the target's first N layers (:mod:`tasks.train.distill`, ``layers=N``) is
the target's layers plus low-rank updates: its package keeps the peft adapter folder (a few
MB) and :data:`BASE_FILE` beside it, which says which base the adapter was trained on (N and
the target's shapes), instead of a full fp32 copy of the merged model (~170 MB for
SmolLM2-135M's first 4 layers). :func:`load_lora_draft` rebuilds that base from the target it
is loaded against, exactly as training built it (a fresh fp32 copy of the target's first N
layers, never the target's own modules), and merges the adapter into it
(``merge_and_unload``): the same weights :func:`tasks.train.distill_model.merge_lora` wrote.

Where the target's layers are not plain float32 parameters (packed for oneDNN, quantised to
int8/int4, or held in bfloat16 on a GPU) the fp32 base is read from the target's own model
folder (``config._name_or_path``, where ``from_pretrained`` loaded it), checked against the
target's embedding; the merged draft then takes the target's dtype and kernels like any
``model:PATH`` draft (:func:`serving.engine.drafters.model.model_drafter_for`).

peft is needed only here, when a LoRA package loads (``pip install 'specops[train]'``).
"""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Literal, cast

import torch
from pydantic import BaseModel, ConfigDict, Field, ValidationError
from transformers import PreTrainedModel

from serving.errors import ModelSourceError
from serving.models.kernels import kernels_of
from serving.models.truncated import first_layers

BASE_FILE = "lora_base.json"  # in the adapter folder: the base it was trained on
ADAPTER_CONFIG = "adapter_config.json"  # peft's


class LoraBase(BaseModel):
    """The base a LoRA adapter was trained on: its target's first ``layers`` layers."""

    model_config = ConfigDict(extra="forbid")

    format: Literal[1] = 1
    layers: int = Field(ge=1)  # N: the target's first N layers
    model_type: str  # the target's config.model_type, e.g. "llama"
    hidden_size: int = Field(ge=1)
    vocab_size: int = Field(ge=1)
    target_layers: int = Field(ge=2)  # the training target's layer count (for messages)


def lora_base_of(target: PreTrainedModel, layers: int) -> LoraBase:
    """What :data:`BASE_FILE` records for an adapter over ``target``'s first ``layers``."""
    config = target.config
    return LoraBase(
        layers=layers,
        model_type=str(config.model_type),
        hidden_size=int(config.hidden_size),
        vocab_size=int(config.vocab_size),
        target_layers=int(config.num_hidden_layers),
    )


def write_lora_base(adapter_dir: str | Path, base: LoraBase) -> Path:
    path = Path(adapter_dir) / BASE_FILE
    path.write_text(base.model_dump_json(indent=2))
    return path


def read_lora_base(adapter_dir: str | Path) -> LoraBase:
    """The adapter folder's :data:`BASE_FILE`; :class:`ModelSourceError` naming what is
    missing or wrong."""
    folder = Path(adapter_dir)
    if not (folder / ADAPTER_CONFIG).is_file():
        raise ModelSourceError(
            f"{str(folder)!r} is not a LoRA adapter: {ADAPTER_CONFIG} is missing"
        )
    path = folder / BASE_FILE
    if not path.is_file():
        raise ModelSourceError(
            f"the LoRA adapter at {str(folder)!r} does not say which base it was trained on: "
            f"{BASE_FILE} is missing; ship its merged model as a model:PATH draft instead"
        )
    try:
        return LoraBase.model_validate(json.loads(path.read_text()))
    except (json.JSONDecodeError, UnicodeDecodeError, ValidationError) as error:
        raise ModelSourceError(f"bad {BASE_FILE} in {str(folder)!r}: {error}") from None


def check_base_fits(base: LoraBase, target: PreTrainedModel, adapter_dir: str | Path) -> None:
    """Refuse an adapter whose base the target cannot give: N not below its layer count,
    or another architecture, width or vocabulary."""
    config = target.config
    total = int(config.num_hidden_layers)
    where = f"the LoRA adapter at {str(adapter_dir)!r}"
    if not base.layers < total:
        raise ModelSourceError(
            f"{where} was trained on the first {base.layers} layers of a {base.target_layers}-"
            f"layer target, but this target has {total} layers (layers:N needs N < {total}); "
            "load it against the target it was trained for"
        )
    ours = {
        "model_type": str(config.model_type),
        "hidden_size": int(config.hidden_size),
        "vocab_size": int(config.vocab_size),
    }
    for key, value in ours.items():
        if getattr(base, key) != value:
            raise ModelSourceError(
                f"{where} was trained on a target with {key}={getattr(base, key)!r}, but this "
                f"target has {key}={value!r}; load it against the target it was trained for"
            )


def _plain_fp32(target: PreTrainedModel) -> bool:
    return kernels_of(target) == "stock" and all(
        p.dtype == torch.float32 for p in target.parameters()
    )


def fp32_first_layers(target: PreTrainedModel, layers: int) -> PreTrainedModel:
    """A fresh float32 copy of ``target``'s first ``layers`` layers, embedding, final norm
    and output layer, in eval mode: the base a LoRA draft was trained on. ``target`` is
    read, never modified, and shares no module with the copy."""
    if _plain_fp32(target):
        return copy.deepcopy(first_layers(target, layers)).float().eval()
    return _first_layers_from_folder(target, layers)


def _first_layers_from_folder(target: PreTrainedModel, layers: int) -> PreTrainedModel:
    """The fp32 base read from the folder ``target`` was loaded from (its own layers are
    packed, quantised or not float32), checked against the target's embedding."""
    from transformers import AutoConfig, AutoModelForCausalLM
    from transformers.utils import logging as hf_logging

    source = str(getattr(target.config, "_name_or_path", "") or "")
    folder = Path(source)
    if not source or not (folder / "config.json").is_file():
        raise ModelSourceError(
            f"a LoRA draft needs its target's float32 weights, but this target runs "
            f"{kernels_of(target)!r} kernels in {next(target.parameters()).dtype} and its "
            f"model folder ({source!r}) is not there to read them from; load the target from "
            "its folder, or with kernels='stock' in float32"
        )
    total = int(target.config.num_hidden_layers)
    if not 1 <= layers < total:
        raise ModelSourceError(f"a LoRA base needs 1 <= layers < {total}, got {layers!r}")
    config = AutoConfig.from_pretrained(folder)
    config.num_hidden_layers = layers
    if getattr(config, "layer_types", None):
        config.layer_types = config.layer_types[:layers]
    verbosity = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()  # the layers past N are unused on purpose
    try:
        model = AutoModelForCausalLM.from_pretrained(folder, config=config, dtype=torch.float32)
    except (OSError, ValueError) as error:
        raise ModelSourceError(f"cannot read the target's weights at {source!r}: {error}") from None
    finally:
        hf_logging.set_verbosity(verbosity)
    ours = cast(torch.Tensor, target.get_input_embeddings().weight).detach()
    theirs = model.get_input_embeddings().weight.detach()  # type: ignore[operator]
    if theirs.shape != ours.shape or not torch.equal(theirs.to(ours.dtype), ours.cpu()):
        raise ModelSourceError(
            f"the weights in the target's folder {source!r} are not the loaded target's (their "
            "embeddings differ); load the target with kernels='stock' in float32 to serve a "
            "LoRA draft of it"
        )
    return model.eval()


def load_adapter(adapter_dir: str | Path, base):
    """The peft model of the adapter in ``adapter_dir`` on ``base`` (eval mode)."""
    try:
        from peft import PeftModel
    except ImportError as error:
        raise ModelSourceError(
            f"a LoRA adapter needs peft, which does not import here ({error}); install it "
            "with `pip install 'specops[train]'`"
        ) from None
    adapter_dir = Path(adapter_dir)
    if not (adapter_dir / ADAPTER_CONFIG).is_file():
        raise ModelSourceError(f"{adapter_dir} is not a LoRA adapter: {ADAPTER_CONFIG} is missing")
    try:
        return PeftModel.from_pretrained(base, adapter_dir).eval()
    except (OSError, ValueError, RuntimeError, KeyError) as error:
        raise ModelSourceError(f"cannot load the LoRA adapter at {adapter_dir}: {error}") from error


def merge_adapter(adapter_dir: str | Path, base):
    """``base`` with the adapter's low-rank updates added into its weights: a plain model."""
    return load_adapter(adapter_dir, base).merge_and_unload()


def load_lora_draft(adapter_dir: str | Path, target: PreTrainedModel) -> PreTrainedModel:
    """The float32 draft of a stored adapter: its base rebuilt from ``target``
    (:func:`fp32_first_layers`) with the adapter merged in. Raises
    :class:`ModelSourceError` if the adapter does not fit ``target``."""
    base = read_lora_base(adapter_dir)
    check_base_fits(base, target, adapter_dir)
    return merge_adapter(adapter_dir, fp32_first_layers(target, base.layers)).eval()
