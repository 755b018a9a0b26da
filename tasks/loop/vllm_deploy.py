"""``specops deploy vllm``: a hardware target's champion, served by vLLM's own server.

vLLM reads its speculative configuration at start-up, so each champion runs in a server of
its own (:class:`~serving.gateway.vllm_process.VLLMServer`) behind one front
(:class:`~serving.gateway.front.Front`) that clients call. :class:`Deployment` polls the
registry's ``champion-<target>`` alias; when it moves (a promotion, or a rollback: the same
path), it exports the new champion for vLLM (the export the evaluation on that target
logged, or a fresh one), starts a server with it beside the old one, waits until it
answers a completion, moves traffic to it, lets the old one finish what it has in flight
and stops it. A configuration vLLM rejects leaves the old server serving; the front's
``/health`` names the version and quotes vLLM's error, and that version is not retried
until the alias moves again. A server that dies is restarted with exponential back-off
(``/health`` says ``restarting`` and the front answers 503 meanwhile).

Every ``scrape_s`` seconds the serving process's ``/metrics`` is read, and the
speculative-decoding counters since the last reading become a window in the store
(``vllm-acceptance/``), which ``collect``'s retrain trigger pools like the engine's records
(:mod:`tasks.data.vllm_acceptance`). Completions through the front are captured as
request/response token-id pairs (``vllm-pairs/``).
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from registry.client import Registry
from serving.backends.exports import load_export
from serving.backends.vllm_config import speculative_config
from serving.errors import SpecOpsError
from serving.gateway.front import Front, Upstream
from serving.gateway.scrape import Counters, read_counters, window
from serving.gateway.sink import ACCEPTANCE, PAIRS, PartSink
from serving.gateway.vllm_process import ServerSpec, ServerStartError, VLLMServer
from serving.hardware import HardwareTarget
from serving.server.capture import capture_run_id
from tasks.evaluate.targets import backend_python, check_runnable, target_folder
from tasks.loop.target_promotion import ensure_export
from tasks.loop.vllm_target import check_vllm

log = logging.getLogger(__name__)

NO_CHAMPION = "none (plain decoding)"
MAX_BACKOFF_S = 60.0
STABLE_S = 60.0  # a server up this long resets the back-off


@dataclass(frozen=True)
class Release:
    """What one server runs: a champion (or plain decoding) and its vLLM configuration."""

    version: str
    speculative_config: dict[str, Any] | None
    promoted_at: float | None = None


class ChampionReleases:
    """The registry champion of a vLLM hardware target, exported for vLLM (plain decoding
    while the target has none). Polled every few seconds, so a champion's export is
    fetched once, not on every poll."""

    def __init__(
        self, hardware: HardwareTarget, *, cache: Path, registry: Registry | None = None
    ) -> None:
        self.target = check_vllm(hardware, installed=False)
        self.hardware = hardware.name  # the registry's key
        self.cache = Path(cache)
        self.registry = registry or Registry()
        self._known: dict[tuple[str, str | None], Release] = {}

    def current(self) -> Release:
        draft = self.registry.champion(self.hardware)
        if draft is None:
            return Release(NO_CHAMPION, None)
        promoted = draft.tags.get(f"promoted_at.{self.hardware}")
        key = (draft.label, promoted)
        if key not in self._known:
            folder = ensure_export(
                self.registry, draft, "vllm", self.cache, k=self.target.num_speculative_tokens
            )
            config = speculative_config(load_export(folder, "vllm"))
            self._known[key] = Release(draft.label, config, float(promoted) if promoted else None)
        return self._known[key]


@dataclass
class DeploySettings:
    hardware: HardwareTarget
    model: Path  # the target's folder
    python: Path  # vLLM's interpreter
    work: Path  # server logs
    served_model_name: str = "specops"
    poll_s: float = 5.0
    scrape_s: float = 10.0
    drain_s: float = 120.0
    ready_timeout_s: float = 600.0
    threads: int = 2
    device: str = "cpu"


class Deployment:
    """Blue/green replacement of vLLM servers behind ``front`` as ``releases`` change."""

    def __init__(
        self,
        settings: DeploySettings,
        front: Front,
        releases,
        *,
        store: Path | None = None,
        redact=None,
    ) -> None:
        """``redact``: a transform for captured pairs (:func:`pair_redactor`), or None."""
        self.settings = settings
        self.front = front
        self.releases = releases  # .current() -> Release
        self.server: VLLMServer | None = None
        self.release: Release | None = None
        self.refused: dict[str, str] = {}  # version -> vLLM's error (until the alias moves)
        self.restarts = 0
        self._counter = 0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._reading: tuple[str, float, Counters] | None = None
        self._next_scrape = 0.0
        self._next_restart = 0.0
        run_id = capture_run_id("vllm")
        self.acceptance_sink = (
            PartSink(store, ACCEPTANCE, hardware=settings.hardware, run_id=run_id, flush_rows=1)
            if store is not None
            else None
        )
        self.pair_sink = (
            PartSink(store, PAIRS, hardware=settings.hardware, run_id=run_id, transform=redact)
            if store is not None
            else None
        )
        if self.pair_sink is not None:
            front.capture = self.pair_sink.add

    # ------------------------------------------------------------------ the loop
    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="vllm-deploy", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self.step()
            except Exception as error:  # the loop must outlive any one failure
                log.exception("deployment step failed")
                self.front.last_error = f"{type(error).__name__}: {error}"
            self._stop.wait(self.settings.poll_s)
        # The last window, from this thread: the servers it started get SIGTERM when it
        # ends (PR_SET_PDEATHSIG follows the starting thread).
        self.scrape(force=True)

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=self.settings.ready_timeout_s + 30)
        else:
            self.scrape(force=True)
        previous = self.front.switch(None)
        self.front.state = "stopped"
        if previous is not None:
            self.front.wait_drained(previous, self.settings.drain_s)
        if self.server is not None:
            self.server.stop()
        for sink in (self.acceptance_sink, self.pair_sink):
            if sink is not None:
                sink.close()

    def step(self) -> None:
        """One poll: restart a dead server, follow the champion, scrape."""
        if self.server is not None and not self.server.alive():
            self._restart()
            return
        try:
            release = self.releases.current()
        except SpecOpsError as error:
            self.front.last_error = f"cannot read the champion: {error}"
            log.warning("%s", self.front.last_error)
            release = None
        if release is not None:
            self.refused = {v: e for v, e in self.refused.items() if v == release.version}
            changed = self.release is None or release.version != self.release.version
            if changed and release.version not in self.refused:
                self.roll(release)
        self.scrape()
        if self.pair_sink is not None:  # written here, off the front's request path
            self.pair_sink.flush_if_due()
        if self.server is not None and time.time() - self.server.started_at > STABLE_S:
            self.restarts = 0

    # ------------------------------------------------------------------ replacing servers
    def _spec(self, release: Release) -> ServerSpec:
        s = self.settings
        return ServerSpec(
            python=s.python,
            model=s.model,
            served_model_name=s.served_model_name,
            speculative_config=release.speculative_config,
            device=s.device,
            threads=s.threads,
        )

    def _new_server(self, release: Release) -> VLLMServer:
        self._counter += 1
        slug = "".join(c if c.isalnum() else "-" for c in release.version).strip("-")
        return VLLMServer(
            self._spec(release), log_dir=self.settings.work, name=f"{self._counter:03d}-{slug}"
        )

    def roll(self, release: Release) -> dict[str, Any]:
        """Serve ``release``: start it beside the current server, move traffic, stop the old."""
        seen = time.time()
        previous_state = self.front.state
        self.front.state = "switching"
        log.info("starting a vLLM server for %s", release.version)
        server = self._new_server(release)
        try:
            ready_s = server.wait_ready(self.settings.ready_timeout_s)
        except ServerStartError as error:
            server.stop()
            message = f"vLLM refused {release.version}: {error.args[0].splitlines()[0]}"
            self.refused[release.version] = message
            self.front.last_error = message
            self.front.state = previous_state if self.front.upstream else "failed"
            self.front.event("refused", version=release.version, error=message)
            log.error("%s", message)
            return {"switched": False, "error": message}
        self.scrape(force=True)  # the old server's last window
        upstream = Upstream(
            name=server.name,
            url=server.url,
            version=release.version,
            speculative_config=release.speculative_config,
            pid=server.process.pid,
            started_at=server.started_at,
            ready_s=ready_s,
        )
        old_server, old_release = self.server, self.release
        old = self.front.switch(upstream)
        moved = time.time()
        self.server, self.release = server, release
        self._reading = None
        drained = True
        if old is not None:
            drained = self.front.wait_drained(old, self.settings.drain_s)
        if old_server is not None:
            old_server.stop()
        event = {
            "from": old_release.version if old_release else None,
            "to": release.version,
            "ready_s": round(ready_s, 3),
            "seen_to_moved_s": round(moved - seen, 3),
            "promoted_to_moved_s": (
                round(moved - release.promoted_at, 3) if release.promoted_at else None
            ),
            "drained": drained,
            "drain_s": round(time.time() - moved, 3),
        }
        self.front.last_error = None
        self.front.switches.inc()
        self.front.event("switched", **event)
        log.info("traffic moved to %s (%s)", release.version, event)
        return {"switched": True, **event}

    def _restart(self) -> None:
        """The serving process died: 503 while it restarts, with back-off."""
        assert self.server is not None and self.release is not None
        now = time.time()
        if self.front.upstream is not None:
            self.front.switch(None)
            code = self.server.process.returncode
            self.front.last_error = f"vLLM server {self.server.name} exited with status {code}"
            self.front.state = "restarting"
            self.front.event("died", server=self.server.name, status=code)
            self._next_restart = now + min(MAX_BACKOFF_S, 2.0**self.restarts)
        if now < self._next_restart:
            return
        self.restarts += 1
        self.front.restarts.inc()
        release, self.release, dead = self.release, None, self.server
        dead.stop()
        self.server = None
        result = self.roll(release)
        if not result["switched"]:
            # Keep trying the same release: it served before, so this is not a rejection.
            self.refused.pop(release.version, None)
            self.release, self.server = release, dead
            self.front.state = "restarting"
            self._next_restart = time.time() + min(MAX_BACKOFF_S, 2.0**self.restarts)

    # ------------------------------------------------------------------ acceptance
    def scrape(self, *, force: bool = False) -> None:
        now = time.time()
        if self.server is None or self.release is None or not self.server.alive():
            return
        if not force and now < self._next_scrape:
            return
        self._next_scrape = now + self.settings.scrape_s
        try:
            text = httpx.get(f"{self.server.url}/metrics", timeout=5.0).text
        except httpx.HTTPError as error:
            log.warning("cannot scrape %s: %s", self.server.name, error)
            return
        counters = read_counters(text)
        if self._reading is not None and self._reading[0] == self.server.name:
            _, started, before = self._reading
            observed = window(
                before,
                counters,
                start=started,
                end=now,
                hardware=self.settings.hardware,
                champion=self.release.version,
                server=self.server.name,
            )
            if observed.acceptance is not None:
                self.front.acceptance.labels(self.settings.hardware.name).set(observed.acceptance)
            if self.acceptance_sink is not None and (observed.requests or observed.drafts):
                self.acceptance_sink.add({"timestamp": now, **observed.to_dict()})
                self.acceptance_sink.flush_if_due()
        self._reading = (self.server.name, now, counters)


def deployment_for(
    hardware: HardwareTarget,
    *,
    target: str,
    work: Path,
    store: Path | None,
    front: Front,
    registry: Registry | None = None,
    redact_patterns: list[str] | None = None,
    **options: Any,
) -> Deployment:
    """A deployment of ``hardware``'s registry champion; checked before anything starts.
    Captured pairs are redacted with the built-in patterns and ``redact_patterns``
    (``None``: no redaction) using the target's tokenizer."""
    spec = check_runnable(hardware)
    releases = ChampionReleases(hardware, cache=work / "cache", registry=registry)
    settings = DeploySettings(
        hardware=hardware,
        model=target_folder(target),
        python=backend_python("vllm"),
        work=work / "logs",
        threads=spec.threads,
        device=spec.device,
        **options,
    )
    redact = None
    if store is not None and redact_patterns is not None:
        from transformers import AutoTokenizer

        from serving.security.redact import Redactor, mask_token, pair_redactor

        redactor = Redactor(redact_patterns)  # a bad pattern fails before anything starts
        tokenizer = AutoTokenizer.from_pretrained(settings.model)
        mask_id = mask_token(tokenizer)

        def event(kind: str, n: int) -> None:
            front.redactions.labels(kind).inc(n)

        redact = pair_redactor(redactor, tokenizer, mask_id, on_event=event)
    return Deployment(settings, front, releases, store=store, redact=redact)
