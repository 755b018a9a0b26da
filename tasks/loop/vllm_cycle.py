"""A deploy-promote-switch cycle on a vLLM target, under load, measured.

``specops deploy cycle`` (and the vLLM deployment test) runs the whole path a promotion takes
to a running vLLM server, for real: two drafts are registered, evaluated through vLLM on
the target (export logged), the first is promoted, :class:`~tasks.loop.vllm_deploy.Deployment`
serves it behind the front, a steady load of chat completions runs through the front
with the ``openai`` client, the second draft is promoted, then the registry rolls back.
The report counts every request and its outcome, and gives each switch's times (vLLM
start-up to ready, alias seen to traffic moved, promotion to traffic moved, drain) and
the acceptance windows scraped from vLLM.
"""

from __future__ import annotations

import json
import ssl
import threading
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import httpx

from registry.client import Registry
from registry.versions import DraftVersion
from serving.atomic import write_json_atomic
from serving.engine.drafters.package import DraftManifest, write_package
from serving.engine.drafters.plan import DraftPlan
from serving.gateway.front import Front
from serving.gateway.sink import ACCEPTANCE, PAIRS, area_parts
from serving.gateway.vllm_process import free_port
from serving.hardware import HardwareTarget
from serving.security.keys import client_key
from serving.security.tls import ServerTls, ca_context, uvicorn_tls
from tasks.data.traffic import build_workload
from tasks.loop.target_promotion import evaluate_registered
from tasks.loop.vllm_deploy import deployment_for

if TYPE_CHECKING:
    import uvicorn

SERVED_NAME = "specops"


def _packages(work: Path, drafters: list[str], k: int) -> dict[str, Path]:
    """A package of each drafter spec, registered under its kind's family."""
    out = {}
    for drafter in drafters:
        folder = work / "packages" / drafter.replace(":", "-")
        write_package(folder, DraftManifest.of(DraftPlan.parse(drafter, k=k)))
        out[drafter] = folder
    return out


class Load:
    """``workers`` threads sending chat completions through the front until stopped, each
    pausing ``pause_s`` between its requests (a steady load that leaves the machine room to
    start the next server: on 2 cores a saturating load starves it for minutes)."""

    def __init__(
        self,
        url: str,
        prompts: list[Any],
        *,
        workers: int,
        max_tokens: int,
        pause_s: float = 1.0,
        verify: ssl.SSLContext | None = None,
    ):
        from openai import DefaultHttpxClient, OpenAI

        self.client = OpenAI(
            base_url=f"{url}/v1",
            api_key=client_key(),
            max_retries=0,
            timeout=600,
            http_client=DefaultHttpxClient(verify=verify) if verify is not None else None,
        )
        self.prompts = prompts
        self.max_tokens = max_tokens
        self.pause_s = pause_s
        self.outcomes: Counter[str] = Counter()
        self.errors: list[str] = []
        self._stop = threading.Event()
        self._threads = [threading.Thread(target=self._work, args=(i,)) for i in range(workers)]

    def _work(self, worker: int) -> None:
        i = worker
        while not self._stop.is_set():
            messages = self.prompts[i % len(self.prompts)]
            i += 1
            try:
                if i % 3 == 0:  # every third streams
                    stream = self.client.chat.completions.create(
                        model=SERVED_NAME,
                        messages=messages,
                        max_tokens=self.max_tokens,
                        temperature=0,
                        stream=True,
                    )
                    text = "".join(
                        (chunk.choices[0].delta.content or "")
                        for chunk in stream
                        if getattr(chunk, "choices", None)
                    )
                else:
                    reply = self.client.chat.completions.create(
                        model=SERVED_NAME,
                        messages=messages,
                        max_tokens=self.max_tokens,
                        temperature=0,
                    )
                    text = reply.choices[0].message.content or ""
                self.outcomes["ok" if text else "empty"] += 1
            except Exception as error:  # every failure is counted, with its message
                self.outcomes["failed"] += 1
                self.errors.append(f"{type(error).__name__}: {error}")
            self._stop.wait(self.pause_s)

    def start(self) -> None:
        for thread in self._threads:
            thread.start()

    def stop(self) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join()


def _health(front_url: str, verify: ssl.SSLContext | bool) -> dict[str, Any]:
    return httpx.get(f"{front_url}/health", timeout=5, verify=verify).json()


def _wait_for(
    front_url: str, champion: str, timeout_s: float, verify: ssl.SSLContext | bool = True
) -> float:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            health = _health(front_url, verify)
        except httpx.HTTPError:
            health = {}
        if (health.get("upstream") or {}).get("champion") == champion:
            return time.time()
        time.sleep(0.2)
    raise TimeoutError(f"the front did not serve {champion} within {timeout_s:.0f} s")


def _register(registry: Registry, work: Path, drafters: tuple[str, str]) -> list[DraftVersion]:
    """The cycle's two draft packages (:func:`_packages`, k = 3), registered in their
    families."""
    versions = []
    for path in _packages(work, list(drafters), k=3).values():
        manifest = DraftManifest.model_validate_json((path / "draft.json").read_text())
        versions.append(registry.log_draft(path, family=manifest.family))
    return versions


