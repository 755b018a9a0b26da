"""``specops bench``: specops against the baselines a user would otherwise pick.

In one run, on real workloads, interleaved: Hugging Face ``generate`` greedy, HF assisted
generation with the same model draft, HF prompt lookup, and every specops drafter. Each
method gets one warm-up generation; then, prompt by prompt, every method runs once in an
order that rotates per prompt, so machine noise lands on all methods alike. The result is
a JSON file, a table (tokens/s, speedup over HF greedy, acceptance, mean accepted length,
token-for-token equality with HF greedy) and a plot.
"""

from __future__ import annotations

import logging
import os
import platform
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import torch
import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from serving.atomic import write_json_atomic
from serving.errors import BadInputError
from serving.hardware import engine_target
from serving.loader import DecoderOptions, build_decoder, eos_ids, set_threads
from serving.metrics import pool
from serving.models.truncated import first_layers
from serving.paths import CONFIG_DIR
from serving.records.schema import WORKLOADS, Split, Workload

log = logging.getLogger(__name__)

DEFAULT_CONFIG = CONFIG_DIR / "bench.yaml"
BASELINE = "hf-greedy"


class MethodConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: str
    engine: Literal["hf", "specops"]
    mode: Literal["greedy", "assisted", "prompt_lookup"] | None = None
    drafter: str | None = None
    k: int = 4
    policy: str = "fixed"
    prompt_lookup_num_tokens: int = 10


class BenchConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    workloads: list[Workload] = Field(default_factory=lambda: list(WORKLOADS))
    prompts_per_workload: int = Field(4, ge=1)
    split: Split = "heldout"
    seed: int = 0
    max_new_tokens: int = Field(128, ge=1)
    threads: int = Field(2, ge=1)
    draft_layers: int = Field(4, ge=1)
    # specops's hardware target (configs/hardware.yaml): its kernels and measured pass costs.
    # HF baselines always run the stock model, as a user would.
    hardware: str = "cpu"
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


@dataclass
class Outcome:
    token_ids: list[int]
    seconds: float
    stats: dict[str, object] | None = None


Runner = Callable[[list[int]], Outcome]


def _hf_runner(model, *, max_new_tokens: int, pad_id: int, **generate_kwargs) -> Runner:
    def run(prompt_ids: list[int]) -> Outcome:
        input_ids = torch.tensor([prompt_ids])
        started = time.perf_counter()
        with torch.inference_mode():
            out = model.generate(
                input_ids,
                attention_mask=torch.ones_like(input_ids),
                max_new_tokens=max_new_tokens,
                do_sample=False,
                pad_token_id=pad_id,
                **generate_kwargs,
            )
        seconds = time.perf_counter() - started
        return Outcome(out[0, len(prompt_ids) :].tolist(), seconds)

    return run


def _specops_runner(decoder, *, max_new_tokens: int) -> Runner:
    def run(prompt_ids: list[int]) -> Outcome:
        started = time.perf_counter()
        result = decoder.generate(prompt_ids, max_new_tokens=max_new_tokens)
        seconds = time.perf_counter() - started
        return Outcome(result.token_ids, seconds, result.stats.to_dict())

    return run


def make_runners(model, engine_model, tokenizer, config: BenchConfig) -> dict[str, Runner]:
    """HF methods run ``model`` (stock); specops methods run ``engine_model``."""
    draft_model = None
    runners: dict[str, Runner] = {}
    pad_id = eos_ids(model, tokenizer)[0]
    for method in config.methods:
        if method.engine == "hf":
            kwargs: dict[str, object] = {}
            if method.mode == "assisted":
                if draft_model is None:
                    draft_model = first_layers(model, config.draft_layers)
                kwargs["assistant_model"] = draft_model
            elif method.mode == "prompt_lookup":
                kwargs["prompt_lookup_num_tokens"] = method.prompt_lookup_num_tokens
            elif method.mode != "greedy":
                raise BadInputError(f"hf method {method.name!r} needs a mode, got {method.mode!r}")
            runners[method.name] = _hf_runner(
                model, max_new_tokens=config.max_new_tokens, pad_id=pad_id, **kwargs
            )
        else:
            drafter = (method.drafter or "none").format(draft_layers=config.draft_layers)
            options = DecoderOptions(
                drafter=drafter, k=method.k, policy=method.policy, hardware=config.hardware
            )
            runners[method.name] = _specops_runner(
                build_decoder(engine_model, tokenizer, options),
                max_new_tokens=config.max_new_tokens,
            )
    return runners


