"""The one training loop of every trainer (draft head, distillation), on ``accelerate``.

A trainer supplies a :class:`TrainTask`: the module to train (its ``requires_grad``
parameters), how to sample a batch from a seeded ``torch.Generator``, the loss of a batch,
and its evaluation (a frozen metrics dataclass). :func:`run_training` owns the rest: AdamW
with transformers' constant-after-warm-up schedule, gradient clipping, mixed precision
(``accelerator.autocast``), the time budget (:class:`TrainClock`), progress, the evaluation
and checkpoint cadence, the refusal of a non-finite loss, and checkpoint/resume. The same
seed gives the same weights, and a run resumed from a checkpoint ends with the weights of an
uninterrupted one.

The checkpoint is one ``Accelerator.save_state`` folder, ``output_dir/checkpoint``, written
into a hidden temporary folder and renamed into place (a killed run leaves the previous
checkpoint whole):

- ``model.safetensors``: the trainable weights only (accelerate's save/load pre-hooks): a
  LoRA draft's base, a frozen embedding or a quantised base is never written;
- ``optimizer.bin``, ``scheduler.bin``, ``random_states_0.pkl`` (python, numpy, torch and
  cuda generators) and, with fp16, the gradient scaler: accelerate's own;
- ``custom_checkpoint_0.pkl`` (the data generator) and ``custom_checkpoint_1.pkl`` (the
  clock): registered with ``register_for_checkpointing``;
- ``loop_state.json``: format, step, the run's config and the evaluation history. A resume
  reads it first and refuses changed settings (outside :data:`RESUMABLE`) before loading
  anything else.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from time import perf_counter
from typing import Annotated, Any, ClassVar, Generic, Literal, Protocol, Self, TypeVar

import torch
from accelerate import Accelerator, PartialState
from accelerate.utils import RNG_STATE_NAME, SAFE_WEIGHTS_NAME
from accelerate.utils import load as accelerate_load
from pydantic import BaseModel, ConfigDict, Field
from safetensors.torch import load_file
from transformers import get_constant_schedule_with_warmup

from serving.atomic import atomic_dir, recover_dir, remove_scratch
from serving.errors import ModelSourceError

CHECKPOINT_DIR = "checkpoint"  # under output_dir
LOOP_STATE_FILE = "loop_state.json"  # in the checkpoint folder
LEGACY_CHECKPOINT = "checkpoint.pt"  # format 1: one torch.save file, no longer read
CHECKPOINT_FORMAT = 2

# Settings a resumed run may change; any other difference refuses to resume. A resumed
# head run ignores init_head (its start is in the checkpoint; see tasks.train.train_head).
RESUMABLE = frozenset({"max_steps", "eval_every", "checkpoint_every", "output_dir", "init_head"})

PositiveInt = Annotated[int, Field(ge=1)]
NonNegativeInt = Annotated[int, Field(ge=0)]
PositiveFloat = Annotated[float, Field(gt=0)]


class LoopConfig(BaseModel):
    """The settings every trainer shares. Each trainer's config extends it and gives the
    defaults left open here (a head and a distilled model train with different ones)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    output_dir: Path  # the checkpoint, the trained draft and its metrics
    seed: int = 0
    max_steps: PositiveInt
    batch_size: PositiveInt
    max_seq_len: PositiveInt  # positions per training window
    learning_rate: PositiveFloat
    weight_decay: float = Field(default=0.0, ge=0)
    warmup_steps: NonNegativeInt  # linear warm-up from 0, then constant
    grad_clip: float | None = Field(default=1.0, gt=0)
    answers_only: bool = False  # train on answer positions only (eval always is)
    eval_fraction: float = Field(default=0.1, ge=0, lt=1)
    eval_every: PositiveInt
    checkpoint_every: PositiveInt
    mixed_precision: Literal["no", "bf16", "fp16"] = "no"


# ------------------------------------------------------------------- the trainer's side