def _switch(
    acts: list[tuple[str, Callable[[], object]]],
    url: str,
    timeout_s: float,
    settle_s: float,
    verify: ssl.SSLContext | None,
) -> list[dict[str, Any]]:
    """Each registry act (a promotion, a rollback) in turn, and how long the front took to
    serve the version it named (``acted_to_serving_s``), settling ``settle_s`` after each."""
    timeline: list[dict[str, Any]] = []
    for label, act in acts:
        acted = time.time()
        act()
        moved = _wait_for(url, label, timeout_s, verify or True)
        timeline.append({"to": label, "acted_to_serving_s": round(moved - acted, 3)})
        time.sleep(settle_s)
    return timeline


def _serve(front: Front, tls: ServerTls | None) -> tuple[uvicorn.Server, threading.Thread, int]:
    """The front served by uvicorn in a thread on a free port (TLS with ``tls``)."""
    import uvicorn

    port = free_port()
    server = uvicorn.Server(
        uvicorn.Config(front.app(), port=port, log_level="warning", **uvicorn_tls(tls))
    )
    serving = threading.Thread(target=server.run, daemon=True)
    serving.start()
    return server, serving, port


def _scraped(store: Path, hardware: HardwareTarget) -> dict[str, Any]:
    """What the store collected on ``hardware`` during the cycle: the acceptance windows
    scraped from vLLM (their count and totals) and the prompt-answer pairs captured."""
    windows = [
        json.loads(line)
        for part in area_parts(store, ACCEPTANCE, hardware)
        for line in part.read_text().splitlines()
    ]
    return {
        "acceptance_windows": len(windows),
        "acceptance": {
            "draft_tokens": sum(w["draft_tokens"] for w in windows),
            "accepted_tokens": sum(w["accepted_tokens"] for w in windows),
            "by_champion": sorted({w["champion"] for w in windows}),
        },
        "pairs_captured": sum(
            len(p.read_text().splitlines()) for p in area_parts(store, PAIRS, hardware)
        ),
    }


def run_cycle(
    *,
    hardware: HardwareTarget,
    target: str,
    work: Path,
    store: Path,
    drafters: tuple[str, str] = ("pld:1", "pld:3"),
    workers: int = 2,
    max_tokens: int = 24,
    pause_s: float = 1.0,
    settle_s: float = 5.0,
    timeout_s: float = 600.0,
    rollback: bool = True,
    eval_prompts: int = 2,
    eval_tokens: int = 16,
    registry: Registry | None = None,
    out: Path | None = None,
    tls: ServerTls | None = None,
    tls_ca: Path | None = None,
) -> dict[str, Any]:
    """The cycle on ``hardware`` (a vLLM target: :func:`tasks.loop.vllm_target.check_vllm`)
    serving ``target`` (a model source). ``tls``: the front serves TLS with it, and the
    cycle's clients trust ``tls_ca`` (the CA that signed it; None: the system's CAs)."""
    registry = registry or Registry()
    prompts = build_workload("humaneval", 4, seed=0) + build_workload("sharegpt", 4, seed=0)
    versions = _register(registry, work, drafters)
    evaluation = evaluate_registered(
        registry,
        hardware,
        versions,
        prompts[:eval_prompts],
        cache=work / "cache",
        workdir=work / "evaluate",
        max_new_tokens=eval_tokens,
        promote=False,
    )
    first, second = versions
    registry.promote(first, hardware.name, reason="cycle: first champion")

    front = Front(hardware=hardware)
    deployment = deployment_for(
        hardware,
        target=target,
        work=work,
        store=store,
        front=front,
        registry=registry,
        poll_s=1.0,
        scrape_s=2.0,
        redact_patterns=[],  # captured pairs redacted, as deployed
    )
    server, serving, port = _serve(front, tls)
    url = f"{'https' if tls else 'http'}://127.0.0.1:{port}"
    verify = ca_context(tls_ca) if tls else None
    deployment.start()
    load = None
    try:
        _wait_for(url, first.label, timeout_s, verify or True)
        load = Load(
            url,
            [p.messages for p in prompts],
            workers=workers,
            max_tokens=max_tokens,
            pause_s=pause_s,
            verify=verify,
        )
        load.start()
        time.sleep(settle_s)
        acts = [
            (
                second.label,
                lambda: registry.promote(second, hardware.name, reason="cycle: promote"),
            ),
            (first.label, lambda: registry.rollback(hardware.name, reason="cycle: rollback")),
        ]
        timeline = _switch(acts if rollback else acts[:1], url, timeout_s, settle_s, verify)
    finally:
        if load is not None:
            load.stop()
        health = _health(url, verify or True)
        deployment.stop()
        server.should_exit = True
        serving.join(timeout=30)
    report = {
        "hardware": hardware.name,
        "target": target,
        "drafters": list(drafters),
        "versions": [v.label for v in versions],
        "evaluation": {
            label: {k: r.get(k) for k in ("exact", "speedup", "acceptance_rate")}
            for label, r in evaluation["results"].items()
        },
        "requests": dict(load.outcomes) if load else {},
        "failed": load.outcomes.get("failed", 0) if load else None,
        "errors": load.errors[:5] if load else [],
        "switches": [e for e in front.events if e["event"] == "switched"],
        "timeline": timeline,
        **_scraped(store, hardware),
        "final_health": health,
    }
    if out is not None:
        write_json_atomic(out, report)
    return report
