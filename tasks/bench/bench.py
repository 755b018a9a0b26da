"""``specops bench``: specops against the baselines a user would otherwise pick.

In one run, on real workloads, interleaved: Hugging Face ``generate`` greedy, HF assisted
generation with the same model draft, HF prompt lookup, every specops drafter on one or
more hardware targets (each its own weight format: ``hardware`` per method), and llama.cpp
plain and prompt-lookup decoding of the shipped GGUF in its own environment
(:mod:`tasks.bench.llamacpp`; skipped, with the install command, where that environment
does not exist). Every method decodes the same token ids (the bench's tokenizer and chat
template) with the same budget. Each method gets one warm-up generation; then, prompt by
prompt, every method runs once in an order that rotates per prompt, so machine noise lands
on all methods alike.

Each row is checked token for token against its *reference* (:func:`pick_references`): a
specops row against the plain specops row (no drafter) on the same hardware target, a
llama.cpp row against llama.cpp plain, everything else (and those plain rows themselves)
against HF greedy. Beside tokens/s, the speedup over HF greedy, the ratio to llama.cpp
plain (``x llama``), acceptance and mean accepted length, each row shows the physical
limit of plain decoding for its weight format, ``limit tok/s`` = measured memory bandwidth
÷ weight bytes read per generated token, and its tokens/s as a share of it
(:mod:`tasks.bench.limits` defines both). The result is a JSON file, a table and a plot.
"""

from __future__ import annotations

import logging
import os
import platform
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Literal, cast

import torch
import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from serving.atomic import write_json_atomic
from serving.engine.build import build_decoder
from serving.engine.decoder import SpeculativeDecoder
from serving.engine.drafters.plan import CascadePlan, DraftPlan, Plan
from serving.engine.metrics import pool
from serving.errors import BadInputError, SpecOpsError
from serving.hardware import DEFAULT_HARDWARE, HardwareTarget, engine_target
from serving.loader import set_threads
from serving.models.truncated import first_layers
from serving.paths import CONFIG_DIR
from serving.records.schema import WORKLOADS, Split, Workload
from serving.target import DEFAULT_TARGET, LoadedTarget
from tasks.bench.limits import (
    BANDWIDTH_MB,
    cpu_description,
    gguf_weights,
    limit_tokens_per_s,
    memory_bandwidth,
    weight_bytes_per_token,
)
from tasks.bench.llamacpp import LlamaCppProcess, LlamaCppUnavailable, llamacpp_python
from tasks.bench.profile import sync
from tasks.data.prompts import Prompt
from tasks.evaluate.evaluate import EncodedPrompt
from tasks.evaluate.interleave import interleave

if TYPE_CHECKING:
    from transformers import PreTrainedModel

log = logging.getLogger(__name__)

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
    methods: list[MethodConfig]

    @field_validator("methods")
    @classmethod
    def _has_baseline(cls, methods: list[MethodConfig]) -> list[MethodConfig]:
        names = [m.name for m in methods]
        if BASELINE not in names:
            raise ValueError(f"methods must include {BASELINE!r} (the baseline), got {names}")
        if len(set(names)) != len(names):
            raise ValueError(f"method names must be unique, got {names}")
        return methods


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
    config.methods = [m for m in config.methods if m.name in names or m.name == BASELINE]
    return config


@dataclass
class Outcome:
    token_ids: list[int]
    seconds: float
    stats: dict[str, object] | None = None


Runner = Callable[[list[int]], Outcome]


def _hf_runner(
    model: PreTrainedModel, *, max_new_tokens: int, pad_id: int, **generate_kwargs: object
) -> Runner:
    """HF ``generate`` of ``model`` (a causal LM: it has transformers' generation mixin)."""
    device = next(model.parameters()).device
    generate = cast("Callable[..., torch.Tensor]", model.generate)

    def run(prompt_ids: list[int]) -> Outcome:
        input_ids = torch.tensor([prompt_ids], device=device)
        sync(device)
        started = time.perf_counter()
        with torch.inference_mode():
            out = generate(
                input_ids,
                attention_mask=torch.ones_like(input_ids),
                max_new_tokens=max_new_tokens,
                do_sample=False,
                pad_token_id=pad_id,
                **generate_kwargs,
            )
        sync(device)
        seconds = time.perf_counter() - started
        return Outcome(out[0, len(prompt_ids) :].tolist(), seconds)

    return run


