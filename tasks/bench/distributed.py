"""Distributed against fused speculative decoding on loopback (``specops distributed bench``).

One run, one target server process (``specops distributed serve-target``, its own torch
threads), and the draft clients in this process. For every round-trip time (injected on the
client, :mod:`serving.distributed.client`) and every number of concurrent sessions, the same
requests are decoded three ways:

- ``distributed``: the drafter here, one Verify round trip per step;
- ``fused``: the same drafter spec on the server, steps streamed back;
- ``plain``: no drafter, fused (at 0 ms only: the baseline a user would otherwise run).

Sessions are closed-loop clients: each takes the next request as soon as its last one is
done. Per point: output tokens/s over the point's wall time, request latency and time to
first token (p50/p90), steps, acceptance, and whether every greedy output equals plain
decoding's. Per request the steps ``(proposed, accepted)`` are kept: the simulator's
calibration reads acceptance off them (:mod:`tasks.simulate`).
"""

from __future__ import annotations

import contextlib
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np

from serving.atomic import atomic_path, write_json_atomic, write_text_atomic
from serving.distributed.client import SessionResult, TargetClient, run_distributed, run_fused
from serving.engine.drafters.base import Drafter
from serving.engine.drafters.factory import build_drafter, parse_drafter_spec
from serving.engine.drafters.kinds import MODEL_KINDS, DrafterSpec
from serving.engine.policy import make_policy
from serving.errors import BadInputError
from serving.hardware import HardwareTarget
from serving.target import DEFAULT_TARGET, LoadedTarget
from tasks.distributed_records import BenchPoint, ComparisonRow, DistributedBenchResults

MODES = ("distributed", "fused")


@dataclass
class DistributedBenchSettings:
    rtt_ms: list[float] = field(default_factory=lambda: [0.0, 1.0, 5.0, 20.0])
    sessions: list[int] = field(default_factory=lambda: [1, 2, 4, 8])
    drafter: str = "pld"
    policy: str = "fixed"
    k: int = 4
    requests: int = 8  # per point (at least 2 per session: raised when fewer)
    max_new_tokens: int = 64
    workload: str = "sharegpt"
    seed: int = 0

    def check(self) -> None:
        if not self.rtt_ms or any(not r >= 0 for r in self.rtt_ms):
            raise BadInputError(f"rtt_ms must be round-trip times >= 0, got {self.rtt_ms!r}")
        if not self.sessions or any(
            isinstance(s, bool) or not isinstance(s, int) or s < 1 for s in self.sessions
        ):
            raise BadInputError(f"sessions must be integers >= 1, got {self.sessions!r}")
        if self.requests < 1 or self.max_new_tokens < 1:
            raise BadInputError(
                f"requests and max_new_tokens must be >= 1, got {self.requests}, "
                f"{self.max_new_tokens}"
            )
        spec = parse_drafter_spec(self.drafter)
        if spec.kind in ("none", "head"):
            raise BadInputError(
                f"drafter {self.drafter!r} cannot run on a draft client (none: nothing to "
                "compare; head: it reads the target's hidden states)"
            )
        make_policy(self.policy, self.k)

    def requests_at(self, sessions: int) -> int:
        return max(self.requests, 2 * sessions)


@contextlib.contextmanager
def target_server_process(
    *,
    hardware: HardwareTarget,
    threads: int = 1,
    target: str = DEFAULT_TARGET,
    start_s: float = 600.0,
) -> Iterator[TargetClient]:
    """``specops distributed serve-target`` in a process of its own (its own torch threads,
    as on a real server) on a free loopback port, serving ``hardware`` (its command line
    names it) and ``target`` (a model source); yields a client, stops the server after."""
    with tempfile.TemporaryDirectory(prefix="specops-target-") as folder:
        ready = Path(folder) / "port"
        log_path = Path(folder) / "server.log"
        command = [
            sys.executable, "-m", "specops", "distributed", "serve-target", "--port", "0",
            "--threads", str(threads), "--hardware", hardware.name, "--target", target,
            "--ready-file", str(ready),
        ]  # fmt: skip
        with open(log_path, "w") as log:
            process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT)
        try:
            deadline = time.monotonic() + start_s
            while not ready.exists():
                if process.poll() is not None or time.monotonic() > deadline:
                    tail = log_path.read_text()[-2000:]
                    raise BadInputError(f"the target server did not start:\n{tail}")
                time.sleep(0.2)
            client = TargetClient(f"127.0.0.1:{ready.read_text().strip()}")
            client.wait_ready()
            try:
                yield client
            finally:
                client.close()
        finally:
            process.terminate()
            try:
                process.wait(30)
            except subprocess.TimeoutExpired:
                process.kill()


