"""``specops bench``, ``bench-skeleton`` and ``profile``: what decoding costs here, measured
(the work is in :mod:`tasks.bench.bench`, :mod:`tasks.bench.skeleton` and
:mod:`tasks.bench.profile`)."""

from __future__ import annotations

import json
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Annotated, Any

import typer

from serving.defaults import DEFAULT_POLICY, DEFAULT_TARGET
from serving.hardware import DEFAULT_HARDWARE
from specops.exit import failing
from specops.load import draft_plan, load_engine_target
from specops.options import Policy, Threads


def bench(
    config: Annotated[Path, typer.Option(help="Bench config (YAML).")] = Path("configs/bench.yaml"),
    prompts: Annotated[int | None, typer.Option(help="Prompts per workload.")] = None,
    max_new_tokens: Annotated[int | None, typer.Option(help="Token budget per prompt.")] = None,
    threads: Annotated[int | None, typer.Option(help="torch threads (recorded).")] = None,
    workloads: Annotated[str | None, typer.Option(help="Comma-separated workloads.")] = None,
    methods: Annotated[str | None, typer.Option(help="Comma-separated method names.")] = None,
    seed: Annotated[int | None, typer.Option(help="Prompt-selection seed.")] = None,
    out: Annotated[Path, typer.Option(help="Folder for bench.json and bench.png.")] = Path(
        "results"
    ),
) -> None:
    """Benchmark specops against HF greedy, HF assisted generation, HF prompt lookup and
    llama.cpp (plain and prompt lookup, when .venv-llamacpp exists)."""
    from tasks.bench.bench import format_table, load_bench_config, run_bench, select_methods

    with failing():
        overrides: dict[str, object] = {
            "prompts_per_workload": prompts,
            "max_new_tokens": max_new_tokens,
            "threads": threads,
            "seed": seed,
            "workloads": workloads.split(",") if workloads else None,
        }
        settings = load_bench_config(config, **overrides)
        if methods:
            select_methods(settings, methods.split(","))
        results = run_bench(settings, out_dir=out)
    typer.echo(format_table(results["summary"], results["skipped"]))
    bandwidth = results["environment"]["memory_bandwidth"]["gb_per_s"]
    typer.echo(
        f"threads={results['environment']['threads']}  memory bandwidth={bandwidth:.1f} GB/s  "
        f"results: {out / 'bench.json'}  plot: {out / 'bench.png'}"
    )


def bench_skeleton(
    prompts: Annotated[int, typer.Option(help="Planning prompts (held-out ShareGPT).")] = 12,
    max_tokens: Annotated[int, typer.Option(help="Token budget per point.")] = 64,
    plain_max_tokens: Annotated[int, typer.Option(help="Budget of the plain answer.")] = 256,
    drafter: Annotated[str, typer.Option(help="Drafter of every request.")] = "pld",
    policy: Policy = DEFAULT_POLICY,
    k: Annotated[int, typer.Option("--k", help="The policy's k.")] = 8,
    threads: Threads = 2,
    hardware: Annotated[str, typer.Option(help="Hardware target.")] = DEFAULT_HARDWARE,
    seed: Annotated[int, typer.Option(help="Prompt-selection seed.")] = 0,
    out: Annotated[Path, typer.Option(help="Results file.")] = Path("results/skeleton.json"),
) -> None:
    """Skeleton-of-thought against the same requests one at a time and a plain answer, on
    the planning workload; write a results file."""
    from serving.engine.build import build_decoder
    from serving.hardware import engine_target
    from tasks.bench.skeleton import run_skeleton_bench, skeleton_constraint, write_results

    with failing():
        engine = engine_target(hardware)
        plan = draft_plan(drafter, policy=policy, k=k, hardware=engine)
        target = load_engine_target(DEFAULT_TARGET, engine, threads)
        results = run_skeleton_bench(
            target,
            lambda: build_decoder(target, plan),
            skeleton_constraint(target),
            prompts=prompts,
            max_tokens=max_tokens,
            plain_max_tokens=plain_max_tokens,
            limits=engine.batch_limits(),
            cost=engine.pass_cost(),
            seed=seed,
        )
    results["settings"] = {
        "prompts": prompts,
        "max_tokens": max_tokens,
        "plain_max_tokens": plain_max_tokens,
        "drafter": drafter,
        "policy": policy,
        "k": k,
        "threads": threads,
        "hardware": hardware,
    }
    write_results(results, out)
    typer.echo(json.dumps(results["summary"], indent=2))
    typer.echo(f"wrote {out}", err=True)


