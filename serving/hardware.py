"""Hardware targets (``configs/hardware.yaml``), loaded and validated at the edge."""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path
from typing import Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from serving.curves import BatchLimits, PassCost
from serving.defaults import DEFAULT_HARDWARE
from serving.errors import BadInputError
from serving.paths import CONFIG_DIR, PROJECT_ROOT

__all__ = [
    "DEFAULT_HARDWARE",
    "HardwareConfig",
    "HardwareTarget",
    "cpu_target_for",
    "engine_target",
    "hardware_target",
    "load_hardware",
]

HARDWARE_CONFIG = CONFIG_DIR / "hardware.yaml"
ENGINE_DEVICES = ("cpu", "cuda")  # where the specops engine (backend transformers) runs


class HardwareTarget(BaseModel):
    """One target of ``configs/hardware.yaml``, resolved: :func:`hardware_target` sets its
    ``name`` (the key it is stored under), which registry aliases, MLflow tags and records
    carry. Inside ``serving/`` and ``tasks/`` this object travels, not the name."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    # The key in configs/hardware.yaml; not a field of the file (excluded when dumped).
    name: str = Field("", exclude=True)

    backend: Literal["transformers", "vllm", "mlx", "neuron"] = "transformers"
    device: str = "cpu"
    kernels: Literal["onednn", "stock", "int8", "int4"] = "stock"
    threads: int = Field(2, ge=1)
    # The specops engine's measured pass-cost curve (its cost-aware policy needs it); the
    # other backends draft a fixed number of tokens per step instead.
    verify_curve: list[float] | None = Field(None, min_length=1)
    num_speculative_tokens: int = Field(3, ge=1, le=16)
    # Continuous batching (serving/engine/batch): requests in one packed target pass, and tokens
    # (pending tokens and drafts of all of them) per pass.
    max_batch: int = Field(8, ge=1, le=256)
    max_tokens_per_pass: int = Field(64, ge=1, le=4096)
    # The measured cost of a packed pass over n tokens relative to a one-token pass, as
    # [n, cost] points from n = 1 (`specops profile --batch`); None: the verify curve,
    # extended at its average slope.
    batch_curve: list[tuple[int, float]] | None = Field(None, min_length=2)
    dtype: Literal["float32", "bfloat16", "float16"] = "float32"
    # False for targets whose hardware this project cannot reach (CUDA, Trainium): their
    # code is real but was not run here; docs/targets.md says so.
    runs_here: bool = True

    @field_validator("verify_curve")
    @classmethod
    def _positive(cls, curve: list[float] | None) -> list[float] | None:
        if curve is not None and any(c <= 0 for c in curve):
            raise ValueError(f"verify_curve entries must be > 0, got {curve}")
        return curve

    @model_validator(mode="after")
    def _batch_fits(self) -> HardwareTarget:
        if self.max_tokens_per_pass < self.max_batch:
            raise ValueError(
                f"max_tokens_per_pass ({self.max_tokens_per_pass}) must be at least max_batch "
                f"({self.max_batch}): every request's pending token rides in the pass"
            )
        if self.batch_curve is not None:
            try:
                PassCost(batch_curve=tuple(self.batch_curve))
            except BadInputError as error:
                raise ValueError(str(error)) from None
        return self

    @model_validator(mode="after")
    def _engine_target_is_consistent(self) -> HardwareTarget:
        if self.backend != "transformers":
            return self
        if self.device_type not in ENGINE_DEVICES:
            raise ValueError(
                f"the specops engine (backend transformers) runs on {ENGINE_DEVICES}, "
                f"not on device {self.device!r}"
            )
        if self.kernels != "stock" and (self.device_type != "cpu" or self.dtype != "float32"):
            raise ValueError(
                f"kernels {self.kernels!r} are for float32 layers on the CPU; device "
                f"{self.device!r} with dtype {self.dtype!r} needs kernels 'stock'"
            )
        # A target this machine cannot run may wait for its curve: `specops profile
        # --hardware NAME` on that hardware measures it, and engine_target() refuses to
        # serve or evaluate on it until then.
        if not self.verify_curve and self.runs_here:
            raise ValueError(
                "a transformers target that runs here needs its measured verify_curve "
                "(`specops profile --hardware NAME`)"
            )
        return self

    @property
    def device_type(self) -> str:
        """``cuda`` for ``cuda:1``: what the engine's loader checks."""
        return self.device.split(":")[0]

    def load_options(self) -> dict[str, str]:
        """How :func:`serving.loader.load_target` loads a model for this target:
        ``load_target(source, **target.load_options())``."""
        return {"kernels": self.kernels, "device": self.device, "dtype": self.dtype}

    def pass_cost(self) -> PassCost:
        """What a packed pass costs on this target."""
        return PassCost(verify_curve=self.curve, batch_curve=tuple(self.batch_curve or ()))

    def batch_limits(self) -> BatchLimits:
        """How many requests and tokens one packed pass carries on this target."""
        return BatchLimits(self.max_batch, self.max_tokens_per_pass)

    @property
    def curve(self) -> tuple[float, ...]:
        """The verify curve as the policies take it (empty off the specops engine)."""
        return tuple(self.verify_curve or ())


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
    """The target stored under ``name``, with its name set."""
    targets = load_hardware(path).targets
    if name not in targets:
        raise BadInputError(f"unknown hardware target {name!r}; known: {sorted(targets)}")
    return targets[name].model_copy(update={"name": name})


def cpu_target_for(kernels: str, path: Path = HARDWARE_CONFIG) -> HardwareTarget:
    """The engine's CPU target (backend transformers, device cpu) whose layers run on
    ``kernels``: ``onednn`` is ``cpu``, ``int4`` is ``cpu-int4``, ... (the transformers
    backend's ``kernels`` option, as evaluation requests carry it)."""
    for name, target in load_hardware(path).targets.items():
        engine_cpu = target.backend == "transformers" and target.device == "cpu"
        if engine_cpu and target.kernels == kernels:
            return engine_target(name, path)
    raise BadInputError(
        f"no CPU target of {_shown(path)} runs kernels {kernels!r}; choose one of "
        f"{sorted({t.kernels for t in load_hardware(path).targets.values()})}"
    )


def _shown(path: Path) -> str:
    """``configs/hardware.yaml`` for the shipped file, the path as given otherwise."""
    resolved = Path(path).resolve()
    if resolved.is_relative_to(PROJECT_ROOT):
        return str(resolved.relative_to(PROJECT_ROOT))
    return str(path)


def engine_target(
    name: str, path: Path = HARDWARE_CONFIG, *, require_curve: bool = True
) -> HardwareTarget:
    """A target the specops engine itself serves (backend ``transformers``), with its
    measured verify curve. ``require_curve=False`` is for ``specops profile``, which is what
    measures the curve of a target that has none yet."""
    target = hardware_target(name, path)
    if target.backend != "transformers":
        raise BadInputError(
            f"hardware target {name!r} runs on the {target.backend!r} backend, not on the "
            "specops engine; evaluate it with `specops targets evaluate --hardware "
            f"{name}`"
        )
    if require_curve and not target.verify_curve:
        where = "GPU" if target.device_type == "cuda" else "hardware"
        raise BadInputError(
            f"the {name} target's verify curve has not been measured: run `specops profile "
            f"--hardware {name}` on that {where} and put its curve in {_shown(path)}"
        )
    return target