def summarize(runs: list[dict], methods: list[str]) -> list[dict]:
    """Rows per (workload, method) plus an ``all`` workload; sums, not mean of ratios."""
    rows = []
    workloads = sorted({r["workload"] for r in runs})
    for workload in [*workloads, "all"]:
        subset = [r for r in runs if workload in ("all", r["workload"])]
        base_seconds = sum(r["seconds"] for r in subset if r["method"] == BASELINE)
        base_tokens = sum(len(r["token_ids"]) for r in subset if r["method"] == BASELINE)
        base_rate = base_tokens / base_seconds if base_seconds else None
        for method in methods:
            mine = [r for r in subset if r["method"] == method]
            seconds = sum(r["seconds"] for r in mine)
            tokens = sum(len(r["token_ids"]) for r in mine)
            rate = tokens / seconds if seconds else None
            stats = [r["stats"] for r in mine if r["stats"] is not None]
            pooled = pool(_as_stats(s) for s in stats) if stats else {}
            rows.append(
                {
                    "workload": workload,
                    "method": method,
                    "prompts": len(mine),
                    "tokens": tokens,
                    "seconds": seconds,
                    "tokens_per_s": rate,
                    "speedup": rate / base_rate if rate and base_rate else None,
                    "acceptance_rate": pooled.get("acceptance_rate"),
                    "mean_accepted_length": pooled.get("mean_accepted_length"),
                    "identical": all(r["identical"] for r in mine),
                }
            )
    return rows


def _as_stats(stats: dict):
    from serving.metrics import RequestStats

    return RequestStats(**stats)


def format_table(rows: list[dict]) -> str:
    def fmt(value, spec):
        return "-" if value is None else format(value, spec)

    header = (
        f"{'workload':<10} {'method':<18} {'tok/s':>7} {'speedup':>8} {'accept':>7} "
        f"{'mean len':>8} {'= HF greedy':>11}"
    )
    lines = [header, "-" * len(header)]
    for row in rows:
        lines.append(
            f"{row['workload']:<10} {row['method']:<18} {fmt(row['tokens_per_s'], '.2f'):>7} "
            f"{fmt(row['speedup'], '.2f'):>7}x {fmt(row['acceptance_rate'], '.3f'):>7} "
            f"{fmt(row['mean_accepted_length'], '.2f'):>8} "
            f"{'yes' if row['identical'] else 'NO':>11}"
        )
    return "\n".join(lines)


def plot(rows: list[dict], path: Path) -> None:
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
    ax.set_title("specops bench: speculative decoding on SmolLM2-135M-Instruct, CPU")
    ax.legend(fontsize=7, ncol=2)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)


def run_bench(
    config: BenchConfig,
    *,
    out_dir: Path = Path("results"),
    target: str = "smollm2",
    progress: bool = True,
) -> dict:
    """Run the benchmark; write ``bench.json`` and ``bench.png`` into ``out_dir``."""
    from tqdm.auto import tqdm

    from serving.loader import encode_messages, load_target
    from tasks.data.traffic import build_workload

    set_threads(config.threads)
    prompts = [
        prompt
        for workload in config.workloads
        for prompt in build_workload(
            workload, config.prompts_per_workload, seed=config.seed, split=config.split
        )
    ]
    kernels = engine_target(config.hardware).kernels
    model, tokenizer = load_target(target, kernels="stock")
    engine_model = model
    if kernels != "stock":
        engine_model, _ = load_target(target, kernels=kernels)
    runners = make_runners(model, engine_model, tokenizer, config)
    names = list(runners)
    encoded = [encode_messages(tokenizer, p.messages) for p in prompts]
    for name in tqdm(names, desc="warm-up", disable=not progress):
        runners[name](encoded[0][:64])
    runs: list[dict] = []
    bar = tqdm(total=len(prompts) * len(names), desc="bench", disable=not progress)
    for index, (prompt, prompt_ids) in enumerate(zip(prompts, encoded, strict=True)):
        order = names[index % len(names) :] + names[: index % len(names)]
        outcomes: dict[str, Outcome] = {}
        for name in order:
            bar.set_postfix_str(f"{prompt.workload}:{name}")
            outcomes[name] = runners[name](prompt_ids)
            bar.update()
        reference = outcomes[BASELINE].token_ids
        for name in names:
            outcome = outcomes[name]
            runs.append(
                {
                    "prompt_id": prompt.id,
                    "workload": prompt.workload,
                    "method": name,
                    "prompt_tokens": len(prompt_ids),
                    "token_ids": outcome.token_ids,
                    "seconds": outcome.seconds,
                    "identical": outcome.token_ids == reference,
                    "stats": outcome.stats,
                }
            )
    bar.close()
    rows = summarize(runs, names)
    results = {
        "config": config.model_dump(),
        "environment": {
            "threads": torch.get_num_threads(),
            "specops_hardware": config.hardware,
            "specops_kernels": kernels,
            "torch": torch.__version__,
            "machine": platform.machine(),
            "processor": platform.processor(),
            "cpu_count": os.cpu_count(),
            "python": platform.python_version(),
        },
        "summary": rows,
        "runs": runs,
    }
    out_dir = Path(out_dir)
    write_json_atomic(out_dir / "bench.json", results)
    plot(rows, out_dir / "bench.png")
    return results