def profile(
    hardware: Annotated[
        str,
        typer.Option(
            help="Hardware target to measure on: its device, dtype, kernels and threads "
            "(configs/hardware.yaml). Its verify curve need not exist yet."
        ),
    ] = DEFAULT_HARDWARE,
    threads: Annotated[
        int | None, typer.Option(help="torch threads (recorded); default: the target's.")
    ] = None,
    max_n: Annotated[int, typer.Option(help="Largest block to time (not with --batch).")] = 16,
    context: Annotated[
        int | None,
        typer.Option(
            help="Tokens already in the KV cache; default 256, or 200 with --batch (each "
            "sequence's within ±25%)."
        ),
    ] = None,
    repeats: Annotated[int, typer.Option(help="Timings per size (medians kept).")] = 15,
    out: Annotated[
        Path | None,
        typer.Option(
            help="Results file; default results/profile.json, or results/profile-batch.json "
            "with --batch (its plot beside it as .png)."
        ),
    ] = None,
    kernels: Annotated[
        str | None,
        typer.Option(help="onednn | int8 | int4 (CPU) | stock; default: the target's."),
    ] = None,
    batch: Annotated[
        bool,
        typer.Option(
            "--batch",
            help="Measure packed passes instead: n rows shared by B sequences, each with its "
            "own cache, and print the batch_curve configs/hardware.yaml takes.",
        ),
    ] = False,
    breakdown: Annotated[
        bool,
        typer.Option(
            "--breakdown",
            help="Split a one-token and a --rows-token pass into matmuls, attention, "
            "norms/activations and the rest, through transformers' forward and the lean "
            "step, beside the physical limit (results/profile-breakdown.json).",
        ),
    ] = False,
    rows: Annotated[int, typer.Option(help="The block size --breakdown splits.")] = 8,
    draft: Annotated[
        list[str] | None,
        typer.Option(
            help="Also time this drafter's drafting cost per drafted token, in one-token "
            "passes, as the lookups' is (a drafter spec, e.g. head:PATH; repeatable)."
        ),
    ] = None,
    from_evaluation: Annotated[
        list[Path] | None,
        typer.Option(
            help="Time nothing: pool the verify curves these evaluations' own timed passes "
            "followed (evaluation reports or files, repeatable; the host's typical passes, "
            "not one quiet moment's) into the verify_curve line (results/profile.json)."
        ),
    ] = None,
) -> None:
    """Measure target-pass cost by block size, and first-N-layer draft costs, on a hardware
    target, and print its verify curve as configs/hardware.yaml takes it (with --batch: the
    cost of packed passes over several sequences, and its batch curve; with
    --from-evaluation: pooled from evaluations' own passes instead)."""
    from serving.atomic import write_json_atomic
    from serving.hardware import engine_target
    from tasks.bench.profile import plot_batch, profile_batch_hardware, profile_hardware
    from tasks.bench.profile_report import batch_report, pass_report

    if from_evaluation:
        _from_evaluations(hardware, from_evaluation, out or Path("results/profile.json"))
        return
    if breakdown:
        _breakdown(hardware, kernels, threads, rows, context, repeats, out)
        return
    measure: Callable[..., Any]
    if batch:
        out = out or Path("results/profile-batch.json")
        measure = partial(profile_batch_hardware, context=200 if context is None else context)
    else:
        out = out or Path("results/profile.json")
        measure = partial(
            profile_hardware,
            max_n=max_n,
            context=256 if context is None else context,
            drafts=tuple(draft or ()),
        )
    with failing():
        # This is what measures a target's verify curve: it need not have one yet.
        engine = engine_target(hardware, require_curve=False)
        # a PassProfile, or with --batch a BatchProfile
        result: Any = measure(engine, kernels=kernels, threads=threads, repeats=repeats)
    write_json_atomic(out, {"hardware": hardware, **result})
    if not batch:
        typer.echo(pass_report(engine, result))
        typer.echo(f"results: {out}")
        return
    title = f"packed pass cost on {hardware} ({result['threads']} threads)"
    plot = plot_batch(result, out.with_suffix(".png"), title=title)
    typer.echo(batch_report(engine, result))
    typer.echo(f"results: {out}, plot: {plot}")


def _from_evaluations(hardware: str, paths: list[Path], out: Path) -> None:
    from serving.atomic import write_json_atomic
    from tasks.bench.profile import curve_yaml
    from tasks.evaluate.evaluated_curve import pooled_curve
    from tasks.evaluate.evaluation_file import read_report

    with failing():
        curve, passes = pooled_curve([read_report(path) for path in paths], hardware)
    rounded = [round(c, 3) for c in curve]
    write_json_atomic(
        out,
        {
            "hardware": hardware,
            "from_evaluations": [str(p) for p in paths],
            "passes": passes,
            "verify_curve": rounded,
            "config_curve": rounded,
        },
    )
    typer.echo(
        f"{hardware}: the verify curve {len(paths)} evaluations' {passes} timed passes "
        f"followed (per size, the median over the evaluations); under {hardware} in "
        "configs/hardware.yaml:"
    )
    typer.echo("    " + curve_yaml(rounded))
    typer.echo(f"results: {out}")


def _breakdown(
    hardware: str,
    kernels: str | None,
    threads: int | None,
    rows: int,
    context: int | None,
    repeats: int,
    out: Path | None,
) -> None:
    from serving.atomic import write_json_atomic
    from serving.errors import BadInputError
    from serving.hardware import engine_target
    from tasks.bench.breakdown import breakdown, breakdown_report
    from tasks.bench.profile import load_for

    out = out or Path("results/profile-breakdown.json")
    with failing():
        if rows < 2:
            raise BadInputError(f"--rows must be >= 2 (the block --breakdown splits), got {rows}")
        engine = engine_target(hardware, require_curve=False)
        target = load_for(engine, None, kernels, threads)
        result = breakdown(target, rows=rows, context=context or 256, repeats=repeats)
    write_json_atomic(out, {"hardware": hardware, **result.to_dict()})
    typer.echo(breakdown_report(engine, result))
    typer.echo(f"results: {out}")
