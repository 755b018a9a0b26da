"""The bench's configuration (``configs/bench.yaml``): its methods, the engine and hardware
target each runs on, the draft plan of a specops method, and the row each method's outputs
are checked against (:func:`pick_references`)."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from serving.engine.drafters.plan import CascadePlan, DraftPlan, Plan
from serving.errors import BadInputError
from serving.hardware import DEFAULT_HARDWARE, HardwareTarget, engine_target
from serving.paths import CONFIG_DIR
from serving.records.schema import WORKLOADS, Split, Workload
from tasks.bench.limits import BANDWIDTH_MB

DEFAULT_CONFIG = CONFIG_DIR / "bench.yaml"
BASELINE = "hf-greedy"


Engine = Literal["hf", "specops", "llamacpp"]
# The modes each engine takes (specops has none: its drafter decides).
ENGINE_MODES: dict[str, tuple[str | None, ...]] = {
    # static: greedy over a static KV cache, which transformers compiles (torch.compile)
    # on an accelerator; on the CPU it runs uncompiled (transformers' own rule).
    "hf": ("greedy", "assisted", "prompt_lookup", "static"),
    "specops": (None,),
    "llamacpp": ("plain", "prompt_lookup"),
}


class MethodConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: str
    engine: Engine
    mode: Literal["greedy", "assisted", "prompt_lookup", "static", "plain"] | None = None
    # specops: the drafter spec, its largest block, the draft-length policy, and the hardware
    # target (configs/hardware.yaml) whose weight format and pass costs it runs with; the
    # bench's ``hardware`` when not given.
    drafter: str | None = None
    k: int = 4
    policy: str = "fixed"
    hardware: str | None = None
    # specops: the decode step, "transformers" to measure the framework's forward beside the
    # lean step (serving.lean) that targets get by default.
    step: Literal["lean", "transformers"] | None = None
    # specops: a draft cascade instead of ``drafter`` (its stages in order, ``k`` its
    # largest block), its acceptance predictor folder, and opt-in relaxed verification.
    cascade: str | None = None
    predictor: str | None = None
    relax_lambda: float | None = None
    # hf prompt lookup: HF's prompt_lookup_num_tokens.
    prompt_lookup_num_tokens: int = Field(10, ge=1)
    # llamacpp prompt lookup: LlamaPromptLookupDecoding(num_pred_tokens=...).
    num_pred_tokens: int = Field(10, ge=1)

    @model_validator(mode="after")
    def _fits_its_engine(self) -> MethodConfig:
        modes = ENGINE_MODES[self.engine]
        if self.mode not in modes:
            shown = "no mode" if modes == (None,) else f"mode one of {list(modes)}"
            raise ValueError(
                f"method {self.name!r}: engine {self.engine!r} takes {shown}, got {self.mode!r}"
            )
        specops_only = (self.hardware, self.drafter, self.cascade, self.predictor, self.step)
        if self.engine != "specops" and any(v is not None for v in specops_only):
            raise ValueError(
                f"method {self.name!r}: hardware, drafter and cascade are specops settings; engine "
                f"{self.engine!r} runs its own weights"
            )
        return self


class BenchConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    workloads: list[Workload] = Field(default_factory=lambda: list(WORKLOADS))
    prompts_per_workload: int = Field(4, ge=1)
    split: Split = "heldout"
    seed: int = 0
    max_new_tokens: int = Field(128, ge=1)
    threads: int = Field(2, ge=1)
    draft_layers: int = Field(4, ge=1)
    # specops's hardware target (configs/hardware.yaml): its kernels and measured pass costs,
    # for methods that name none. HF baselines always run the stock model, as a user would.
    hardware: str = DEFAULT_HARDWARE
    # The buffer streamed once per run to measure memory bandwidth (the limit column).
    bandwidth_mb: int = Field(BANDWIDTH_MB, ge=1)
    # The GGUF llama.cpp decodes: the shipped model's own file when the target is smollm2.
    llamacpp_model: str | None = None
    # The method every speedup divides by, and the reference of the methods with no plain
    # method of their own engine and target: HF greedy (what a user would otherwise run),
    # or the plain specops method of a bench about one target's drafters.
    baseline: str = BASELINE
    methods: list[MethodConfig]

    @field_validator("methods")
    @classmethod
    def _unique(cls, methods: list[MethodConfig]) -> list[MethodConfig]:
        names = [m.name for m in methods]
        if len(set(names)) != len(names):
            raise ValueError(f"method names must be unique, got {names}")
        return methods

    @model_validator(mode="after")
    def _has_baseline(self) -> BenchConfig:
        names = [m.name for m in self.methods]
        if self.baseline not in names:
            raise ValueError(f"methods must include {self.baseline!r} (the baseline), got {names}")
        return self


def load_bench_config(path: Path = DEFAULT_CONFIG, **overrides: object) -> BenchConfig:
    try:
        raw = yaml.safe_load(Path(path).read_text()) or {}
    except (OSError, yaml.YAMLError) as error:
        raise BadInputError(f"cannot read bench config {str(path)!r}: {error}") from None
    raw.update({key: value for key, value in overrides.items() if value is not None})
    try:
        return BenchConfig.model_validate(raw)
    except ValidationError as error:
        raise BadInputError(f"invalid bench config {str(path)!r}:\n{error}") from None


def select_methods(config: BenchConfig, names: list[str]) -> BenchConfig:
    """Keep only the methods ``names`` and the baseline (every speedup is over it)."""
    known = [m.name for m in config.methods]
    unknown = sorted(set(names) - set(known))
    if unknown:
        raise BadInputError(f"unknown methods {unknown}; the config has {known}")
    config.methods = [m for m in config.methods if m.name in names or m.name == config.baseline]
    return config


def method_hardware(method: MethodConfig, config: BenchConfig) -> str | None:
    """The hardware target a specops method runs on; ``None`` for the other engines."""
    if method.engine != "specops":
        return None
    return method.hardware or config.hardware


def engine_key(method: MethodConfig, config: BenchConfig) -> str | None:
    """Which loaded engine model a specops method runs: its hardware target, and
    ``/transformers`` when it asks for transformers' forward instead of the lean step."""
    hardware = method_hardware(method, config)
    if hardware is None or method.step != "transformers":
        return hardware
    return f"{hardware}/transformers"


