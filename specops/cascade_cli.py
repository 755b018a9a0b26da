"""``specops cascade``: collect per-stage training data for the acceptance predictor.

The λ sweep (speed against quality) is a study outside the product:
``python -m benchmarks.cascade_sweep`` (docs/cascade.md)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from serving.defaults import DEFAULT_TARGET
from serving.hardware import DEFAULT_HARDWARE
from specops.exit import fail
from specops.load import load_engine_target

cascade_app = typer.Typer(help="The draft cascade: per-stage data collection.")


@cascade_app.command()
def collect(
    stages: Annotated[
        str, typer.Option(help="Stages in order, e.g. suffix,pld:3,ngram:4,layers:4.")
    ] = "suffix,pld:3,ngram:4,layers:4",
    hardware: Annotated[
        str, typer.Option(help="A target of configs/hardware.yaml.")
    ] = DEFAULT_HARDWARE,
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
    target: Annotated[
        str, typer.Option(help="smollm2 (shipped) or a model folder.")
    ] = DEFAULT_TARGET,
) -> None:
    """Replay train and held-out prompts through every stage alone (detailed mode)."""
    from serving.engine.cascade.build import parse_stages
    from serving.engine.policy import check_k
    from serving.errors import SpecOpsError
    from serving.hardware import engine_target
    from tasks.data.stage_collect import collect_stages
    from tasks.data.traffic import build_workload

    try:
        specs = [str(spec) for spec in parse_stages(stages)]
        check_k(k)
        engine = engine_target(hardware)
        names = [w.strip() for w in workloads.split(",") if w.strip()]
        traffic = []
        for name in names:
            traffic += build_workload(name, prompts, seed=seed, split="train")
            if heldout_prompts:
                traffic += build_workload(name, heldout_prompts, seed=seed, split="heldout")
        loaded = load_engine_target(target, engine, threads)
        summaries = collect_stages(
            traffic,
            stages=specs,
            target=loaded,
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
