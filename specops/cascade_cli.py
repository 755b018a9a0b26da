"""``specops cascade``: collect per-stage training data for the acceptance predictor, and
sweep the cascade's λ (speed against quality)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from specops.exit import fail

cascade_app = typer.Typer(help="The draft cascade: per-stage data collection and the λ sweep.")


@cascade_app.command()
def collect(
    stages: Annotated[
        str, typer.Option(help="Stages in order, e.g. suffix,pld:3,ngram:4,layers:4.")
    ] = "suffix,pld:3,ngram:4,layers:4",
    hardware: Annotated[str, typer.Option(help="A target of configs/hardware.yaml.")] = "cpu",
    workloads: Annotated[str, typer.Option(help="Comma-separated workloads.")] = (
        "sharegpt,humaneval,grounded"
    ),
    prompts: Annotated[int, typer.Option(help="Train-split prompts per workload.")] = 8,
    heldout_prompts: Annotated[
        int, typer.Option(help="Held-out-split prompts per workload (predictor evaluation).")
    ] = 3,
    k: Annotated[int, typer.Option(help="Tokens every stage drafts per step.")] = 8,
    max_new_tokens: Annotated[int, typer.Option()] = 128,
    seed: Annotated[int, typer.Option(help="Which prompts of each workload.")] = 0,
    threads: Annotated[int, typer.Option(help="torch threads.")] = 2,
    store_root: Annotated[Path, typer.Option("--store", help="The record store.")] = Path(
        "results/cascade/store"
    ),
    run_id: Annotated[str, typer.Option(help="Re-running one id skips what it wrote.")] = (
        "stages"
    ),
    target: Annotated[str, typer.Option(help="smollm2 (shipped) or a model folder.")] = ("smollm2"),
) -> None:
    """Replay train and held-out prompts through every stage alone (detailed mode)."""
    from serving.cascade.build import parse_stages
    from serving.errors import SpecOpsError
    from serving.hardware import engine_target
    from serving.loader import load_target, set_threads
    from tasks.data.stage_collect import collect_stages
    from tasks.data.traffic import build_workload

    try:
        specs = [str(spec) for spec in parse_stages(stages)]
        names = [w.strip() for w in workloads.split(",") if w.strip()]
        traffic = []
        for name in names:
            traffic += build_workload(name, prompts, seed=seed, split="train")
            if heldout_prompts:
                traffic += build_workload(name, heldout_prompts, seed=seed, split="heldout")
        kernels = engine_target(hardware).kernels
        set_threads(threads)
        model, tokenizer = load_target(target, kernels=kernels)
        summaries = collect_stages(
            traffic,
            stages=specs,
            model=model,
            tokenizer=tokenizer,
            hardware=hardware,
            store_root=store_root,
            run_id=run_id,
            k=k,
            max_new_tokens=max_new_tokens,
        )
    except SpecOpsError as error:
        fail(str(error))
    for stage, summary in summaries.items():
        rate = summary.acceptance_rate
        typer.echo(
            f"{stage:>12}: {summary.written} records written, {summary.skipped_existing} "
            f"already there; acceptance {'n/a' if rate is None else f'{rate:.3f}'}"
        )


@cascade_app.command()
def sweep(
    config: Annotated[Path, typer.Option(help="The cascade config (targets + sweep).")] = Path(
        "configs/cascade.yaml"
    ),
    out: Annotated[Path, typer.Option(help="Folder for sweep.json and frontier.png.")] = Path(
        "results/cascade/sweep"
    ),
    hardware: Annotated[str | None, typer.Option(help="Override sweep.hardware.")] = None,
    predictor: Annotated[str | None, typer.Option(help="Override sweep.predictor.")] = None,
    seeds: Annotated[str | None, typer.Option(help="Override sweep.seeds, e.g. 0,1,2.")] = None,
    prompts: Annotated[
        int | None, typer.Option(help="Override the prompts per seed of both workloads.")
    ] = None,
    mlflow: Annotated[bool, typer.Option(help="Log the results as an MLflow run.")] = True,
    target: Annotated[str, typer.Option(help="smollm2 (shipped) or a model folder.")] = ("smollm2"),
) -> None:
    """λ × seeds on held-out HumanEval (pass@1) and ShareGPT (ROUGE-L), with ablations."""
    from serving.errors import SpecOpsError
    from tasks.bench.cascade_sweep import load_cascade_config, run_sweep

    try:
        loaded = load_cascade_config(config)
        overrides: dict[str, object] = {}
        if hardware is not None:
            overrides["hardware"] = hardware
        if predictor is not None:
            overrides["predictor"] = predictor
        if seeds is not None:
            overrides["seeds"] = [int(s) for s in seeds.split(",") if s.strip()]
        if prompts is not None:
            overrides["humaneval_prompts"] = overrides["sharegpt_prompts"] = prompts
        if overrides:
            merged = {**loaded.sweep.model_dump(), **overrides}
            loaded = loaded.model_copy(update={"sweep": type(loaded.sweep).model_validate(merged)})
        payload = run_sweep(loaded, out, target_source=target)
    except ValueError as error:  # a bad override (pydantic), named
        fail(f"bad sweep setting: {error}")
    except SpecOpsError as error:
        fail(str(error))
    typer.echo(payload["table"])
    typer.echo(f"wrote {out / 'sweep.json'} and {out / 'frontier.png'}")
    if mlflow:
        from registry.client import Registry

        summary = payload["summary"]
        metrics = {
            f"{name.replace('=', '_').replace('λ', 'lambda')}/{key}": float(value)
            for name, row in summary.items()
            for key, value in (
                ("speedup", row["speedup"]["mean"]),
                ("pass_at_1", row["pass_at_1"]),
                ("rouge_l", row["rouge_l"]["mean"]),
            )
            if value is not None
        }
        run_id = Registry().log_report(
            f"cascade-sweep-{loaded.sweep.hardware}",
            [out / "sweep.json", out / "frontier.png"],
            metrics=metrics,
            tags={"hardware": loaded.sweep.hardware},
        )
        typer.echo(f"logged to MLflow run {run_id}")
