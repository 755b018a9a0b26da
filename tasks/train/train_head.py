"""Train a feature-level draft head on teacher data (see :mod:`tasks.train.teacher`).

``train_head(config, target)`` builds a :class:`serving.models.head.DraftHead` for the
target (optionally over a reduced vocabulary built from the teacher data) and trains it on
the EAGLE-style loss of :mod:`tasks.train.head_loss` in the loop of :mod:`tasks.train.loop`
(AdamW, held-out top-1 agreement every ``eval_every`` steps, a checkpoint every
``checkpoint_every`` steps). Run again with the same config (a larger ``max_steps`` is fine)
and it resumes from the checkpoint; the same seed gives the same weights.

With ``init_head`` (a head folder as :func:`serving.models.head.save_head` writes it, e.g.
the ``head/`` of an earlier run, or a head draft package) a fresh run continues training
that head: it starts from its weights, and from its reduced vocabulary if it has one (the
output layer it learned stays the one it learned over; the vocabulary is not rebuilt from
the new data). The head must have the shape the config asks for. A resumed run ignores
``init_head`` (it may name another folder, or the folder may hold another head by now): the
checkpoint has the weights, and the run continues from what its first run started from,
with the reduced vocabulary of the copy of ``init_head`` kept in ``output_dir`` (the
checkpoint holds trained weights only). To start over from another head, use a new
``output_dir`` or delete the checkpoint.

Layout of ``output_dir``: ``checkpoint/``, ``head/`` (the final head, loadable with
:func:`serving.models.head.load_head` or the ``head:PATH`` drafter spec),
``train_metrics.json`` and, with ``init_head``, ``init_head/`` (the head the run started
from).
"""

from __future__ import annotations

import json
import math
import shutil
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import torch
from pydantic import Field, SerializerFunctionWrapHandler, model_serializer

from serving.atomic import write_json_atomic
from serving.engine.drafters.kinds import DrafterSpec
from serving.engine.drafters.package import MANIFEST as PACKAGE_MANIFEST
from serving.engine.drafters.package import DraftManifest, write_package
from serving.engine.drafters.package import read_manifest as read_package_manifest
from serving.engine.drafters.plan import DEFAULT_POLICY, DraftPlan
from serving.engine.policy import check_policy
from serving.errors import IncompatibleDraftError, ModelSourceError
from serving.models.head import CONFIG_FILE as HEAD_CONFIG_FILE
from serving.models.head import (
    DraftHead,
    HeadConfig,
    HeadLayout,
    head_config_for,
    load_head,
    save_head,
)
from tasks.train.draft_vocab import build_reduced_vocab
from tasks.train.head_data import (
    HeadBatch,
    eval_windows,
    make_batch,
    sample_windows,
    split_sequences,
)
from tasks.train.head_loss import MAX_DEPTHS, FrozenTarget, frozen_target, head_loss
from tasks.train.loop import (
    CHECKPOINT_DIR,
    LoopConfig,
    NonNegativeInt,
    PositiveFloat,
    PositiveInt,
    checkpoint_config,
    has_checkpoint,
    run_training,
    training_device,
)
from tasks.train.teacher import TeacherSequence, load_teacher_data

if TYPE_CHECKING:
    from transformers import PreTrainedModel

CHECKPOINT_FILE = CHECKPOINT_DIR  # the loop's checkpoint folder under output_dir
HEAD_DIR = "head"
INIT_HEAD_DIR = "init_head"  # under output_dir: a copy of the head a continued run began from
METRICS_FILE = "train_metrics.json"


