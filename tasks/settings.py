"""Settings of the loop's processes (flows on a worker, ``specops`` commands), by the
environment: pydantic-settings reads ``SPECOPS_<NAME>``; a flow parameter or a command-line
flag, where one exists, wins over it. The registry's settings are in
``registry/config.py`` (docs/configuration.md has the whole order).

- ``SPECOPS_TARGET``: the target model, ``smollm2`` (the shipped SmolLM2-135M-Instruct) or a
  local model folder; every loop step loads this one.
- ``SPECOPS_DVC_REMOTE``: the DVC remote the collect flow pushes the store to (``team`` on
  the local team stack); unset, DVC's default remote (``.dvc/config``).
- ``SPECOPS_RETRAIN_DEPLOYMENT``: the Prefect deployment ``collect`` triggers a retrain
  through (``retrain/daily``), so the retrain runs on that deployment's work pool (a GPU
  pool, say); unset, ``collect`` runs ``retrain`` in its own process.
"""

from __future__ import annotations

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict

from serving.defaults import DEFAULT_TARGET


class LoopSettings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="SPECOPS_", extra="ignore")

    target: str = Field(DEFAULT_TARGET, min_length=1)
    dvc_remote: str | None = Field(None, pattern=r"^[A-Za-z0-9_.-]+$")
    retrain_deployment: str | None = Field(None, pattern=r"^[^/]+/[^/]+$")


def loop_settings() -> LoopSettings:
    """Read afresh each call: a test, or a worker's job variables, may set the environment."""
    from pydantic import ValidationError

    from serving.errors import BadInputError

    try:
        return LoopSettings()
    except ValidationError as error:
        raise BadInputError(f"invalid SPECOPS_* setting: {error}") from None


def promotion_limit(hardware_name: str) -> str:
    """The name of the Prefect global concurrency limit (one slot) held around
    evaluate-and-promote on the hardware target named ``hardware_name``;
    ``tasks/ops/prefect_setup.py`` creates one per target."""
    return f"promote-{hardware_name}"
