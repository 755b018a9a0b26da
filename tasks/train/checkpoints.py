"""Plumbing shared by the trainers (head, distillation): atomic checkpoint saves, a checked
load, the resume guard that names every changed setting, RNG state, and the bookkeeping
after each optimiser step (loss check, progress, evaluation and checkpoint cadence)."""

from __future__ import annotations

import json
import math
import time
from collections.abc import Callable, Collection
from pathlib import Path
from typing import Any

import torch
from pydantic import BaseModel

from serving.atomic import atomic_path
from serving.errors import ModelSourceError


def atomic_torch_save(state: dict[str, Any], path: Path) -> None:
    """``torch.save`` into a hidden temporary file beside ``path``, then rename: a killed
    run leaves the previous checkpoint whole."""
    with atomic_path(path) as scratch:
        torch.save(state, scratch)


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


def rng_state(data_rng: torch.Generator) -> dict[str, Any]:
    """Every random state a resumed run needs to continue exactly."""
    return {
        "data": data_rng.get_state(),
        "torch": torch.get_rng_state(),
        "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else [],
    }


def restore_rng(saved: dict[str, Any], data_rng: torch.Generator) -> None:
    data_rng.set_state(saved["data"])
    torch.set_rng_state(saved["torch"])
    if saved.get("cuda") and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(saved["cuda"])


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
        self._started = time.perf_counter()

    def stop(self, tokens: int) -> None:
        if self._started is None:
            raise RuntimeError("TrainClock.stop() without start()")
        self.seconds += time.perf_counter() - self._started
        self.tokens += tokens
        self._started = None

    def out_of_time(self) -> bool:
        return self.budget_s is not None and self.seconds >= self.budget_s

    def state(self) -> dict[str, float]:
        return {"seconds": self.seconds, "tokens": self.tokens}

    def restore(self, saved: dict[str, Any] | None) -> None:
        """From :meth:`state`; a checkpoint written before clocks existed starts at zero."""
        saved = saved or {}
        self.seconds = float(saved.get("seconds", 0.0))
        self.tokens = int(saved.get("tokens", 0))


class _TimeBar:
    """A progress bar over a time budget: seconds spent in optimiser steps, not steps."""

    def __init__(self, bar, clock: TrainClock) -> None:
        self.bar, self.clock = bar, clock

    def update(self, n: int = 1) -> None:
        self.bar.n = min(round(self.clock.seconds), self.bar.total)
        self.bar.refresh()

    def set_postfix(self, **values: Any) -> None:
        self.bar.set_postfix(**values)

    def close(self) -> None:
        self.bar.close()


def progress_bar(desc: str, *, step: int, max_steps: int, clock: TrainClock, enabled: bool):
    """Steps out of ``max_steps``, or, when the clock has a budget, its seconds."""
    from tqdm.auto import tqdm

    if clock.budget_s is None:
        return tqdm(total=max_steps, initial=step, desc=desc, disable=not enabled)
    total = round(clock.budget_s)
    bar = tqdm(
        total=total,
        initial=min(round(clock.seconds), total),
        desc=f"{desc} (seconds of training)",
        unit="s",
        disable=not enabled,
    )
    return _TimeBar(bar, clock)


def after_step(
    step: int,
    loss: float,
    *,
    max_steps: int,
    out_of_time: bool = False,
    eval_every: int,
    checkpoint_every: int,
    bar,
    run_eval: Callable[[], Any],
    checkpoint: Callable[[], None],
    on_step: Callable[[int, dict[str, float]], None] | None = None,
) -> None:
    """Refuse a non-finite loss, show progress, evaluate and checkpoint on their cadence
    (and always at the last step: ``max_steps``, or the first step ``out_of_time``)."""
    if not math.isfinite(loss):
        raise FloatingPointError(
            f"the training loss became {loss} at step {step}; lower learning_rate or use "
            "mixed_precision='no'"
        )
    bar.update()
    bar.set_postfix(loss=f"{loss:.4f}")
    if on_step is not None:
        on_step(step, {"loss": loss})
    last = step == max_steps or out_of_time
    if step % eval_every == 0 or last:
        metrics = run_eval()
        bar.set_postfix(loss=f"{loss:.4f}", agree=f"{metrics.agreement or 0:.3f}")
    if step % checkpoint_every == 0 or last:
        checkpoint()