def _specops_runner(decoder: SpeculativeDecoder, *, max_new_tokens: int) -> Runner:
    def run(prompt_ids: list[int]) -> Outcome:
        started = time.perf_counter()
        result = decoder.generate(prompt_ids, max_new_tokens=max_new_tokens)
        seconds = time.perf_counter() - started
        return Outcome(result.token_ids, seconds, result.stats.to_dict())

    return run


def _llamacpp_runner(
    process: LlamaCppProcess, method: MethodConfig, *, max_new_tokens: int, eos: list[int]
) -> Runner:
    lookup = method.mode == "prompt_lookup"

    def run(prompt_ids: list[int]) -> Outcome:
        out = process.generate(
            prompt_ids,
            max_new_tokens=max_new_tokens,
            mode=str(method.mode),
            num_pred_tokens=method.num_pred_tokens if lookup else None,
            eos=eos,
        )
        return Outcome(out.token_ids, out.seconds)

    return run


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
    target's plain output is its own reference, not HF's), against HF greedy, which has
    none."""
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
        if method.name == BASELINE:
            references[method.name] = None
        elif plain is not None and plain != method.name:
            references[method.name] = plain
        else:
            references[method.name] = BASELINE
    return references


def llamacpp_reference(config: BenchConfig) -> str | None:
    """The llama.cpp plain method, which the ``x llama`` column divides by."""
    return next((m.name for m in config.methods if m.engine == "llamacpp" and _is_plain(m)), None)


def make_runners(
    stock: LoadedTarget,
    engine_targets: dict[str, LoadedTarget],
    config: BenchConfig,
    *,
    llamacpp: LlamaCppProcess | None = None,
) -> dict[str, Runner]:
    """HF methods run ``stock``'s model (stock kernels); a specops method runs the target
    loaded for its hardware target (``engine_targets[engine_key(method, config)]``);
    llama.cpp methods run in ``llamacpp``, and are left out when it is ``None`` (skipped).
    Every method stops at ``stock``'s end-of-sequence ids."""
    model = stock.model
    draft_model = None
    runners: dict[str, Runner] = {}
    eos = list(stock.eos_token_ids)
    pad_id = eos[0]
    for method in config.methods:
        if method.engine == "hf":
            kwargs: dict[str, object] = {}
            if method.mode == "assisted":
                if draft_model is None:
                    draft_model = first_layers(model, config.draft_layers)
                kwargs["assistant_model"] = draft_model
            elif method.mode == "prompt_lookup":
                kwargs["prompt_lookup_num_tokens"] = method.prompt_lookup_num_tokens
            elif method.mode == "static":
                kwargs["cache_implementation"] = "static"
            runners[method.name] = _hf_runner(
                model, max_new_tokens=config.max_new_tokens, pad_id=pad_id, **kwargs
            )
        elif method.engine == "specops":
            target = engine_targets[str(engine_key(method, config))]
            decoder = build_decoder(
                target, method_plan(method, config), relax_lambda=method.relax_lambda
            )
            runners[method.name] = _specops_runner(decoder, max_new_tokens=config.max_new_tokens)
        elif llamacpp is not None:
            runners[method.name] = _llamacpp_runner(
                llamacpp, method, max_new_tokens=config.max_new_tokens, eos=eos
            )
    return runners


