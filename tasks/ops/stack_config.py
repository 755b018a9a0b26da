"""Where the local team stack lives and listens (``scripts/stack.sh``, :mod:`tasks.ops.stack`).

Every setting has a default and an environment variable ``SPECOPS_STACK_<NAME>``
(pydantic-settings), e.g. ``SPECOPS_STACK_MLFLOW_PORT=5000``. Everything listens on
``host`` (loopback by default); the state (database files, artifacts, the DVC remote's
folder, keys, logs, pids) lives under ``root``.
"""

from __future__ import annotations

import getpass
from pathlib import Path
from urllib.parse import quote

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict

from serving.paths import PROJECT_ROOT

DEFAULT_ROOT = PROJECT_ROOT / ".specops" / "stack"


class StackConfig(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="SPECOPS_STACK_", extra="forbid")

    root: Path = DEFAULT_ROOT
    host: str = "127.0.0.1"
    postgres_port: int = Field(55432, ge=1, le=65535)
    mlflow_port: int = Field(55000, ge=1, le=65535)
    prefect_port: int = Field(54200, ge=1, le=65535)
    ssh_port: int = Field(52222, ge=1, le=65535)
    # The database role that owns the stack's databases (the private cluster's superuser).
    db_user: str = Field("specops", pattern=r"^[a-z_][a-z0-9_]*$")
    # The Prefect work pool the deployments of prefect.yaml target, and its worker.
    pool: str = Field("specops-cpu", pattern=r"^[A-Za-z0-9_-]+$")
    # Seconds between the worker's polls (Prefect's default is 15).
    worker_poll_s: float = Field(5.0, gt=0)
    # Seconds to wait for a service to answer before giving up.
    ready_timeout_s: float = Field(180.0, gt=0)

    # --- where things are --------------------------------------------------------------
    @property
    def state(self) -> Path:
        return self.root.resolve()

    @property
    def logs(self) -> Path:
        return self.state / "logs"

    @property
    def run(self) -> Path:
        return self.state / "run"

    @property
    def secrets(self) -> Path:
        return self.state / "secrets"

    @property
    def artifacts(self) -> Path:
        return self.state / "mlflow-artifacts"

    @property
    def dvc_remote(self) -> Path:
        return self.state / "dvc-remote"

    # --- what clients use --------------------------------------------------------------
    def db_password(self) -> str:
        return (self.secrets / "db-password").read_text().strip()

    def database_uri(self, database: str, *, driver: str = "") -> str:
        scheme = f"postgresql+{driver}" if driver else "postgresql"
        password = quote(self.db_password(), safe="")
        return f"{scheme}://{self.db_user}:{password}@{self.host}:{self.postgres_port}/{database}"

    @property
    def mlflow_uri(self) -> str:
        return f"http://{self.host}:{self.mlflow_port}"

    @property
    def prefect_api_url(self) -> str:
        return f"http://{self.host}:{self.prefect_port}/api"

    @property
    def ssh_user(self) -> str:
        return getpass.getuser()

    @property
    def ssh_key(self) -> Path:
        return self.secrets / "id_ed25519"

    @property
    def dvc_remote_url(self) -> str:
        return f"ssh://{self.ssh_user}@{self.host}:{self.ssh_port}{self.dvc_remote}"

    def client_env(self) -> dict[str, str]:
        """What a specops process needs to use the stack: the standard variables of each
        tool (``scripts/stack.sh env`` prints them to ``source``)."""
        return {
            "MLFLOW_TRACKING_URI": self.mlflow_uri,
            "PREFECT_API_URL": self.prefect_api_url,
            "SPECOPS_DVC_REMOTE": "team",
        }
