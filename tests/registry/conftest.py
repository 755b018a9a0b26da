"""The registry tests' store: a migrated, empty SQLite MLflow store made once per module
(migrating takes seconds) and copied for each test (model prefix ``t``)."""

from __future__ import annotations

import shutil

import pytest

from registry.client import Registry
from registry.config import RegistryConfig


def _config(folder) -> RegistryConfig:
    return RegistryConfig(
        tracking_uri=f"sqlite:///{folder}/mlflow.db",
        artifact_root=str(folder / "artifacts"),
        model_prefix="t",
    )


@pytest.fixture(scope="module")
def empty_store(tmp_path_factory):
    folder = tmp_path_factory.mktemp("store")
    Registry(_config(folder))
    return folder / "mlflow.db"


@pytest.fixture
def registry(tmp_path, empty_store):
    shutil.copy(empty_store, tmp_path / "mlflow.db")
    return Registry(_config(tmp_path))
