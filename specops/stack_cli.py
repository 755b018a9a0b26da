"""``specops stack up|down|status|env``: the local team stack (:mod:`tasks.ops.stack`)."""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Annotated

import typer

from serving.defaults import DEFAULT_K, DEFAULT_TARGET
from serving.hardware import DEFAULT_HARDWARE
from specops.exit import fail, failing
from specops.options import Target

stack_app = typer.Typer(
    help="A local team stack on loopback: PostgreSQL, an MLflow server with proxied "
    "artifacts, a Prefect server with a work pool and a worker, and sshd serving a DVC remote.",
    no_args_is_help=True,
)


def _stack():
    from pydantic import ValidationError

    from tasks.ops.stack import Stack
    from tasks.ops.stack_config import StackConfig

    logging.basicConfig(level=logging.INFO, format="%(message)s")
    logging.getLogger("httpx").setLevel(logging.WARNING)
    try:
        return Stack(StackConfig())
    except ValidationError as error:
        problems = "; ".join(
            f"SPECOPS_STACK_{'_'.join(str(p) for p in e['loc']).upper()}: {e['msg']}"
            for e in error.errors()
        )
        fail(f"invalid stack setting: {problems}")


@stack_app.command("up")
def up(
    repo: Annotated[
        Path, typer.Option(help="The checkout whose DVC config gets the stack's remote 'team'.")
    ] = Path("."),
) -> None:
    """Start every service that is not running (idempotent); print start-up times, memory
    and the settings a client needs (also in <stack>/stack.env)."""
    stack = _stack()
    with failing():
        started = stack.up(repo=repo)
    status = stack.status()
    for item in started:
        state = "was running" if item.already else f"started in {item.seconds:.1f} s"
        mib = status.get(item.name, {}).get("memory_mib")
        memory = f", {mib:.0f} MiB" if mib is not None else ""
        typer.echo(f"{item.name:9s} {state}{memory}")
    total = sum(s["memory_mib"] or 0.0 for s in status.values())
    typer.echo(f"total memory (proportional set size): {total:.0f} MiB")
    typer.echo(f"settings: source {stack.config.state / 'stack.env'}")
    for key, value in stack.config.client_env().items():
        typer.echo(f"  {key}={value}")


@stack_app.command("down")
def down(
    purge: Annotated[bool, typer.Option(help="Also delete the stack's state.")] = False,
) -> None:
    """Stop every service (the state is kept unless --purge)."""
    stopped = _stack().down(purge=purge)
    typer.echo(f"stopped: {', '.join(stopped) or 'nothing was running'}")


@stack_app.command("status")
def status() -> None:
    """Each service: running, pid, memory of its process tree (PSS, MiB)."""
    typer.echo(json.dumps(_stack().status(), indent=2))


@stack_app.command("env")
def env() -> None:
    """The client settings as shell exports: eval "$(specops stack env)"."""
    for key, value in _stack().config.client_env().items():
        typer.echo(f"export {key}={value}")


def _tiny_target(folder: Path) -> Path:
    """A tiny random Llama with the shipped model's tokenizer, for a quick run of the loop
    (its drafts and numbers mean nothing; the plumbing is what runs). Initialised narrowly,
    its greedy output soon repeats itself, so drafts are accepted and the gates can pass."""
    if not (folder / "config.json").is_file():
        from transformers import AutoTokenizer

        from serving.models.real import real_model_dir
        from serving.models.tiny import tiny_llama

        folder.mkdir(parents=True, exist_ok=True)
        model = tiny_llama(
            vocab_size=49152,
            hidden_size=64,
            num_layers=6,  # configs/retrain.yaml's LoRA draft takes the first 4
            max_positions=4096,
            initializer_range=0.02,
        )
        model.save_pretrained(folder)
        AutoTokenizer.from_pretrained(real_model_dir()).save_pretrained(folder)
    return folder


@stack_app.command("loop")
def loop(
    checkout: Annotated[
        Path,
        typer.Option(help="The checkout the worker runs the flows in (its data/ is the store)."),
    ] = Path("."),
    target: Target = DEFAULT_TARGET,
    tiny: Annotated[
        bool, typer.Option(help="Use a tiny random target instead (the plumbing, in minutes).")
    ] = False,
    hardware: Annotated[str, typer.Option(help="Hardware target.")] = DEFAULT_HARDWARE,
    replicas: Annotated[int, typer.Option(min=1, help="Serving replicas.")] = 2,
    requests: Annotated[int, typer.Option(min=1, help="Requests sent across them.")] = 12,
    workload: Annotated[str, typer.Option(help="The traffic's workload.")] = "humaneval",
    max_new_tokens: Annotated[int, typer.Option(min=1)] = 48,
    eval_prompts: Annotated[int, typer.Option(min=1, help="Held-out prompts per workload.")] = 4,
    budget: Annotated[
        float, typer.Option(min=1, help="Training seconds per learned family (head, LoRA).")
    ] = 60.0,
    poll_s: Annotated[float, typer.Option(min=0.1, help="The replicas' champion poll.")] = 2.0,
    bootstrap_k: Annotated[
        int, typer.Option(min=1, help="Draft length of the bootstrapped prompt lookup.")
    ] = DEFAULT_K,
    failure_threshold: Annotated[
        float,
        typer.Option(min=0.0, max=1.0, help="Acceptance under which a request is a failure case."),
    ] = 0.5,
    schedules: Annotated[
        bool, typer.Option(help="Keep the deployments' schedules active during the run.")
    ] = False,
    kill_worker_after: Annotated[
        float | None,
        typer.Option(help="Kill the worker (and its flow run) this many seconds into the retrain."),
    ] = None,
    report: Annotated[Path, typer.Option(help="The JSON report.")] = Path("results/team-loop.json"),
) -> None:
    """The whole loop on the team stack: deploy, bootstrap a champion if none, serve with
    replicas that capture into one store, collect -> retrain on the worker -> evaluate ->
    promote; check that nothing was registered twice, that lineage was recorded and that
    every replica serves the champion."""
    from tasks.ops.team_loop import TeamLoopOptions, dump, run_team_loop

    stack = _stack()
    if tiny:
        target = str(_tiny_target(stack.config.state / "tiny-target"))
    options = TeamLoopOptions(
        checkout=checkout.resolve(),
        target=target,
        hardware=hardware,
        replicas=replicas,
        workload=workload,
        requests=requests,
        max_new_tokens=max_new_tokens,
        eval_prompts=eval_prompts,
        budgets={"head": budget, "lora": budget},
        poll_s=poll_s,
        bootstrap_k=bootstrap_k,
        failure_threshold=failure_threshold,
        schedules=schedules,
        kill_worker_after_s=kill_worker_after,
        report=report,
    )
    with failing():
        result = run_team_loop(stack, options)
    typer.echo(dump({k: result[k] for k in ("timings_s", "retrain", "checks", "ok")}))
    if not result["ok"]:
        raise typer.Exit(code=1)


if __name__ == "__main__":
    stack_app()
