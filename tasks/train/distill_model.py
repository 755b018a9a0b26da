"""The models of draft distillation: the base to train, LoRA (peft), quantized bases
(bitsandbytes), and the standalone folders written after training.

The base is either a deep copy of the target's first N layers (:func:`first_layers` shares
the target's modules; training the copy never touches the target) or a local Hugging Face
causal-LM folder sharing the target's vocabulary. A LoRA run saves its adapter
(``save_pretrained``, loadable again with :func:`load_lora` on a fresh base) and merges it
into a fresh fp32 base (``merge_and_unload``): the merged folder is a plain causal LM that
the ``model:PATH`` drafter serves. With a quantized base (QLoRA) the adapter is trained
against the 8-/4-bit weights and merged into the fp32 ones.

Two checks guard what is written after training. The merge is checked against the
unmerged adapter on a few windows (:func:`check_merge`): both compute the same function in
exact arithmetic, so their logits may differ by fp32 rounding only. With a quantized base,
the merged model is also written re-quantised in the same mode (:func:`requantize_checked`),
and kept only if it loads back quantised and its top-1 tokens agree with the fp32 merged
model's often enough: ``MIN_REQUANTIZED_AGREEMENT``.
"""

from __future__ import annotations

import copy
import shutil
import tempfile
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Literal

import torch

from serving.atomic import atomic_dir
from serving.errors import BadInputError, IncompatibleDraftError, ModelSourceError
from serving.models.lora import load_adapter, merge_adapter
from serving.models.truncated import first_layers
from tasks.train.distill_data import DistillBatch

if TYPE_CHECKING:
    from transformers import PreTrainedModel

Quantize = Literal["none", "8bit", "4bit"]
BITSANDBYTES = "bitsandbytes==0.50.2"  # the version that ran nf4/int8 on this CPU

# How far the merged model's logits may drift from the adapter's, relative to the largest
# logit (at least 1). Merging reorders fp32 sums, W x + B (A x) -> (W + B A) x, so each
# layer's outputs move by a few ulps, compounded over the layers: 9.5e-7 of the logit scale
# on SmolLM2-135M's first 4 layers with an r=16 all-linear adapter (measured by the
# real-model test of tests/tasks/train/test_distill_checks.py, run with -s). 1e-4 leaves
# a 100-fold margin, while a wrong merge (a missed module, a wrong scaling, a corrupted
# weight) moves logits by a visible fraction of their scale.
MERGE_RTOL = 1e-4
# The least top-1 agreement of a re-quantised merged model with the fp32 one, on the check
# windows. Measured by the same test on that draft: LLM.int8() agreed at 0.955, nf4 at
# 0.856. A broken quantisation (a wrong layout, weights lost on save) agrees at about
# chance; a draft below the floor has lost a good part of what it learned.
MIN_REQUANTIZED_AGREEMENT: dict[str, float] = {"8bit": 0.9, "4bit": 0.8}


class MergeMismatchError(ModelSourceError):
    """The merged model does not compute what the adapter on its base computes."""


class RequantizationError(ModelSourceError):
    """The re-quantised merged model does not load, run, or agree with the fp32 one."""


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


def _check_trainable(target: PreTrainedModel) -> None:
    from serving.models.onednn import PackedLinear

    if any(isinstance(module, PackedLinear) for module in target.modules()):
        raise BadInputError(
            "the target's linear layers are packed for oneDNN (inference only, no weights to "
            "copy); load it on hardware target 'cpu-stock' (kernels='stock') to train a layers "
            "draft"
        )


def base_draft(
    target: PreTrainedModel, *, layers: int | None, draft_model: Path | None, tokenizer=None
):
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
            from serving.engine.drafters.model import check_same_tokenizer

            check_same_tokenizer(str(folder), tokenizer)
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