class Batch(Protocol):
    @property
    def tokens(self) -> int: ...  # positions trained on

    def to(self, device: torch.device) -> Self: ...


class EvalPoint(Protocol):
    """What the loop reads of a trainer's metrics: a frozen dataclass with these fields."""

    __dataclass_fields__: ClassVar[dict[str, Any]]

    @property
    def step(self) -> int: ...

    @property
    def agreement(self) -> float | None: ...

    @property
    def train_seconds(self) -> float: ...  # filled in by the loop (TrainClock)

    @property
    def train_tokens(self) -> int: ...  # likewise


ModelT = TypeVar("ModelT", bound=torch.nn.Module)
BatchT = TypeVar("BatchT", bound=Batch)
MetricsT = TypeVar("MetricsT", bound=EvalPoint)
MetricsT_co = TypeVar("MetricsT_co", bound=EvalPoint, covariant=True)


class TrainTask(Protocol[ModelT, BatchT, MetricsT_co]):
    """What a trainer supplies to :func:`run_training`. ``batch_loss`` gets the model as
    accelerate prepared it, ``evaluate`` the model itself."""

    @property
    def model(self) -> ModelT: ...  # its requires_grad parameters are trained

    @property
    def metrics_type(self) -> type[MetricsT_co]: ...  # to read the history back

    def sample_batch(self, generator: torch.Generator) -> BatchT: ...  # on the CPU

    def batch_loss(self, model: ModelT, batch: BatchT) -> torch.Tensor: ...  # scalar

    def evaluate(self, model: ModelT, step: int) -> MetricsT_co: ...


@dataclass(frozen=True)
class TrainRun(Generic[ModelT, MetricsT]):
    model: ModelT  # the trained module (unwrapped)
    steps: int
    resumed_from: int | None  # the checkpoint step this run started from
    history: list[MetricsT]  # every evaluation, over every run of this output_dir
    train_seconds: float  # in optimiser steps, over every run of this output_dir
    train_tokens: int  # likewise
    tokens_per_s: float | None  # over this run's steps


def training_device() -> torch.device:
    """The device :func:`run_training` trains on, for a trainer's own tensors."""
    return PartialState().device


# ---------------------------------------------------------------- checkpointed state


class TrainClock:
    """Seconds and tokens spent in optimiser steps (evaluation, checkpoints and loading left
    out), carried across resumes; with ``budget_s``, says when the run is out of time."""

    def __init__(self, budget_s: float | None = None) -> None:
        if budget_s is not None and not budget_s > 0:
            raise ValueError(f"the time budget must be > 0 seconds, got {budget_s!r}")
        self.budget_s = budget_s
        self.seconds = 0.0
        self.tokens = 0
        self._started: float | None = None

    def start(self) -> None:
        self._started = perf_counter()

    def stop(self, tokens: int) -> None:
        if self._started is None:
            raise RuntimeError("TrainClock.stop() without start()")
        self.seconds += perf_counter() - self._started
        self.tokens += tokens
        self._started = None

    def out_of_time(self) -> bool:
        return self.budget_s is not None and self.seconds >= self.budget_s

    def state_dict(self) -> dict[str, float]:  # the budget belongs to each run, not saved
        return {"seconds": self.seconds, "tokens": self.tokens}

    def load_state_dict(self, state: dict[str, float]) -> None:
        self.seconds, self.tokens = float(state["seconds"]), int(state["tokens"])


class DataGenerator:
    """The seeded ``torch.Generator`` batches are sampled from, checkpointable."""

    def __init__(self, seed: int) -> None:
        self.generator = torch.Generator().manual_seed(seed)

    def state_dict(self) -> dict[str, torch.Tensor]:
        return {"state": self.generator.get_state()}

    def load_state_dict(self, state: dict[str, torch.Tensor]) -> None:
        self.generator.set_state(state["state"])


