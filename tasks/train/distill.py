"""Distil a model draft on the target's own responses (teacher data, :mod:`tasks.train.teacher`).

``distill(config, target)`` trains a draft (the target's first ``layers`` layers, deep-copied,
or a local causal LM sharing its vocabulary: ``draft_model``) with a LoRA adapter
(``kind="lora"``, peft; optionally on an 8-/4-bit base: ``quantize``) or all its weights
(``kind="full"``), on the loss of :mod:`tasks.train.distill_data` (``"ce"``: cross-entropy to the
target's greedy tokens; ``"kl"``: KL to its top-k distribution), in the loop of
:mod:`tasks.train.loop` (held-out top-1 agreement every ``eval_every`` steps, a checkpoint of
the trainable weights every ``checkpoint_every`` steps). Run again with the same config (a
larger ``max_steps`` is fine) and it resumes from the checkpoint; the same seed gives the
same weights.

After training, a LoRA adapter is merged into a fresh fp32 base and the merge is checked
against the unmerged adapter on up to ``CHECK_WINDOWS`` held-out windows (train windows
when nothing is held out): :func:`tasks.train.distill_model.check_merge` raises
:class:`~tasks.train.distill_model.MergeMismatchError` beyond fp32 rounding, and the
measured difference is ``merge_max_abs_diff`` in the result. With ``quantize`` set, the
merged model is also written re-quantised in that mode and kept only if it loads back
quantised and agrees with the fp32 one (``requantized_agreement``;
:func:`~tasks.train.distill_model.requantize_checked`).

Layout of ``output_dir``: ``checkpoint/``, ``adapter/`` (LoRA only: the peft adapter, and
for a ``layers`` base ``lora_base.json``, the base it was trained on), ``model/`` (a
standalone fp32 causal LM, the adapter merged in), ``model-8bit/`` or ``model-4bit/`` (with
``quantize``: the same, re-quantised) and ``train_metrics.json``.
:func:`write_draft_package` turns the result into a draft package: a LoRA draft of the
target's first layers as its adapter alone (``lora:adapter``, merged when it loads), any
other as its weights (``model:weights``).
"""

from __future__ import annotations

import json
import math
import shutil
import tempfile
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, cast

import torch
from pydantic import Field, model_validator

from serving.atomic import atomic_dir, write_json_atomic
from serving.engine.drafters.package import DraftManifest, write_package
from serving.engine.drafters.plan import DEFAULT_POLICY
from serving.errors import BadInputError, IncompatibleDraftError
from serving.models.lora import BASE_FILE, lora_base_of, write_lora_base
from tasks.train.distill_data import DistillBatch, LossKind, distill_loss, make_batch
from tasks.train.distill_model import (
    MergeCheck,
    MergeMismatchError,
    Quantize,
    base_draft,
    check_merge,
    check_quantize_available,
    load_lora,
    merge_lora,
    quantized,
    requantize_checked,
    save_causal_lm,
    with_lora,
)
from tasks.train.head_data import eval_windows, sample_windows, split_sequences
from tasks.train.loop import (
    CHECKPOINT_DIR,
    LoopConfig,
    NonNegativeInt,
    PositiveFloat,
    PositiveInt,
    run_training,
)
from tasks.train.teacher import (
    TeacherManifest,
    TeacherSequence,
    load_teacher_data,
    target_fingerprint,
)

if TYPE_CHECKING:
    from peft import PeftModel
    from transformers import PreTrainedModel

CHECKPOINT_FILE = CHECKPOINT_DIR  # the loop's checkpoint folder under output_dir
ADAPTER_DIR = "adapter"
MODEL_DIR = "model"
REQUANTIZED_DIRS: dict[str, str] = {"8bit": "model-8bit", "4bit": "model-4bit"}
METRICS_FILE = "train_metrics.json"
CHECK_WINDOWS = 8  # windows the merge and the re-quantised model are checked on


