"""``specops distributed ...``: a gRPC target server, a draft client, and their benchmark."""

from __future__ import annotations

import json
import signal
import threading
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from serving.defaults import DEFAULT_TARGET
from serving.hardware import DEFAULT_HARDWARE
from specops.exit import fail, failing
from specops.load import decode_text, load_engine_target, tokenizer_of
from specops.options import AllowUnauthenticated, ApiKeyFile, Policy, Target, TlsCa, TlsCert, TlsKey

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

    from serving.target import LoadedTarget

distributed_app = typer.Typer(
    help="Distributed speculative decoding over gRPC: the target on a server, the drafter "
    "on a client (docs/distributed.md)."
)


# A drafter spec, run on the client (distributed) or on the server (--fused).
RemoteDrafter = Annotated[str, typer.Option(help="Drafter spec (here, or the server).")]
DraftLength = Annotated[int, typer.Option(help="Draft length (the cost policy's largest).")]


@distributed_app.command("serve-target")
def serve_target(
    host: Annotated[str, typer.Option(help="Bind address.")] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="Port (0: any free port).")] = 50051,
    target: Target = DEFAULT_TARGET,
    hardware: Annotated[
        str, typer.Option(help="Hardware target (its kernels and costs).")
    ] = DEFAULT_HARDWARE,
    threads: Annotated[int, typer.Option(help="torch threads for the target.")] = 1,
    max_sessions: Annotated[int, typer.Option(help="Sessions held at once.")] = 64,
    idle_timeout: Annotated[float, typer.Option(help="Idle seconds to expiry.")] = 60.0,
    max_block: Annotated[int, typer.Option(help="Drafts per verify, at most.")] = 16,
    batch_window_ms: Annotated[
        float, typer.Option(help="Longest wait for sessions' blocks (at most half a pass).")
    ] = 25.0,
    ready_file: Annotated[
        Path | None, typer.Option(help="Write the bound port here once serving.")
    ] = None,
    api_key_file: ApiKeyFile = None,
    allow_unauthenticated: AllowUnauthenticated = False,
    tls_cert: TlsCert = None,
    tls_key: TlsKey = None,
) -> None:
    """Serve the target model's verification over gRPC until interrupted. With API keys
    (``$SPECOPS_API_KEYS``, --api-key-file) every call needs one; without, a host beyond
    loopback is refused unless --allow-unauthenticated (docs/security.md)."""
    import logging

    from serving.atomic import write_text_atomic
    from serving.distributed.server import TargetLimits, TargetService
    from serving.distributed.server import serve_target as start
    from serving.hardware import engine_target
    from serving.security import logs
    from serving.security.keys import check_bind, load_api_keys
    from serving.security.tls import server_tls

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    with failing():
        # Keys, binding and TLS files checked before the model loads.
        keys = load_api_keys(path=api_key_file)
        check_bind(host, keys, allow_open=allow_unauthenticated, key_file="--api-key-file")
        tls = server_tls(tls_cert, tls_key)
        engine = engine_target(hardware)
        logs.install(keys.secrets)
        limits = TargetLimits(
            max_sessions=max_sessions,
            idle_timeout_s=idle_timeout,
            max_block=max_block,
            batch_window_s=batch_window_ms / 1000.0,
        )
        service = TargetService(
            load_engine_target(target, engine, threads),
            model_name=target,
            limits=limits,
            batch_limits=engine.batch_limits(),
            cost=engine.pass_cost(),
        )
        running = start(
            service,
            host=host,
            port=port,
            keys=keys,
            tls=tls,
            allow_unauthenticated=allow_unauthenticated,
        )
    if ready_file is not None:
        write_text_atomic(ready_file, f"{running.port}\n")
    access = f"API keys: {len(keys.digests)}" if keys.enabled else "no API key (open)"
    typer.echo(
        f"target server on {host}:{running.port} ({'TLS' if tls else 'no TLS'}, {access})",
        err=True,
    )
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    stop.wait()
    running.stop()


def _client_side(kind: str | None) -> tuple[LoadedTarget | None, PreTrainedTokenizerBase]:
    """``(target, tokenizer)`` a client needs for a drafter of ``kind``: the shipped model's
    tokenizer, and the target itself only for a draft built from it or served like it
    (:data:`~serving.engine.drafters.kinds.MODEL_KINDS`: ``layers``, ``model``, ``lora``)."""
    from serving.engine.drafters.kinds import MODEL_KINDS
    from serving.loader import load_target

    if kind in MODEL_KINDS:
        target = load_target(DEFAULT_TARGET)
        return target, tokenizer_of(target)
    from transformers import AutoTokenizer

    from serving.models.real import real_model_dir

    return None, AutoTokenizer.from_pretrained(real_model_dir(progress=False))