def _save_trainable_only(models: list, weights: list, folder: str) -> None:
    """accelerate's save pre-hook: what it writes of each model is its trainable weights."""
    for index, model in enumerate(models):
        weights[index] = {n: p.detach() for n, p in model.named_parameters() if p.requires_grad}


def _load_trainable_only(models: list, folder: str) -> None:
    """accelerate's load pre-hook: put back each model's trainable weights, checking names
    and shapes, and take the models off accelerate's list (it would expect every weight)."""
    for index, model in enumerate(models):
        name = SAFE_WEIGHTS_NAME if index == 0 else SAFE_WEIGHTS_NAME.replace(".", f"_{index}.")
        saved = load_file(Path(folder) / name)
        params = {n: p for n, p in model.named_parameters() if p.requires_grad}
        expected = {n: tuple(p.shape) for n, p in params.items()}
        found = {n: tuple(t.shape) for n, t in saved.items()}
        if expected != found:
            raise ModelSourceError(
                f"checkpoint {folder} holds other trainable weights than this model has "
                f"({_weights_difference(expected, found)}); delete it to train from scratch"
            )
        with torch.no_grad():
            for n, param in params.items():
                param.copy_(saved[n])
    models.clear()


def _weights_difference(expected: dict[str, tuple], found: dict[str, tuple]) -> str:
    """What differs between the model's trainable weights and a checkpoint's (up to three
    names of each kind)."""
    shared = sorted(expected.keys() & found.keys())
    groups = {
        "missing": sorted(expected.keys() - found.keys()),
        "unexpected": sorted(found.keys() - expected.keys()),
        "other shapes": [
            f"{n} {found[n]} (model {expected[n]})" for n in shared if found[n] != expected[n]
        ],
    }
    return "; ".join(
        f"{label}: {', '.join(names[:3])}{', ...' if len(names) > 3 else ''}"
        for label, names in groups.items()
        if names
    )


# ---------------------------------------------------------------- checkpoint and resume


def check_resumable(saved: dict[str, Any], config: BaseModel, path: Path) -> None:
    """Raise :class:`ModelSourceError` naming every setting (outside :data:`RESUMABLE`) that
    differs between the checkpoint's config and ``config``."""
    current = json.loads(config.model_dump_json())
    changed = sorted(k for k in current.keys() - RESUMABLE if saved.get(k) != current.get(k))
    if changed:
        details = ", ".join(f"{k}: {saved.get(k)!r} -> {current.get(k)!r}" for k in changed)
        raise ModelSourceError(
            f"checkpoint {path} was written with other settings ({details}); use another "
            "output_dir or the same settings to resume"
        )


def _unreadable(folder: Path, exc: BaseException) -> ModelSourceError:
    first_line = str(exc).strip().split("\n")[0]  # torch's messages run over many lines
    return ModelSourceError(
        f"checkpoint {folder} is corrupt or unreadable ({type(exc).__name__}: {first_line}); "
        "delete it to train from scratch"
    )


def read_loop_state(
    folder: Path, config: LoopConfig, metrics_type: type[MetricsT]
) -> tuple[int, list[MetricsT]] | None:
    """The step and history of the checkpoint ``folder``, None if there is none; refuses an
    old-format checkpoint, a damaged one, or one written with other settings."""
    legacy = folder.parent / LEGACY_CHECKPOINT
    if legacy.exists():
        raise ModelSourceError(
            f"{legacy} is a checkpoint of an earlier specops version, which cannot be "
            "resumed; delete it to train from scratch"
        )
    if not folder.exists():
        return None
    try:
        state = json.loads((folder / LOOP_STATE_FILE).read_text())
        if state["format"] != CHECKPOINT_FORMAT:
            raise ValueError(f"format {state['format']!r}, this version reads {CHECKPOINT_FORMAT}")
        saved_config = state["config"]
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise _unreadable(folder, exc) from exc
    check_resumable(saved_config, config, folder)
    try:
        return int(state["step"]), [metrics_type(**m) for m in state["history"]]
    except (ValueError, KeyError, TypeError) as exc:
        raise _unreadable(folder, exc) from exc