class DistillConfig(LoopConfig):
    """Every setting of a distillation run (see :class:`LoopConfig` for the shared ones)."""

    teacher_dir: Path  # a cache written by tasks.train.teacher_build.build_teacher_cache
    kind: Literal["lora", "full"] = "lora"
    layers: int | None = Field(default=None, ge=1)  # the target's first N layers, or ...
    draft_model: Path | None = None  # ... a local causal-LM folder sharing its vocabulary
    loss: LossKind = "kl"
    quantize: Quantize = "none"  # LoRA only: train against an 8-bit / nf4 base (bitsandbytes)
    lora_r: int = Field(default=16, ge=1)
    lora_alpha: int = Field(default=32, ge=1)
    lora_dropout: float = Field(default=0.0, ge=0, lt=1)
    target_modules: str | tuple[str, ...] = "all-linear"  # peft's name for every linear layer
    freeze_embeddings: bool = True  # full: keep the embedding and output layer as they are
    max_steps: PositiveInt = 200
    batch_size: PositiveInt = 4
    max_seq_len: PositiveInt = 256
    learning_rate: PositiveFloat = 2e-4
    warmup_steps: NonNegativeInt = 10
    eval_every: PositiveInt = 50
    checkpoint_every: PositiveInt = 50

    @model_validator(mode="after")
    def _one_base(self) -> DistillConfig:
        if (self.layers is None) == (self.draft_model is None):
            raise ValueError(
                "give exactly one of layers (the target's first N layers) and draft_model "
                f"(a local model folder); got layers={self.layers!r}, "
                f"draft_model={self.draft_model!r}"
            )
        if self.quantize != "none" and self.kind != "lora":
            raise ValueError(
                f"quantize={self.quantize!r} needs kind='lora': quantized weights cannot be "
                "fine-tuned directly"
            )
        if not self.target_modules:
            raise ValueError("target_modules is empty; name linear layers or use 'all-linear'")
        return self


@dataclass(frozen=True)
class EvalMetrics:
    step: int
    loss: float  # the training loss over held-out positions
    agreement: float | None  # held-out top-1 agreement with the target (answer positions)
    positions: int  # answer positions scored
    train_seconds: float = 0.0  # time in optimiser steps so far (loop.TrainClock)
    train_tokens: int = 0  # positions trained on so far


@dataclass(frozen=True)
class DistillResult:
    model_dir: Path  # the standalone causal LM (adapter merged in)
    adapter_dir: Path | None  # the LoRA adapter (None for kind="full")
    config: DistillConfig
    steps: int
    resumed_from: int | None  # the checkpoint step this run started from
    final: EvalMetrics
    history: list[EvalMetrics]
    trainable_parameters: int
    train_tokens_per_s: float | None  # over this run's steps
    train_seconds: float  # in optimiser steps, over every run of this output_dir
    train_tokens: int  # likewise
    train_sequences: int
    heldout_sequences: int
    # LoRA: the largest |merged - unmerged adapter| logit on the check windows, and the
    # most rounding allows there (distill_model.MERGE_RTOL x the logit scale).
    merge_max_abs_diff: float | None = None
    merge_tolerance: float | None = None
    # quantize != "none": the merged model re-quantised, and its top-1 agreement with the
    # fp32 merged model on the check windows.
    requantized_dir: Path | None = None
    requantized_agreement: float | None = None


# --------------------------------------------------------------------------- checks


def check_teacher(
    manifest: TeacherManifest, target: PreTrainedModel, teacher_dir: Path, loss: LossKind
) -> None:
    """Refuse teacher data of another target, or ``loss="kl"`` on a cache without the
    target's top-k distribution."""
    ours = target_fingerprint(target)
    for key in ("vocab_size", "hidden_size", "embedding_digest"):
        if manifest.target.get(key) != ours[key]:
            raise IncompatibleDraftError(
                f"the teacher data at {teacher_dir} was recorded from another target "
                f"({key}={manifest.target.get(key)!r}, this target has {ours[key]!r}); build "
                "teacher data with this target"
            )
    if loss == "kl" and manifest.config.top_k < 2:
        raise BadInputError(
            f"loss='kl' needs the target's top-k log-probs, but the teacher data at "
            f"{teacher_dir} keeps top_k={manifest.config.top_k} (its greedy token only); use "
            "loss='ce' or rebuild it with TeacherConfig(top_k=8)"
        )