def resolve_hardware(config: BenchConfig) -> dict[str, HardwareTarget]:
    """Every specops method's hardware target, checked before any model work."""
    targets: dict[str, HardwareTarget] = {}
    for method in config.methods:
        name = method_hardware(method, config)
        if name is None or name in targets:
            continue
        try:
            targets[name] = engine_target(name)
        except BadInputError as error:
            raise BadInputError(f"bench method {method.name!r}: {error}") from None
    return targets


def method_plan(method: MethodConfig, config: BenchConfig) -> Plan:
    """The draft plan a specops method decodes with: its cascade (``k`` its largest block,
    with its predictor), else its drafter (``{draft_layers}`` filled in) under its policy."""
    if method.cascade is not None:
        return CascadePlan.parse(method.cascade, k=method.k, predictor=method.predictor)
    if method.predictor is not None:
        raise BadInputError("an acceptance predictor needs a cascade (--cascade STAGES)")
    drafter = (method.drafter or "none").format(draft_layers=config.draft_layers)
    return DraftPlan.parse(drafter, policy=method.policy, k=method.k)


def _is_plain(method: MethodConfig) -> bool:
    if method.engine == "specops":
        return (method.drafter or "none") == "none" and method.cascade is None
    return method.mode == ("plain" if method.engine == "llamacpp" else "greedy")


def pick_references(config: BenchConfig) -> dict[str, str | None]:
    """The row each method's outputs must equal, token for token.

    A specops method: the plain specops method (no drafter) on the same hardware target,
    when the config has one; a llama.cpp method: llama.cpp plain. Everything else, and those
    plain methods themselves (whose weights may differ from the stock model's: a quantised
    target's plain output is its own reference, not HF's), against the baseline (HF greedy
    by default), which has none."""
    references: dict[str, str | None] = {}
    for method in config.methods:
        plain = next(
            (
                other.name
                for other in config.methods
                if other.engine == method.engine
                and method.engine != "hf"
                and _is_plain(other)
                and engine_key(other, config) == engine_key(method, config)
            ),
            None,
        )
        if method.name == config.baseline:
            references[method.name] = None
        elif plain is not None and plain != method.name:
            references[method.name] = plain
        else:
            references[method.name] = config.baseline
    return references


def llamacpp_reference(config: BenchConfig) -> str | None:
    """The llama.cpp plain method, which the ``x llama`` column divides by."""
    return next((m.name for m in config.methods if m.engine == "llamacpp" and _is_plain(m)), None)
