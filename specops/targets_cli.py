"""``specops targets ...``: drafts on every hardware target, side by side."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from serving.defaults import DEFAULT_TARGET
from specops.exit import failing
from specops.load import tokenizer_of

if TYPE_CHECKING:
    from serving.hardware import HardwareTarget
    from tasks.data.prompts import Prompt
    from tasks.evaluate.targets import TargetReport

targets_app = typer.Typer(
    help="Hardware targets: evaluate drafts on each backend (vLLM, MLX, the specops engine)."
)


@targets_app.command("list")
def list_targets() -> None:
    """Every hardware target, its backend, and whether it runs on this machine."""
    from serving.backends import backend_info
    from serving.hardware import load_hardware

    for name, target in sorted(load_hardware().targets.items()):
        info = backend_info(target.backend)
        where = "runs here" if target.runs_here else "not runnable here"
        typer.echo(
            f"{name:<12} {target.backend:<12} {target.device:<7} {where:<18} "
            f"env: {info.env_dir or '.venv'}"
        )


@targets_app.command("evaluate")
def evaluate(
    hardware: Annotated[list[str], typer.Option(help="Hardware target(s) to evaluate on.")],
    drafter: Annotated[
        list[str] | None, typer.Option(help="A drafter spec to evaluate (pld:3, layers:4...).")
    ] = None,
    package: Annotated[list[Path] | None, typer.Option(help="A draft package folder.")] = None,
    champion_of: Annotated[
        str | None,
        typer.Option(
            help="Also evaluate this target's registered champion; log every "
            "result to MLflow and promote the winner on each target."
        ),
    ] = None,
    workload: Annotated[str, typer.Option(help="Held-out workload.")] = "humaneval",
    prompts: Annotated[int, typer.Option(min=1, help="Held-out prompts.")] = 4,
    max_new_tokens: Annotated[int, typer.Option(min=1)] = 64,
    k: Annotated[int | None, typer.Option(help="Drafts per step (default: the target's).")] = None,
    out: Annotated[Path, typer.Option(help="Results JSON.")] = Path("results/targets.json"),
    seed: int = 0,
) -> None:
    """Evaluate drafts on each target through its own backend, interleaved with plain
    decoding there; print the side-by-side table and write the results file."""
    import tempfile

    from serving.atomic import write_json_atomic
    from serving.engine.drafters.package import DraftManifest, write_package
    from serving.hardware import hardware_target
    from tasks.data.traffic import build_workload
    from tasks.evaluate.targets import evaluate_target, table

    reports: list[TargetReport] = []
    with failing():
        targets = [(name, hardware_target(name)) for name in hardware]
        chosen = build_workload(workload, prompts, seed=seed, split="heldout")
        with tempfile.TemporaryDirectory(prefix="specops-targets-") as scratch:
            drafts = {
                spec.replace(":", "-"): write_package(
                    Path(scratch) / "packages" / spec.replace(":", "-"),
                    DraftManifest(drafter=spec),
                )
                for spec in drafter or []
            }
            drafts.update({p.name: p for p in package or []})
            for name, resolved in targets:
                workdir = Path(scratch) / name
                if champion_of:
                    reports.append(
                        _registered(resolved, champion_of, chosen, workdir, max_new_tokens)
                    )
                if drafts:
                    reports.append(
                        evaluate_target(
                            resolved,
                            drafts,
                            chosen,
                            workdir=workdir,
                            max_new_tokens=max_new_tokens,
                            k=k,
                        )
                    )
    typer.echo(table(reports))
    for report in reports:
        if "decision" in report:
            typer.echo(f"{report['hardware']}: {report['decision']['reason']}")
    write_json_atomic(out, {"workload": workload, "reports": reports})
    typer.echo(f"wrote {out}")


def _registered(
    hardware: HardwareTarget,
    champion_of: str,
    prompts: list[Prompt],
    workdir: Path,
    max_new_tokens: int,
) -> TargetReport:
    """Evaluate ``champion_of``'s champion (and ``hardware``'s own, if another) on
    ``hardware``; log it and promote the winner there."""
    from registry.client import Registry, RegistryError
    from serving.models.real import cache_root
    from tasks.loop.target_promotion import evaluate_registered

    registry = Registry()
    champion = registry.champion(champion_of)
    if champion is None:
        raise RegistryError(f"hardware target {champion_of!r} has no champion to evaluate")
    drafts = [champion]
    current = registry.champion(hardware.name)
    if current is not None and current.label != champion.label:
        drafts.append(current)
    return evaluate_registered(
        registry,
        hardware,
        drafts,
        prompts,
        cache=cache_root() / "registry",
        workdir=workdir,
        max_new_tokens=max_new_tokens,
    )


@targets_app.command("bundle")
def bundle(
    hardware: Annotated[str, typer.Option(help="The hardware target it will run on (cuda...).")],
    challenger: Annotated[
        list[str], typer.Option(help="A registered version to evaluate, family/version.")
    ],
    out: Annotated[Path, typer.Option(help="The bundle folder to write.")],
    workload: Annotated[
        list[str] | None, typer.Option(help="Built-in workloads (held-out prompts).")
    ] = None,
    prompts: Annotated[int, typer.Option(min=1, help="Held-out prompts per workload.")] = 8,
    traffic: Annotated[
        Path | None,
        typer.Option(help="A dataset folder whose heldout_traffic.jsonl is evaluated too."),
    ] = None,
    traffic_prompts: Annotated[int, typer.Option(min=1, help="Per recorded workload.")] = 8,
    max_new_tokens: Annotated[int, typer.Option(min=1)] = 96,
    seed: int = 0,
) -> None:
    """Prepare an evaluation of ``hardware``'s champion and challengers for another machine
    (a GPU box with only torch, transformers, peft and accelerate). There:
    ``python -m tasks.evaluate.remote OUT --out evaluation.json``; back here:
    ``specops registry log-evaluation evaluation.json --promote``."""
    from registry.client import Registry
    from serving.hardware import engine_target, hardware_target
    from serving.loader import load_target
    from serving.models.real import cache_root
    from tasks.data.dataset import read_part
    from tasks.data.traffic import build_workload
    from tasks.evaluate.evaluate import traffic_prompts as held_out_traffic
    from tasks.loop.remote_bundle import prepare_bundle

    with failing():
        resolved = hardware_target(hardware)  # before the registry and the model
        registry = Registry()  # the bundle's champion, challengers and their packages
        drafts = [registry.resolve(ref) for ref in challenger]
        chosen: list = [
            p
            for name in workload or ["humaneval"]
            for p in build_workload(name, prompts, seed=seed, split="heldout")
        ]
        if traffic is not None:
            held = read_part(traffic, "heldout_traffic")
            chosen += held_out_traffic(held, per_workload=traffic_prompts)
        # The shipped target's tokenizer encodes the prompts.
        tokenizer = tokenizer_of(load_target(DEFAULT_TARGET, engine_target("cpu-stock")))
        folder = prepare_bundle(
            registry,
            resolved,
            drafts,
            chosen,
            out,
            tokenizer=tokenizer,
            cache=cache_root() / "registry",
            max_new_tokens=max_new_tokens,
        )
    typer.echo(
        f"bundle for {hardware}: {len(drafts)} challenger(s), {len(chosen)} prompts -> {folder}\n"
        f"there: python -m tasks.evaluate.remote {folder} --out evaluation.json\n"
        "here:  specops registry log-evaluation evaluation.json --promote"
    )
