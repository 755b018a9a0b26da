"""Checkpoint plumbing shared by the trainers (head, distillation): atomic saves, a
checked load, and the resume guard that names every changed setting."""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Collection
from pathlib import Path
from typing import Any

import torch
from pydantic import BaseModel

from serving.errors import ModelSourceError


def atomic_torch_save(state: dict[str, Any], path: Path) -> None:
    """``torch.save`` into a hidden temporary file beside ``path``, then rename: a killed
    run leaves the previous checkpoint whole."""
    descriptor, scratch = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    os.close(descriptor)
    try:
        torch.save(state, scratch)
        os.replace(scratch, path)
    except BaseException:
        Path(scratch).unlink(missing_ok=True)
        raise


def read_checkpoint(path: Path, *, keys: Collection[str], version: int) -> dict[str, Any]:
    """Load a checkpoint that must hold ``keys`` and ``format == version``;
    :class:`ModelSourceError` (saying what to do) if it is unreadable or of another kind."""
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:  # torch raises a zoo of types for a damaged file
        first_line = str(exc).strip().split("\n")[0]  # torch's messages run over many lines
        raise ModelSourceError(
            f"checkpoint {path} is corrupt or unreadable ({type(exc).__name__}: {first_line}); "
            "delete it to train from scratch"
        ) from exc
    missing = set(keys) - set(state if isinstance(state, dict) else ())
    if missing:
        raise ModelSourceError(
            f"checkpoint {path} lacks {sorted(missing)}; delete it to train from scratch"
        )
    if state["format"] != version:
        raise ModelSourceError(
            f"checkpoint {path} has format {state['format']}, this version reads "
            f"{version}; delete it to train from scratch"
        )
    return state


def check_resumable(
    saved: dict[str, Any], config: BaseModel, resumable: Collection[str], path: Path
) -> None:
    """Raise :class:`ModelSourceError` naming every setting (outside ``resumable``) that
    differs between the checkpoint's config and ``config``."""
    current = json.loads(config.model_dump_json())
    changed = sorted(k for k in current.keys() - set(resumable) if saved.get(k) != current.get(k))
    if changed:
        details = ", ".join(f"{k}: {saved.get(k)!r} -> {current.get(k)!r}" for k in changed)
        raise ModelSourceError(
            f"checkpoint {path} was written with other settings ({details}); use another "
            "output_dir or the same settings to resume"
        )
