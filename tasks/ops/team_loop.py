"""The whole loop against the team stack, as a team runs it (``specops stack loop``):

1. the stack is up (:mod:`tasks.ops.stack`) and ``prefect.yaml``'s deployments are deployed
   from ``checkout`` to its work pool; the worker loads the target model ``target``;
2. ``replicas`` serving processes (``specops serve``) follow the registry's champion
   (plain decoding while the target has none) and capture every request into one shared
   store (``<checkout>/data``);
3. the hardware target gets a champion: the ``bootstrap/once`` deployment makes one when
   it has none, and the replicas swap to it; traffic of ``workload`` goes to them in turn;
4. the ``collect/hourly`` deployment validates the new parts, versions the store with DVC
   (pushed to the stack's SSH remote) and starts the retrain through the ``retrain/daily``
   deployment (``run_deployment``); the worker trains, registers, evaluates, gates and
   promotes;
5. optionally the worker is killed (with the flow run it runs) in the middle of the retrain
   and started again: the run is marked crashed, rescheduled, and finishes;
6. checks: the retrain completed; every challenger is registered once (no duplicates
   after a crash), carries its lineage (DVC data version, git commit) and was evaluated,
   and so was the champion; every promotion of the run reached every replica within one
   poll interval (plus the time to load the draft), and they all serve the champion.

It prints progress and returns (and writes) a JSON report of timings and checks.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from serving.atomic import write_json_atomic
from serving.defaults import DEFAULT_K, DEFAULT_TARGET
from serving.errors import SpecOpsError
from serving.hardware import DEFAULT_HARDWARE, hardware_target
from tasks.ops.replicas import (
    SwapWatch,
    greedy_chat,
    replica_config,
    send_traffic,
    served_version,
    wait_for_captures,
)
from tasks.ops.server_process import ServerProcess
from tasks.ops.stack import Stack, StackError

log = logging.getLogger(__name__)

# Re-exported: the replica drill (benchmarks/drill_replicas.py) imports these from here.
__all__ = [
    "SwapWatch",
    "TeamLoopOptions",
    "dump",
    "greedy_chat",
    "replica_config",
    "run_team_loop",
    "served_version",
]

FINAL = ("COMPLETED", "FAILED", "CANCELLED", "CRASHED")
# Beyond one champion poll, the time a replica may take to download and load a new draft.
SWAP_SLACK_S = 5.0


@dataclass
class TeamLoopOptions:
    checkout: Path
    target: str = DEFAULT_TARGET
    hardware: str = DEFAULT_HARDWARE
    replicas: int = 2
    workload: str = "humaneval"
    requests: int = 12
    max_new_tokens: int = 48
    eval_workloads: list[str] = field(default_factory=lambda: ["humaneval"])
    eval_prompts: int = 4
    budgets: dict[str, float] = field(default_factory=lambda: {"head": 60.0, "lora": 60.0})
    poll_s: float = 2.0  # the replicas' champion poll interval
    # A captured request accepting less than this is a failure case (the training mix is
    # mostly failure cases): 1.0 counts every request that was not drafted perfectly.
    failure_threshold: float = 0.5
    bootstrap_k: int = DEFAULT_K  # prompt lookup's draft length, when a champion is bootstrapped
    schedules: bool = False  # keep the deployments' cron schedules active during the run
    kill_worker_after_s: float | None = None  # kill the worker this long into the retrain
    timeout_s: float = 3600.0
    report: Path | None = None


def _worker_env(options: TeamLoopOptions) -> dict[str, str]:
    """The worker's environment names the target model its flow runs load."""
    return {"SPECOPS_TARGET": options.target}


