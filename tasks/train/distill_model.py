"""The models of draft distillation: the base to train, LoRA (peft), quantized bases
(bitsandbytes), and the standalone folders written after training.

The base is either a deep copy of the target's first N layers (:func:`first_layers` shares
the target's modules; training the copy never touches the target) or a local Hugging Face
causal-LM folder sharing the target's vocabulary. A LoRA run saves its adapter
(``save_pretrained``, loadable again with :func:`load_lora` on a fresh base) and merges it
into a fresh fp32 base (``merge_and_unload``): the merged folder is a plain causal LM that
the ``model:PATH`` drafter serves. With a quantized base (QLoRA) the adapter is trained
against the 8-/4-bit weights and merged into the fp32 ones.
"""

from __future__ import annotations

import copy
import tempfile
from pathlib import Path
from typing import Literal

import torch

from serving.atomic import atomic_dir
from serving.errors import BadInputError, IncompatibleDraftError, ModelSourceError
from serving.models.truncated import first_layers

Quantize = Literal["none", "8bit", "4bit"]
BITSANDBYTES = "bitsandbytes==0.50.2"  # the version that ran nf4/int8 on this CPU


def check_quantize_available(quantize: Quantize) -> None:
    """Raise :class:`BadInputError` naming the install command if ``quantize`` needs
    bitsandbytes and it does not import here."""
    if quantize == "none":
        return
    try:
        import bitsandbytes  # noqa: F401
    except (ImportError, OSError, RuntimeError) as exc:
        raise BadInputError(
            f"quantize={quantize!r} needs bitsandbytes, which does not import here ({exc}); "
            f"install it with `pip install {BITSANDBYTES}` or use quantize='none'"
        ) from exc


def _check_trainable(target) -> None:
    from serving.models.onednn import PackedLinear

    if any(isinstance(module, PackedLinear) for module in target.modules()):
        raise BadInputError(
            "the target's linear layers are packed for oneDNN (inference only, no weights to "
            "copy); load it with kernels='stock' to train a layers draft"
        )


def base_draft(target, *, layers: int | None, draft_model: Path | None, tokenizer=None):
    """A fresh fp32 base for the draft, in train mode: a deep copy of ``target``'s first
    ``layers`` layers, or the causal LM in the folder ``draft_model``."""
    from transformers import AutoModelForCausalLM

    if layers is not None:
        _check_trainable(target)
        model = copy.deepcopy(first_layers(target, layers))  # never the target's own modules
    else:
        assert draft_model is not None
        folder = Path(draft_model)
        if not folder.is_dir():
            raise ModelSourceError(f"draft_model {str(folder)!r} is not a model folder")
        if tokenizer is not None:
            from serving.drafters.factory import _check_same_tokenizer

            _check_same_tokenizer(str(folder), tokenizer)
        try:
            model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32)
        except (OSError, ValueError) as exc:
            raise ModelSourceError(f"cannot load the draft model at {folder}: {exc}") from exc
        draft_vocab, vocab = int(model.config.vocab_size), int(target.config.vocab_size)
        if draft_vocab != vocab:
            raise IncompatibleDraftError(
                f"the draft model at {folder} has a vocabulary of {draft_vocab} tokens but the "
                f"target has {vocab}; a draft must share the target's tokenizer"
            )
    return model.float().train()


def quantized(model, quantize: Quantize, scratch: Path):
    """``model`` reloaded with its linear layers in bitsandbytes 8-bit or nf4 (through a
    temporary save under ``scratch``), prepared for k-bit LoRA training."""
    from peft import prepare_model_for_kbit_training
    from transformers import AutoModelForCausalLM, BitsAndBytesConfig

    check_quantize_available(quantize)
    if quantize == "4bit":
        settings = BitsAndBytesConfig(
            load_in_4bit=True, bnb_4bit_quant_type="nf4", bnb_4bit_compute_dtype=torch.float32
        )
    else:
        settings = BitsAndBytesConfig(load_in_8bit=True)
    with tempfile.TemporaryDirectory(dir=scratch, prefix=".quantize.") as folder:
        model.save_pretrained(folder)
        loaded = AutoModelForCausalLM.from_pretrained(
            folder, quantization_config=settings, dtype=torch.float32
        )
    loaded.config._name_or_path = model.config._name_or_path  # not the temporary folder
    for module in loaded.modules():
        # bitsandbytes 0.50.2 repacks nf4 weights for its CPU inference kernel on the first
        # eval-mode pass and never unpacks them; later training passes then run that kernel,
        # which has no autograd (gradients come out silently wrong). Keep the plain layout.
        if hasattr(module, "support_avx512bf16_for_cpu"):
            setattr(module, "support_avx512bf16_for_cpu", False)  # noqa: B010 - a plain attribute
    return prepare_model_for_kbit_training(loaded, use_gradient_checkpointing=False)


def with_lora(model, *, r: int, alpha: int, dropout: float, target_modules: str | tuple[str, ...]):
    """Wrap ``model`` in a fresh peft LoRA adapter (only the adapter is trainable)."""
    from peft import LoraConfig, get_peft_model

    settings = LoraConfig(
        r=r,
        lora_alpha=alpha,
        lora_dropout=dropout,
        target_modules=target_modules if isinstance(target_modules, str) else list(target_modules),
        bias="none",
        task_type="CAUSAL_LM",
    )
    try:
        return get_peft_model(model, settings)
    except ValueError as exc:
        raise BadInputError(
            f"LoRA target_modules {target_modules!r} do not fit the draft ({exc}); name its "
            "linear layers (e.g. q_proj,v_proj) or use 'all-linear'"
        ) from exc


def load_lora(adapter_dir: str | Path, base):
    """The peft model of an adapter saved by a LoRA run, on ``base`` (see
    :func:`base_draft`)."""
    from peft import PeftModel

    adapter_dir = Path(adapter_dir)
    if not (adapter_dir / "adapter_config.json").is_file():
        raise ModelSourceError(
            f"{adapter_dir} is not a LoRA adapter: adapter_config.json is missing"
        )
    try:
        return PeftModel.from_pretrained(base, adapter_dir).eval()
    except (OSError, ValueError, RuntimeError, KeyError) as exc:
        raise ModelSourceError(f"cannot load the LoRA adapter at {adapter_dir}: {exc}") from exc


def merge_lora(adapter_dir: str | Path, base):
    """``base`` with the adapter's low-rank updates added into its weights: a plain model."""
    return load_lora(adapter_dir, base).merge_and_unload()


def save_causal_lm(model, folder: Path, tokenizer=None) -> Path:
    """A standalone Hugging Face causal-LM folder (with the tokenizer, if given), written
    atomically."""
    with atomic_dir(folder) as scratch:
        model.save_pretrained(scratch)
        if tokenizer is not None:
            tokenizer.save_pretrained(scratch)
    return folder