@distributed_app.command("client")
def client(
    prompt: Annotated[str, typer.Argument(help="The user's message (chat template applied).")],
    address: Annotated[str, typer.Option(help="The target server.")] = "127.0.0.1:50051",
    drafter: RemoteDrafter = "pld",
    policy: Policy = "fixed",
    k: DraftLength = 4,
    max_new_tokens: Annotated[int, typer.Option(help="Tokens to generate.")] = 128,
    temperature: Annotated[float, typer.Option(help="0: greedy.")] = 0.0,
    seed: Annotated[int | None, typer.Option(help="Sampling seed.")] = None,
    fused: Annotated[bool, typer.Option("--fused", help="Draft on the server instead.")] = False,
    rtt_ms: Annotated[float, typer.Option(help="Inject this round-trip time (ms).")] = 0.0,
    api_key_file: Annotated[
        Path | None,
        typer.Option(help="Send this file's first key (mode 600); default: $SPECOPS_API_KEYS'."),
    ] = None,
    tls: Annotated[
        bool, typer.Option("--tls", help="TLS, trusting the system's CAs (or --tls-ca's).")
    ] = False,
    tls_ca: TlsCa = None,
) -> None:
    """Decode one prompt against a target server; print the answer and the statistics."""
    from serving.distributed.client import TargetClient, run_distributed, run_fused
    from serving.engine.drafters.factory import parse_drafter_spec
    from serving.engine.policy import make_policy
    from serving.engine.sampling import SamplingParams
    from serving.loader import encode_prompt
    from serving.security.keys import client_key
    from tasks.bench.distributed import client_drafter

    with failing():
        spec = parse_drafter_spec(drafter)
        sampling = SamplingParams(temperature=temperature, seed=seed)
        remote = TargetClient(
            address,
            rtt_s=rtt_ms / 1000.0,
            api_key=client_key(path=api_key_file),
            tls=tls,
            tls_ca=tls_ca,
        )
        with remote:
            remote.wait_ready(10.0)
            target, tokenizer = _client_side(None if fused else spec.kind)
            ids = encode_prompt(tokenizer, prompt)
            if fused:
                result = run_fused(
                    remote,
                    ids,
                    server_drafter=drafter,
                    policy=policy,
                    k=k,
                    max_new_tokens=max_new_tokens,
                    sampling=sampling,
                )
            else:
                made = client_drafter(spec, target)
                result = run_distributed(
                    remote,
                    ids,
                    drafter=made,
                    policy=make_policy(policy, k) if made is not None else None,
                    max_new_tokens=max_new_tokens,
                    sampling=sampling,
                )
    typer.echo(decode_text(tokenizer, result.token_ids))
    drafted = result.draft_tokens
    typer.echo(
        json.dumps(
            {
                "mode": "fused" if fused else "distributed",
                "output_tokens": len(result.token_ids),
                "steps": len(result.steps),
                "acceptance_rate": result.accepted_tokens / drafted if drafted else None,
                "ttft_s": round(result.ttft_s, 4),
                "total_s": round(result.total_s, 4),
                "tokens_per_s": round(len(result.token_ids) / result.total_s, 2),
                "round_trips": result.round_trips,
                "stop_reason": result.stop_reason,
            }
        ),
        err=True,
    )


@distributed_app.command("bench")
def bench(
    rtt_ms: Annotated[str, typer.Option(help="Round-trip times to inject (ms).")] = "0,1,5,20",
    sessions: Annotated[str, typer.Option(help="Concurrent sessions.")] = "1,2,4,8",
    drafter: RemoteDrafter = "pld",
    policy: Policy = "fixed",
    k: DraftLength = 4,
    requests: Annotated[int, typer.Option(help="Requests per point (>= 2 per session).")] = 8,
    max_new_tokens: Annotated[int, typer.Option(help="Tokens per request.")] = 64,
    workload: Annotated[str, typer.Option(help="Prompts (held-out split).")] = "sharegpt",
    threads: Annotated[int, typer.Option(help="torch threads of the target server.")] = 1,
    hardware: Annotated[str, typer.Option(help="The server's hardware target.")] = DEFAULT_HARDWARE,
    seed: Annotated[int, typer.Option(help="Workload selection seed.")] = 0,
    out: Annotated[Path, typer.Option(help="Results file (.md and .png beside it).")] = Path(
        "results/distributed.json"
    ),
) -> None:
    """Distributed vs fused vs plain on loopback: a target server process, clients here."""
    import torch

    from serving.hardware import engine_target
    from serving.loader import encode_prompt
    from tasks.bench.distributed import (
        DistributedBenchSettings,
        run_distributed_bench,
        target_server_process,
        write_report,
    )
    from tasks.data.traffic import build_workload

    def numbers(text: str, kind: type) -> list:
        try:
            return [kind(x) for x in text.split(",") if x.strip()]
        except ValueError:
            fail(f"not a comma-separated list of numbers: {text!r}")

    settings = DistributedBenchSettings(
        rtt_ms=numbers(rtt_ms, float),
        sessions=numbers(sessions, int),
        drafter=drafter,
        policy=policy,
        k=k,
        requests=requests,
        max_new_tokens=max_new_tokens,
        workload=workload,
        seed=seed,
    )
    torch.set_num_threads(1)  # the client side; the server process has its own
    with failing():
        settings.check()
        from serving.engine.drafters.factory import parse_drafter_spec

        draft_target, tokenizer = _client_side(parse_drafter_spec(drafter).kind)
        count = max(settings.requests_at(s) for s in settings.sessions)
        prompts = [
            encode_prompt(tokenizer, p.user_text)
            for p in build_workload(workload, min(count, 64), seed=seed)
        ]
        served = engine_target(hardware)  # what the server process resolves, checked here first
        with target_server_process(hardware=served, threads=threads) as remote:
            results = run_distributed_bench(remote, prompts, settings, draft_target=draft_target)
    results["settings"] |= {"server_threads": threads, "client_threads": 1, "hardware": hardware}
    paths = write_report(results, out)
    typer.echo((out.with_suffix(".md")).read_text())
    typer.echo(f"all outputs equal to plain decoding: {results['all_equal_to_plain']}", err=True)
    typer.echo("wrote " + ", ".join(str(p) for p in paths.values()), err=True)
