"""``specops quality``: what the quantised targets cost in quality, next to float32.

Thin: options are checked (and the targets' kernels probed) before any model loads; the work
is in :mod:`tasks.bench.quality`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from serving.defaults import DEFAULT_TARGET
from specops.exit import fail


def quality(
    targets: Annotated[
        str,
        typer.Option(
            help="Comma-separated hardware targets (configs/hardware.yaml), the first the "
            "reference; kernels:K loads kernels K (onednn, int8, int4, stock) on the CPU "
            "without a target of its own."
        ),
    ] = "cpu,cpu-int8,cpu-int4",
    problems: Annotated[
        int | None,
        typer.Option(
            min=1, help="Held-out HumanEval problems, in the seeded order; default: all (29)."
        ),
    ] = None,
    sharegpt: Annotated[
        int, typer.Option(min=0, help="Held-out ShareGPT prompts (agreement only).")
    ] = 8,
    max_new_tokens: Annotated[int, typer.Option(min=1, help="Token budget per prompt.")] = 384,
    threads: Annotated[int, typer.Option(min=1, help="torch threads (recorded).")] = 2,
    timeout: Annotated[
        float, typer.Option(help="Seconds each HumanEval problem's tests may run.")
    ] = 3.0,
    seed: Annotated[int, typer.Option(help="Seed of the held-out prompts' order.")] = 0,
    target: Annotated[str, typer.Option(help="smollm2 or a local model folder.")] = DEFAULT_TARGET,
    drafter: Annotated[
        str, typer.Option(help="Drafter for generation (greedy output is the same with any).")
    ] = "pld",
    k: Annotated[int, typer.Option("--k", help="Draft tokens per step.")] = 8,
    out: Annotated[Path, typer.Option(help="Folder for quality.json and quality.png.")] = Path(
        "results"
    ),
    report_only: Annotated[
        bool,
        typer.Option(
            "--report-only", help="Measure nothing: print OUT/quality.json, redraw its plot."
        ),
    ] = False,
) -> None:
    """HumanEval pass@1 (executed) of each target's greedy answers, and their agreement with
    the first target's greedy output (whole outputs, common prefix, teacher-forced top-1)."""
    from serving.errors import SpecOpsError
    from tasks.bench.quality import QualityConfig, format_table, report, run_quality

    if report_only:
        try:
            results = report(out)
        except SpecOpsError as error:
            fail(str(error))
        typer.echo(format_table(results))
        typer.echo(f"results: {out / 'quality.json'}  plot: {out / 'quality.png'}")
        return
    names = tuple(name.strip() for name in targets.split(",") if name.strip())
    config = QualityConfig(
        targets=names,
        problems=problems,
        sharegpt=sharegpt,
        max_new_tokens=max_new_tokens,
        threads=threads,
        seed=seed,
        timeout_s=timeout,
        source=target,
        drafter=drafter,
        k=k,
    )
    try:
        config.check()
        results = run_quality(config, out)
    except SpecOpsError as error:
        fail(str(error))
    typer.echo(format_table(results))
    typer.echo(
        f"threads={results['environment']['threads']}  wall {results['wall_s']:.0f}s  "
        f"results: {out / 'quality.json'}  plot: {out / 'quality.png'}"
    )
