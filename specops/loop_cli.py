"""``specops loop ...``: the closed loop (Prefect flows over the registry and the store)."""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from serving.defaults import DEFAULT_K, DEFAULT_POLICY
from serving.engine.drafters.kinds import BUILTIN_KINDS, spec_syntax
from serving.hardware import DEFAULT_HARDWARE
from specops.exit import fail

if TYPE_CHECKING:
    from pydantic import BaseModel

    from tasks.loop.demo_report import BeforeAfter, DemoReport, DrillSummary, Regained

loop_app = typer.Typer(help="The closed loop: drift demo, flows, scheduled deployments.")


def _prefect_env() -> None:
    """Before any flow: the temporary Prefect server sends nothing out and stops on
    SIGTERM as on Ctrl-C (:mod:`specops.prefect_env`)."""
    from specops.prefect_env import prepare_prefect

    prepare_prefect()


@loop_app.command()
def demo(
    work: Annotated[Path, typer.Option(help="Workspace: store, packages, MLflow.")] = Path(
        ".specops/demo"
    ),
    fresh: Annotated[
        bool, typer.Option("--fresh/--resume", help="Start over, or resume a killed run.")
    ] = True,
    hardware: Annotated[str, typer.Option(help="Hardware target.")] = DEFAULT_HARDWARE,
    before_prompts: Annotated[int, typer.Option(help="Grounded requests before the drift.")] = 16,
    after_prompts: Annotated[int, typer.Option(help="HumanEval requests after it.")] = 24,
    max_new_tokens: Annotated[int, typer.Option(help="Tokens per request.")] = 64,
    eval_prompts: Annotated[
        int, typer.Option(help="Built-in prompts per workload in each evaluation.")
    ] = 4,
    threads: Annotated[int, typer.Option(help="torch threads.")] = 2,
    head_seconds: Annotated[
        float, typer.Option(help="Head training budget per retrain (seconds).")
    ] = 30.0,
    lora_seconds: Annotated[
        float, typer.Option(help="LoRA training budget per retrain (seconds).")
    ] = 30.0,
    drill: Annotated[
        bool,
        typer.Option(
            "--drill/--no-drill",
            help="Last, promote the head by hand, scramble its weights, and let the watch "
            "roll it back.",
        ),
    ] = True,
) -> None:
    """The main job: bootstrap a champion, replay drift, retrain, evaluate, gate, promote."""
    from serving.errors import SpecOpsError
    from serving.loader import set_threads

    _demo_workspace(work, fresh=fresh)
    _prefect_env()
    try:
        set_threads(threads)
        summary = _run_demo(
            work,
            hardware,
            before_prompts=before_prompts,
            after_prompts=after_prompts,
            max_new_tokens=max_new_tokens,
            eval_prompts=eval_prompts,
            budgets={"head": head_seconds, "lora": lora_seconds},
            drill=drill,
        )
    except SpecOpsError as error:
        fail(str(error))
    _echo_demo(summary)


def _demo_workspace(work: Path, *, fresh: bool) -> None:
    """The demo's folder (emptied first unless resuming) and its own MLflow store."""
    if fresh and work.exists():
        shutil.rmtree(work)
    work.mkdir(parents=True, exist_ok=True)
    # The demo keeps its own MLflow store so that it starts from a clean registry; point
    # SPECOPS_MLFLOW_URI elsewhere to run it against another tracking server.
    os.environ.setdefault("SPECOPS_MLFLOW_URI", f"sqlite:///{work.resolve()}/mlflow.db")
    os.environ.setdefault("SPECOPS_MLFLOW_ARTIFACTS", str(work.resolve() / "mlartifacts"))


def _run_demo(
    work: Path,
    hardware: str,
    *,
    before_prompts: int,
    after_prompts: int,
    max_new_tokens: int,
    eval_prompts: int,
    budgets: dict[str, float],
    drill: bool,
) -> DemoReport:
    """Run the drift demo's flow, write its report under results/main and log that report
    (with its headline numbers) to the registry."""
    from flows.demo import drift_demo
    from tasks.loop.demo_report import write_report

    result = drift_demo(
        hardware=hardware,
        work=str(work),
        before_prompts=before_prompts,
        after_prompts=after_prompts,
        max_new_tokens=max_new_tokens,
        eval_prompts=eval_prompts,
        budgets=budgets,
        drill=drill,
    )
    summary = write_report(result, work / "store", Path("results/main"))
    headline = _headline(summary.before_after, hardware)
    from tasks.loop.registry_steps import open_registry

    open_registry().log_report(
        "drift-demo",
        [Path("results/main/loop.png"), Path("results/main/loop.json")],
        metrics=headline,
        tags={"hardware": hardware},
    )
    return summary


