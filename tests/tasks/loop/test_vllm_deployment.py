"""The deployment's decisions, with stand-in servers (the real vLLM cycle is
tests/backends/test_vllm_deploy.py): a new champion is started beside the old one and
takes traffic once ready; a configuration the server rejects leaves the old one serving,
is reported and not retried until the champion moves; a dead server is restarted with
back-off while the front answers 503; scraped counters become acceptance windows."""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
from starlette.responses import PlainTextResponse
from starlette.routing import Route

from serving.gateway.front import Front
from serving.gateway.sink import ACCEPTANCE, area_parts
from serving.gateway.vllm_process import ServerStartError
from serving.hardware import hardware_target
from tasks.loop.vllm_deploy import Deployment, DeploySettings, Release
from tests.serving.gateway.test_front import Served, fake_vllm

CPU_VLLM = hardware_target("cpu-vllm")

METRICS = """\
vllm:spec_decode_num_drafts_total{{engine="0"}} {drafts}
vllm:spec_decode_num_draft_tokens_total{{engine="0"}} {drafted}
vllm:spec_decode_num_accepted_tokens_total{{engine="0"}} {accepted}
vllm:request_success_total{{engine="0",finished_reason="length"}} {requests}
"""


class FakeProcess:
    def __init__(self) -> None:
        self.pid = 4242
        self.returncode: int | None = None


class FakeServer:
    """What Deployment needs of a VLLMServer, backed by an in-thread HTTP app."""

    def __init__(self, name: str, release: Release, *, fails: str | None = None) -> None:
        self.name, self.release, self.fails = name, release, fails
        self.counters = {"drafts": 0, "drafted": 0, "accepted": 0, "requests": 0}
        app = fake_vllm(name)
        app.router.routes.append(Route("/metrics", self._metrics))
        self.served = Served(app)
        self.process = FakeProcess()
        self.started_at = 0.0
        self.stopped = False

    async def _metrics(self, _request):
        return PlainTextResponse(METRICS.format(**self.counters))

    @property
    def url(self) -> str:
        return self.served.url

    def alive(self) -> bool:
        return self.process.returncode is None

    def wait_ready(self, timeout_s: float) -> float:
        if self.fails:
            raise ServerStartError(f"vLLM server {self.name} exited with status 1: {self.fails}")
        return 0.5

    def stop(self) -> int | None:
        self.stopped = True
        self.served.stop()
        if self.process.returncode is None:
            self.process.returncode = 0
        return 0


@dataclass
class Releases:
    release: Release

    def current(self) -> Release:
        return self.release


class FakeDeployment(Deployment):
    def __init__(self, *args, rejects: set[str] = frozenset(), **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.rejects = rejects
        self.started: list[FakeServer] = []

    def _new_server(self, release: Release) -> FakeServer:  # type: ignore[override]
        fails = "ValueError: bad speculative config" if release.version in self.rejects else None
        self.started.append(FakeServer(f"s{len(self.started) + 1}", release, fails=fails))
        return self.started[-1]


def ngram(version: str, k: int = 3) -> Release:
    return Release(version, {"method": "ngram", "num_speculative_tokens": k})


@pytest.fixture
def setup(tmp_path):
    front = Front(hardware=CPU_VLLM)
    releases = Releases(ngram("ngram/1"))
    settings = DeploySettings(hardware=CPU_VLLM, model=tmp_path, python=Path("python"),
                              work=tmp_path / "logs", poll_s=0.05, scrape_s=0.0)  # fmt: skip
    deployment = FakeDeployment(settings, front, releases, store=tmp_path / "store",
                                rejects={"bad/2"})  # fmt: skip
    yield front, releases, deployment
    for server in deployment.started:
        if not server.stopped:
            server.stop()


def test_a_new_champion_replaces_the_old_server(setup):
    front, releases, deployment = setup
    deployment.step()
    first = deployment.started[0]
    assert front.upstream.name == "s1" and front.health()[0] == 200
    releases.release = ngram("ngram/3", k=5)
    deployment.step()
    assert front.upstream.name == "s2" and front.upstream.version == "ngram/3"
    assert first.stopped and not deployment.started[1].stopped
    [event] = [e for e in front.events if e["event"] == "switched" and e["to"] == "ngram/3"]
    assert event["from"] == "ngram/1" and event["drained"]


def test_a_rejected_configuration_leaves_the_old_server_serving(setup):
    front, releases, deployment = setup
    deployment.step()
    releases.release = ngram("bad/2")
    deployment.step()
    assert front.upstream.name == "s1"  # still serving, and answering
    assert httpx.post(f"{front.upstream.url}/v1/completions", json={}).status_code == 200
    status, health = front.health()
    assert status == 200 and "bad speculative config" in health["last_error"]
    assert health["events"][-1]["event"] == "refused"
    deployment.step()  # not retried while the alias still names it
    assert len(deployment.started) == 2
    releases.release = ngram("ngram/1")  # the alias moved back: the refusal is forgotten
    deployment.step()
    assert deployment.refused == {} and front.upstream.name == "s1"
    releases.release = ngram("bad/2")  # promoted again: tried again
    deployment.step()
    assert len(deployment.started) == 3 and front.upstream.name == "s1"


def test_a_dead_server_is_restarted_with_backoff_and_503_meanwhile(setup, monkeypatch):
    front, _releases, deployment = setup
    deployment.step()
    deployment.started[0].process.returncode = -9  # killed
    deployment.started[0].served.stop()
    clock = [1000.0]
    monkeypatch.setattr("tasks.loop.vllm_deploy.time.time", lambda: clock[0])
    deployment.step()
    status, health = front.health()
    assert status == 503 and health["status"] == "restarting"
    assert "exited with status -9" in health["last_error"]
    deployment.step()  # back-off not over yet: nothing started
    assert len(deployment.started) == 1
    clock[0] += 1.5
    deployment.step()
    assert len(deployment.started) == 2 and front.upstream.name == "s2"
    assert front.health()[0] == 200 and deployment.restarts == 1


def test_scraped_counters_become_acceptance_windows(setup, tmp_path):
    front, _releases, deployment = setup
    deployment.step()  # serves s1, first reading
    server = deployment.started[0]
    server.counters.update(drafts=10, drafted=30, accepted=12, requests=4)
    deployment.scrape(force=True)
    server.counters.update(drafts=12, drafted=36, accepted=15, requests=5)
    deployment.scrape(force=True)
    deployment.acceptance_sink.flush()
    rows = [json.loads(line) for part in area_parts(tmp_path / "store", ACCEPTANCE, CPU_VLLM)
            for line in part.read_text().splitlines()]  # fmt: skip
    assert [(r["draft_tokens"], r["accepted_tokens"], r["requests"]) for r in rows] == [
        (30, 12, 4), (6, 3, 1)
    ]  # fmt: skip
    assert rows[0]["champion"] == "ngram/1" and rows[0]["server"] == "s1"
    assert (
        'specops_vllm_acceptance_rate{hardware="cpu-vllm"} 0.5'
        in httpx.get(f"{Served(front.app()).url}/metrics").text
    )


def test_the_loop_survives_a_failing_step(setup):
    front, _releases, deployment = setup

    class Broken:
        def current(self):
            raise RuntimeError("registry exploded")

    deployment.releases = Broken()
    deployment.settings.poll_s = 0.01
    deployment.start()
    deadline = time.monotonic() + 10
    while front.last_error is None and time.monotonic() < deadline:
        time.sleep(0.01)
    deployment._stop.set()
    deployment._thread.join(timeout=5)
    assert "registry exploded" in front.last_error
