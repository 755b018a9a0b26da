"""``specops gpu kit`` and ``specops gpu ingest``: a GPU machine measured and back (docs/gpu/)."""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path
from typing import Annotated

import typer

from serving.defaults import DEFAULT_TARGET
from specops.exit import failing

gpu_app = typer.Typer(
    help="The GPU run kit: build it here, run it on a bare GPU machine, ingest its results."
)


@gpu_app.command("kit")
def kit(
    bundle: Annotated[
        Path,
        typer.Option(
            help="An evaluation bundle (`specops targets bundle`): its target, "
            "champion, challengers and prompts."
        ),
    ],
    out: Annotated[Path, typer.Option(help="The kit folder to write.")] = Path(".specops/gpu-kit"),
    dataset: Annotated[
        Path | None,
        typer.Option(
            help="A dataset folder (`specops data build`): teacher data for the head "
            "and LoRA challengers trained there."
        ),
    ] = None,
    target: Annotated[str, typer.Option(help="smollm2 or a local model folder.")] = DEFAULT_TARGET,
    part_size: Annotated[float, typer.Option(help="Largest part, MiB.", min=1)] = 60,
    wheels: Annotated[
        bool, typer.Option("--wheels/--no-wheels", help="Bring the small packages as wheels.")
    ] = True,
    python: Annotated[str, typer.Option(help="The GPU machine's Python, for the wheels.")] = "3.12",
    repeats: Annotated[int, typer.Option(min=3, help="Profile timings per size.")] = 30,
    train_budget: Annotated[float, typer.Option(help="Seconds per learned family.")] = 90.0,
    command_budget: Annotated[int, typer.Option(help="Seconds one run.sh command may take.")] = 600,
    total_budget: Annotated[int, typer.Option(help="Seconds of GPU time in all.")] = 720,
    threads: Annotated[int, typer.Option(min=1, help="torch threads there.")] = 8,
    dry_run: Annotated[
        bool,
        typer.Option(
            "--dry-run",
            help="Build the kit in a temporary folder, check every part "
            "against the size limit, print the plan, and remove it.",
        ),
    ] = False,
) -> None:
    """Build a kit that travels to a bare GPU machine in parts of at most --part-size MiB,
    and print the plan: what runs there, each step's expected time, the total."""
    from tasks.gpu.kit import KitOptions, build_kit, plan_text
    from tasks.gpu.manifest import MIB, KitSettings

    settings = KitSettings(
        threads=threads,
        repeats=repeats,
        train_budget_s=train_budget,
        command_s=command_budget,
        total_s=total_budget,
    )
    scratch = Path(tempfile.mkdtemp(prefix="specops-kit-")) if dry_run else None
    try:
        with failing():
            manifest = build_kit(
                KitOptions(
                    out=scratch / "kit" if scratch else out,
                    bundle=bundle,
                    target=target,
                    dataset=dataset,
                    part_size=int(part_size * MIB),
                    wheels=wheels,
                    python=python,
                    settings=settings,
                ),
                say=lambda line: typer.echo(line, err=True),
            )
        typer.echo(plan_text(manifest))
        if dry_run:
            typer.echo("dry run: every part fits; nothing kept")
        else:
            typer.echo(f"kit: {out} (there: bash run.sh measure; bash run.sh learn)")
    finally:
        if scratch is not None:
            shutil.rmtree(scratch, ignore_errors=True)


@gpu_app.command("ingest")
def ingest(
    results: Annotated[Path, typer.Argument(help="The kit's results folder, brought back.")],
    promote: Annotated[
        bool, typer.Option("--promote/--no-promote", help="Let the gates promote.")
    ] = True,
    hardware_config: Annotated[
        Path | None, typer.Option(help="Where the curves go; default configs/hardware.yaml.")
    ] = None,
    docs: Annotated[Path | None, typer.Option(help="Default docs/gpu.")] = None,
) -> None:
    """Write the measured curves into configs/hardware.yaml, register the challengers
    trained there and log the evaluation (the gates decide, as `specops registry
    log-evaluation --promote`), and write docs/gpu/<target>.md."""
    from serving.hardware import HARDWARE_CONFIG
    from tasks.gpu.ingest import DOCS
    from tasks.gpu.ingest import ingest as run_ingest

    with failing():
        done = run_ingest(
            results,
            hardware_config=hardware_config or HARDWARE_CONFIG,
            docs=docs or DOCS,
            promote=promote,
        )
    hardware = done.hardware
    typer.echo(f"curves written under {hardware}: {', '.join(done.curves) or 'none measured'}")
    for name, label in done.registered.items():
        typer.echo(f"{name}: {label}")
    for label, reason in done.gates.items():
        typer.echo(f"gate {label}: {reason}")
    typer.echo(
        f"champion-{hardware} -> {done.promoted}"
        if done.promoted
        else f"champion-{hardware} kept: {done.champion}"
    )
    for missing in done.missing:
        typer.echo(f"not in the results: {missing}")
    typer.echo(f"wrote {done.doc}")
