"""Train a feature-level draft head on teacher data (see :mod:`tasks.train.teacher`).

``train_head(config, target)`` builds a :class:`serving.models.head.DraftHead` for the
target (optionally over a reduced vocabulary built from the teacher data), trains it with
AdamW on the EAGLE-style loss of :mod:`tasks.train.head_loss`, evaluates held-out top-1 agreement
every ``eval_every`` steps, and checkpoints (head, optimizer, scheduler, step, RNG states)
atomically every ``checkpoint_every`` steps. Run again with the same config (a larger
``max_steps`` is fine) and it resumes from the checkpoint; the same seed gives the same
weights. Device placement goes through ``accelerate``, so the code is the same on a GPU.

Layout of ``output_dir``: ``checkpoint.pt``, ``head/`` (the final head, loadable with
:func:`serving.models.head.load_head` or the ``head:PATH`` drafter spec) and
``train_metrics.json``.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any, Literal

import torch
from pydantic import BaseModel, ConfigDict, Field

from serving.atomic import write_json_atomic
from serving.errors import IncompatibleDraftError, ModelSourceError
from serving.models.head import DraftHead, head_config_for, save_head
from tasks.train.checkpoints import (
    TrainClock,
    after_step,
    atomic_torch_save,
    check_resumable,
    progress_bar,
    read_checkpoint,
    restore_rng,
    rng_state,
)
from tasks.train.draft_vocab import build_reduced_vocab
from tasks.train.head_data import eval_windows, make_batch, sample_windows, split_sequences
from tasks.train.head_loss import FrozenTarget, frozen_target, head_loss
from tasks.train.teacher import TeacherSequence, load_teacher_data

CHECKPOINT_FILE = "checkpoint.pt"
HEAD_DIR = "head"
METRICS_FILE = "train_metrics.json"
CHECKPOINT_FORMAT = 1


class TrainHeadConfig(BaseModel):
    """Every setting of a head training run; defaults follow EAGLE's recipe."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    teacher_dir: Path  # a cache written by tasks.train.teacher.build_teacher_cache
    output_dir: Path
    seed: int = 0
    max_steps: int = Field(default=1000, ge=1)
    batch_size: int = Field(default=8, ge=1)
    max_seq_len: int = Field(default=512, ge=1)  # head positions per training window
    learning_rate: float = Field(default=3e-4, gt=0)
    weight_decay: float = Field(default=0.0, ge=0)
    warmup_steps: int = Field(default=20, ge=0)  # linear warm-up, then constant
    grad_clip: float | None = Field(default=1.0, gt=0)
    intermediate_size: int | None = Field(default=None, ge=1)  # None: the target's FFN width
    draft_vocab_size: int | None = Field(default=None, ge=1)  # None: the full vocabulary
    feature_weight: float = Field(default=1.0, ge=0)
    token_weight: float = Field(default=0.1, ge=0)
    token_loss: Literal["top1", "topk"] = "topk"
    second_step_weight: float = Field(default=0.5, ge=0)  # 0 turns the second step off
    answers_only: bool = False  # train on answer positions only (eval always is)
    eval_fraction: float = Field(default=0.1, ge=0, lt=1)
    eval_every: int = Field(default=100, ge=1)
    checkpoint_every: int = Field(default=100, ge=1)
    mixed_precision: Literal["no", "bf16", "fp16"] = "no"


# Settings a resumed run may change; any other difference refuses to resume.
RESUMABLE = frozenset({"max_steps", "eval_every", "checkpoint_every", "output_dir"})


@dataclass(frozen=True)
class EvalMetrics:
    step: int
    loss: float  # the training objective on held-out data (step 1 and, if on, step 2)
    agreement: float | None  # held-out top-1 agreement of the first draft (answer positions)
    agreement_second: float | None  # same for the second draft, on the head's own feature
    positions: int  # answer positions scored
    train_seconds: float = 0.0  # time in optimiser steps so far (see TrainClock)
    train_tokens: int = 0  # positions trained on so far


@dataclass(frozen=True)
class TrainResult:
    head_dir: Path
    steps: int
    resumed_from: int | None  # the checkpoint step this run started from
    final: EvalMetrics
    history: list[EvalMetrics]
    draft_vocab_size: int | None
    train_tokens_per_s: float | None  # over this run's steps
    train_seconds: float  # in optimiser steps, over every run of this output_dir
    train_tokens: int  # likewise
    train_sequences: int
    heldout_sequences: int


# --------------------------------------------------------------------------- checkpoints


_CHECKPOINT_KEYS = ("format", "step", "config", "head", "optimizer", "scheduler", "rng")


