"""Does continuing the head on collected traffic win back what drift cost it? A curve.

The loop's retrain continues the head family's champion (or newest evaluated version) on
the store's training mix. This benchmark measures what that buys on the traffic that
drifted, as the issue asks: the pre-drift head, continued for up to ``marks_s[-1]`` seconds
of optimiser steps (one thread by default) on the mix the loop would train on, scored at
each mark by the replayed mean accepted length at ``k`` drafts per step on the held-out
slice of the drifted workload's traffic (the newest share, never trained on: the same time
split as the loop's, :mod:`tasks.data.dataset`). Replay (:mod:`tasks.evaluate.offline_acceptance`)
walks the target's recorded greedy answers, so the figure is exact for greedy decoding and
needs no timing; the engine's speed is what the loop's evaluation measures.

Optionally the same budget on a fresh head (``fresh=True``), to show what continuation
itself is worth. Writes ``head-continuation.json`` and ``.png`` in ``out_dir``.
"""

from __future__ import annotations

import math
import time
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from pydantic import BaseModel, ConfigDict, SerializationInfo, model_serializer

from serving.atomic import write_json_atomic
from serving.errors import BadInputError
from serving.hardware import hardware_target
from serving.loader import set_threads
from serving.models.head import load_head
from tasks.data.dataset import build_dataset
from tasks.data.store_view import read_valid_records
from tasks.evaluate.offline_acceptance import head_hits, replay_all
from tasks.loop.learned import training_target
from tasks.loop.retrain_config import load_retrain_config
from tasks.train.head_loss import frozen_target
from tasks.train.store_teacher import build_store_teacher
from tasks.train.teacher import load_teacher_data
from tasks.train.train_head import TrainHeadConfig, train_head

if TYPE_CHECKING:
    from transformers import PreTrainedModel

DEFAULT_MARKS_S = (60.0, 120.0, 300.0, 600.0)


class _Curve(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class Replayed(_Curve):
    """A head scored on the held-out drifted traffic (replayed, ``k`` drafts per step)."""

    mean_accepted_length: float | None
    agreement: float | None


class CurvePoint(_Curve):
    """A head after ``seconds`` of optimiser steps."""

    seconds: float
    steps: int
    mean_accepted_length: float | None
    agreement: float | None
    wall_s: float | None = None  # training and scoring; None for the starting point

    @model_serializer(mode="wrap")
    def _wall_if_timed(self, handler: Any, info: SerializationInfo) -> dict[str, Any]:
        data = handler(self)
        if self.wall_s is None:
            data.pop("wall_s", None)
        return data


class HeadContinuation(_Curve):
    """``head-continuation.json``."""

    store: str
    pre_drift_head: str
    drifted_workload: str
    heldout_sequences: int
    train_mix_records: int
    k: int
    threads: int
    torch_threads: int
    pre_drift: Replayed
    runs: dict[str, list[CurvePoint]]  # "continued" (and "fresh") -> points


def replayed_length(
    head_dir: Path, sequences: Sequence[Any], model: PreTrainedModel, k: int
) -> Replayed:
    """The head at ``head_dir`` replayed over ``sequences`` of the target ``model``'s
    teacher data, ``k`` drafts per step."""
    head = load_head(head_dir, model)
    frozen = frozen_target(model, head.vocab_ids)
    total = replay_all(lambda s: head_hits(head, s, frozen, depths=k), sequences, k)
    return Replayed(mean_accepted_length=total.mean_accepted_length, agreement=total.agreement)


def head_continuation_curve(
    store: Path,
    pre_drift_head: Path,
    out_dir: Path,
    *,
    drifted: str = "humaneval",
    marks_s: Sequence[float] = DEFAULT_MARKS_S,
    k: int = 2,
    threads: int = 1,
    heldout_share: float = 0.2,
    fresh: bool = False,
    progress: bool = True,
) -> HeadContinuation:
    if not marks_s or any(b <= a for a, b in zip([0.0, *marks_s], marks_s, strict=False)):
        raise BadInputError(f"marks must be positive and increasing, got {list(marks_s)}")
    if not (Path(pre_drift_head) / "head_config.json").is_file():
        raise BadInputError(f"{pre_drift_head} is not a saved head (head_config.json is missing)")
    out_dir = Path(out_dir)
    set_threads(threads)
    target = training_target()
    model = target.model
    records = read_valid_records(store)
    dataset = build_dataset(records, heldout_share=heldout_share)
    held = [r for r in dataset.heldout_traffic if r.workload == drifted]
    if not held:
        raise BadInputError(f"no held-out {drifted} traffic in {store}: collect some first")
    eos = target.eos_token_ids
    # The mix the loop would train on, and the minimums it would train it with.
    retrain = load_retrain_config().target(hardware_target("cpu"))
    build_store_teacher(
        dataset.train_mix,
        model,
        out_dir / "teacher-mix",
        eos_token_ids=eos,
        min_sequences=retrain.min_sequences,
        min_answer_tokens=retrain.min_answer_tokens,
        progress=progress,
    )
    build_store_teacher(
        held,
        model,
        out_dir / "teacher-heldout",
        eos_token_ids=eos,
        min_sequences=1,
        min_answer_tokens=1,
        progress=progress,
    )
    _, sequences = load_teacher_data(out_dir / "teacher-heldout")
    settings = retrain.family("head").settings
    before = replayed_length(Path(pre_drift_head), sequences, model, k)
    runs: dict[str, list[CurvePoint]] = {}
    for name, init in (("continued", Path(pre_drift_head)), ("fresh", None)):
        if name == "fresh" and not fresh:
            continue
        config = TrainHeadConfig(
            teacher_dir=out_dir / "teacher-mix",
            output_dir=out_dir / f"head-{name}",
            max_steps=10**9,
            init_head=init,
            **settings,
        )
        points = [CurvePoint(seconds=0.0, steps=0, **dict(before))] if init is not None else []
        for mark in marks_s:
            started = time.perf_counter()
            result = train_head(config, model, progress=progress, max_train_seconds=mark)
            scored = replayed_length(result.head_dir, sequences, model, k)
            points.append(
                CurvePoint(
                    seconds=result.train_seconds,
                    steps=result.steps,
                    **dict(scored),
                    wall_s=time.perf_counter() - started,
                )
            )
        runs[name] = points
    payload = HeadContinuation(
        store=str(store),
        pre_drift_head=str(pre_drift_head),
        drifted_workload=drifted,
        heldout_sequences=len(sequences),
        train_mix_records=len(dataset.train_mix),
        k=k,
        threads=threads,
        torch_threads=torch.get_num_threads(),
        pre_drift=before,
        runs=runs,
    )
    write_json_atomic(out_dir / "head-continuation.json", payload.model_dump(mode="json"))
    _plot(payload, out_dir / "head-continuation.png")
    return payload


def _plot(payload: HeadContinuation, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axis = plt.subplots(figsize=(6.5, 4))
    for name, points in payload.runs.items():
        axis.plot(
            [p.seconds / 60 for p in points],
            [
                math.nan if p.mean_accepted_length is None else p.mean_accepted_length
                for p in points
            ],
            "o-",
            label=f"{name} head",
        )
    if payload.pre_drift.mean_accepted_length is not None:
        axis.axhline(
            payload.pre_drift.mean_accepted_length, color="grey", ls="--", label="pre-drift head"
        )
    axis.set(
        xlabel=f"minutes of training ({payload.threads} thread)",
        ylabel=f"replayed mean accepted length (k = {payload.k})",
        title=f"held-out drifted traffic ({payload.drifted_workload})",
    )
    axis.legend()
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)
