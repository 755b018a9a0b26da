"""``specops deploy vllm``: serve a hardware target's champion with vLLM's own server
(:mod:`tasks.loop.vllm_deploy`), replaced without dropping requests on every promotion."""

from __future__ import annotations

import json
import logging
import signal
from pathlib import Path
from typing import Annotated

import typer

from serving.defaults import DEFAULT_TARGET
from specops.exit import fail, failing
from specops.options import (
    AllowUnauthenticated,
    ApiKeyFile,
    Target,
    TlsCa,
    TlsCert,
    TlsKey,
    security_overrides,
)

deploy_app = typer.Typer(
    help="Deploy a hardware target's champion on an inference server.", no_args_is_help=True
)


def _log_progress() -> None:
    """The deployment's progress lines on stderr; httpx's per-request lines left out."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    logging.getLogger("httpx").setLevel(logging.WARNING)


@deploy_app.command("vllm")
def vllm(
    hardware: Annotated[str, typer.Option(help="A vLLM hardware target (cpu-vllm, cuda-vllm).")],
    target: Target = DEFAULT_TARGET,
    host: Annotated[str, typer.Option(help="The front's address.")] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="The front's port (clients call this one).")] = 8100,
    store: Annotated[
        Path | None,
        typer.Option(help="Record store for captured pairs and acceptance windows."),
    ] = Path("data"),
    no_capture: Annotated[
        bool, typer.Option("--no-capture", help="Write nothing to the store.")
    ] = False,
    work: Annotated[Path, typer.Option(help="Exports, server logs.")] = Path(".specops/deploy"),
    served_model_name: Annotated[
        str, typer.Option(help="The model name clients send (stable across swaps).")
    ] = "specops",
    poll_s: Annotated[float, typer.Option(help="Seconds between registry polls.")] = 5.0,
    scrape_s: Annotated[float, typer.Option(help="Seconds between metric scrapes.")] = 10.0,
    drain_s: Annotated[
        float, typer.Option(help="Longest wait for the old server's requests in flight.")
    ] = 120.0,
    config: Annotated[
        Path,
        typer.Option(
            help="Serving config: its security section (API keys, TLS), limits.max_body_bytes "
            "and capture redaction apply to the front too."
        ),
    ] = Path("configs/serving.yaml"),
    api_key_file: ApiKeyFile = None,
    allow_unauthenticated: AllowUnauthenticated = False,
    tls_cert: TlsCert = None,
    tls_key: TlsKey = None,
) -> None:
    """Run the front on HOST:PORT and keep the champion's vLLM server behind it: on a
    promotion or rollback, start the new configuration beside the old, wait for it to
    answer, move traffic, stop the old. /health says what serves and why not."""
    import uvicorn

    from serving.gateway.front import Front
    from serving.security import logs
    from serving.security.rate import TokenBuckets
    from serving.security.tls import server_tls, uvicorn_tls
    from serving.server.config import load_server_config
    from serving.server.state import server_keys
    from tasks.loop.vllm_deploy import deployment_for
    from tasks.loop.vllm_target import vllm_target

    _log_progress()
    with failing():
        overrides = security_overrides(api_key_file, allow_unauthenticated, tls_cert, tls_key)
        settings = load_server_config(config, **{"host": host, **overrides})
        keys = server_keys(settings)
        tls = server_tls(settings.security.tls_cert, settings.security.tls_key)
        resolved = vllm_target(hardware)  # before the registry is opened
    logs.install(keys.secrets)
    front = Front(
        hardware=resolved,
        keys=keys,
        max_body_bytes=settings.limits.max_body_bytes,
        max_json_depth=settings.limits.max_json_depth,
        buckets=(
            TokenBuckets(settings.limits.rate_per_s, settings.limits.burst)
            if settings.limits.rate_per_s
            else None
        ),
        refusal_delay_s=settings.limits.refusal_delay_s,
        metrics_open=settings.security.metrics_open,
    )
    capture = settings.capture
    with failing():
        deployment = deployment_for(
            resolved,
            target=target,
            work=work,
            store=None if no_capture else store,
            front=front,
            served_model_name=served_model_name,
            poll_s=poll_s,
            scrape_s=scrape_s,
            drain_s=drain_s,
            redact_patterns=list(capture.redact_patterns) if capture.redact else None,
        )
    deployment.start()
    server = uvicorn.Server(
        uvicorn.Config(front.app(), host=host, port=port, log_level="warning", **uvicorn_tls(tls))
    )
    signal.signal(signal.SIGTERM, lambda *_: setattr(server, "should_exit", True))
    try:
        server.run()
    finally:
        deployment.stop()


@deploy_app.command("cycle")
def cycle(
    hardware: Annotated[str, typer.Option(help="A vLLM hardware target.")] = "cpu-vllm",
    target: Target = DEFAULT_TARGET,
    first: Annotated[str, typer.Option(help="The first champion's drafter spec.")] = "pld:1",
    second: Annotated[str, typer.Option(help="The drafter promoted over it.")] = "pld:3",
    work: Annotated[Path, typer.Option(help="Packages, exports, logs.")] = Path(
        ".specops/deploy-cycle"
    ),
    store: Annotated[Path, typer.Option(help="Where capture and windows go.")] = Path(
        ".specops/deploy-cycle/store"
    ),
    workers: Annotated[int, typer.Option(help="Concurrent clients of the steady load.")] = 2,
    max_tokens: Annotated[int, typer.Option(help="Tokens per completion.")] = 24,
    pause_s: Annotated[float, typer.Option(help="Each client's pause between requests.")] = 1.0,
    out: Annotated[Path, typer.Option(help="The report.")] = Path("results/vllm-deploy.json"),
    tls_cert: TlsCert = None,
    tls_key: TlsKey = None,
    tls_ca: TlsCa = None,
) -> None:
    """Register two drafts, evaluate them through vLLM, promote the first, serve it with
    `deploy vllm`'s machinery under a steady load, promote the second, roll back; report
    every request's outcome and each switch's times (uses the configured registry)."""
    from serving.security.tls import ca_context, server_tls
    from tasks.loop.vllm_cycle import run_cycle
    from tasks.loop.vllm_target import vllm_target

    _log_progress()

    def interrupt(*_):  # SIGTERM stops the servers as Ctrl-C does
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, interrupt)
    with failing():
        resolved = vllm_target(hardware)  # before anything is registered or promoted
        tls = server_tls(tls_cert, tls_key)
        if tls_ca is not None:
            ca_context(tls_ca)  # a bad CA file fails here, not under load
            if tls is None:
                fail("--tls-ca is for a front served with TLS: give --tls-cert and --tls-key")
        report = run_cycle(
            hardware=resolved,
            target=target,
            work=work,
            store=store,
            drafters=(first, second),
            workers=workers,
            max_tokens=max_tokens,
            pause_s=pause_s,
            out=out,
            tls=tls,
            tls_ca=tls_ca,
        )
    typer.echo(json.dumps({k: report[k] for k in ("requests", "failed", "timeline")}, indent=2))
    typer.echo(f"report: {out}")