def _percentile(values: Sequence[float], q: float) -> float | None:
    return float(np.percentile(values, q)) if values else None


def closed_loop(
    work: Callable[[int], SessionResult], jobs: Sequence[int], sessions: int
) -> tuple[list[tuple[int, SessionResult]], float]:
    """Run ``work(job)`` for every job on ``sessions`` threads, each taking the next job as
    soon as its last one is done; returns ``[(job, result)]`` in finishing order and the
    wall time. The first failure is raised once every thread has stopped."""
    queue = list(jobs)
    lock = threading.Lock()
    done: list[tuple[int, SessionResult]] = []
    errors: list[BaseException] = []

    def worker() -> None:
        while True:
            with lock:
                if not queue or errors:
                    return
                job = queue.pop(0)
            try:
                result = work(job)
            except BaseException as error:
                with lock:
                    errors.append(error)
                return
            with lock:
                done.append((job, result))

    threads = [threading.Thread(target=worker, daemon=True) for _ in range(sessions)]
    started = time.perf_counter()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    wall = time.perf_counter() - started
    if errors:
        raise errors[0]
    return done, wall


def summarize_point(
    mode: str,
    rtt_ms: float,
    sessions: int,
    done: list[tuple[int, SessionResult]],
    wall_s: float,
    reference: dict[int, list[int]] | None,
) -> BenchPoint:
    results = [r for _, r in done]
    tokens = sum(len(r.token_ids) for r in results)
    latencies = [r.total_s for r in results]
    ttfts = [r.ttft_s for r in results]
    steps = [s for r in results for s in r.steps]
    drafted = sum(p for p, _ in steps)
    accepted = sum(a for _, a in steps)
    equal = None
    if reference is not None:
        equal = sum(reference[job] == r.token_ids for job, r in done)
    return {
        "mode": mode,
        "rtt_ms": rtt_ms,
        "sessions": sessions,
        "requests": len(results),
        "wall_s": wall_s,
        "output_tokens": tokens,
        "tokens_per_s": tokens / wall_s if wall_s else None,
        "latency_p50_s": _percentile(latencies, 50),
        "latency_p90_s": _percentile(latencies, 90),
        "ttft_p50_s": _percentile(ttfts, 50),
        "steps": len(steps),
        "tokens_per_step": tokens / len(steps) if steps else None,
        "acceptance_rate": accepted / drafted if drafted else None,
        "round_trips_per_request": statistics.fmean(r.round_trips for r in results),
        # Sessions in the pass each step rode in, averaged over steps.
        "mean_pass_sessions": statistics.fmean(n for r in results for n in r.pass_sessions)
        if steps
        else None,
        "equal_to_plain": equal,
        "per_request": [
            {
                "prompt": job,
                "prompt_tokens": r.prompt_tokens,
                "output_tokens": len(r.token_ids),
                "latency_s": r.total_s,
                "ttft_s": r.ttft_s,
                "draft_s": r.draft_s,
                "steps": r.steps,
            }
            for job, r in done
        ],
    }


def client_drafter(spec: DrafterSpec, draft_target: LoadedTarget | None) -> Drafter | None:
    """A draft client's drafter of ``spec``, built against ``draft_target``. A drafter of
    the kinds that draft with a model (:data:`MODEL_KINDS`) needs it; a lookup drafter
    reads nothing of a target, and is built without one when none was loaded."""
    if draft_target is None and spec.kind in MODEL_KINDS:
        raise BadInputError(f"drafter {str(spec)!r} needs the target model on the client")
    return build_drafter(spec, draft_target)


