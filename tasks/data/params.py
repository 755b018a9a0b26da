"""Typed sections of ``params.yaml`` (the DVC pipeline's parameters), validated at load.

``dvc exp run -S collect.max_new_tokens=32`` edits params.yaml; every stage command reads
its section through here, so a bad value fails at load time with the key in the message.
"""

from __future__ import annotations

from pathlib import Path

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from serving.engine.drafters.plan import DEFAULT_K, DEFAULT_POLICY
from serving.engine.policy import PolicyName
from serving.errors import BadInputError
from serving.hardware import DEFAULT_HARDWARE
from serving.records.schema import WORKLOADS, Workload
from serving.target import DEFAULT_TARGET
from tasks.data.dataset import DEFAULT_HELDOUT_SHARE

PARAMS_FILE = Path("params.yaml")


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid")


def _all_workloads() -> list[Workload]:
    return list(WORKLOADS)


class TrafficParams(_Section):
    workloads: list[Workload] = Field(default_factory=_all_workloads, min_length=1)
    train_prompts_per_workload: int = Field(8, ge=0)
    heldout_prompts_per_workload: int = Field(4, ge=0)
    seed: int = 0


class CollectParams(_Section):
    target: str = DEFAULT_TARGET
    drafter: str = "pld"
    drafter_version: str = "builtin"
    k: int = Field(DEFAULT_K, ge=1, le=64)
    policy: PolicyName = DEFAULT_POLICY
    hardware: str = DEFAULT_HARDWARE
    threads: int = Field(2, ge=1)
    max_new_tokens: int = Field(64, ge=1)
    temperature: float = Field(0.0, ge=0.0)
    top_k: int = Field(0, ge=0)
    top_p: float = Field(1.0, gt=0.0, le=1.0)
    seed: int = 0
    failure_threshold: float = Field(0.5, ge=0.0, le=1.0)
    chunk_size: int = Field(8, ge=1)


class DatasetParams(_Section):
    failure_share: float = Field(0.8, gt=0.0, le=1.0)  # failures vs replay in the training mix
    # The newest share of each workload's train traffic, held out by time (never trained on).
    heldout_share: float = Field(DEFAULT_HELDOUT_SHARE, ge=0.0, lt=1.0)
    seed: int = 0


class TrackerParams(_Section):
    window: int = Field(50, ge=1)
    threshold: float = Field(0.5, ge=0.0, le=1.0)


class EvaluateParams(_Section):
    workload: Workload = "humaneval"
    prompts: int = Field(4, ge=1)
    max_new_tokens: int = Field(64, ge=1)


class PredictorParams(_Section):
    """The acceptance predictor's training (``tasks/train/predictor.py``)."""

    seed: int = 0
    epochs: int = Field(200, ge=1)  # at most; early stopping usually ends sooner
    minutes: float | None = Field(5.0, gt=0)  # wall-clock budget of the epochs (None: none)
    hidden: int = Field(32, ge=1)  # MLP width
    shrinkage_strength: float = Field(2.0, ge=0)  # m: pseudo-rows of each stage's prior
    learning_rate: float = Field(3e-3, gt=0)  # Adam
    batch_size: int = Field(256, ge=1)
    patience: int = Field(10, ge=1)  # epochs without a better validation loss, then stop
    validation_fraction: float = Field(0.15, ge=0.0, lt=1.0)  # of the training requests


class BaseHeadParams(_Section):
    """The base head's shape and training (``specops train-draft --kind head``)."""

    intermediate_size: int = Field(384, ge=1)
    draft_vocab: int = Field(8192, ge=1)
    depths: int = Field(4, ge=1, le=8)  # draft steps unrolled in training, the k it drafts
    minutes: float = Field(60.0, gt=0)  # of optimiser steps, over every run (resumable)
    batch_size: int = Field(8, ge=1)
    max_seq_len: int = Field(512, ge=2)
    lr: float = Field(1e-3, gt=0)
    eval_every: int = Field(500, ge=1)
    checkpoint_every: int = Field(500, ge=1)
    k: int = Field(4, ge=1, le=8)  # drafts per step in the score and the package


class BaseParams(_Section):
    """The base head's corpus (dvc.yaml's ``base_*`` stages, issue 51): the serving target's
    own greedy answers to ShareGPT training prompts, less those the product draws."""

    hardware: str = "cpu-int4"  # the serving target that answers (and gives features)
    threads: int = Field(2, ge=1)
    prompts: int = Field(6100, ge=1)
    max_prompt_tokens: int = Field(512, ge=1)
    max_new_tokens: int = Field(384, ge=1)
    reserve: int = Field(256, ge=0)  # the first N training prompts of each product draw
    sequences: int = Field(32, ge=1)  # requests sharing a packed pass
    heldout_prompts: int = Field(120, ge=1)  # held-out ShareGPT prompts the head is scored on
    head: BaseHeadParams = Field(default_factory=lambda: BaseHeadParams())


class PipelineParams(_Section):
    traffic: TrafficParams = Field(default_factory=lambda: TrafficParams())
    collect: CollectParams = Field(default_factory=lambda: CollectParams())
    dataset: DatasetParams = Field(default_factory=lambda: DatasetParams())
    tracker: TrackerParams = Field(default_factory=lambda: TrackerParams())
    evaluate: EvaluateParams = Field(default_factory=lambda: EvaluateParams())
    predictor: PredictorParams = Field(default_factory=lambda: PredictorParams())
    base: BaseParams = Field(default_factory=lambda: BaseParams())


def load_params(path: Path = PARAMS_FILE) -> PipelineParams:
    try:
        raw = yaml.safe_load(Path(path).read_text()) or {}
    except (OSError, yaml.YAMLError) as error:
        raise BadInputError(f"cannot read params file {str(path)!r}: {error}") from None
    try:
        return PipelineParams.model_validate(raw)
    except ValidationError as error:
        raise BadInputError(f"invalid params in {str(path)!r}:\n{error}") from None