# --------------------------------------------------------------------------------- eval


@torch.no_grad()
def _evaluate(
    model: torch.nn.Module,
    sequences: list[TeacherSequence],
    loss: LossKind,
    batch_size: int,
    max_len: int,
    step: int,
) -> EvalMetrics:
    was_training = model.training
    model.eval()
    device = next(model.parameters()).device
    loss_sum, tokens, correct, scored = 0.0, 0, 0, 0
    for windows in eval_windows(sequences, batch_size, max_len):
        batch: DistillBatch = make_batch(windows, max_len).to(device)
        part = distill_loss(model, batch, loss)
        loss_sum += float(part.loss) * batch.tokens
        tokens += batch.tokens
        correct += int(part.correct)
        scored += int(part.answer_positions)
    model.train(was_training)
    return EvalMetrics(
        step=step,
        loss=loss_sum / tokens if tokens else math.nan,
        agreement=correct / scored if scored else None,
        positions=scored,
    )


def evaluate_draft(
    model: torch.nn.Module,
    teacher_dir: str | Path,
    *,
    target: PreTrainedModel | None = None,
    loss: LossKind = "kl",
    batch_size: int = 4,
    max_seq_len: int = 256,
) -> EvalMetrics:
    """Loss and top-1 agreement of a draft ``model`` on every position of a teacher cache
    (e.g. one built from held-out prompts); with ``target``, check the cache is its."""
    manifest, sequences = load_teacher_data(teacher_dir)
    if target is not None:
        check_teacher(manifest, target, Path(teacher_dir), loss)
    sequences, _ = split_sequences(sequences, 0.0)
    return _evaluate(model, sequences, loss, batch_size, max_seq_len, step=0)


# -------------------------------------------------------------------------------- train


def _build(config: DistillConfig, target: PreTrainedModel, tokenizer, scratch: Path):
    model = base_draft(
        target, layers=config.layers, draft_model=config.draft_model, tokenizer=tokenizer
    )
    if config.kind == "full":
        model.requires_grad_(True)
        if config.freeze_embeddings:  # the input embedding and output layer (often tied)
            for layer in (model.get_input_embeddings(), model.get_output_embeddings()):
                if layer is not None:
                    layer.requires_grad_(False)
        return model
    if config.quantize != "none":
        model = quantized(model, config.quantize, scratch)
    torch.manual_seed(config.seed)  # the adapter's initial weights
    return with_lora(
        model,
        r=config.lora_r,
        alpha=config.lora_alpha,
        dropout=config.lora_dropout,
        target_modules=config.target_modules,
    ).train()


@dataclass(frozen=True)
class DistillTask:
    """A distillation run as the training loop sees it (:class:`tasks.train.loop.TrainTask`)."""

    model: torch.nn.Module  # the draft; only its adapter (LoRA) or unfrozen weights train
    config: DistillConfig
    train: list[TeacherSequence]
    heldout: list[TeacherSequence]
    metrics_type: type[EvalMetrics] = EvalMetrics

    def sample_batch(self, generator: torch.Generator) -> DistillBatch:
        config = self.config
        windows = sample_windows(self.train, config.batch_size, config.max_seq_len, generator)
        return make_batch(windows, config.max_seq_len, answers_only=config.answers_only)

    def batch_loss(self, model: torch.nn.Module, batch: DistillBatch) -> torch.Tensor:
        return distill_loss(model, batch, self.config.loss).loss

    def evaluate(self, model: torch.nn.Module, step: int) -> EvalMetrics:
        # With eval_fraction=0 there is nothing held out: the numbers are then on train data.
        config = self.config
        sequences = self.heldout or self.train
        return _evaluate(model, sequences, config.loss, config.batch_size, config.max_seq_len, step)


