"""The retrain flow's settings (``configs/retrain.yaml``): which learned challengers each
hardware target trains, their time budgets (and optional step bounds) and settings, the
data minimums, the relative retrain trigger and the cool-down. Loaded and validated at the
edge."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    SerializerFunctionWrapHandler,
    ValidationError,
    model_serializer,
    model_validator,
)

from serving.engine.drafters.plan import DEFAULT_POLICY
from serving.engine.policy import PolicyName
from serving.errors import BadInputError
from serving.hardware import HardwareTarget
from serving.paths import CONFIG_DIR, PROJECT_ROOT
from tasks.loop.shadow import ShadowSettings
from tasks.loop.watch import WatchSettings

RETRAIN_CONFIG = CONFIG_DIR / "retrain.yaml"

LearnedFamily = Literal["head", "lora"]
LEARNED_FAMILIES: tuple[LearnedFamily, ...] = ("head", "lora")


class FamilySettings(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    budget_seconds: float = Field(gt=0)  # in optimiser steps, over every run of one retrain
    # And at most this many optimiser steps, over every run of one retrain (the first bound
    # reached ends it); None: the time budget alone. Steps are the same on any machine.
    max_steps: int | None = Field(default=None, ge=1)
    k: int = Field(default=5, ge=1, le=16)  # the package's largest draft block
    policy: PolicyName = DEFAULT_POLICY
    settings: dict[str, Any] = Field(default_factory=dict)  # the trainer's config fields

    @model_serializer(mode="wrap")
    def _omit_unset_step_bound(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        """Without a step bound the settings dump as they did before there was one (a kit's
        manifest, an MLflow param)."""
        data = handler(self)
        if self.max_steps is None:
            data.pop("max_steps", None)
        return data


class TargetRetrain(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    families: list[LearnedFamily] = Field(default_factory=list)
    threads: int = Field(default=1, ge=1)
    min_sequences: int = Field(default=8, ge=1)
    min_answer_tokens: int = Field(default=256, ge=1)
    head: FamilySettings | None = None
    lora: FamilySettings | None = None
    # A shipped base head (the folder `dvc repro base_ship` writes; relative to the project
    # root): bootstrap registers and evaluates it as the head family's first version on this
    # target once its checksums hold, and every retrain continues from there. None: the
    # first retrain trains its head from scratch.
    base_head: str | None = None

    @model_validator(mode="after")
    def _settings_for_each_family(self) -> TargetRetrain:
        missing = [f for f in self.families if getattr(self, f) is None]
        if missing:
            raise ValueError(f"families {missing} are listed but have no settings")
        if self.base_head is not None and "head" not in self.families:
            raise ValueError(f"base_head {self.base_head!r} is set but head is not a family")
        return self

    def base_head_folder(self) -> Path | None:
        """:attr:`base_head` resolved against the project root, or None."""
        if self.base_head is None:
            return None
        path = Path(self.base_head)
        return path if path.is_absolute() else PROJECT_ROOT / path

    def family(self, name: LearnedFamily) -> FamilySettings:
        settings = getattr(self, name)
        assert settings is not None  # checked by the validator for listed families
        return settings

    def with_budgets(self, budgets: dict[str, float]) -> TargetRetrain:
        """The same settings with other time budgets (the main job keeps them small)."""
        unknown = sorted(set(budgets) - set(LEARNED_FAMILIES))
        if unknown:
            raise BadInputError(f"budgets for unknown families {unknown}; use {LEARNED_FAMILIES}")
        bad = {k: v for k, v in budgets.items() if not v > 0}
        if bad:
            raise BadInputError(f"budgets must be > 0 seconds, got {bad}")
        update: dict[str, Any] = {}
        for name, seconds in budgets.items():
            current = getattr(self, name)
            if current is not None:
                update[name] = current.model_copy(update={"budget_seconds": float(seconds)})
        return self.model_copy(update=update)


class RetrainConfig(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    relative_threshold: float = Field(default=0.8, gt=0, le=1)
    cooldown_minutes: float = Field(default=360, ge=0)
    traffic_prompts_per_workload: int = Field(default=8, ge=1)
    watch: WatchSettings = Field(default_factory=WatchSettings)  # tasks/loop/watch.py
    shadow: ShadowSettings = Field(default_factory=ShadowSettings)  # tasks/loop/shadow.py
    targets: dict[str, TargetRetrain] = Field(default_factory=dict)

    def target(self, hardware: HardwareTarget) -> TargetRetrain:
        """``hardware``'s settings (listed under its name); a target not listed trains no
        learned challenger."""
        return self.targets.get(hardware.name, TargetRetrain())


def load_retrain_config(path: str | Path = RETRAIN_CONFIG) -> RetrainConfig:
    try:
        raw = yaml.safe_load(Path(path).read_text()) or {}
        return RetrainConfig.model_validate(raw)
    except (OSError, yaml.YAMLError, ValidationError) as error:
        raise BadInputError(f"invalid retrain config {str(path)!r}: {error}") from None