def quantized(model: PreTrainedModel, quantize: Quantize, scratch: Path):
    """``model`` reloaded with its linear layers in bitsandbytes 8-bit or nf4 (through a
    temporary save under ``scratch``), prepared for k-bit LoRA training."""
    from peft import prepare_model_for_kbit_training

    with tempfile.TemporaryDirectory(dir=scratch, prefix=".quantize.") as folder:
        model.save_pretrained(folder)
        loaded = load_quantized(folder, quantize)
    loaded.config._name_or_path = model.config._name_or_path  # not the temporary folder
    for module in loaded.modules():
        # bitsandbytes 0.50.2 repacks nf4 weights for its CPU inference kernel on the first
        # eval-mode pass and never unpacks them; later training passes then run that kernel,
        # which has no autograd (gradients come out silently wrong). Keep the plain layout.
        if hasattr(module, "support_avx512bf16_for_cpu"):
            setattr(module, "support_avx512bf16_for_cpu", False)  # noqa: B010 - a plain attribute
    return prepare_model_for_kbit_training(loaded, use_gradient_checkpointing=False)


def load_quantized(folder: str | Path, quantize: Quantize):
    """The causal LM in ``folder`` with its linear layers in bitsandbytes 8-bit (LLM.int8())
    or nf4 (fp32 compute); the output layer stays as it is (transformers' default)."""
    from transformers import AutoModelForCausalLM, BitsAndBytesConfig

    check_quantize_available(quantize)
    if quantize == "4bit":
        settings = BitsAndBytesConfig(
            load_in_4bit=True, bnb_4bit_quant_type="nf4", bnb_4bit_compute_dtype=torch.float32
        )
    elif quantize == "8bit":
        settings = BitsAndBytesConfig(load_in_8bit=True)
    else:
        raise BadInputError(f"quantize must be '8bit' or '4bit' here, got {quantize!r}")
    return AutoModelForCausalLM.from_pretrained(
        folder, quantization_config=settings, dtype=torch.float32
    )


def with_lora(
    model: PreTrainedModel,
    *,
    r: int,
    alpha: int,
    dropout: float,
    target_modules: str | tuple[str, ...],
):
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
    :func:`base_draft`): :func:`serving.models.lora.load_adapter`, which serving uses too."""
    return load_adapter(adapter_dir, base)


def merge_lora(adapter_dir: str | Path, base):
    """``base`` with the adapter's low-rank updates added into its weights: a plain model
    (what a ``lora:PATH`` draft package merges when it loads)."""
    return merge_adapter(adapter_dir, base)


def save_causal_lm(
    model: PreTrainedModel, folder: Path, tokenizer=None, *, atomic: bool = True
) -> Path:
    """A standalone Hugging Face causal-LM folder (with the tokenizer, if given), written
    atomically (``atomic=False``: straight into ``folder``, itself a scratch folder)."""
    if not atomic:
        model.save_pretrained(folder)
        if tokenizer is not None:
            tokenizer.save_pretrained(folder)
        return folder
    with atomic_dir(folder) as scratch:
        save_causal_lm(model, scratch, tokenizer, atomic=False)
    return folder


# ------------------------------------------------------------------- checks after training


@dataclass(frozen=True)
class MergeCheck:
    max_abs_diff: float  # the largest |merged - adapter| logit over the checked positions
    logit_scale: float  # the largest |logit| of the adapter model there
    tolerance: float  # MERGE_RTOL * max(logit_scale, 1)
    positions: int  # positions compared (every vocabulary entry of each)


@torch.no_grad()
def _logits(model: torch.nn.Module, batches: Sequence[DistillBatch]) -> Iterator[torch.Tensor]:
    """Per batch, ``model``'s fp32 logits at its real (unpadded) positions ``[n, vocab]``,
    on the model's device."""
    device = next(model.parameters()).device
    for batch in batches:
        input_ids, mask = batch.input_ids.to(device), batch.attention_mask.to(device)
        logits = model(input_ids=input_ids, attention_mask=mask).logits  # [rows, len, vocab]
        yield logits[mask > 0].float()


