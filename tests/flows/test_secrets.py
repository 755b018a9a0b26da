"""A configured secret never reaches MLflow (params, tags, artifacts), Prefect (flow
parameters, logs) or the logs: the bootstrap flow runs with an API key in the environment
and a password in a URI it logs, on the tiny target, and every byte they stored is
scanned."""

import logging
from pathlib import Path

import pytest

import tasks.data.traffic as traffic
import tasks.loop.targets as targets
from serving.hardware import HardwareTarget
from serving.target import LoadedTarget, eos_ids
from tests.tasks.loop.base_head import naming_base_head

pytestmark = pytest.mark.slow  # the bootstrap flow under a Prefect server

SECRET = "sk-secret-0123456789abcdefXYZ"
PASSWORD = "pw-0123456789-hidden"


@pytest.fixture
def harness(prefect_harness):
    """The session's Prefect test server (tests/conftest.py)."""


def stored_bytes(folder: Path) -> bytes:
    return b"".join(p.read_bytes() for p in folder.rglob("*") if p.is_file())


def test_a_configured_secret_reaches_no_store_and_no_log(
    harness, monkeypatch, tmp_path, target, char_tokenizer, make_prompts, caplog, mlflow_uri
):
    from prefect.settings import PREFECT_API_DATABASE_CONNECTION_URL

    from flows.loop import bootstrap
    from serving.security import logs

    monkeypatch.setenv("SPECOPS_API_KEYS", SECRET)
    monkeypatch.setenv("SPECOPS_MLFLOW_URI", mlflow_uri)
    monkeypatch.setenv("SPECOPS_MLFLOW_ARTIFACTS", str(tmp_path / "artifacts"))
    eos = eos_ids(target, char_tokenizer)

    def loaded_on(hardware: HardwareTarget) -> LoadedTarget:
        return LoadedTarget.of(target, char_tokenizer, hardware=hardware, eos_token_ids=eos)

    monkeypatch.setattr(targets, "target_for", lambda hardware, source=None: loaded_on(hardware))
    naming_base_head(monkeypatch, None)  # the shipped head is SmolLM2's
    monkeypatch.setattr(
        traffic, "build_workload", lambda name, n, *, seed=0, split="heldout": make_prompts()[:n]
    )
    caplog.set_level(logging.DEBUG)
    logs.install([SECRET])
    logging.getLogger("specops.test").warning(
        "tracking at postgresql://me:%s@db/x with key %s", PASSWORD, SECRET
    )
    bootstrap(
        hardware="cpu", drafter="pld:3", k=4, policy="fixed", workloads=["grounded"],
        prompts_per_workload=4, max_new_tokens=12, work=str(tmp_path / "work"),
    )  # fmt: skip
    mlflow = stored_bytes(tmp_path)  # the SQLite store, artifacts, the work folder
    assert b"specops-draft" in mlflow, "the run did register in this store"
    database = Path(PREFECT_API_DATABASE_CONNECTION_URL.value().split(":///", 1)[-1])
    prefect = b"".join(p.read_bytes() for p in database.parent.glob(database.name + "*"))
    assert b"bootstrap" in prefect, f"no flow run in Prefect's database at {database}"
    # The server is the session's: this test's own run is there (its parameters name it).
    assert str(tmp_path / "work").encode() in prefect, "this test's flow run is not stored"
    for blob, where in ((mlflow, "MLflow/work"), (prefect, "Prefect")):
        assert SECRET.encode() not in blob, f"the API key reached {where}"
    text = caplog.text
    assert SECRET not in text and PASSWORD not in text
    assert "postgresql://me:***@db/x" in text