def run_distributed_bench(
    client: TargetClient,
    prompts: list[list[int]],
    settings: DistributedBenchSettings,
    *,
    draft_target: LoadedTarget | None = None,
    progress: bool = True,
) -> DistributedBenchResults:
    """Every point of the grid against the server ``client`` talks to (its ``rtt_s`` is
    set per point). ``prompts``: token ids, used in order and cycled; ``draft_target``: the
    target a model-based client drafter (``layers:N``) drafts with (None: none loaded)."""
    from tqdm.auto import tqdm

    settings.check()
    if not prompts:
        raise BadInputError("the benchmark needs at least one prompt")
    spec = parse_drafter_spec(settings.drafter)
    if spec.kind in MODEL_KINDS and draft_target is None:
        raise BadInputError(f"drafter {settings.drafter!r} needs the target model on the client")
    max_sessions = max(settings.sessions)
    jobs_at = {s: list(range(settings.requests_at(s))) for s in settings.sessions}
    every_job = range(max(len(j) for j in jobs_at.values()))
    prompt_of = {job: prompts[job % len(prompts)] for job in every_job}
    points = len(settings.sessions) * (1 + len(MODES) * len(settings.rtt_ms))
    bar = tqdm(total=points, desc="distributed bench", unit="point", disable=not progress)

    def plain(job: int) -> SessionResult:
        return run_fused(
            client,
            prompt_of[job],
            server_drafter="none",
            max_new_tokens=settings.max_new_tokens,
        )

    def fused(job: int) -> SessionResult:
        return run_fused(
            client,
            prompt_of[job],
            server_drafter=settings.drafter,
            policy=settings.policy,
            k=settings.k,
            max_new_tokens=settings.max_new_tokens,
        )

    max_block = client.info().max_block  # asked once, not once per request

    def distributed(job: int) -> SessionResult:
        drafter = client_drafter(spec, draft_target)
        return run_distributed(
            client,
            prompt_of[job],
            drafter=drafter,
            policy=make_policy(settings.policy, settings.k),
            max_new_tokens=settings.max_new_tokens,
            max_block=max_block,
        )

    # Plain outputs of every request first: the reference every mode must reproduce.
    client.rtt_s = 0.0
    done, _ = closed_loop(plain, list(every_job), 1)
    reference = {job: r.token_ids for job, r in done}
    rows: list[BenchPoint] = []
    for sessions in settings.sessions:
        client.rtt_s = 0.0
        done, wall = closed_loop(plain, jobs_at[sessions], sessions)
        rows.append(summarize_point("plain", 0.0, sessions, done, wall, reference))
        bar.update()
        for rtt_ms in settings.rtt_ms:
            client.rtt_s = rtt_ms / 1000.0
            for mode, work in (("distributed", distributed), ("fused", fused)):
                bar.set_postfix_str(f"{mode} {rtt_ms:g} ms x{sessions}")
                done, wall = closed_loop(work, jobs_at[sessions], sessions)
                rows.append(summarize_point(mode, rtt_ms, sessions, done, wall, reference))
                bar.update()
    bar.close()
    client.rtt_s = 0.0
    return {
        "settings": asdict(settings) | {"max_sessions": max_sessions},
        "points": rows,
        "table": comparison_rows(rows),
        "all_equal_to_plain": all(
            r["equal_to_plain"] == r["requests"] for r in rows if r["equal_to_plain"] is not None
        ),
    }


def comparison_rows(points: list[BenchPoint]) -> list[ComparisonRow]:
    """One row per (RTT, sessions): both modes side by side, with plain at that level."""
    by_key = {(p["mode"], p["rtt_ms"], p["sessions"]): p for p in points}
    plain = {p["sessions"]: p for p in points if p["mode"] == "plain"}
    rows: list[ComparisonRow] = []
    for (mode, rtt, sessions), dist in sorted(by_key.items(), key=lambda kv: kv[0][1:]):
        if mode != "distributed":
            continue
        fused = by_key.get(("fused", rtt, sessions))
        base = plain.get(sessions)
        if fused is None:
            continue
        dist_tps, fused_tps = dist["tokens_per_s"], fused["tokens_per_s"]
        assert dist_tps is not None and fused_tps is not None  # a point's wall time is > 0
        rows.append(
            {
                "rtt_ms": rtt,
                "sessions": sessions,
                "distributed_tokens_per_s": dist["tokens_per_s"],
                "fused_tokens_per_s": fused["tokens_per_s"],
                "distributed_over_fused": dist_tps / fused_tps,
                "plain_tokens_per_s": base["tokens_per_s"] if base else None,
                "distributed_latency_p50_s": dist["latency_p50_s"],
                "fused_latency_p50_s": fused["latency_p50_s"],
                "equal_to_plain": dist["equal_to_plain"] == dist["requests"]
                and fused["equal_to_plain"] == fused["requests"],
                "better": "distributed" if dist_tps > fused_tps else "fused",
            }
        )
    return rows


