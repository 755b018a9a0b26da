"""The team stack's settings: defaults, SPECOPS_STACK_* overrides, the URIs clients get."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from tasks.ops.stack_config import StackConfig


def test_environment_overrides_and_client_settings(tmp_path, monkeypatch):
    monkeypatch.setenv("SPECOPS_STACK_ROOT", str(tmp_path / "stack"))
    monkeypatch.setenv("SPECOPS_STACK_MLFLOW_PORT", "5999")
    config = StackConfig()
    assert config.state == (tmp_path / "stack").resolve()
    assert config.client_env() == {
        "MLFLOW_TRACKING_URI": "http://127.0.0.1:5999",
        "PREFECT_API_URL": "http://127.0.0.1:54200/api",
        "SPECOPS_DVC_REMOTE": "team",
    }
    assert config.dvc_remote_url.endswith(f"@127.0.0.1:52222{config.state}/dvc-remote")


def test_the_database_password_is_quoted_into_the_uri(tmp_path):
    config = StackConfig(root=tmp_path)
    config.secrets.mkdir(parents=True)
    (config.secrets / "db-password").write_text("p@ss/word:1\n")
    assert config.database_uri("mlflow") == (
        "postgresql://specops:p%40ss%2Fword%3A1@127.0.0.1:55432/mlflow"
    )
    assert config.database_uri("prefect", driver="asyncpg").startswith("postgresql+asyncpg://")


@pytest.mark.parametrize(
    ("name", "value"),
    [("SPECOPS_STACK_MLFLOW_PORT", "70000"), ("SPECOPS_STACK_POOL", "bad pool")],
)
def test_a_bad_setting_is_refused_naming_it(monkeypatch, name, value):
    monkeypatch.setenv(name, value)
    with pytest.raises(ValidationError, match=name.removeprefix("SPECOPS_STACK_").lower()):
        StackConfig()
