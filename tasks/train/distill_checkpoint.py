"""Checkpoints of a distillation run: the trainable weights only (a LoRA adapter, or the
unfrozen weights of a full run), optimizer, scheduler, step, RNG states and eval history,
written atomically. Resuming refuses a checkpoint written with other settings, naming them.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch
from pydantic import BaseModel

from serving.errors import ModelSourceError
from tasks.train.checkpoints import atomic_torch_save, read_checkpoint, restore_rng, rng_state
from tasks.train.checkpoints import check_resumable as check_resumable

CHECKPOINT_FORMAT = 1
_KEYS = {"format", "step", "config", "trainable", "optimizer", "scheduler", "rng"}


def trainable(model) -> dict[str, torch.nn.Parameter]:
    return {name: p for name, p in model.named_parameters() if p.requires_grad}


def save_checkpoint(
    path: Path,
    *,
    step: int,
    config: BaseModel,
    model,
    optimizer,
    scheduler,
    data_rng: torch.Generator,
    history: list[dict[str, Any]],
    clock: dict[str, float] | None = None,
) -> None:
    atomic_torch_save(
        {
            "format": CHECKPOINT_FORMAT,
            "step": step,
            "config": json.loads(config.model_dump_json()),
            "trainable": {k: v.detach().cpu() for k, v in trainable(model).items()},
            "optimizer": optimizer.state_dict(),
            "scheduler": scheduler.state_dict(),
            "rng": rng_state(data_rng),
            "history": history,
            "clock": clock or {},
        },
        path,
    )


def load_checkpoint(path: Path) -> dict[str, Any]:
    """Read a distillation checkpoint; :class:`ModelSourceError` if it is unreadable."""
    return read_checkpoint(path, keys=_KEYS, version=CHECKPOINT_FORMAT)


def restore(
    state: dict[str, Any], path: Path, *, model, optimizer, scheduler, data_rng: torch.Generator
) -> None:
    """Put a checkpoint's weights, optimizer, scheduler and RNG states back."""
    params = trainable(model)
    saved = state["trainable"]
    shapes = {name: tuple(p.shape) for name, p in params.items()}
    if shapes != {name: tuple(t.shape) for name, t in saved.items()}:
        raise ModelSourceError(
            f"checkpoint {path} holds other trainable weights than this draft has; delete it "
            "to train from scratch"
        )
    with torch.no_grad():
        for name, param in params.items():
            param.copy_(saved[name])
    try:
        optimizer.load_state_dict(state["optimizer"])
        scheduler.load_state_dict(state["scheduler"])
    except (RuntimeError, ValueError, KeyError) as exc:
        raise ModelSourceError(
            f"checkpoint {path} does not fit this draft ({exc}); delete it to train from scratch"
        ) from exc
    restore_rng(state["rng"], data_rng)
