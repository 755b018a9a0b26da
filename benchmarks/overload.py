"""Does a storm of refusals leave decoding its throughput? (issue 39, item 4)

Two phases against one ``specops serve`` (the shipped model, one worker, one torch thread,
the serving config's limits), the server pinned to one core and the load generator to the
other, from an idle server each:

- **light**: ``--users`` chat users (``--max-tokens`` each, greedy), each waiting
  ``--think-s`` between its requests;
- **storm**: the same users plus ``--storm-users`` that send the request again at once,
  whatever the answer, ``Retry-After`` ignored (the issue's 64 users retrying at once).

Decode throughput is counted by the server over each phase after ``--settle-s``: request
steps per second, the sum over its packed passes of the requests in each
(``specops:batch_size``; each request's step yields at least one token, and both phases
decode the same greedy prompt, so steps stand for tokens without the quantisation of
``specops:generation_tokens_total``, which counts a request's tokens when it finishes).
The storm must keep at least ``TARGET`` (80 %) of the light phase's. The server's counters
also give each phase's tokens of finished requests, answers by status, refusals by reason
and the server's CPU seconds.

The load generator is locust (``pip install locust``; it is not a dependency of specops):
the users are in ``benchmarks/overload_locust.py``. ``--generator asyncio`` drives the same
users from a small asyncio/httpx loop in this file instead; its results say so (it is not
locust, and one Python core sends fewer requests per second with it). From the repository
root, nothing else running:

    python -m benchmarks.overload --out results/overload.json
"""

from __future__ import annotations

import argparse
import asyncio
import csv
import json
import os
import platform
import shutil
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

import httpx
import yaml
from prometheus_client.parser import text_string_to_metric_families

from benchmarks.cli import run_study
from serving.atomic import write_json_atomic
from serving.errors import SpecOpsError
from serving.server.config import SERVING_CONFIG
from tasks.ops.server_process import ServerProcess

TARGET = 0.8  # the issue's: the storm keeps 80 % of the light phase's decode throughput
LOCUSTFILE = Path(__file__).with_name("overload_locust.py")
PROMPT = "Write a long story about a lighthouse keeper and a storm."
ASYNCIO_LABEL = "asyncio, hand-written HTTP/1.1, in this file (NOT locust)"


def _count_key(name: str, labels: dict[str, str]) -> str | None:
    """Which of the phases' counts a sample adds to (None: none)."""
    if name == "specops:generation_tokens_total":
        return "tokens"
    if name == "specops:request_success_total":
        return "finished"
    if name == "specops:request_errors_total":
        return f"status_{labels['status']}"
    if name == "specops:requests_rejected_total":
        return f"refused_{labels['reason']}"
    if name in ("specops:num_requests_running", "specops:num_requests_waiting"):
        return "busy"
    if name == "specops:batch_size_count":
        return "passes"
    if name == "specops:batch_size_sum":
        return "request_steps"  # each request in a pass decodes one step (>= 1 token)
    if name == "process_cpu_seconds_total":
        return "server_cpu_s"
    return None


def server_counts(text: str) -> dict[str, float]:
    """The server's counters that the phases compare, summed over labels except the
    status of errors and the reason of refusals."""
    counts: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            key = _count_key(sample.name, sample.labels)
            if key is not None:
                counts[key] = counts.get(key, 0.0) + sample.value
    return counts


async def scrape(client: httpx.AsyncClient) -> dict[str, float]:
    response = await client.get("/metrics")
    response.raise_for_status()
    return server_counts(response.text)


def _delta(after: dict[str, float], before: dict[str, float]) -> dict[str, float]:
    keys = sorted(set(after) | set(before))
    return {k: after.get(k, 0.0) - before.get(k, 0.0) for k in keys if k != "busy"}


# ------------------------------------------------------------------------- generators
async def _post(port: int, request: bytes, connection: list) -> str:
    """Send ``request`` on the user's kept-alive connection (opened, or opened again when
    the server closed it) and read the answer; its status code."""
    if not connection:
        connection[:] = await asyncio.open_connection("127.0.0.1", port)
    reader, writer = connection
    try:
        writer.write(request)
        head = await reader.readuntil(b"\r\n\r\n")
        status = head.split(b" ", 2)[1].decode()
        length = next(
            int(line.split(b":", 1)[1])
            for line in head.split(b"\r\n")
            if line.lower().startswith(b"content-length:")
        )
        await reader.readexactly(length)
        return status
    except (OSError, asyncio.IncompleteReadError, StopIteration) as error:
        writer.close()
        connection.clear()
        return type(error).__name__