def check_merge(unmerged, merged, batches: Sequence[DistillBatch]) -> MergeCheck:
    """Compare the logits of ``merged`` (the adapter merged into its base) with those of
    ``unmerged`` (the adapter on a copy of the same base) on ``batches``; raise
    :class:`MergeMismatchError` if they differ by more than rounding (:data:`MERGE_RTOL`)."""
    if not batches:
        raise BadInputError("no windows to check the merge on; give at least one batch")
    was_training = unmerged.training, merged.training
    unmerged.eval()
    merged.eval()
    diff = scale = 0.0
    positions = 0
    try:
        for ours, theirs in zip(_logits(merged, batches), _logits(unmerged, batches), strict=True):
            diff = max(diff, float((ours - theirs.to(ours.device)).abs().max()))
            scale = max(scale, float(theirs.abs().max()))
            positions += ours.shape[0]
    finally:
        unmerged.train(was_training[0])
        merged.train(was_training[1])
    check = MergeCheck(diff, scale, MERGE_RTOL * max(scale, 1.0), positions)
    if not diff <= check.tolerance:  # a NaN fails too
        raise MergeMismatchError(
            f"the merged model's logits differ from the unmerged adapter's by up to {diff:.3g} "
            f"over {positions} positions, more than fp32 rounding allows ({check.tolerance:.3g}"
            f" = {MERGE_RTOL:g} x logit scale {max(scale, 1.0):.3g}): the merge is wrong. The "
            "adapter is saved unmerged; merge it again (merge_lora) or serve it with its base"
        )
    return check


def top1_agreement(
    model: torch.nn.Module, reference: torch.nn.Module, batches: Sequence[DistillBatch]
) -> float:
    """The fraction of the real positions of ``batches`` at which ``model``'s top token is
    ``reference``'s."""
    agree = total = 0
    for ours, theirs in zip(_logits(model, batches), _logits(reference, batches), strict=True):
        agree += int((ours.argmax(-1).cpu() == theirs.argmax(-1).cpu()).sum())
        total += ours.shape[0]
    if not total:
        raise BadInputError("no positions to compare; give at least one non-empty batch")
    return agree / total


def _is_quantized(model: torch.nn.Module, quantize: Quantize) -> bool:
    import bitsandbytes as bnb

    kind = bnb.nn.Linear8bitLt if quantize == "8bit" else bnb.nn.Linear4bit
    return any(isinstance(module, kind) for module in model.modules())


def requantize_checked(
    model_dir: str | Path,
    quantize: Quantize,
    folder: str | Path,
    *,
    reference,
    batches: Sequence[DistillBatch],
    tokenizer=None,
    min_agreement: float | None = None,
) -> float:
    """Write the causal LM in ``model_dir`` (the fp32 merged draft) to ``folder`` quantised
    with bitsandbytes in ``quantize`` mode, its quantization config in ``config.json`` so
    that a plain ``AutoModelForCausalLM.from_pretrained`` (the ``model:PATH`` drafter) loads
    it quantised; return its top-1 agreement with ``reference`` (that fp32 model) on
    ``batches``.

    The folder is loaded back as serving loads it before it is put in place. If it does not
    load quantised, does not run, or agrees less than ``min_agreement`` (default:
    :data:`MIN_REQUANTIZED_AGREEMENT`), :class:`RequantizationError` is raised and no folder
    is left at ``folder`` (an earlier one would not match ``model_dir``)."""
    from transformers import AutoModelForCausalLM

    floor = MIN_REQUANTIZED_AGREEMENT[quantize] if min_agreement is None else min_agreement
    folder = Path(folder)
    try:
        with atomic_dir(folder) as scratch:
            save_causal_lm(load_quantized(model_dir, quantize), scratch, tokenizer, atomic=False)
            try:
                loaded = AutoModelForCausalLM.from_pretrained(scratch, dtype=torch.float32).eval()
                if not _is_quantized(loaded, quantize):
                    raise RequantizationError(
                        f"the {quantize} model written to {folder} loads back unquantised; "
                        "its config.json lacks the quantization config"
                    )
                agreement = top1_agreement(loaded, reference, batches)
            except RequantizationError:
                raise
            except Exception as exc:  # bitsandbytes' kernels raise a zoo of types
                first_line = str(exc).strip().split("\n")[0]
                raise RequantizationError(
                    f"the {quantize} re-quantised model does not load or run here "
                    f"({type(exc).__name__}: {first_line}); ship the fp32 merged model at "
                    f"{model_dir} instead"
                ) from exc
            if not agreement >= floor:
                raise RequantizationError(
                    f"the {quantize} re-quantised model's top-1 tokens agree with the fp32 "
                    f"merged model's at {agreement:.3f} of the checked positions, below the "
                    f"floor of {floor}: quantisation changes this draft too much; ship the "
                    f"fp32 merged model at {model_dir} or train with quantize='none'"
                )
    except RequantizationError:
        shutil.rmtree(folder, ignore_errors=True)
        raise
    return agreement
