"""``specops serve``, ``loadtest`` and ``model-path``: the OpenAI-compatible server
(:mod:`serving.server`), a load test against it (:mod:`tasks.ops.loadtest`), the shipped
model's folder."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from specops.exit import fail, failing
from specops.options import (
    AllowUnauthenticated,
    ApiKeyFile,
    TlsCa,
    TlsCert,
    TlsKey,
    security_overrides,
)


def serve(
    config: Annotated[Path, typer.Option(help="Serving config (YAML).")] = Path(
        "configs/serving.yaml"
    ),
    host: Annotated[str | None, typer.Option(help="Bind address (default 127.0.0.1).")] = None,
    port: Annotated[int | None, typer.Option(help="Port (default 8000).")] = None,
    target: Annotated[str | None, typer.Option(help="smollm2 or a local model folder.")] = None,
    hardware: Annotated[str | None, typer.Option(help="Hardware target.")] = None,
    threads: Annotated[int | None, typer.Option(help="torch threads per decode worker.")] = None,
    drafter: Annotated[
        str | None, typer.Option(help="Serve this drafter spec (a static champion).")
    ] = None,
    champion: Annotated[
        Path | None,
        typer.Option(help="Serve the draft package a pointer file names; hot-swap on change."),
    ] = None,
    registry: Annotated[
        bool, typer.Option("--registry", help="Serve the MLflow champion of the hardware target.")
    ] = False,
    capture_share: Annotated[
        float | None, typer.Option(help="Share of requests captured into the store.")
    ] = None,
    store: Annotated[Path | None, typer.Option(help="Capture store folder.")] = None,
    queue_size: Annotated[int | None, typer.Option(help="Waiting requests before 429.")] = None,
    max_active: Annotated[int | None, typer.Option(help="Requests decoded concurrently.")] = None,
    workers: Annotated[int | None, typer.Option(help="Decode threads.")] = None,
    api_key_file: ApiKeyFile = None,
    allow_unauthenticated: AllowUnauthenticated = False,
    tls_cert: TlsCert = None,
    tls_key: TlsKey = None,
) -> None:
    """Serve the target with its champion draft: an OpenAI-compatible HTTP endpoint."""
    import logging

    import uvicorn

    from serving.security import logs
    from serving.security.tls import server_tls, uvicorn_tls
    from serving.server.app import create_app
    from serving.server.config import load_server_config
    from serving.server.state import build_state, server_keys

    if sum([drafter is not None, champion is not None, registry]) > 1:
        fail("give at most one of --drafter, --champion and --registry")
    source = "static" if drafter else "local" if champion else "registry" if registry else None
    with failing():
        settings = load_server_config(
            config,
            **{
                "host": host,
                "port": port,
                "target": target,
                "hardware": hardware,
                "threads": threads,
                "champion.source": source,
                "champion.drafter": drafter,
                "champion.path": str(champion) if champion else None,
                "capture.share": capture_share,
                "capture.store": str(store) if store else None,
                "limits.queue_size": queue_size,
                "limits.max_active": max_active,
                "limits.workers": workers,
                **security_overrides(api_key_file, allow_unauthenticated, tls_cert, tls_key),
            },
        )
        keys = server_keys(settings)  # before the model loads: a bad key file fails fast
        tls = server_tls(settings.security.tls_cert, settings.security.tls_key)
        logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
        logs.install(keys.secrets)
        state = build_state(settings, api_keys=keys)
    access = f"API keys: {len(keys.digests)}" if keys.enabled else "no API key (open)"
    typer.echo(
        f"serving {settings.model_name} on {'https' if tls else 'http'}://{settings.host}:"
        f"{settings.port}/v1 "
        f"(hardware {settings.hardware}, draft {state.watcher.current.version}, {access})",
        err=True,
    )
    # uvicorn's loggers go through the root handlers (log_config=None), so the secret filter
    # masks them too.
    logging.getLogger("uvicorn").setLevel(logging.WARNING)
    uvicorn.run(
        create_app(state),
        host=settings.host,
        port=settings.port,
        log_config=None,
        log_level="warning",
        timeout_graceful_shutdown=10,
        **uvicorn_tls(tls),
    )


def loadtest(
    url: Annotated[
        str | None, typer.Option(help="A running server (loopback); default: start one.")
    ] = None,
    clients: Annotated[
        str, typer.Option(help="Concurrency levels, a comma list; measured one after the other.")
    ] = "1,2,4,8",
    requests: Annotated[int, typer.Option(help="Requests per level.")] = 16,
    max_tokens: Annotated[int, typer.Option(help="max_tokens per request.")] = 64,
    temperature: Annotated[
        float, typer.Option(help="Sampling temperature; at 0 the levels' outputs are compared.")
    ] = 0.0,
    skeleton: Annotated[
        bool, typer.Option("--skeleton", help="Ask for skeleton-of-thought decoding per request.")
    ] = False,
    workload: Annotated[str, typer.Option(help="Prompts: a workload's held-out split.")] = (
        "sharegpt"
    ),
    drafter: Annotated[
        str | None, typer.Option(help="Per-request drafter (default: the champion).")
    ] = None,
    serve_args: Annotated[
        str, typer.Option(help="Extra `specops serve` options when starting the server.")
    ] = "",
    tls_ca: TlsCa = None,
    out: Annotated[
        Path, typer.Option(help="Results file; the table (.md) and plot (.png) go beside it.")
    ] = Path("results/loadtest.json"),
) -> None:
    """Load-test a server on loopback at several concurrency levels with the official openai
    client; write a results file, a table and a plot. It sends the first of
    $SPECOPS_API_KEYS; --tls-ca: the server (given, or started with --serve-args
    '--tls-cert ... --tls-key ...') serves TLS signed by this CA."""
    import asyncio
    import shlex

    from tasks.ops.loadtest import (
        LoadTestSettings,
        check_levels,
        markdown_table,
        parse_levels,
        run_load_sweep,
        write_report,
    )
    from tasks.ops.server_process import ServerProcess

    settings = LoadTestSettings(
        requests=requests,
        max_tokens=max_tokens,
        temperature=temperature,
        workload=workload,
        drafter=drafter,
        skeleton=skeleton,
        tls_ca=tls_ca,
    )
    server = None
    try:
        with failing():
            levels = parse_levels(clients)
            # The url checked before a server starts: the given one, or the one it will have.
            settings.url = url or ("https://127.0.0.1" if tls_ca else "http://127.0.0.1")
            settings.check()
            check_levels(levels, requests)
            if url is None:
                out.parent.mkdir(parents=True, exist_ok=True)
                log_path = out.with_suffix(".server.log")
                typer.echo(f"starting a server (log: {log_path}) ...", err=True)
                server = ServerProcess(
                    shlex.split(serve_args), log_path=log_path, tls_ca=tls_ca
                ).start()
                url = server.url
            settings.url = url
            results = asyncio.run(run_load_sweep(settings, levels))
    finally:
        if server is not None:
            server.stop()
    results["serve_args"] = serve_args if server is not None else None
    written = write_report(results, out)
    equal = results["outputs_equal"]
    typer.echo(
        markdown_table(results)
        + "\ngreedy outputs equal at every level: "
        + ("n/a (temperature > 0)" if equal is None else "yes" if equal else "NO")
        + f"\nresults: {written['json']}, {written['table']}, {written['plot']}"
    )


def model_path() -> None:
    """Convert the shipped SmolLM2-135M-Instruct once (cached) and print its folder."""
    from serving.models.real import real_model_dir

    typer.echo(str(real_model_dir()))