def summarize(
    runs: list[dict],
    methods: list[str],
    *,
    references: dict[str, str | None] | None = None,
    llamacpp_plain: str | None = None,
    weights: dict[str, dict] | None = None,
    bandwidth_bytes_per_s: float | None = None,
) -> list[dict]:
    """Rows per (workload, method) plus an ``all`` workload; sums, not mean of ratios.

    ``speedup`` divides a row's pooled tokens/s by HF greedy's, ``x_llama`` by llama.cpp
    plain's (``llamacpp_plain``) on the same prompts; ``identical`` says whether every
    output equals its reference row's (``references``); ``limit_tokens_per_s`` is
    bandwidth ÷ the weight bytes per token of the row's format (``weights[method]``), and
    ``of_limit`` the row's tokens/s as a share of it."""
    references = references or {}
    weights = weights or {}
    rows = []
    workloads = sorted({r["workload"] for r in runs})

    def rate_of(subset: list[dict], method: str | None) -> float | None:
        mine = [r for r in subset if r["method"] == method]
        seconds = sum(r["seconds"] for r in mine)
        return sum(len(r["token_ids"]) for r in mine) / seconds if seconds else None

    for workload in [*workloads, "all"]:
        subset = [r for r in runs if workload in ("all", r["workload"])]
        base_rate = rate_of(subset, BASELINE)
        llama_rate = rate_of(subset, llamacpp_plain) if llamacpp_plain else None
        for method in methods:
            mine = [r for r in subset if r["method"] == method]
            seconds = sum(r["seconds"] for r in mine)
            tokens = sum(len(r["token_ids"]) for r in mine)
            rate = tokens / seconds if seconds else None
            stats = [r["stats"] for r in mine if r["stats"] is not None]
            pooled = pool(_as_stats(s) for s in stats) if stats else {}
            weight = weights.get(method, {})
            per_token = weight.get("bytes_per_token")
            limit = (
                limit_tokens_per_s(bandwidth_bytes_per_s, per_token)
                if bandwidth_bytes_per_s and per_token
                else None
            )
            rows.append(
                {
                    "workload": workload,
                    "method": method,
                    "weights": weight.get("format"),
                    "prompts": len(mine),
                    "tokens": tokens,
                    "seconds": seconds,
                    "tokens_per_s": rate,
                    "speedup": rate / base_rate if rate and base_rate else None,
                    "x_llama": rate / llama_rate if rate and llama_rate else None,
                    "acceptance_rate": pooled.get("acceptance_rate"),
                    "mean_accepted_length": pooled.get("mean_accepted_length"),
                    "reference": references.get(method, BASELINE if method != BASELINE else None),
                    "identical": all(r["identical"] for r in mine),
                    "bytes_per_token": per_token,
                    "limit_tokens_per_s": limit,
                    "of_limit": rate / limit if rate and limit else None,
                }
            )
    return rows


def _as_stats(stats: dict):
    from serving.engine.metrics import RequestStats

    return RequestStats(**stats)


def format_table(rows: list[dict], skipped: list[dict] | None = None) -> str:
    """The summary as a text table; skipped methods and why follow it."""

    def fmt(value, spec):
        return "-" if value is None else format(value, spec)

    def same(row: dict) -> str:
        if row.get("reference") is None and row["method"] == BASELINE:
            return "(reference)"
        return f"{'yes' if row['identical'] else 'NO'} {row.get('reference') or BASELINE}"

    name_w = max([18, *(len(row["method"]) for row in rows)])
    weights_w = max([16, *(len(row.get("weights") or "") for row in rows)])
    header = (
        f"{'workload':<10} {'method':<{name_w}} {'weights':<{weights_w}} {'tok/s':>7} "
        f"{'speedup':>8} {'x llama':>7} {'accept':>7} {'mean len':>8} {'limit tok/s':>11} "
        f"{'% limit':>7}  identical to"
    )
    lines = [header, "-" * (len(header) + 12)]
    for row in rows:
        of_limit = row.get("of_limit")
        lines.append(
            f"{row['workload']:<10} {row['method']:<{name_w}} "
            f"{row.get('weights') or '-':<{weights_w}} "
            f"{fmt(row['tokens_per_s'], '.2f'):>7} {fmt(row['speedup'], '.2f'):>7}x "
            f"{fmt(row.get('x_llama'), '.2f'):>6}x {fmt(row['acceptance_rate'], '.3f'):>7} "
            f"{fmt(row['mean_accepted_length'], '.2f'):>8} "
            f"{fmt(row.get('limit_tokens_per_s'), '.1f'):>11} "
            f"{fmt(None if of_limit is None else 100 * of_limit, '.0f'):>6}%  {same(row)}"
        )
    for item in skipped or []:
        lines.append(f"skipped {item['method']}: {item['reason']}")
    return "\n".join(lines)