def load_checkpoint(path: Path) -> dict[str, Any]:
    """Read a training checkpoint, raising :class:`ModelSourceError` if it is unreadable."""
    return read_checkpoint(path, keys=_CHECKPOINT_KEYS, version=CHECKPOINT_FORMAT)


# --------------------------------------------------------------------------------- eval


@torch.no_grad()
def evaluate(
    head: DraftHead,
    sequences: list[TeacherSequence],
    target: FrozenTarget,
    config: TrainHeadConfig,
    device: torch.device,
    step: int,
) -> EvalMetrics:
    """Loss and top-1 agreement over every held-out position."""
    was_training = head.training
    head.eval()
    loss_sum, batches = 0.0, 0
    correct = [0, 0]
    scored = [0, 0]
    for windows in eval_windows(sequences, config.batch_size, config.max_seq_len):
        batch = make_batch(windows, config.max_seq_len).to(device)
        loss = head_loss(
            head,
            batch,
            target,
            feature_weight=config.feature_weight,
            token_weight=config.token_weight,
            token_loss=config.token_loss,
            second_step_weight=config.second_step_weight,
        )
        loss_sum += float(loss.total)
        batches += 1
        for i, part in enumerate((loss.first, loss.second)):
            if part is not None:
                correct[i] += int(part.correct)
                scored[i] += int(part.answer_positions)
    head.train(was_training)
    return EvalMetrics(
        step=step,
        loss=loss_sum / batches if batches else math.nan,
        agreement=correct[0] / scored[0] if scored[0] else None,
        agreement_second=correct[1] / scored[1] if scored[1] else None,
        positions=scored[0],
    )


def evaluate_head(
    head: DraftHead,
    target,
    teacher_dir: str | Path,
    *,
    batch_size: int = 8,
    max_seq_len: int = 512,
    second_step: bool = True,
) -> EvalMetrics:
    """Top-1 agreement (and loss, with the default weights) of a trained ``head`` on every
    position of another teacher cache, e.g. one built from held-out prompts."""
    manifest, sequences = load_teacher_data(teacher_dir)
    check_target(manifest.target, target)
    sequences, _ = split_sequences(sequences, 0.0)
    config = TrainHeadConfig(
        teacher_dir=Path(teacher_dir),
        output_dir=Path(teacher_dir),  # unused
        batch_size=batch_size,
        max_seq_len=max_seq_len,
        second_step_weight=0.5 if second_step else 0.0,
    )
    frozen = frozen_target(target, head.vocab_ids)
    device = next(head.parameters()).device
    return evaluate(head, sequences, frozen.to(device), config, device, step=0)


# -------------------------------------------------------------------------------- train


def check_target(manifest_target: dict[str, object], target) -> None:
    hidden, vocab = int(target.config.hidden_size), int(target.config.vocab_size)
    for key, ours in (("hidden_size", hidden), ("vocab_size", vocab)):
        if manifest_target.get(key) != ours:
            raise IncompatibleDraftError(
                f"the teacher data was recorded from a target with {key}="
                f"{manifest_target.get(key)} but this target has {key}={ours}; build teacher "
                "data with this target"
            )