def _say(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {message}", flush=True)


class _Prefect:
    """The few Prefect API calls the driver makes, on the stack's API (every call inside
    :meth:`api`: Prefect reads its settings once, so the environment alone is too late)."""

    def __init__(self, stack: Stack) -> None:
        self.url = stack.config.prefect_api_url

    @contextlib.contextmanager
    def api(self):
        from prefect.settings import PREFECT_API_URL, temporary_settings

        with temporary_settings(updates={PREFECT_API_URL: self.url}):
            yield

    def run(self, name: str, parameters: dict[str, Any], *, wait_s: float = 0.0):
        from prefect.deployments import run_deployment

        with self.api():
            return run_deployment(name, parameters=parameters, timeout=wait_s, as_subflow=False)

    def flow_run(self, run_id):
        from prefect.client.orchestration import get_client

        with self.api(), get_client(sync_client=True) as client:
            return client.read_flow_run(run_id)

    def runs_of(self, deployment: str, *, since: float) -> list:
        from prefect.client.orchestration import get_client
        from prefect.client.schemas.filters import (
            DeploymentFilter,
            DeploymentFilterName,
            FlowFilter,
            FlowFilterName,
        )

        flow, _, name = deployment.partition("/")
        with self.api(), get_client(sync_client=True) as client:
            runs = client.read_flow_runs(
                flow_filter=FlowFilter(name=FlowFilterName(any_=[flow])),
                deployment_filter=DeploymentFilter(name=DeploymentFilterName(any_=[name])),
            )
        return [
            r for r in runs if r.flow_id and r.created and r.created.timestamp() >= since and r.name
        ]

    def pause_schedules(self) -> int:
        """Make every deployment's schedules inactive; return how many were active."""
        from prefect.client.orchestration import get_client

        paused = 0
        with self.api(), get_client(sync_client=True) as client:
            for deployment in client.read_deployments():
                for schedule in deployment.schedules:
                    if schedule.active:
                        client.update_deployment_schedule(deployment.id, schedule.id, active=False)
                        paused += 1
        return paused

    def wait(self, run_id, *, timeout_s: float, every: Callable[[Any], None] | None = None) -> Any:
        deadline = time.monotonic() + timeout_s
        last = None
        while time.monotonic() < deadline:
            run = self.flow_run(run_id)
            state = run.state.type.value if run.state else "?"
            if state != last:
                _say(f"flow run {run.name}: {run.state.name if run.state else '?'}")
                last = state
            if every is not None:
                every(run)
            if state in FINAL:
                return run
            time.sleep(2.0)
        raise SpecOpsError(f"flow run {run_id} did not finish within {timeout_s:g} s")


def _deploy(stack: Stack, checkout: Path) -> None:
    env = {**os.environ, **stack.prefect_env(), "PWD": str(checkout)}
    done = subprocess.run(
        [str(Path(sys.executable).with_name("prefect")), "--no-prompt", "deploy", "--all"],
        cwd=checkout,
        env=env,
        capture_output=True,
        text=True,
    )
    if done.returncode != 0:
        raise StackError(f"`prefect deploy --all` failed: {done.stdout[-2000:]}{done.stderr}")


def _kill_tree(pid: int) -> list[int]:
    """SIGKILL ``pid`` and every process below it (a lost machine, not a clean stop)."""
    import psutil

    try:
        root = psutil.Process(pid)
        tree = [*root.children(recursive=True), root]
    except psutil.Error:
        return []
    for process in tree:
        with contextlib.suppress(psutil.Error):
            process.send_signal(signal.SIGKILL)
    return [p.pid for p in tree]


def run_team_loop(stack: Stack, options: TeamLoopOptions) -> dict[str, Any]:
    from registry.client import Registry

    checkout = options.checkout.resolve()
    report: dict[str, Any] = {
        "options": json.loads(json.dumps({**options.__dict__, "checkout": checkout}, default=str))
    }
    timings: dict[str, float] = {}
    report["timings_s"] = timings
    start = time.perf_counter()
    _say("stack: starting what is not running")
    stack.up(repo=checkout)
    stack.restart_worker(_worker_env(options))
    timings["stack_up"] = time.perf_counter() - start
    report["stack"] = stack.status()
    for name in ("SPECOPS_MLFLOW_URI", "SPECOPS_MLFLOW_ARTIFACTS", "MLFLOW_REGISTRY_URI"):
        os.environ.pop(name, None)  # they would win over the stack's tracking server
    os.environ.update(stack.config.client_env())
    prefect = _Prefect(stack)

    start = time.perf_counter()
    _deploy(stack, checkout)
    timings["deploy"] = time.perf_counter() - start
    _say("deployed prefect.yaml's deployments")
    if not options.schedules:
        paused = prefect.pause_schedules()
        _say(f"paused {paused} schedules for this run (the flows run when this run says)")

    registry = Registry()
    run_started = time.time()
    folder = stack.config.state / "replicas"
    folder.mkdir(parents=True, exist_ok=True)
    replicas = [
        ServerProcess(
            [
                "--config",
                str(
                    replica_config(
                        folder,
                        f"r{i + 1}",
                        target=options.target,
                        hardware=hardware_target(options.hardware),
                        poll_s=options.poll_s,
                        store=options.checkout / "data",
                        max_tokens=max(options.max_new_tokens, 16),
                        failure_threshold=options.failure_threshold,
                    )
                ),
            ],
            log_path=folder / f"r{i + 1}.log",
            env=stack.config.client_env(),
        )
        for i in range(options.replicas)
    ]
    try:
        start = time.perf_counter()
        with ThreadPoolExecutor(len(replicas)) as pool:  # they load their models side by side
            list(pool.map(ServerProcess.start, replicas))
        timings["replicas_up"] = time.perf_counter() - start
        _say(f"{len(replicas)} replicas serve {[served_version(r) for r in replicas]}")
        with SwapWatch(replicas) as watch:
            _loop(stack, prefect, registry, options, replicas, report, timings)
            time.sleep(options.poll_s + SWAP_SLACK_S)  # a promotion at the very end too
        report["checks"] = _check(registry, options, watch, since=run_started)
    except SpecOpsError as error:
        # The report says how far the run got and why it stopped, for whoever reads it.
        report.update(ok=False, error=str(error))
        if options.report is not None:
            write_json_atomic(options.report, report)
        raise
    finally:
        for replica in replicas:
            replica.stop()
    report["ok"] = all(c["ok"] for c in report["checks"].values())
    if options.report is not None:
        write_json_atomic(options.report, report)
    return report


def _bootstrap(stack: Stack, prefect: _Prefect, registry, options: TeamLoopOptions) -> None:
    """``bootstrap/once`` on the worker: the target's first champion (the replicas serve
    plain decoding until it is promoted)."""
    run = prefect.run(
        "bootstrap/once",
        {
            "hardware": options.hardware,
            "k": options.bootstrap_k,
            "policy": "cost" if options.bootstrap_k > 1 else "fixed",
            "workloads": options.eval_workloads,
            "prompts_per_workload": options.eval_prompts,
            "max_new_tokens": options.max_new_tokens,
        },
    )
    run = prefect.wait(run.id, timeout_s=options.timeout_s)
    if registry.champion(options.hardware) is None:
        why = (
            "prompt lookup did not beat plain decoding"
            if run.state.type.value == "COMPLETED"
            else run.state.message
        )
        raise SpecOpsError(
            f"bootstrap ended {run.state.name}: no champion on {options.hardware} ({why}); "
            f"see the worker's log {stack.config.logs / 'worker.log'}"
        )


def _loop(
    stack: Stack,
    prefect: _Prefect,
    registry,
    options: TeamLoopOptions,
    replicas: list[ServerProcess],
    report: dict[str, Any],
    timings: dict[str, float],
) -> None:
    """Bootstrap if need be, traffic through the replicas, collect, the retrain (the
    worker killed in it, if asked), each step on the worker."""
    if registry.champion(options.hardware) is None:
        _say(f"{options.hardware} has no champion: bootstrap/once on the worker")
        start = time.perf_counter()
        _bootstrap(stack, prefect, registry, options)
        timings["bootstrap"] = time.perf_counter() - start
    champion = registry.champion(options.hardware)
    assert champion is not None
    report["champion_before"] = champion.label
    _say(f"champion: {champion.label}")
    _wait_served(replicas, champion.label, timeout_s=options.poll_s + SWAP_SLACK_S + 30)

    start = time.perf_counter()
    since_traffic = time.time()
    sent = send_traffic(
        replicas, options.workload, options.requests, max_tokens=options.max_new_tokens
    )
    timings["traffic"] = time.perf_counter() - start
    report["requests"] = sent
    _say(f"sent {sent} {options.workload} requests across the replicas")
    captured = wait_for_captures(options.checkout / "data", since=since_traffic, want=sent)
    report["captured_parts"] = captured
    _say(f"the replicas' captures landed in {len(captured)} parts of one store")

    since = time.time()
    start = time.perf_counter()
    collect = prefect.run(
        "collect/hourly",
        {
            "hardware": options.hardware,
            "force_retrain": True,
            "cooldown_minutes": 0,
            "retrain_options": {
                "budgets": options.budgets,
                "eval_workloads": options.eval_workloads,
                "eval_prompts_per_workload": options.eval_prompts,
                "max_new_tokens": options.max_new_tokens,
            },
        },
    )
    collect = prefect.wait(collect.id, timeout_s=options.timeout_s)
    timings["collect"] = time.perf_counter() - start
    report["collect_state"] = collect.state.name
    if collect.state.type.value != "COMPLETED":
        raise SpecOpsError(f"collect ended {collect.state.name}; see the worker's log")
    retrains = prefect.runs_of("retrain/daily", since=since)
    if len(retrains) != 1:
        raise SpecOpsError(f"collect started {len(retrains)} retrain runs, not one")
    retrain = retrains[0]
    _say(f"retrain flow run {retrain.name} started through run_deployment")

    killed: dict[str, Any] = {}

    def maybe_kill(run) -> None:
        if options.kill_worker_after_s is None or killed:
            return
        if run.state is None or run.state.type.value != "RUNNING" or run.start_time is None:
            return
        if time.time() - run.start_time.timestamp() < options.kill_worker_after_s:
            return
        pid = stack.pid("worker")
        if pid is None:
            return
        killed["pids"] = _kill_tree(pid)
        _say(f"killed the worker and its flow run (pids {killed['pids']})")
        time.sleep(2.0)
        stack.restart_worker(_worker_env(options))
        _say("worker started again")

    start = time.perf_counter()
    retrain = prefect.wait(retrain.id, timeout_s=options.timeout_s, every=maybe_kill)
    timings["retrain"] = time.perf_counter() - start
    report["retrain"] = {
        "flow_run": str(retrain.id),
        "state": retrain.state.name,
        "run_count": retrain.run_count,
        "worker_killed": bool(killed),
    }
    if retrain.state.type.value != "COMPLETED":
        raise SpecOpsError(f"the retrain ended {retrain.state.name}; see the worker's log")


def _wait_served(replicas: list[ServerProcess], label: str, *, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while [served_version(r) for r in replicas] != [label] * len(replicas):
        if time.monotonic() > deadline:
            raise SpecOpsError(f"the replicas did not serve {label} within {timeout_s:g} s")
        time.sleep(0.5)


def _latest(first_seen: dict[str, float]) -> str | None:
    """The version a replica switched to last."""
    return max(first_seen.items(), key=lambda item: item[1])[0] if first_seen else None


def _check(
    registry, options: TeamLoopOptions, watch: SwapWatch, *, since: float
) -> dict[str, dict[str, Any]]:
    """The issue's checks, each ``{"ok": bool, ...}``."""
    checks: dict[str, dict[str, Any]] = {}
    hardware = options.hardware
    versions = []
    for family in registry.families():
        name = registry.model_name(family)
        for mv in registry.client.search_model_versions(f"name = '{name}'"):
            if (mv.tags or {}).get("run_key") and mv.creation_timestamp / 1000 >= since - 60:
                versions.append(registry.get(family, mv.version))
    keys = [v.tags["run_key"] for v in versions]
    checks["registered_once"] = {
        "ok": bool(keys) and len(keys) == len(set(keys)),
        "versions": sorted(v.label for v in versions),
    }
    lineage = {
        v.label: {k: v.tags.get(k) for k in ("data_version", "git_commit")} for v in versions
    }
    checks["lineage"] = {
        "ok": bool(lineage) and all(all(tags.values()) for tags in lineage.values()),
        "versions": lineage,
    }
    evaluation_runs = {v.label: v.tags.get(f"evaluated.{hardware}") for v in versions}
    tagged = {}
    for label, run_id in evaluation_runs.items():
        if run_id:
            tags = registry.client.get_run(run_id).data.tags
            tagged[label] = {k: tags.get(k) for k in ("data_version", "git_commit")}
    checks["evaluated_with_lineage"] = {
        "ok": bool(tagged)
        and len(tagged) == len(evaluation_runs)
        and all(all(t.values()) for t in tagged.values()),
        "runs": tagged,
    }
    champion = registry.champion(hardware)
    assert champion is not None
    # Every promotion during the run (the bootstrap's, the retrain's) reached every replica
    # within one poll interval plus the time to load the draft.
    limit = options.poll_s + SWAP_SLACK_S
    promotions: list[dict[str, Any]] = []
    for family in registry.families():
        name = registry.model_name(family)
        for mv in registry.client.search_model_versions(f"name = '{name}'"):
            at = float((mv.tags or {}).get(f"promoted_at.{hardware}", "0"))
            if at >= since:
                label = f"{name}/{mv.version}"
                seen = [first.get(label) for first in watch.first_seen]
                delays: list[float | None] = [None if t is None else round(t - at, 2) for t in seen]
                promotions.append({"label": label, "seconds_to_serve": delays})
    checks["swaps"] = {
        "ok": bool(promotions)
        and all(d is not None and d <= limit for p in promotions for d in p["seconds_to_serve"]),
        "limit_s": limit,
        "promotions": promotions,
    }
    final = [_latest(first) for first in watch.first_seen]
    checks["replicas_serve_champion"] = {
        "ok": final == [champion.label] * len(final),
        "champion": champion.label,
        "replicas": final,
    }
    checks["champion_evaluated"] = {"ok": champion.evaluated_on(hardware), "label": champion.label}
    return checks


def dump(report: dict[str, Any]) -> str:
    return json.dumps(report, indent=2, default=str)