def _headline(ba: BeforeAfter | None, hardware: str) -> dict[str, float]:
    """The champion's and the challenger's mean accepted length and speedup after the
    drift, as registry metrics (``<hardware>/<role>_<metric>``)."""
    headline = {}
    if ba is not None:
        for role, row in (("before", ba.before), ("challenger", ba.challenger)):
            for key in ("mean_accepted_length", "speedup"):
                value = None if row is None else getattr(row, key)
                if value is not None:
                    headline[f"{hardware}/{role}_{key}"] = float(value)
    return headline


def _echo_demo(summary: DemoReport) -> None:
    """The demo's outcome: its bootstrap champion, the retrain after the drift, the drill,
    and where its results are."""
    typer.echo("")
    typer.echo(f"bootstrap champion: {summary.bootstrap}")
    ba = summary.before_after
    if ba is None:
        typer.echo("no retrain happened (acceptance stayed above the threshold)")
    else:
        _echo_before_after(ba, summary.regained)
    if summary.drill is not None:
        _echo_drill(summary.drill)
    from registry.config import mask_uri

    typer.echo(
        "results: results/main/loop.json, plot results/main/loop.png\n"
        f"MLflow: mlflow ui --backend-store-uri {mask_uri(os.environ['SPECOPS_MLFLOW_URI'])}\n"
        "Prefect: prefect server start (flow runs of this process went to a temporary server)"
    )


def _echo_before_after(ba: BeforeAfter, back: Regained | None) -> None:
    """Each contender after the drift (overall and on held-out drifted traffic), the
    promotion, the gates, and how much of the drift's loss the loop's draft regained."""
    typer.echo("after the drift (overall | held-out drifted traffic):")
    for row in [ba.plain, *([ba.before] if ba.before else []), *ba.challengers]:
        on = row.traffic
        typer.echo(
            f"  {row.label:>28}: mean accepted length {_num(row.mean_accepted_length)}"
            f" | {_num(None if on is None else on.mean_accepted_length)}, speedup "
            f"{_num(row.speedup)}x | {_num(None if on is None else on.speedup)}x, "
            f"lossless {row.lossless}"
        )
    typer.echo(f"{'promoted ' + ba.promoted if ba.promoted else 'champion kept'}")
    for label, gate in ba.gates.items():
        typer.echo(f"gate {label}: {gate.reason}")
    if back is not None:
        share = back.regained_share
        typer.echo(
            f"held-out traffic: the champion at the drift, {back.champion}, had a mean "
            f"accepted length of {back.champion_before_drift:.2f} before it and "
            f"{back.champion_after_drift:.2f} on {back.workload}; "
            f"{back.loop_draft} gets {back.loop_draft_after_drift:.2f} there"
            + (
                f": {share:.0%} of the loss regained"
                if share is not None
                else " (the drift cost it nothing to regain)"
            )
        )


def _echo_drill(drilled: DrillSummary) -> None:
    """The drill: the damaged draft, the requests it served, and whether the watch rolled
    it back."""
    typer.echo(
        f"drill: {drilled.draft} promoted by hand, its weights scrambled on disk, served "
        f"{drilled.requests} requests; "
        + (
            f"the watch rolled it back to {drilled.rolled_back_to}"
            if drilled.restored
            else f"NOT restored ({drilled.alarm or 'the watch did not fire'})"
        )
    )
    for line in drilled.watch:
        typer.echo(f"  watch: {line}")


def _num(value: float | None, digits: int = 2) -> str:
    return "n/a" if value is None else f"{value:.{digits}f}"