def crossover(rows: list[ComparisonRow]) -> dict[int, float | None]:
    """Per session count, the smallest measured RTT at which fused beats distributed
    (``None``: distributed wins at every RTT measured; 0: fused wins even on loopback)."""
    out: dict[int, float | None] = {}
    for sessions in sorted({r["sessions"] for r in rows}):
        worse = [r["rtt_ms"] for r in rows if r["sessions"] == sessions and r["better"] == "fused"]
        out[sessions] = min(worse) if worse else None
    return out


def markdown_table(results: DistributedBenchResults) -> str:
    def cell(value: float | None, spec: str) -> str:
        return "–" if value is None else format(value, spec)

    lines = [
        "| RTT (ms) | sessions | distributed tok/s | fused tok/s | distributed / fused | "
        "plain tok/s | p50 latency distributed (s) | p50 latency fused (s) | = plain |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|:---:|",
    ]
    for row in results["table"]:
        lines.append(
            f"| {row['rtt_ms']:g} | {row['sessions']} | "
            f"{cell(row['distributed_tokens_per_s'], '.1f')} | "
            f"{cell(row['fused_tokens_per_s'], '.1f')} | "
            f"{cell(row['distributed_over_fused'], '.2f')} | "
            f"{cell(row['plain_tokens_per_s'], '.1f')} | "
            f"{cell(row['distributed_latency_p50_s'], '.2f')} | "
            f"{cell(row['fused_latency_p50_s'], '.2f')} | "
            f"{'yes' if row['equal_to_plain'] else 'NO'} |"
        )
    return "\n".join(lines) + "\n"


def plot(results: DistributedBenchResults, path: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = results["table"]
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.2))
    for sessions in sorted({r["sessions"] for r in rows}):
        mine = sorted((r for r in rows if r["sessions"] == sessions), key=lambda r: r["rtt_ms"])
        rtts = [r["rtt_ms"] for r in mine]
        (line,) = axes[0].plot(
            rtts, [r["fused_tokens_per_s"] for r in mine], marker="o", label=f"fused ×{sessions}"
        )
        axes[0].plot(
            rtts,
            [r["distributed_tokens_per_s"] for r in mine],
            marker="s",
            linestyle="--",
            color=line.get_color(),
            label=f"distributed ×{sessions}",
        )
        axes[1].plot(
            rtts,
            [r["distributed_over_fused"] for r in mine],
            marker="o",
            label=f"{sessions} sessions",
        )
    axes[0].set_xlabel("injected round-trip time (ms)")
    axes[0].set_ylabel("output tokens/s")
    axes[0].set_title("Throughput (solid: fused, dashed: distributed)")
    axes[0].legend(fontsize=7, ncol=2)
    axes[1].axhline(1.0, color="grey", linewidth=0.8)
    axes[1].set_xlabel("injected round-trip time (ms)")
    axes[1].set_ylabel("distributed / fused tokens/s")
    axes[1].set_title("Above 1: distributed wins")
    axes[1].legend(fontsize=7)
    for ax in axes:
        ax.grid(alpha=0.3)
    fig.tight_layout()
    with atomic_path(path) as tmp:
        fig.savefig(tmp, format="png", dpi=120)
    plt.close(fig)
    return path


def write_report(results: DistributedBenchResults, out: Path) -> dict[str, Path]:
    """``out`` (json), and beside it the table (.md) and the plot (.png)."""
    out = Path(out)
    results = {**results, "crossover_rtt_ms": crossover(results["table"])}
    write_json_atomic(out, results)
    table = out.with_suffix(".md")
    write_text_atomic(table, markdown_table(results))
    return {"json": out, "table": table, "plot": plot(results, out.with_suffix(".png"))}
