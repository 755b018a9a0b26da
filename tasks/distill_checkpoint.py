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
from tasks.train_head import _atomic_torch_save

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
) -> None:
    _atomic_torch_save(
        {
            "format": CHECKPOINT_FORMAT,
            "step": step,
            "config": json.loads(config.model_dump_json()),
            "trainable": {k: v.detach().cpu() for k, v in trainable(model).items()},
            "optimizer": optimizer.state_dict(),
            "scheduler": scheduler.state_dict(),
            "rng": {
                "data": data_rng.get_state(),
                "torch": torch.get_rng_state(),
                "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else [],
            },
            "history": history,
        },
        path,
    )


def load_checkpoint(path: Path) -> dict[str, Any]:
    """Read a distillation checkpoint; :class:`ModelSourceError` if it is unreadable."""
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:  # torch raises a zoo of types for a damaged file
        first_line = str(exc).strip().split("\n")[0]  # torch's messages run over many lines
        raise ModelSourceError(
            f"checkpoint {path} is corrupt or unreadable ({type(exc).__name__}: {first_line}); "
            "delete it to train from scratch"
        ) from exc
    missing = _KEYS - set(state if isinstance(state, dict) else ())
    if missing:
        raise ModelSourceError(
            f"checkpoint {path} lacks {sorted(missing)}; delete it to train from scratch"
        )
    if state["format"] != CHECKPOINT_FORMAT:
        raise ModelSourceError(
            f"checkpoint {path} has format {state['format']}, this version reads "
            f"{CHECKPOINT_FORMAT}; delete it to train from scratch"
        )
    return state


def check_resumable(
    saved: dict[str, Any], config: BaseModel, resumable: frozenset[str], path: Path
) -> None:
    """Raise :class:`ModelSourceError` naming every setting (outside ``resumable``) that
    differs between the checkpoint's config and ``config``."""
    current = json.loads(config.model_dump_json())
    changed = sorted(k for k in current.keys() - resumable if saved.get(k) != current.get(k))
    if changed:
        details = ", ".join(f"{k}: {saved.get(k)!r} -> {current.get(k)!r}" for k in changed)
        raise ModelSourceError(
            f"checkpoint {path} was written with other settings ({details}); use another "
            "output_dir or the same settings to resume"
        )


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
    data_rng.set_state(state["rng"]["data"])
    torch.set_rng_state(state["rng"]["torch"])
    if state["rng"].get("cuda") and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["rng"]["cuda"])