def distill(
    config: DistillConfig,
    target: PreTrainedModel,
    *,
    tokenizer=None,
    progress: bool = True,
    on_step: Callable[[int, dict[str, float]], None] | None = None,
    max_train_seconds: float | None = None,
) -> DistillResult:
    """Train (or resume training) a model draft of ``target``; see the module docstring.
    ``target`` is read, never modified. ``tokenizer`` (the target's) is checked against a
    ``draft_model``'s and saved beside the merged model. ``on_step(step, {"loss": ...})``
    is called after every optimizer step."""
    check_quantize_available(config.quantize)
    manifest, sequences = load_teacher_data(config.teacher_dir)
    check_teacher(manifest, target, Path(config.teacher_dir), config.loss)
    train, heldout = split_sequences(sequences, config.eval_fraction)

    output_dir = Path(config.output_dir)
    output_dir.mkdir(parents=True, exist_ok=True)  # quantized() saves the base under it
    torch.manual_seed(config.seed)
    model = _build(config, target, tokenizer, output_dir)
    run = run_training(
        config,
        DistillTask(model, config, train, heldout),
        desc="distil draft",
        progress=progress,
        on_step=on_step,
        max_train_seconds=max_train_seconds,
    )
    saved = _save_models(run.model, config, target, tokenizer, heldout or train)
    result = DistillResult(
        model_dir=saved.model_dir,
        adapter_dir=saved.adapter_dir,
        config=config,
        steps=run.steps,
        resumed_from=run.resumed_from,
        final=run.history[-1],
        history=run.history,
        trainable_parameters=sum(p.numel() for p in model.parameters() if p.requires_grad),
        train_tokens_per_s=run.tokens_per_s,
        train_seconds=run.train_seconds,
        train_tokens=run.train_tokens,
        train_sequences=len(train),
        heldout_sequences=len(heldout),
        merge_max_abs_diff=None if saved.merge is None else saved.merge.max_abs_diff,
        merge_tolerance=None if saved.merge is None else saved.merge.tolerance,
        requantized_dir=saved.requantized_dir,
        requantized_agreement=saved.requantized_agreement,
    )
    write_json_atomic(output_dir / METRICS_FILE, result_payload(result))
    return result


@dataclass(frozen=True)
class SavedModels:
    model_dir: Path
    adapter_dir: Path | None
    merge: MergeCheck | None
    requantized_dir: Path | None
    requantized_agreement: float | None


def check_batches(sequences: list[TeacherSequence], config: DistillConfig) -> list[DistillBatch]:
    """The first :data:`CHECK_WINDOWS` consecutive windows of ``sequences``, batched: what
    the merge and a re-quantised model are checked on (the same every time)."""
    windows = [
        window
        for batch in eval_windows(sequences, config.batch_size, config.max_seq_len)
        for window in batch
    ][:CHECK_WINDOWS]
    return [
        make_batch(windows[i : i + config.batch_size], config.max_seq_len)
        for i in range(0, len(windows), config.batch_size)
    ]


def _save_models(
    model: torch.nn.Module,
    config: DistillConfig,
    target: PreTrainedModel,
    tokenizer,
    check_sequences: list[TeacherSequence],
) -> SavedModels:
    """Write the trained ``model`` (see the module docstring): the full model (a causal
    LM), or the adapter (a peft model), its checked merge and, with ``quantize``, the
    checked re-quantised merge."""
    output_dir = Path(config.output_dir)
    model_dir = output_dir / MODEL_DIR
    if config.kind == "full":
        full = cast("PreTrainedModel", model)
        return SavedModels(save_causal_lm(full, model_dir, tokenizer), None, None, None, None)
    adapter_dir = output_dir / ADAPTER_DIR
    with atomic_dir(adapter_dir) as scratch:
        cast("PeftModel", model).save_pretrained(str(scratch))
        if config.layers is not None:  # its base, for a package that stores the adapter only
            write_lora_base(scratch, lora_base_of(target, config.layers))

    def fresh_base():
        return base_draft(
            target, layers=config.layers, draft_model=config.draft_model, tokenizer=tokenizer
        )

    # Merged into a fresh fp32 base (not the possibly quantized one trained against), and
    # checked against the adapter on another fresh fp32 base.
    batches = check_batches(check_sequences, config)
    merged = merge_lora(adapter_dir, fresh_base()).eval()
    try:
        merge = check_merge(load_lora(adapter_dir, fresh_base()), merged, batches)
    except MergeMismatchError:
        shutil.rmtree(model_dir, ignore_errors=True)  # an earlier merge: not this adapter's
        raise
    save_causal_lm(merged, model_dir, tokenizer)
    if config.quantize == "none":
        return SavedModels(model_dir, adapter_dir, merge, None, None)
    requantized_dir = output_dir / REQUANTIZED_DIRS[config.quantize]
    agreement = requantize_checked(
        model_dir,
        config.quantize,
        requantized_dir,
        reference=merged,
        batches=batches,
        tokenizer=tokenizer,
    )
    return SavedModels(model_dir, adapter_dir, merge, requantized_dir, agreement)