def plot(rows: list[dict], path: Path, *, hardware: str = DEFAULT_HARDWARE) -> None:
    """A bar per method and workload: its speedup over the baseline, on ``hardware`` (a
    hardware target's name, as results store it)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    workloads = list(dict.fromkeys(r["workload"] for r in rows))
    methods = list(dict.fromkeys(r["method"] for r in rows))
    width = 0.8 / len(methods)
    fig, ax = plt.subplots(figsize=(1.8 + 1.6 * len(workloads), 4.2))
    for i, method in enumerate(methods):
        values = [
            next(
                (r["speedup"] or 0.0 for r in rows if r["workload"] == w and r["method"] == method),
                0.0,
            )
            for w in workloads
        ]
        positions = [j + (i - (len(methods) - 1) / 2) * width for j in range(len(workloads))]
        ax.bar(positions, values, width, label=method)
    ax.axhline(1.0, color="black", linewidth=0.8, linestyle="--")
    ax.set_xticks(range(len(workloads)), workloads)
    ax.set_ylabel(f"speedup over {BASELINE} (tokens/s ratio)")
    ax.set_title(f"specops bench: speculative decoding on `{hardware}`")
    ax.legend(fontsize=7, ncol=2)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)


def _llamacpp_model(config: BenchConfig, target: str) -> Path:
    if config.llamacpp_model:
        path = Path(config.llamacpp_model)
        if not path.is_file():
            raise LlamaCppUnavailable(f"llamacpp_model {str(path)!r} is not a file")
        return path
    if target != DEFAULT_TARGET:
        raise LlamaCppUnavailable(
            f"llama.cpp decodes a GGUF file, and target {target!r} is a model folder; set "
            "llamacpp_model in the bench config to its GGUF"
        )
    from serving.models.real import gguf_path

    try:
        return gguf_path()
    except SpecOpsError as error:
        raise LlamaCppUnavailable(str(error)) from None


def _n_ctx(prompt_lengths: list[int], config: BenchConfig) -> int:
    """llama.cpp's context: the longest prompt, the budget and one draft block, in 256s."""
    lookahead = max(
        (m.num_pred_tokens for m in config.methods if m.engine == "llamacpp"), default=0
    )
    needed = max(prompt_lengths) + config.max_new_tokens + lookahead + 1
    return -(-needed // 256) * 256


def load_bench_targets(
    source: str,
    config: BenchConfig,
    hardware: dict[str, HardwareTarget],
    main: HardwareTarget,
) -> tuple[LoadedTarget, dict[str, LoadedTarget], list[PreTrainedModel]]:
    """``source`` loaded for every method: the stock target the HF baselines run (stock
    kernels on ``main``'s device and dtype), the target of each specops method by
    :func:`engine_key` (on its hardware target of ``hardware``), and the distinct models
    they hold. One model is loaded per distinct way of loading (kernels, device, dtype,
    lean step), shared by the targets that load alike."""
    from serving.loader import load_target

    def way(spec: HardwareTarget, lean_mode: str | None) -> tuple[str, ...]:
        return (spec.kernels, spec.device, spec.dtype, lean_mode or "")

    stock_hardware = main.model_copy(update={"kernels": "stock"})
    stock = load_target(source, stock_hardware)
    loaded: dict[tuple[str, ...], LoadedTarget] = {way(stock_hardware, None): stock}
    engine_targets: dict[str, LoadedTarget] = {}
    for method in config.methods:
        name = engine_key(method, config)
        if name is None or name in engine_targets:
            continue
        spec = hardware[str(method_hardware(method, config))]
        lean_mode = "off" if method.step == "transformers" else None
        key = way(spec, lean_mode)
        if key not in loaded:
            loaded[key] = load_target(source, spec, lean_mode=lean_mode)
        # The same model (and step), decoded with this method's hardware target's curves.
        engine_targets[name] = replace(loaded[key], hardware=spec)
    return stock, engine_targets, [target.model for target in loaded.values()]


def run_bench(
    config: BenchConfig,
    *,
    out_dir: Path = Path("results"),
    target: str = DEFAULT_TARGET,
    progress: bool = True,
    prompts: Sequence[EncodedPrompt | Prompt] | None = None,
    draw: bool = True,
) -> dict:
    """Run the benchmark; write ``bench.json`` and (``draw``) ``bench.png`` into ``out_dir``.

    ``prompts`` (token ids, e.g. a GPU run kit's) replace the config's workloads. HF methods
    run the target on the device and dtype of the config's hardware target (stock kernels).
    llama.cpp methods whose environment or model is missing are left out and listed under
    ``skipped`` with the reason (and logged); the rest of the bench runs."""
    from serving.loader import encode_messages

    set_threads(config.threads)
    load_before = os.getloadavg()  # other work on the machine shows in every timing
    hardware = resolve_hardware(config)  # every target checked before any weights are read
    references = pick_references(config)
    skipped: list[dict] = []
    llama_methods = [m.name for m in config.methods if m.engine == "llamacpp"]
    llama_python = gguf = None
    if llama_methods:
        try:
            llama_python = llamacpp_python()
            gguf = _llamacpp_model(config, target)
        except LlamaCppUnavailable as error:
            skipped = [{"method": name, "reason": str(error)} for name in llama_methods]
            log.warning("skipping %s: %s", ", ".join(llama_methods), error)
    if prompts is None:
        from tasks.data.traffic import build_workload

        prompts = [
            prompt
            for workload in config.workloads
            for prompt in build_workload(
                workload, config.prompts_per_workload, seed=config.seed, split=config.split
            )
        ]
    main = hardware.get(config.hardware) or engine_target(config.hardware, require_curve=False)
    stock, engine_targets, models = load_bench_targets(target, config, hardware, main)
    tokenizer = stock.tokenizer
    assert tokenizer is not None  # load_target loads the source's tokenizer
    encoded = [
        p.token_ids if isinstance(p, EncodedPrompt) else encode_messages(tokenizer, p.messages)
        for p in prompts
    ]

    bandwidth = memory_bandwidth(config.bandwidth_mb)
    footprints = {id(m): weight_bytes_per_token(m) for m in models}
    stock_dtype = str(stock.dtype).removeprefix("torch.")
    weights: dict[str, dict] = {}
    gguf_read = gguf_weights(gguf) if gguf is not None else None
    llama_weights = (
        {"format": f"gguf {gguf_read.format}", "bytes_per_token": gguf_read.bytes_per_token}
        if gguf_read is not None
        else None
    )
    for method in config.methods:
        hw_name = method_hardware(method, config)
        if method.engine == "llamacpp":
            if llama_weights is not None:
                weights[method.name] = dict(llama_weights)
        elif hw_name is None:  # HF: the stock model
            weights[method.name] = {
                "format": f"{stock_dtype} stock",
                "bytes_per_token": footprints[id(stock.model)],
            }
        else:
            engine = engine_targets[str(engine_key(method, config))]
            weights[method.name] = {
                "format": hw_name,
                "kernels": hardware[hw_name].kernels,
                "bytes_per_token": footprints[id(engine.model)],
            }

    llama: LlamaCppProcess | None = None
    try:
        if llama_python is not None and gguf is not None:
            try:
                llama = LlamaCppProcess(
                    gguf,
                    threads=config.threads,
                    n_ctx=_n_ctx([len(ids) for ids in encoded], config),
                    prompt_lookup_tokens=tuple(
                        m.num_pred_tokens
                        for m in config.methods
                        if m.engine == "llamacpp" and m.mode == "prompt_lookup"
                    ),
                    python=llama_python,
                )
            except LlamaCppUnavailable as error:
                skipped = [{"method": name, "reason": str(error)} for name in llama_methods]
                log.warning("skipping %s: %s", ", ".join(llama_methods), error)
        runners = make_runners(stock, engine_targets, config, llamacpp=llama)
        names = list(runners)
        runs = _interleave(runners, list(prompts), encoded, references, progress=progress)
    finally:
        if llama is not None:
            llama.close()
    llama_plain = llamacpp_reference(config) if llama is not None else None
    rows = summarize(
        runs,
        names,
        references=references,
        llamacpp_plain=llama_plain,
        weights=weights,
        bandwidth_bytes_per_s=bandwidth.bytes_per_s,
    )
    for weight in weights.values():
        weight["limit_tokens_per_s"] = limit_tokens_per_s(
            bandwidth.bytes_per_s, weight["bytes_per_token"]
        )
    results = {
        "config": config.model_dump(),
        "environment": {
            "threads": torch.get_num_threads(),
            "specops_hardware": config.hardware,
            "specops_kernels": main.kernels,
            "specops_targets": {name: spec.load_options() for name, spec in hardware.items()},
            "memory_bandwidth": bandwidth.to_dict(),
            "weights": weights,
            "llamacpp": llama.info if llama is not None else None,
            "torch": torch.__version__,
            "machine": platform.machine(),
            "processor": platform.processor(),
            "cpu": cpu_description(),
            "cpu_count": os.cpu_count(),
            "load_average_before": load_before,
            "load_average_after": os.getloadavg(),
            "python": platform.python_version(),
        },
        "references": {name: references[name] for name in names},
        "skipped": skipped,
        "summary": rows,
        "runs": runs,
    }
    out_dir = Path(out_dir)
    write_json_atomic(out_dir / "bench.json", results)
    if draw:
        plot(rows, out_dir / "bench.png", hardware=config.hardware)
    return results


def _interleave(
    runners: dict[str, Runner],
    prompts: list,
    encoded: list[list[int]],
    references: dict[str, str | None],
    *,
    progress: bool,
) -> list[dict]:
    """One warm-up each, then every method once per prompt in a rotating order
    (:func:`tasks.evaluate.interleave.interleave`). A row's ``seconds`` are its runner's own
    (llama.cpp times itself, without the pipe)."""
    from tqdm.auto import tqdm

    names = list(runners)
    bar = tqdm(total=len(prompts) * len(names), desc="bench", disable=not progress)

    # The longest prompt: a static KV cache (hf-static) is sized once, for every prompt
    # after it (transformers keeps the largest), so no timed run recompiles.
    longest = max(encoded, key=len)

    def warm_up(name: str) -> None:
        bar.set_postfix_str(f"warm-up:{name}")
        runners[name](longest)

    def show(name: str, index: int) -> None:
        bar.set_postfix_str(f"{prompts[index].workload}:{name}")

    calls = {name: (lambda index, name=name: runners[name](encoded[index])) for name in names}
    rounds = interleave(
        calls, len(prompts), warm_up=warm_up, on_start=show, on_end=lambda *_: bar.update()
    )
    runs: list[dict] = []
    for prompt, prompt_ids, timed in zip(prompts, encoded, rounds, strict=True):
        outcomes = {name: run.value for name, run in timed.items()}
        for name in names:
            outcome = outcomes[name]
            reference = references.get(name)
            runs.append(
                {
                    "prompt_id": prompt.id,
                    "workload": prompt.workload,
                    "method": name,
                    "prompt_tokens": len(prompt_ids),
                    "token_ids": outcome.token_ids,
                    "seconds": outcome.seconds,
                    "reference": reference,
                    "identical": reference is None
                    or outcome.token_ids == outcomes[reference].token_ids,
                    "stats": outcome.stats,
                }
            )
    bar.close()
    return runs