async def _asyncio_users(
    url: str, body: dict[str, Any], users: int, storm_users: int, think_s: float, stop
) -> dict[str, dict[str, int]]:
    """The in-repo generator: one task and one kept-alive HTTP/1.1 connection per user,
    the request written by hand (httpx's client sent ~60 requests/s from one core, the
    issue's storm 430); answers by status."""
    port = int(url.rsplit(":", 1)[1])
    payload = json.dumps(body).encode()
    request = (
        b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\n"
        b"Content-Type: application/json\r\nContent-Length: %d\r\n\r\n%s"
    ) % (len(payload), payload)
    counts: dict[str, Counter[str]] = {"chat": Counter(), "storm": Counter()}

    async def user(kind: str, pause_s: float) -> None:
        connection: list = []
        try:
            while not stop.is_set():
                counts[kind][await _post(port, request, connection)] += 1
                if pause_s:
                    await asyncio.sleep(pause_s)
        finally:
            if connection:
                connection[1].close()

    tasks = [asyncio.create_task(user("chat", think_s)) for _ in range(users)]
    tasks += [asyncio.create_task(user("storm", 0.0)) for _ in range(storm_users)]
    await stop.wait()
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
    return {kind: dict(c) for kind, c in counts.items()}


def _locust_stats(prefix: Path) -> dict[str, dict[str, float]]:
    """Requests and requests/s per user kind, from locust's ``*_stats.csv``."""
    stats = {}
    with open(f"{prefix}_stats.csv") as handle:
        for row in csv.DictReader(handle):
            if row.get("Name") in ("chat", "storm"):
                stats[row["Name"]] = {
                    "requests": float(row["Request Count"]),
                    "failures": float(row["Failure Count"]),
                    "requests_per_s": float(row["Requests/s"]),
                }
    return stats


async def run_phase(
    url: str, *, generator: str, users: int, storm_users: int, args, work: Path
) -> dict[str, Any]:
    """One phase: the load for ``args.duration_s``, the server's counters read after
    ``args.settle_s`` and at the end."""
    body = {
        "model": "smollm2",
        "messages": [{"role": "user", "content": PROMPT}],
        "max_tokens": args.max_tokens,
        "temperature": 0,
    }
    stop = asyncio.Event()
    async with httpx.AsyncClient(base_url=url, timeout=30) as metrics:
        started = time.monotonic()
        if generator == "locust":
            prefix = work / f"locust-{users}-{storm_users}"
            env = {
                **os.environ,
                "OVERLOAD_USERS": str(users),
                "OVERLOAD_STORM_USERS": str(storm_users),
                "OVERLOAD_THINK_S": str(args.think_s),
                "OVERLOAD_BODY": json.dumps(body),
            }
            total = users + storm_users
            process = await asyncio.create_subprocess_exec(
                "locust",
                "-f",
                str(LOCUSTFILE),
                "--headless",
                "--only-summary",
                "--users",
                str(total),
                "--spawn-rate",
                str(total),
                "--run-time",
                f"{round(args.duration_s)}s",  # locust takes whole seconds
                "--stop-timeout",
                "0",
                "--host",
                url,
                "--csv",
                str(prefix),
                env=env,
                stdout=asyncio.subprocess.DEVNULL,
                stderr=(work / f"{prefix.name}.log").open("w"),
            )
        else:
            load = asyncio.create_task(
                _asyncio_users(url, body, users, storm_users, args.think_s, stop)
            )
        await asyncio.sleep(args.settle_s)
        before, window_start = await scrape(metrics), time.monotonic()
        await asyncio.sleep(max(0.0, args.duration_s - (time.monotonic() - started)))
        after, window_s = await scrape(metrics), time.monotonic() - window_start
        if generator == "locust":
            await asyncio.wait_for(process.wait(), timeout=120)
            if not Path(f"{prefix}_stats.csv").is_file():
                log = (work / f"{prefix.name}.log").read_text()[-3000:]
                raise SpecOpsError(f"locust exited {process.returncode} with no stats:\n{log}")
            client_side: dict[str, Any] = _locust_stats(prefix)
        else:
            stop.set()
            client_side = await load
    server = _delta(after, before)
    return {
        "users": users,
        "storm_users": storm_users,
        "window_s": round(window_s, 2),
        "request_steps_per_s": round(server.get("request_steps", 0.0) / window_s, 2),
        "request_steps_per_server_cpu_s": round(
            server.get("request_steps", 0.0) / max(server.get("server_cpu_s", 0.0), 1e-9), 2
        ),
        "load_average": os.getloadavg(),
        "tokens_per_s": round(server.get("tokens", 0.0) / window_s, 2),
        "finished_per_s": round(server.get("finished", 0.0) / window_s, 3),
        "server_cpu_share": round(server.get("server_cpu_s", 0.0) / window_s, 3),
        "server_counts": server,
        "generator_counts": client_side,
    }


