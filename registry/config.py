"""The registry config (``configs/registry.yaml``), with environment overrides."""

from __future__ import annotations

import os
from pathlib import Path

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from serving.errors import BadInputError
from serving.paths import CONFIG_DIR, PROJECT_ROOT

REGISTRY_CONFIG = CONFIG_DIR / "registry.yaml"


class RegistryConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    tracking_uri: str = "sqlite:///.specops/mlflow/mlflow.db"
    artifact_root: str = ".specops/mlflow/artifacts"
    model_prefix: str = Field("specops-draft", pattern=r"^[A-Za-z0-9_.-]+$")
    experiment: str = Field("specops", min_length=1)
    # The acceptance predictor's registered model (registry/predictor.py): one model, its
    # versions aliased per hardware target like the drafts.
    predictor_model: str = Field("specops-predictor", pattern=r"^[A-Za-z0-9_.-]+$")

    @model_validator(mode="after")
    def _predictor_is_no_draft_family(self) -> RegistryConfig:
        if self.predictor_model.startswith(f"{self.model_prefix}-"):
            raise ValueError(
                f"predictor_model {self.predictor_model!r} starts with the draft prefix "
                f"{self.model_prefix!r}-, so it would be listed as a draft family; name it "
                "outside that prefix (e.g. specops-predictor)"
            )
        return self

    def resolved_tracking_uri(self) -> str:
        """A relative SQLite path is taken from the project root, not the working directory
        (which differs between a flow, a test, the server and ``dvc repro``)."""
        uri = self.tracking_uri
        if uri.startswith("sqlite:///") and not uri.startswith("sqlite:////"):
            return "sqlite:///" + str(PROJECT_ROOT / uri.removeprefix("sqlite:///"))
        return uri

    def resolved_artifact_root(self) -> str:
        root = self.artifact_root
        if "://" in root:
            return root
        return (PROJECT_ROOT / root).resolve().as_uri()


def load_registry_config(path: str | Path = REGISTRY_CONFIG) -> RegistryConfig:
    try:
        raw = yaml.safe_load(Path(path).read_text()) or {}
    except (OSError, yaml.YAMLError) as error:
        raise BadInputError(f"cannot read registry config {str(path)!r}: {error}") from None
    if os.environ.get("SPECOPS_MLFLOW_URI"):
        raw["tracking_uri"] = os.environ["SPECOPS_MLFLOW_URI"]
    if os.environ.get("SPECOPS_MLFLOW_ARTIFACTS"):
        raw["artifact_root"] = os.environ["SPECOPS_MLFLOW_ARTIFACTS"]
    try:
        return RegistryConfig.model_validate(raw)
    except ValidationError as error:
        raise BadInputError(f"invalid registry config {str(path)!r}: {error}") from None
