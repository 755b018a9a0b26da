"""``specops chat``: an interactive session that loads the target once and keeps it
(:mod:`specops.chat`)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from serving.defaults import DEFAULT_K, DEFAULT_POLICY, DEFAULT_TARGET
from serving.hardware import DEFAULT_HARDWARE
from specops.exit import failing
from specops.options import SPEC_HELP, Hardware, Policy, Target, Threads


def chat(
    target: Target = DEFAULT_TARGET,
    hardware: Hardware = DEFAULT_HARDWARE,
    threads: Threads = 2,
    drafter: Annotated[str, typer.Option(help=f"{SPEC_HELP} (/drafter changes it).")] = "pld",
    k: Annotated[
        int, typer.Option("--k", help="Draft block: fixed k, adaptive start, cost policy's max.")
    ] = DEFAULT_K,
    policy: Policy = DEFAULT_POLICY,
    temperature: Annotated[float, typer.Option(help="0 = greedy.")] = 0.0,
    max_tokens: Annotated[int, typer.Option(help="Token budget of an answer.")] = 256,
    mode: Annotated[
        str, typer.Option(help="detailed (records for /save, /eval, /train) | fast.")
    ] = "detailed",
    store: Annotated[
        Path, typer.Option(help="The record store /save appends to and /eval, /train read.")
    ] = Path(".specops/chat/store"),
    work: Annotated[
        Path, typer.Option(help="The flows' work folder (dataset, challengers) for /eval, /train.")
    ] = Path(".specops/chat/work"),
    history: Annotated[
        Path | None,
        typer.Option(help="The prompt history file (default $SPECOPS_CACHE/chat-history)."),
    ] = None,
) -> None:
    """An interactive session: type prompts, switch drafters, /compare, /stats, /save,
    /eval, /train (/help inside lists every command)."""
    from serving.hardware import engine_target, load_hardware
    from serving.loader import load_target, set_threads
    from serving.models.real import cache_root
    from specops.chat.commands import Settings

    with failing():  # every option checked before the model loads
        settings = Settings(
            drafter=drafter,
            k=k,
            policy=policy,
            temperature=temperature,
            max_tokens=max_tokens,
            mode=mode,
        ).check()
        engine = engine_target(hardware)
        set_threads(threads)
    from rich.console import Console
    from transformers.utils import logging as transformers_logging

    from specops.chat.session import ChatSession
    from specops.chat.ui import ChatUI, line_reader

    transformers_logging.disable_progress_bar()  # the session's own status says it loads
    console = Console(highlight=False)
    try:
        with failing(), console.status(f"loading {target} for {hardware}"):
            session = ChatSession(load_target(target, engine), settings=settings)
    except KeyboardInterrupt:
        raise typer.Exit(130) from None
    read_line = line_reader(
        console, history or cache_root() / "chat-history", sorted(load_hardware().targets)
    )
    ui = ChatUI(
        session,
        console=console,
        read_line=read_line,
        store=store,
        work=work,
        champion_cache=cache_root() / "registry",
        target_name=target,
    )
    raise typer.Exit(ui.run())