def result_payload(result: DistillResult) -> dict[str, Any]:
    """A JSON-ready summary of a run: its config and its numbers."""
    payload = asdict(result)
    payload["config"] = json.loads(result.config.model_dump_json())
    payload["model_dir"] = str(result.model_dir)
    for key in ("adapter_dir", "requantized_dir"):
        payload[key] = None if payload[key] is None else str(payload[key])
    return payload


# ------------------------------------------------------------------------------ package


def write_draft_package(
    result: DistillResult,
    folder: str | Path,
    *,
    k: int = 5,
    policy: str = DEFAULT_POLICY,
    description: str = "",
    requantized: bool = True,
) -> Path:
    """Write the trained draft as a draft package, family ``"lora"`` or ``"full"``, with
    ``train_metrics.json``.

    A LoRA draft of the target's first N layers whose fp32 merge is what ships stores its
    adapter only: ``adapter/`` (the peft adapter and ``lora_base.json``: N and the target's
    shapes), drafter ``lora:adapter``, rebuilt over the target's own fp32 layers and merged
    when it loads (:mod:`serving.models.lora`; the same weights as ``model/``, a few MB
    instead of a full model). Every other draft ships ``weights/`` (drafter
    ``model:weights``), plus ``adapter/`` for LoRA: a full draft, a LoRA draft of a local
    ``draft_model`` (its base is not the target's), or a QLoRA run's re-quantised merged
    model (``quantize``: it loads quantised through the same ``model:PATH`` loader, and an
    adapter merged into the fp32 base cannot reproduce its bitsandbytes codes); with
    ``requantized=False`` a QLoRA run ships its fp32 merge, stored as the adapter (on a CPU
    the bitsandbytes kernels save memory, not time: see docs/training.md)."""
    config = result.config
    base = f"layers:{config.layers}" if config.layers is not None else str(config.draft_model)
    agreement = result.final.agreement
    weights: Path | None = result.model_dir
    precision = "fp32"
    if requantized and result.requantized_dir is not None:
        weights, precision = result.requantized_dir, config.quantize
    elif (
        result.adapter_dir is not None
        and config.layers is not None
        and (result.adapter_dir / BASE_FILE).is_file()
    ):
        weights, precision = None, "fp32, stored as the adapter"
    manifest = DraftManifest(
        drafter="model:weights" if weights is not None else f"lora:{ADAPTER_DIR}",
        policy=policy,
        k=k,
        family=config.kind,
        description=description
        or (
            f"{config.kind} draft of {base}, loss {config.loss}, quantize {config.quantize}, "
            f"weights {precision}, {result.steps} steps, held-out agreement "
            f"{'n/a' if agreement is None else f'{agreement:.3f}'}"
        ),
    )
    with tempfile.TemporaryDirectory() as scratch:
        metrics = Path(scratch) / METRICS_FILE
        write_json_atomic(metrics, result_payload(result))
        files = {METRICS_FILE: metrics}
        if weights is not None:
            files["weights"] = weights
        if result.adapter_dir is not None:
            files[ADAPTER_DIR] = result.adapter_dir
        return write_package(folder, manifest, files)
