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

Layout of ``output_dir``: ``checkpoint/``, ``adapter/`` (LoRA only: the peft adapter),
``model/`` (a standalone causal LM, the adapter merged in) and ``train_metrics.json``.
:func:`write_draft_package` turns the result into a draft package (``model:weights``).
"""

from __future__ import annotations

import json
import math
import tempfile
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Literal

import torch
from pydantic import Field, model_validator

from serving.atomic import atomic_dir, write_json_atomic
from serving.drafters.package import DraftManifest, write_package
from serving.errors import BadInputError, IncompatibleDraftError
from tasks.train.distill_data import DistillBatch, LossKind, distill_loss, make_batch
from tasks.train.distill_model import (
    Quantize,
    base_draft,
    check_quantize_available,
    merge_lora,
    quantized,
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

CHECKPOINT_FILE = CHECKPOINT_DIR  # the loop's checkpoint folder under output_dir
ADAPTER_DIR = "adapter"
MODEL_DIR = "model"
METRICS_FILE = "train_metrics.json"


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


# --------------------------------------------------------------------------- checks


def check_teacher(manifest: TeacherManifest, target, teacher_dir: Path, loss: LossKind) -> None:
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
    model,
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
    model,
    teacher_dir: str | Path,
    *,
    target=None,
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


def _build(config: DistillConfig, target, tokenizer, scratch: Path):
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
    target,
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
    model_dir, adapter_dir = _save_models(run.model, config, target, tokenizer)
    result = DistillResult(
        model_dir=model_dir,
        adapter_dir=adapter_dir,
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
    )
    write_json_atomic(output_dir / METRICS_FILE, result_payload(result))
    return result


def _save_models(model, config: DistillConfig, target, tokenizer) -> tuple[Path, Path | None]:
    output_dir = Path(config.output_dir)
    if config.kind == "full":
        return save_causal_lm(model, output_dir / MODEL_DIR, tokenizer), None
    adapter_dir = output_dir / ADAPTER_DIR
    with atomic_dir(adapter_dir) as scratch:
        model.save_pretrained(scratch)
    # Merged into a fresh fp32 base (not the possibly quantized one trained against).
    base = base_draft(
        target, layers=config.layers, draft_model=config.draft_model, tokenizer=tokenizer
    )
    merged = merge_lora(adapter_dir, base).eval()
    return save_causal_lm(merged, output_dir / MODEL_DIR, tokenizer), adapter_dir


def result_payload(result: DistillResult) -> dict[str, Any]:
    """A JSON-ready summary of a run: its config and its numbers."""
    payload = asdict(result)
    payload["config"] = json.loads(result.config.model_dump_json())
    payload["model_dir"] = str(result.model_dir)
    payload["adapter_dir"] = None if result.adapter_dir is None else str(result.adapter_dir)
    return payload


# ------------------------------------------------------------------------------ package


def write_draft_package(
    result: DistillResult,
    folder: str | Path,
    *,
    k: int = 5,
    policy: str = "cost",
    description: str = "",
) -> Path:
    """Write the trained draft as a draft package: ``weights/`` (the merged causal LM,
    drafter ``model:weights``), ``adapter/`` (LoRA) and ``train_metrics.json``; family
    ``"lora"`` or ``"full"``."""
    config = result.config
    base = f"layers:{config.layers}" if config.layers is not None else str(config.draft_model)
    agreement = result.final.agreement
    manifest = DraftManifest(
        drafter="model:weights",
        policy=policy,
        k=k,
        family=config.kind,
        description=description
        or (
            f"{config.kind} draft of {base}, loss {config.loss}, quantize {config.quantize}, "
            f"{result.steps} steps, held-out agreement "
            f"{'n/a' if agreement is None else f'{agreement:.3f}'}"
        ),
    )
    with tempfile.TemporaryDirectory() as scratch:
        metrics = Path(scratch) / METRICS_FILE
        write_json_atomic(metrics, result_payload(result))
        files = {"weights": result.model_dir, METRICS_FILE: metrics}
        if result.adapter_dir is not None:
            files[ADAPTER_DIR] = result.adapter_dir
        return write_package(folder, manifest, files)
