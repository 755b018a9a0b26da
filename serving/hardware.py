"""Hardware targets (``configs/hardware.yaml``), loaded and validated at the edge."""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path
from typing import Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from serving.errors import BadInputError

HARDWARE_CONFIG = Path(__file__).resolve().parent.parent / "configs" / "hardware.yaml"


class HardwareTarget(BaseModel):
    model_config = ConfigDict(extra="forbid")

    backend: Literal["transformers", "vllm", "mlx", "neuron"] = "transformers"
    device: str = "cpu"
    kernels: Literal["onednn", "stock"] = "stock"
    threads: int = Field(2, ge=1)
    verify_curve: list[float] = Field(min_length=1)

    @field_validator("verify_curve")
    @classmethod
    def _positive(cls, curve: list[float]) -> list[float]:
        if any(c <= 0 for c in curve):
            raise ValueError(f"verify_curve entries must be > 0, got {curve}")
        return curve


class HardwareConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    targets: dict[str, HardwareTarget]


@lru_cache(maxsize=4)
def load_hardware(path: Path = HARDWARE_CONFIG) -> HardwareConfig:
    try:
        raw = yaml.safe_load(Path(path).read_text())
        return HardwareConfig.model_validate(raw)
    except (OSError, yaml.YAMLError, ValidationError) as error:
        raise BadInputError(f"invalid hardware config {str(path)!r}: {error}") from None


def hardware_target(name: str, path: Path = HARDWARE_CONFIG) -> HardwareTarget:
    targets = load_hardware(path).targets
    if name not in targets:
        raise BadInputError(f"unknown hardware target {name!r}; known: {sorted(targets)}")
    return targets[name]