async def wait_idle(url: str, timeout_s: float = 300.0) -> None:
    """Until the server has nothing running or waiting (the gauges refresh every 0.5 s)."""
    deadline = time.monotonic() + timeout_s
    async with httpx.AsyncClient(base_url=url, timeout=30) as client:
        while (await scrape(client)).get("busy", 0.0) > 0:
            if time.monotonic() > deadline:
                raise SpecOpsError(f"the server was still busy {timeout_s:g} s after a phase")
            await asyncio.sleep(1.0)


# ------------------------------------------------------------------------- the study
def _serving_config(
    work: Path, rate_per_s: float | None, burst: int | None, refusal_delay_s: float | None
) -> Path:
    config = yaml.safe_load(SERVING_CONFIG.read_text())
    config["threads"] = 1
    config["limits"]["workers"] = 1
    if rate_per_s is not None:
        config["limits"]["rate_per_s"] = rate_per_s
    if burst is not None:
        config["limits"]["burst"] = burst
    if refusal_delay_s is not None:
        config["limits"]["refusal_delay_s"] = refusal_delay_s
    path = work / "serving.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


def _check_generator(generator: str) -> None:
    if generator == "locust" and shutil.which("locust") is None:
        raise SpecOpsError(
            "locust is not installed (it is not a dependency of specops): "
            "`pip install locust` into this environment, or pass --generator asyncio for the "
            "in-repo generator (not locust; the results say so)"
        )


def study(args: argparse.Namespace) -> dict[str, Any]:
    _check_generator(args.generator)
    cores = sorted(os.sched_getaffinity(0))
    if len(cores) < 2:
        raise SpecOpsError(f"the study pins server and generator apart: needs 2 cores, has {cores}")
    server_core, generator_core = cores[0], cores[1]
    args.out.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="overload-") as folder:
        work = Path(folder)
        config = _serving_config(work, args.rate_per_s, args.burst, args.refusal_delay_s)
        os.sched_setaffinity(0, {server_core})  # the server inherits its core
        server = ServerProcess(
            ["--config", str(config)], log_path=args.out.with_suffix(".server.log")
        )
        try:
            server.start()
            os.sched_setaffinity(0, {generator_core})  # this process and locust
            httpx.post(
                f"{server.url}/v1/chat/completions",
                json={
                    "model": "smollm2",
                    "messages": [{"role": "user", "content": "Hi"}],
                    "max_tokens": 8,
                },
                timeout=120,
            ).raise_for_status()  # the lazy initialisation, not measured
            phases = {}
            for name, storm in (("light", 0), ("storm", args.storm_users)):
                phases[name] = asyncio.run(
                    run_phase(
                        server.url,
                        generator=args.generator,
                        users=args.users,
                        storm_users=storm,
                        args=args,
                        work=work,
                    )
                )
                asyncio.run(wait_idle(server.url))
                print(f"{name}: {phases[name]['request_steps_per_s']} steps/s", file=sys.stderr)
        finally:
            server.stop()
            os.sched_setaffinity(0, set(cores))

    def ratio(key: str) -> float:
        return phases["storm"][key] / max(phases["light"][key], 1e-9)

    return {
        "generator": "locust" if args.generator == "locust" else ASYNCIO_LABEL,
        "machine": {
            "platform": platform.platform(),
            "cores": cores,
            "server_core": server_core,
            "generator_core": generator_core,
        },
        "settings": {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()},
        "phases": phases,
        "storm_over_light": round(ratio("request_steps_per_s"), 3),
        "storm_over_light_per_server_cpu_s": round(ratio("request_steps_per_server_cpu_s"), 3),
        "target": TARGET,
        "passed": ratio("request_steps_per_s") >= TARGET,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--generator", choices=("locust", "asyncio"), default="locust")
    parser.add_argument("--users", type=int, default=8)
    parser.add_argument("--storm-users", type=int, default=64)
    parser.add_argument("--think-s", type=float, default=1.0)
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--duration-s", type=float, default=90.0)
    parser.add_argument("--settle-s", type=float, default=15.0)
    parser.add_argument("--rate-per-s", type=float, default=None, help="limits.rate_per_s")
    parser.add_argument("--burst", type=int, default=None, help="limits.burst")
    parser.add_argument(
        "--refusal-delay-s", type=float, default=None, help="limits.refusal_delay_s"
    )
    parser.add_argument("--out", type=Path, default=Path("results/overload.json"))
    args = parser.parse_args(argv)
    if args.settle_s >= args.duration_s:
        parser.error(f"--settle-s {args.settle_s} must be below --duration-s {args.duration_s}")

    def run() -> None:
        results = study(args)
        write_json_atomic(args.out, results)
        keys = ("generator", "storm_over_light", "storm_over_light_per_server_cpu_s", "passed")
        print(json.dumps({k: results[k] for k in keys}))

    return run_study(run)


if __name__ == "__main__":
    raise SystemExit(main())