def _load_checkpoint(accelerator: Accelerator, folder: Path) -> None:
    try:
        # accelerate logs and goes on when its random states do not load: a resumed run
        # would then silently differ from an uninterrupted one. Read them first.
        rng = accelerate_load(folder / f"{RNG_STATE_NAME}_{accelerator.process_index}.pkl")
        if not isinstance(rng, dict) or "torch_manual_seed" not in rng:
            raise ValueError("no torch random state in it")
        accelerator.load_state(str(folder))
    except ModelSourceError:
        raise
    except Exception as exc:  # torch and accelerate raise a zoo of types for damaged files
        raise _unreadable(folder, exc) from exc


def _save_checkpoint(
    accelerator: Accelerator, folder: Path, step: int, config: LoopConfig, history: list
) -> None:
    with atomic_dir(folder) as scratch:
        accelerator.save_state(str(scratch))
        state = {
            "format": CHECKPOINT_FORMAT,
            "step": step,
            "config": json.loads(config.model_dump_json()),
            "history": [asdict(m) for m in history],
        }
        (scratch / LOOP_STATE_FILE).write_text(json.dumps(state, indent=2))


def checkpoint_config(output_dir: str | Path) -> dict[str, Any] | None:
    """The config the checkpoint in ``output_dir`` was written with (as JSON), or None if
    there is none or it cannot be read (:func:`run_training` then says why)."""
    try:
        state = json.loads((Path(output_dir) / CHECKPOINT_DIR / LOOP_STATE_FILE).read_text())
        config = state["config"]
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return config if isinstance(config, dict) else None


def has_checkpoint(output_dir: str | Path) -> bool:
    """Whether :func:`run_training` will resume from a checkpoint in ``output_dir`` (or try
    to: a damaged one is refused there). A run killed outright may have left a half-written
    checkpoint folder beside the last whole one, or (between the two renames of a save) only
    the last whole one, set aside: the first is removed, the second put back."""
    checkpoint_dir = Path(output_dir) / CHECKPOINT_DIR
    remove_scratch(checkpoint_dir)
    recover_dir(checkpoint_dir)
    return checkpoint_dir.exists()


# ------------------------------------------------------------------------------ the loop