def train_head(
    config: TrainHeadConfig,
    target,
    *,
    progress: bool = True,
    on_step: Callable[[int, dict[str, float]], None] | None = None,
    max_train_seconds: float | None = None,
) -> TrainResult:
    """Train (or resume training) a draft head for ``target``; see the module docstring.

    ``on_step(step, {"loss": ...})`` is called after every optimizer step.
    """
    from accelerate import Accelerator

    manifest, sequences = load_teacher_data(config.teacher_dir)
    check_target(manifest.target, target)
    train, heldout = split_sequences(sequences, config.eval_fraction)
    vocab_size = int(target.config.vocab_size)
    vocab_ids = None
    if config.draft_vocab_size is not None:
        vocab_ids = build_reduced_vocab(
            train,
            config.draft_vocab_size,
            vocab_size=vocab_size,
            eos_token_ids=manifest.eos_token_ids,
        )

    accelerator = Accelerator(mixed_precision=config.mixed_precision)
    device = accelerator.device
    torch.manual_seed(config.seed)
    head = DraftHead(
        head_config_for(
            target,
            intermediate_size=config.intermediate_size,
            draft_vocab_size=config.draft_vocab_size,
        ),
        vocab_ids,
    )
    head.train()
    optimizer = torch.optim.AdamW(
        head.parameters(), lr=config.learning_rate, weight_decay=config.weight_decay
    )
    warmup = config.warmup_steps
    scheduler = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda step: min(1.0, (step + 1) / warmup) if warmup else 1.0
    )
    data_rng = torch.Generator().manual_seed(config.seed)
    clock = TrainClock(max_train_seconds)

    output_dir = Path(config.output_dir)
    output_dir.mkdir(parents=True, exist_ok=True)
    checkpoint_path = output_dir / CHECKPOINT_FILE
    step, resumed_from = 0, None
    history: list[EvalMetrics] = []
    if checkpoint_path.exists():
        state = load_checkpoint(checkpoint_path)
        check_resumable(state["config"], config, RESUMABLE, checkpoint_path)
        try:
            head.load_state_dict(state["head"])
            optimizer.load_state_dict(state["optimizer"])
        except (RuntimeError, ValueError, KeyError) as exc:
            raise ModelSourceError(
                f"checkpoint {checkpoint_path} does not fit this head ({exc}); delete it to "
                "train from scratch"
            ) from exc
        scheduler.load_state_dict(state["scheduler"])
        restore_rng(state["rng"], data_rng)
        step = resumed_from = int(state["step"])
        history = [EvalMetrics(**m) for m in state.get("history", [])]
        clock.restore(state.get("clock"))

    frozen = frozen_target(target, head.vocab_ids).to(device)
    head, optimizer = accelerator.prepare(head, optimizer)
    model: DraftHead = accelerator.unwrap_model(head)

    def checkpoint() -> None:
        atomic_torch_save(
            {
                "format": CHECKPOINT_FORMAT,
                "step": step,
                "config": json.loads(config.model_dump_json()),
                "head": {k: v.detach().cpu() for k, v in model.state_dict().items()},
                "optimizer": optimizer.state_dict(),
                "scheduler": scheduler.state_dict(),
                "rng": rng_state(data_rng),
                "history": [asdict(m) for m in history],
                "clock": clock.state(),
            },
            checkpoint_path,
        )

    def run_eval() -> EvalMetrics:
        # With eval_fraction=0 there is nothing held out: the numbers are then on train data.
        with accelerator.autocast():
            metrics = evaluate(model, heldout or train, frozen, config, device, step)
        metrics = replace(metrics, train_seconds=clock.seconds, train_tokens=clock.tokens)
        history.append(metrics)
        return metrics

    if step == 0:
        run_eval()
    run_seconds, run_tokens = clock.seconds, clock.tokens
    bar = progress_bar(
        "train head", step=step, max_steps=config.max_steps, clock=clock, enabled=progress
    )
    while step < config.max_steps and not clock.out_of_time():
        clock.start()
        windows = sample_windows(train, config.batch_size, config.max_seq_len, data_rng)
        batch = make_batch(windows, config.max_seq_len, answers_only=config.answers_only)
        batch = batch.to(device)
        with accelerator.autocast():
            loss = head_loss(
                head,
                batch,
                frozen,
                feature_weight=config.feature_weight,
                token_weight=config.token_weight,
                token_loss=config.token_loss,
                second_step_weight=config.second_step_weight,
            )
        accelerator.backward(loss.total)
        if config.grad_clip is not None:
            accelerator.clip_grad_norm_(head.parameters(), config.grad_clip)
        optimizer.step()
        scheduler.step()
        optimizer.zero_grad(set_to_none=True)
        step += 1
        clock.stop(batch.tokens)
        after_step(
            step,
            float(loss.total.detach()),
            max_steps=config.max_steps,
            out_of_time=clock.out_of_time(),
            eval_every=config.eval_every,
            checkpoint_every=config.checkpoint_every,
            bar=bar,
            run_eval=run_eval,
            checkpoint=checkpoint,
            on_step=on_step,
        )
    bar.close()
    run_seconds, run_tokens = clock.seconds - run_seconds, clock.tokens - run_tokens
    if not history or history[-1].step != step:
        run_eval()

    head_dir = save_head(model, output_dir / HEAD_DIR)
    result = TrainResult(
        head_dir=head_dir,
        steps=step,
        resumed_from=resumed_from,
        final=history[-1],
        history=list(history),
        draft_vocab_size=config.draft_vocab_size,
        train_tokens_per_s=run_tokens / run_seconds if run_tokens else None,
        train_seconds=clock.seconds,
        train_tokens=clock.tokens,
        train_sequences=len(train),
        heldout_sequences=len(heldout),
    )
    _write_metrics(output_dir / METRICS_FILE, config, result)
    return result


def _write_metrics(path: Path, config: TrainHeadConfig, result: TrainResult) -> None:
    payload = {
        "config": json.loads(config.model_dump_json()),
        "result": {**asdict(result), "head_dir": str(result.head_dir)},
    }
    write_json_atomic(path, payload)