@loop_app.command()
def bootstrap(
    hardware: Annotated[str, typer.Option(help="Hardware target.")] = DEFAULT_HARDWARE,
    drafter: Annotated[
        str, typer.Option(help=f"A built-in drafter: {spec_syntax(BUILTIN_KINDS, sep=', ')}.")
    ] = "pld:3",
    family: Annotated[str, typer.Option(help="Registered-model family.")] = "ngram",
    k: Annotated[int, typer.Option(help="Largest draft block.")] = DEFAULT_K,
    policy: Annotated[str, typer.Option(help="Draft-length policy.")] = DEFAULT_POLICY,
    workload: Annotated[str, typer.Option(help="Held-out prompts it is evaluated on.")] = (
        "grounded"
    ),
    prompts: Annotated[int, typer.Option(help="Held-out prompts.")] = 4,
    max_new_tokens: Annotated[int, typer.Option(help="Tokens per prompt.")] = 96,
) -> None:
    """A hardware target's first champion: register a built-in drafter, evaluate it against
    plain decoding on held-out prompts, and promote it if the gates pass."""
    from serving.engine.drafters.plan import DraftPlan
    from serving.errors import SpecOpsError
    from serving.hardware import engine_target

    try:  # bad options fail here, before Prefect or any model starts
        engine_target(hardware)  # bootstrapping evaluates on the specops engine
        if not DraftPlan.parse(drafter, policy=policy, k=k).kind.builtin:
            fail(f"--drafter {drafter!r} needs files; use one of {', '.join(BUILTIN_KINDS)}")
    except SpecOpsError as error:
        fail(str(error))
    _prefect_env()
    from flows.loop import bootstrap as bootstrap_flow

    try:
        result = bootstrap_flow(
            hardware=hardware,
            drafter=drafter,
            family=family,
            k=k,
            policy=policy,
            workloads=[workload],
            prompts_per_workload=prompts,
            max_new_tokens=max_new_tokens,
        )
    except SpecOpsError as error:
        fail(str(error))
    if result.bootstrapped is None:
        typer.echo(f"{hardware} already has a champion: {result.champion}")
        return
    for label, gate in result.bootstrapped.gates.items():
        typer.echo(f"gate {label}: {gate.reason}")
    champion = result.champion
    typer.echo(f"champion-{hardware}: {champion}" if champion else "not promoted: no champion")
    if not champion:
        raise typer.Exit(1)


FLOWS = ("collect", "retrain", "evaluate-and-promote")


@loop_app.command()
def run(
    flow_name: Annotated[str, typer.Argument(help=" | ".join(FLOWS))],
    hardware: Annotated[str, typer.Option(help="Hardware target.")] = DEFAULT_HARDWARE,
    store: Annotated[str, typer.Option(help="The record store.")] = "data",
    work: Annotated[str, typer.Option(help="Work folder (dataset, challengers).")] = (
        ".specops/work"
    ),
    challenger: Annotated[
        list[str] | None,
        typer.Option(help="evaluate-and-promote: a registered version, family/version."),
    ] = None,
    workload: Annotated[
        list[str] | None, typer.Option(help="evaluate-and-promote: built-in workloads.")
    ] = None,
    prompts: Annotated[int, typer.Option(help="Held-out prompts per built-in workload.")] = 8,
    traffic: Annotated[
        bool,
        typer.Option(
            "--traffic/--no-traffic",
            help="evaluate-and-promote: also the held-out traffic of WORK/dataset.",
        ),
    ] = True,
    promote: Annotated[bool, typer.Option("--promote/--no-promote")] = True,
) -> None:
    """Run one flow now against the configured registry and store."""
    from serving.errors import SpecOpsError
    from serving.hardware import hardware_target
    from tasks.loop.results import DraftRef

    if flow_name not in FLOWS:
        fail(f"unknown flow {flow_name!r}; choose one of {', '.join(FLOWS)}")
    try:
        hardware_target(hardware)
        versions: list[DraftRef] = []
        if challenger:  # checked to exist before Prefect starts
            from tasks.loop.registry_steps import open_registry

            registry = open_registry()
            drafts = [registry.resolve(ref) for ref in challenger]
            versions = [DraftRef(family=d.family, version=d.version) for d in drafts]
    except SpecOpsError as error:
        fail(str(error))
    _prefect_env()
    from flows.loop import collect, evaluate_and_promote, retrain

    try:
        if flow_name == "evaluate-and-promote":
            dataset = Path(work) / "dataset"
            if traffic and not (dataset / "heldout_traffic.jsonl").is_file():
                fail(
                    f"no held-out traffic at {dataset}: run `specops loop run collect` first, "
                    "or pass --no-traffic"
                )
            result: BaseModel = evaluate_and_promote(
                versions,
                hardware=hardware,
                workloads=workload or ["humaneval"],
                prompts_per_workload=prompts,
                cache=f"{work}/packages",
                promote=promote,
                traffic=str(dataset) if traffic else None,
            )
        else:
            flows: dict[str, Callable[..., BaseModel]] = {"collect": collect, "retrain": retrain}
            result = flows[flow_name](hardware=hardware, store=store, work=work)
    except SpecOpsError as error:
        fail(str(error))
    typer.echo(json.dumps(result.model_dump(mode="json"), indent=2)[:4000])