def run_training(
    config: LoopConfig,
    task: TrainTask[ModelT, BatchT, MetricsT],
    *,
    desc: str,
    progress: bool = True,
    on_step: Callable[[int, dict[str, float]], None] | None = None,
    max_train_seconds: float | None = None,
) -> TrainRun[ModelT, MetricsT]:
    """Train ``task.model`` to ``config.max_steps`` (or until ``max_train_seconds`` spent in
    optimiser steps, over every run of ``output_dir``), resuming from its checkpoint.

    ``task.evaluate`` runs at step 0 of a fresh run, every ``eval_every`` steps and at the
    last step; the checkpoint is written every ``checkpoint_every`` steps and at the last
    step; ``on_step(step, {"loss": ...})`` is called after every optimiser step. A
    non-finite loss raises :class:`FloatingPointError` naming the step."""
    clock = TrainClock(max_train_seconds)
    checkpoint_dir = Path(config.output_dir) / CHECKPOINT_DIR
    checkpoint_dir.parent.mkdir(parents=True, exist_ok=True)
    has_checkpoint(config.output_dir)  # tidies what a killed run left
    saved = read_loop_state(checkpoint_dir, config, task.metrics_type)

    accelerator = Accelerator(mixed_precision=config.mixed_precision)
    trainable = [p for p in task.model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(
        trainable, lr=config.learning_rate, weight_decay=config.weight_decay
    )
    # lr * step / warmup_steps, then lr. The hand-written schedule this replaced ran at
    # lr * (step + 1) / warmup_steps: only the warm-up steps differ (this one starts at 0).
    scheduler = get_constant_schedule_with_warmup(optimizer, config.warmup_steps)
    model, optimizer, scheduler = accelerator.prepare(task.model, optimizer, scheduler)
    data = DataGenerator(config.seed)
    accelerator.register_for_checkpointing(data, clock)  # custom_checkpoint_0, _1
    accelerator.register_save_state_pre_hook(_save_trainable_only)
    accelerator.register_load_state_pre_hook(_load_trainable_only)
    unwrapped = accelerator.unwrap_model(model)

    step, resumed_from, history = 0, None, list[MetricsT]()
    if saved is not None:
        _load_checkpoint(accelerator, checkpoint_dir)
        step, history = saved
        resumed_from = step

    def evaluate() -> MetricsT:
        with accelerator.autocast():
            metrics = task.evaluate(unwrapped, step)
        metrics = replace(metrics, train_seconds=clock.seconds, train_tokens=clock.tokens)
        history.append(metrics)
        return metrics

    if step == 0:
        evaluate()
    model.train()
    run_seconds, run_tokens = clock.seconds, clock.tokens
    with _progress_bar(desc, step, config.max_steps, clock, progress) as bar:
        while step < config.max_steps and not clock.out_of_time():
            clock.start()
            batch = task.sample_batch(data.generator).to(accelerator.device)
            with accelerator.autocast():
                loss = task.batch_loss(model, batch)
            accelerator.backward(loss)
            if config.grad_clip is not None:
                accelerator.clip_grad_norm_(trainable, config.grad_clip)
            optimizer.step()
            scheduler.step()
            optimizer.zero_grad(set_to_none=True)
            step += 1
            clock.stop(batch.tokens)

            loss_value = _finite_loss(loss, step)
            _advance(bar, clock)
            bar.set_postfix(loss=f"{loss_value:.4f}")
            if on_step is not None:
                on_step(step, {"loss": loss_value})
            last = step == config.max_steps or clock.out_of_time()
            if step % config.eval_every == 0 or last:
                agreement = evaluate().agreement
                bar.set_postfix(loss=f"{loss_value:.4f}", agree=f"{agreement or 0:.3f}")
            if step % config.checkpoint_every == 0 or last:
                _save_checkpoint(accelerator, checkpoint_dir, step, config, history)
    run_seconds, run_tokens = clock.seconds - run_seconds, clock.tokens - run_tokens
    if not history or history[-1].step != step:  # resumed with nothing left to train
        evaluate()
    return TrainRun(
        model=unwrapped,
        steps=step,
        resumed_from=resumed_from,
        history=list(history),
        train_seconds=clock.seconds,
        train_tokens=clock.tokens,
        tokens_per_s=run_tokens / run_seconds if run_tokens else None,
    )


def _finite_loss(loss: torch.Tensor, step: int) -> float:
    """The step's loss as a number; :class:`FloatingPointError` naming the step when it is
    not finite."""
    value = float(loss.detach())
    if not math.isfinite(value):
        raise FloatingPointError(
            f"the training loss became {value} at step {step}; lower learning_rate "
            "or use mixed_precision='no'"
        )
    return value


def _progress_bar(desc: str, step: int, max_steps: int, clock: TrainClock, enabled: bool):
    """Steps out of ``max_steps``, or, when the clock has a budget, its seconds."""
    from tqdm.auto import tqdm

    if clock.budget_s is None:
        return tqdm(total=max_steps, initial=step, desc=desc, disable=not enabled)
    total = round(clock.budget_s)
    return tqdm(
        total=total,
        initial=min(round(clock.seconds), total),
        desc=f"{desc} (seconds of training)",
        unit="s",
        disable=not enabled,
    )


def _advance(bar, clock: TrainClock) -> None:
    if clock.budget_s is None:
        bar.update(1)
    else:
        bar.update(min(round(clock.seconds), bar.total) - bar.n)
