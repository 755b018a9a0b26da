"""The team loop's serving replicas, seen from outside: the config a replica serves with,
the traffic sent to them and its capture into the shared store, and which draft version each
serves (polled in the background, with when every version first reached it)."""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

from serving.defaults import DEFAULT_TARGET
from serving.errors import SpecOpsError
from serving.hardware import HardwareTarget
from tasks.ops.server_process import ServerProcess


def replica_config(
    folder: Path,
    name: str,
    *,
    target: str,
    hardware: HardwareTarget,
    poll_s: float,
    store: Path,
    max_tokens: int,
    failure_threshold: float | None = None,
) -> Path:
    """A serving replica's config file (``specops serve --config``): it follows the
    registry's champion of ``hardware`` (plain decoding while there is none: a fresh stack's
    replicas come up before the bootstrap promotes one, and swap to it) and captures every
    request into ``store``."""
    import yaml

    capture: dict[str, Any] = {"share": 1.0, "store": str(store)}
    if failure_threshold is not None:
        capture["failure_threshold"] = failure_threshold
    config = {
        "target": target,
        "hardware": hardware.name,
        "replica": name,
        "champion": {"source": "registry", "poll_s": poll_s, "missing": "plain"},
        "capture": capture,
        "limits": {"max_tokens": max_tokens},
    }
    path = folder / f"serve-{name}.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


def greedy_chat(prompt: Any, max_tokens: int) -> dict[str, Any]:
    """The body of a greedy ``/v1/chat/completions`` request for a workload ``prompt``."""
    return {
        "model": DEFAULT_TARGET,
        "messages": prompt.messages,
        "max_tokens": max_tokens,
        "temperature": 0,
    }


def send_traffic(
    replicas: list[ServerProcess], workload: str, requests: int, *, max_tokens: int
) -> int:
    """``requests`` greedy chats of ``workload``'s training prompts, to the replicas in turn:
    how many were sent."""
    import httpx

    from tasks.data.traffic import build_workload

    prompts = build_workload(workload, requests, seed=7, split="train")
    for index, prompt in enumerate(prompts):
        replica = replicas[index % len(replicas)]
        response = httpx.post(
            f"{replica.url}/v1/chat/completions",
            json=greedy_chat(prompt, max_tokens),
            timeout=300.0,
        )
        response.raise_for_status()
    return len(prompts)


def wait_for_captures(store: Path, *, since: float, want: int) -> list[str]:
    """The parts written since ``since`` once they hold ``want`` records (the replicas
    flush a part every 30 s at the latest)."""
    from serving.records.store import part_files

    deadline = time.monotonic() + 90.0
    while True:
        parts = [p for p in part_files(store) if p.stat().st_mtime >= since - 1]
        rows = sum(len(p.read_text().splitlines()) for p in parts)
        if rows >= want:
            return sorted(str(p.relative_to(store)) for p in parts)
        if time.monotonic() > deadline:
            raise SpecOpsError(f"the replicas captured {rows} of {want} requests within 90 s")
        time.sleep(1.0)


def served_version(replica: ServerProcess) -> str | None:
    """The draft version ``replica`` serves (its ``/health``), None when it does not say."""
    import httpx

    try:
        return httpx.get(f"{replica.url}/health", timeout=5.0).json()["draft"]["version"]
    except (httpx.HTTPError, KeyError, ValueError):
        return None


class SwapWatch:
    """Polls every replica's served draft (``/health``) in the background and keeps when
    each first served every version (how long a promotion takes to reach serving) and
    every change: (Unix time, replica index, the version it serves from then on)."""

    def __init__(self, replicas: list[ServerProcess], every_s: float = 0.2) -> None:
        self.replicas = replicas
        self.every_s = every_s
        self.first_seen: list[dict[str, float]] = [{} for _ in replicas]
        self.changes: list[tuple[float, int, str]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> SwapWatch:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def _run(self) -> None:
        serving: dict[int, str] = {}
        while not self._stop.is_set():
            for index, replica in enumerate(self.replicas):
                version = served_version(replica)
                if version is not None:
                    now = time.time()
                    self.first_seen[index].setdefault(version, now)
                    if serving.get(index) != version:
                        serving[index] = version
                        self.changes.append((now, index, version))
            self._stop.wait(self.every_s)