@loop_app.command()
def serve(
    hardware: Annotated[str, typer.Option(help="Hardware target.")] = DEFAULT_HARDWARE,
) -> None:
    """Serve the scheduled deployments (collect hourly, retrain daily, evaluate on demand)."""
    from serving.errors import SpecOpsError
    from serving.hardware import hardware_target

    try:  # a bad target fails here, not at the first scheduled run an hour later
        hardware_target(hardware)
    except SpecOpsError as error:
        fail(str(error))
    _prefect_env()
    from flows.deployments import main

    main(hardware)


@loop_app.command("head-curve")
def head_curve(
    work: Annotated[Path, typer.Option(help="The main job's workspace (store, MLflow).")] = Path(
        ".specops/demo"
    ),
    pre_drift_head: Annotated[
        Path | None,
        typer.Option(help="A head folder; default: the workspace's first registered head."),
    ] = None,
    drifted: Annotated[str, typer.Option(help="The workload traffic drifted to.")] = "humaneval",
    minutes: Annotated[float, typer.Option(help="Training budget (minutes of steps).")] = 10.0,
    threads: Annotated[int, typer.Option(help="torch threads (the issue: one).")] = 1,
    fresh: Annotated[bool, typer.Option(help="Also train a fresh head, same budget.")] = False,
    out: Annotated[Path, typer.Option(help="Results folder.")] = Path("results/head-curve"),
) -> None:
    """The head-continuation benchmark: the pre-drift head continued on the collected mix,
    scored at each mark by the replayed mean accepted length (k = 2) on held-out drifted
    traffic; ``OUT/head-continuation.{json,png}``."""
    from serving.errors import SpecOpsError

    os.environ.setdefault("SPECOPS_MLFLOW_URI", f"sqlite:///{work.resolve()}/mlflow.db")
    os.environ.setdefault("SPECOPS_MLFLOW_ARTIFACTS", str(work.resolve() / "mlartifacts"))
    from tasks.loop.head_continuation import head_continuation_curve

    if not minutes > 0:
        fail(f"--minutes must be > 0, got {minutes}")
    marks = [s for s in (60.0, 120.0, 300.0, 600.0, 1200.0) if s < 60 * minutes] + [60 * minutes]
    try:
        head = pre_drift_head or _first_head(work)
        payload = head_continuation_curve(
            work / "store",
            head,
            out,
            drifted=drifted,
            marks_s=marks,
            threads=threads,
            fresh=fresh,
        )
    except SpecOpsError as error:
        fail(str(error))
    before = payload.pre_drift.mean_accepted_length
    typer.echo(f"pre-drift head {head}: {_num(before, 3)} on held-out {drifted} traffic (k = 2)")
    for name, points in payload.runs.items():
        for point in points[1:] if name == "continued" else points:
            typer.echo(
                f"  {name:>9} after {point.seconds / 60:5.1f} min ({point.steps} steps): "
                f"{_num(point.mean_accepted_length, 3)}"
            )
    typer.echo(f"results: {out / 'head-continuation.json'}, plot {out / 'head-continuation.png'}")


def _first_head(work: Path) -> Path:
    """The workspace's first registered head (the main job's pre-drift one)."""
    from serving.errors import BadInputError
    from tasks.loop.registry_steps import open_registry

    registry = open_registry()
    if "head" not in registry.families():
        raise BadInputError(f"no head is registered in {work}: run `specops loop demo` first")
    draft = registry.get("head", 1)
    return registry.download(draft, work / "packages") / "head"