class TrainHeadConfig(LoopConfig):
    """Every setting of a head training run (see :class:`LoopConfig` for the shared ones);
    defaults follow EAGLE's recipe."""

    teacher_dir: Path  # a cache written by tasks.train.teacher_build.build_teacher_cache
    max_steps: PositiveInt = 1000
    batch_size: PositiveInt = 8
    max_seq_len: PositiveInt = 512  # head positions per training window
    learning_rate: PositiveFloat = 3e-4
    warmup_steps: NonNegativeInt = 20
    eval_every: PositiveInt = 100
    checkpoint_every: PositiveInt = 100
    intermediate_size: int | None = Field(default=None, ge=1)  # None: the target's FFN width
    draft_vocab_size: int | None = Field(default=None, ge=1)  # None: the full vocabulary
    # serving.models.head.HEAD_LAYOUTS: "eagle" is EAGLE-1's, the one vLLM's eagle method loads
    layout: HeadLayout = "specops"
    feature_weight: float = Field(default=1.0, ge=0)
    token_weight: float = Field(default=0.1, ge=0)
    token_loss: Literal["top1", "topk"] = "topk"
    second_step_weight: float = Field(default=0.5, ge=0)  # 0 turns the deeper steps off
    # Draft steps the training unrolls on the head's own features (EAGLE-3's training-time
    # test; tasks/train/head_loss.py): the k a serving policy drafts, or fewer.
    depths: int = Field(default=2, ge=1, le=MAX_DEPTHS)

    @model_serializer(mode="wrap")
    def _omit_default_depths(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        """Two steps deep, the config dumps as it did before the depth was a setting (a
        head's train_metrics.json, a checkpoint's config): a file without ``depths`` was
        trained two deep."""
        data = handler(self)
        if self.depths == 2:
            data.pop("depths", None)
        return data

    init_head: Path | None = None  # continue this head (a head folder or head package)


@dataclass(frozen=True)
class EvalMetrics:
    step: int
    loss: float  # the training objective on held-out data (step 1 and, if on, step 2)
    agreement: float | None  # held-out top-1 agreement of the first draft (answer positions)
    agreement_second: float | None  # same for the second draft, on the head's own feature
    positions: int  # answer positions scored
    train_seconds: float = 0.0  # time in optimiser steps so far (loop.TrainClock)
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


# --------------------------------------------------------------------------------- eval


def _head_loss(head: DraftHead, batch: HeadBatch, target: FrozenTarget, config: TrainHeadConfig):
    return head_loss(
        head,
        batch,
        target,
        feature_weight=config.feature_weight,
        token_weight=config.token_weight,
        token_loss=config.token_loss,
        second_step_weight=config.second_step_weight,
        depths=config.depths,
    )


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
        loss = _head_loss(head, batch, target, config)
        loss_sum += float(loss.total)
        batches += 1
        for i, part in enumerate(loss.steps[:2]):  # the first two drafts are reported
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
    target: PreTrainedModel,
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


def check_target(manifest_target: dict[str, object], target: PreTrainedModel) -> None:
    hidden, vocab = int(target.config.hidden_size), int(target.config.vocab_size)
    for key, ours in (("hidden_size", hidden), ("vocab_size", vocab)):
        if manifest_target.get(key) != ours:
            raise IncompatibleDraftError(
                f"the teacher data was recorded from a target with {key}="
                f"{manifest_target.get(key)} but this target has {key}={ours}; build teacher "
                "data with this target"
            )


@dataclass(frozen=True)
class HeadTask:
    """A head run as the training loop sees it (:class:`tasks.train.loop.TrainTask`)."""

    model: DraftHead
    config: TrainHeadConfig
    train: list[TeacherSequence]
    heldout: list[TeacherSequence]
    frozen: FrozenTarget  # on the training device
    metrics_type: type[EvalMetrics] = EvalMetrics

    def sample_batch(self, generator: torch.Generator) -> HeadBatch:
        config = self.config
        windows = sample_windows(self.train, config.batch_size, config.max_seq_len, generator)
        return make_batch(windows, config.max_seq_len, answers_only=config.answers_only)

    def batch_loss(self, model: DraftHead, batch: HeadBatch) -> torch.Tensor:
        return _head_loss(model, batch, self.frozen, self.config).total

    def evaluate(self, model: DraftHead, step: int) -> EvalMetrics:
        # With eval_fraction=0 there is nothing held out: the numbers are then on train data.
        sequences = self.heldout or self.train
        return evaluate(model, sequences, self.frozen, self.config, self.frozen.embed.device, step)


def head_folder(path: str | Path) -> Path:
    """The head folder ``path`` names: itself, or the folder a head draft package's
    manifest points at (``head:head`` in a package written by ``specops train-draft``)."""
    path = Path(path)
    if not (path / PACKAGE_MANIFEST).is_file():
        return path
    manifest = read_package_manifest(path)
    spec = manifest.spec(path)
    if spec.kind != "head" or spec.arg is None:
        raise IncompatibleDraftError(
            f"init_head {path} is a draft package of drafter {manifest.drafter!r}, not of a "
            "head; give a head folder or a head package"
        )
    return Path(spec.arg)


def check_init_head(found: HeadConfig, expected: HeadConfig, source: Path) -> None:
    """Raise :class:`IncompatibleDraftError` naming every setting in which the head at
    ``source`` differs from the head the run's config describes."""
    ours, theirs = expected.model_dump(), found.model_dump()
    changed = sorted(k for k in ours if ours[k] != theirs[k])
    if not changed:
        return
    details = ", ".join(f"{k}: head {theirs[k]!r}, config {ours[k]!r}" for k in changed)
    raise IncompatibleDraftError(
        f"init_head {source} does not have the shape this run asks for ({details}); set "
        "intermediate_size, draft_vocab_size and layout to the head's, or drop init_head to start "
        "from random weights"
    )


def initial_head(
    config: TrainHeadConfig,
    target: PreTrainedModel,
    train: list[TeacherSequence],
    eos_token_ids: list[int],
) -> DraftHead:
    """The head a run starts from: random weights (over a reduced vocabulary built from
    ``train`` when ``draft_vocab_size`` is set), or ``config.init_head``'s; a resumed run
    starts as its first run did, and the checkpoint then replaces the weights (module
    docstring)."""
    expected = head_config_for(
        target,
        intermediate_size=config.intermediate_size,
        draft_vocab_size=config.draft_vocab_size,
        layout=config.layout,
    )
    copy = Path(config.output_dir) / INIT_HEAD_DIR
    if has_checkpoint(config.output_dir):
        first_run = checkpoint_config(config.output_dir) or {}
        source = copy if first_run.get("init_head") is not None else None
        if source is not None and not (copy / HEAD_CONFIG_FILE).is_file():
            raise ModelSourceError(
                f"{copy} is missing: the checkpoint in {config.output_dir} continues a head "
                "whose copy is gone; delete the checkpoint to train from init_head again"
            )
    else:
        source = None if config.init_head is None else head_folder(config.init_head)
        if source is None and copy.exists():
            shutil.rmtree(copy)  # an earlier run's: this one starts from random weights
    if source is None:
        vocab_ids = None
        if config.draft_vocab_size is not None:
            vocab_ids = build_reduced_vocab(
                train,
                config.draft_vocab_size,
                vocab_size=int(target.config.vocab_size),
                eos_token_ids=eos_token_ids,
            )
        torch.manual_seed(config.seed)  # the head's initial weights
        return DraftHead(expected, vocab_ids)
    head = load_head(source, target)
    check_init_head(head.head_config, expected, source)
    if source != copy:
        save_head(head, copy)
    torch.manual_seed(config.seed)
    return head


def train_head(
    config: TrainHeadConfig,
    target: PreTrainedModel,
    *,
    progress: bool = True,
    on_step: Callable[[int, dict[str, float]], None] | None = None,
    max_train_seconds: float | None = None,
) -> TrainResult:
    """Train (or resume training) a draft head for ``target``; see the module docstring.

    ``on_step(step, {"loss": ...})`` is called after every optimizer step.
    """
    manifest, sequences = load_teacher_data(config.teacher_dir)
    check_target(manifest.target, target)
    train, heldout = split_sequences(sequences, config.eval_fraction)
    head = initial_head(config, target, train, manifest.eos_token_ids)
    frozen = frozen_target(target, head.vocab_ids).to(training_device())
    run = run_training(
        config,
        HeadTask(head, config, train, heldout, frozen),
        desc="train head",
        progress=progress,
        on_step=on_step,
        max_train_seconds=max_train_seconds,
    )
    head_dir = save_head(run.model, Path(config.output_dir) / HEAD_DIR)
    result = TrainResult(
        head_dir=head_dir,
        steps=run.steps,
        resumed_from=run.resumed_from,
        final=run.history[-1],
        history=run.history,
        draft_vocab_size=config.draft_vocab_size,
        train_tokens_per_s=run.tokens_per_s,
        train_seconds=run.train_seconds,
        train_tokens=run.train_tokens,
        train_sequences=len(train),
        heldout_sequences=len(heldout),
    )
    _write_metrics(Path(config.output_dir) / METRICS_FILE, config, result)
    return result


def _write_metrics(path: Path, config: TrainHeadConfig, result: TrainResult) -> None:
    payload = {
        "config": json.loads(config.model_dump_json()),
        "result": {**asdict(result), "head_dir": str(result.head_dir)},
    }
    write_json_atomic(path, payload)


def write_head_package(
    result: TrainResult,
    config: TrainHeadConfig,
    folder: str | Path,
    *,
    k: int = 5,
    policy: str = DEFAULT_POLICY,
    description: str = "",
) -> Path:
    """Write a trained head as a draft package (its kind's family, ``head``): ``head/``
    (drafter ``head:head``) and ``train_metrics.json``."""
    agreement = result.final.agreement
    plan = DraftPlan(DrafterSpec("head", HEAD_DIR), check_policy(policy), k)
    manifest = DraftManifest.of(
        plan,
        description=description
        or (
            f"draft head, {result.steps} steps, held-out agreement "
            f"{'n/a' if agreement is None else f'{agreement:.3f}'}"
        ),
    )
    files = {HEAD_DIR: result.head_dir, METRICS_FILE: Path(config.output_dir) / METRICS_FILE}
    return write_package(folder, manifest, files)
