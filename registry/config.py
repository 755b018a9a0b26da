"""Where the registry lives: the MLflow tracking store, the model registry and the artifact
root, read with pydantic-settings from four layers (docs/configuration.md).

Precedence, highest first; each setting is taken from the highest layer that sets it:

1. **flags** of the ``specops`` command (``--tracking-uri``, ``--registry-uri``), which set
   :func:`set_overrides` for the whole process;
2. **environment**: ``SPECOPS_MLFLOW_URI`` or else ``MLFLOW_TRACKING_URI`` (tracking_uri; the
   specops-specific name wins when both are set, and the log says so), ``MLFLOW_REGISTRY_URI``
   (registry_uri), ``SPECOPS_MLFLOW_ARTIFACTS`` (artifact_root);
3. **the file**: ``configs/registry.yaml``, or the one named by ``--registry-config`` or
   ``SPECOPS_REGISTRY_CONFIG`` (in that order);
4. **defaults** (the fields below).

``registry_uri`` follows ``tracking_uri`` unless it is set at the same layer as the tracking
URI or a higher one: pointing the tracking store somewhere (``--tracking-uri``, an
environment variable) takes the registry along, so runs and the versions that point at
their artifacts never land in two different stores by accident.

A :class:`RegistryConfig` built directly (``RegistryConfig(tracking_uri=...)``, as tests do)
is exactly its arguments over the defaults: only :func:`load_registry_config` reads the
environment and the file. A bad value fails at load time naming the key and its layer.
"""

from __future__ import annotations

import logging
import os
import re
from contextvars import ContextVar
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

import yaml
from pydantic import Field, PrivateAttr, ValidationError, field_validator, model_validator
from pydantic.fields import FieldInfo
from pydantic_core import ErrorDetails
from pydantic_settings import BaseSettings, PydanticBaseSettingsSource, SettingsConfigDict

from serving.errors import BadInputError
from serving.paths import CONFIG_DIR, PROJECT_ROOT

log = logging.getLogger(__name__)

REGISTRY_CONFIG = CONFIG_DIR / "registry.yaml"
CONFIG_FILE_ENV = "SPECOPS_REGISTRY_CONFIG"
# The environment layer: field -> variables, the first one set wins.
ENVIRONMENT: dict[str, tuple[str, ...]] = {
    "tracking_uri": ("SPECOPS_MLFLOW_URI", "MLFLOW_TRACKING_URI"),
    "registry_uri": ("MLFLOW_REGISTRY_URI",),
    "artifact_root": ("SPECOPS_MLFLOW_ARTIFACTS",),
}
FLAGS = {"tracking_uri": "--tracking-uri", "registry_uri": "--registry-uri"}
# Where a local store (SQLite, file) keeps artifacts when artifact_root is not set.
LOCAL_ARTIFACT_ROOT = ".specops/mlflow/artifacts"

# MLflow's store schemes (a "+driver" suffix is allowed on the databases: postgresql+psycopg2).
DATABASE_SCHEMES = ("postgresql", "mysql", "mssql")
SERVER_SCHEMES = ("http", "https", "databricks")
LOCAL_SCHEMES = ("sqlite", "file")
TRACKING_SCHEMES = (*LOCAL_SCHEMES, *SERVER_SCHEMES, *DATABASE_SCHEMES)
REGISTRY_SCHEMES = (*TRACKING_SCHEMES, "databricks-uc", "uc")

# Layers, highest first: the rank decides whether a registry_uri pairs with the tracking URI.
_RANK = {"flag": 3, "environment": 2, "file": 1}


def store_kind(uri: str) -> str:
    """``local`` (SQLite, file), ``server`` (http(s), Databricks) or ``database``
    (PostgreSQL, MySQL, SQL Server), from the URI's scheme."""
    scheme = uri.split(":", 1)[0].split("+", 1)[0].lower()
    if scheme in DATABASE_SCHEMES:
        return "database"
    if scheme in SERVER_SCHEMES or scheme in ("databricks-uc", "uc"):
        return "server"
    return "local"


def mask_uri(uri: str) -> str:
    """``uri`` with any password (``user:secret@``, ``?password=...``) shown as ``***``:
    what every message and printout names."""
    try:
        parts = urlsplit(uri)
    except ValueError:
        return uri
    netloc = parts.netloc
    if parts.password is not None:
        netloc = f"{parts.username or ''}:***@{netloc.rsplit('@', 1)[1]}"
    query = parts.query
    if query and re.search(r"(?i)(password|secret|token)", query):
        pairs = parse_qsl(query, keep_blank_values=True)
        query = urlencode(
            [(k, "***" if re.search(r"(?i)(password|secret|token)", k) else v) for k, v in pairs],
            safe="*",
        )
    if (netloc, query) == (parts.netloc, parts.query):
        return uri
    return urlunsplit(parts._replace(netloc=netloc, query=query))


def _resolved_sqlite(uri: str) -> str:
    """A relative SQLite path is taken from the project root, not the working directory
    (which differs between a flow, a test, the server and ``dvc repro``)."""
    if uri.startswith("sqlite:///") and not uri.startswith("sqlite:////"):
        return "sqlite:///" + str(PROJECT_ROOT / uri.removeprefix("sqlite:///"))
    return uri


def _check_scheme(uri: str, schemes: tuple[str, ...]) -> str:
    uri = uri.strip()
    scheme = uri.split(":", 1)[0].lower() if ":" in uri else ""
    if scheme.split("+", 1)[0] not in schemes or (
        "+" in scheme and scheme.split("+", 1)[0] not in DATABASE_SCHEMES
    ):
        shown = f"scheme {scheme!r}" if scheme else "no scheme"
        raise ValueError(
            f"{mask_uri(uri)!r} has {shown}; write sqlite:///PATH (a local store), "
            "http(s)://HOST:PORT (an MLflow tracking server) or "
            "postgresql://USER@HOST/DB (a database); known schemes: " + ", ".join(schemes)
        )
    return uri


# --- the layers ------------------------------------------------------------------------
class _Layer(PydanticBaseSettingsSource):
    """A layer of settings with where each value came from (``origins``)."""

    kind: ClassVar[str]  # the layer: a key of _RANK

    def __init__(self, settings_cls: type[BaseSettings], values: dict[str, Any], origins: dict):
        super().__init__(settings_cls)
        self.values = values
        self.origins: dict[str, str] = origins

    def get_field_value(self, field: FieldInfo, field_name: str) -> tuple[Any, str, bool]:
        return self.values.get(field_name), field_name, False

    def __call__(self) -> dict[str, Any]:
        return dict(self.values)


class _Flags(_Layer):
    kind = "flag"

    @classmethod
    def read(cls, settings_cls: type[BaseSettings], overrides: Overrides) -> _Flags:
        values = {
            key: value
            for key in FLAGS
            if (value := getattr(overrides, key)) is not None and value.strip()
        }
        return cls(settings_cls, values, {key: f"flag {FLAGS[key]}" for key in values})


class _Environment(_Layer):
    kind = "environment"

    @classmethod
    def read(cls, settings_cls: type[BaseSettings], *, above: set[str]) -> _Environment:
        """``above``: the keys a higher layer sets (no warning about those)."""
        values: dict[str, Any] = {}
        origins: dict[str, str] = {}
        for key, names in ENVIRONMENT.items():
            found = [(name, value) for name in names if (value := os.environ.get(name, "").strip())]
            if not found:
                continue
            (name, value), *shadowed = found
            values[key], origins[key] = value, f"environment variable {name}"
            for other, other_value in shadowed:
                if other_value == value:
                    continue
                origins[key] += f" (which wins over {other})"
                warning = (name, value, other, other_value)
                if key not in above and warning not in _warned:
                    _warned.add(warning)
                    log.warning(
                        "%s=%s and %s=%s are both set; %s wins (the specops-specific name)",
                        name,
                        mask_uri(value),
                        other,
                        mask_uri(other_value),
                        name,
                    )
        return cls(settings_cls, values, origins)


_warned: set[tuple[str, ...]] = set()  # each clash of variables is logged once per process


class _File(_Layer):
    kind = "file"

    @classmethod
    def read(cls, settings_cls: type[BaseSettings], path: Path, named_by: str) -> _File:
        where = f"registry config {str(path)!r}" + (f" (named by {named_by})" if named_by else "")
        if not path.is_file():
            raise BadInputError(f"{where} does not exist; name an existing YAML file")
        try:
            raw = yaml.safe_load(path.read_text()) or {}
        except (OSError, yaml.YAMLError) as error:
            raise BadInputError(f"cannot read {where}: {error}") from None
        if not isinstance(raw, dict):
            raise BadInputError(f"{where} holds a {type(raw).__name__}, not a mapping of keys")
        shown = path.name if path == REGISTRY_CONFIG else str(path)
        return cls(settings_cls, raw, {str(key): f"file {shown}" for key in raw})


# Set by load_registry_config while it builds a config: the layers under the flags.
_LAYERS: ContextVar[tuple[_Layer, ...]] = ContextVar("registry_config_layers", default=())


class RegistryConfig(BaseSettings):
    """The registry's settings; see the module's docstring for where each value comes from."""

    model_config = SettingsConfigDict(extra="forbid")

    # The MLflow tracking store: runs, their metrics and artifacts' locations.
    tracking_uri: str = "sqlite:///.specops/mlflow/mlflow.db"
    # The MLflow model registry (versions, aliases); None: the tracking store.
    registry_uri: str | None = None
    # Where new experiments keep artifacts; None: .specops/mlflow/artifacts for a local store,
    # the tracking server's own default (proxied mlflow-artifacts:/ under --serve-artifacts)
    # for a server. An explicit value (s3://..., a path from the project root) always holds.
    artifact_root: str | None = None
    model_prefix: str = Field("specops-draft", pattern=r"^[A-Za-z0-9_.-]+$")
    experiment: str = Field("specops", min_length=1)
    # The acceptance predictor's registered model (registry/predictor.py): one model, its
    # versions aliased per hardware target like the drafts.
    predictor_model: str = Field("specops-predictor", pattern=r"^[A-Za-z0-9_.-]+$")

    _origins: dict[str, str] = PrivateAttr(default_factory=dict)

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        # Built directly: the arguments only. Through load_registry_config: the arguments
        # (the flags), then the environment, then the file.
        return (init_settings, *_LAYERS.get())

    @field_validator("tracking_uri")
    @classmethod
    def _tracking_scheme(cls, uri: str) -> str:
        return _check_scheme(uri, TRACKING_SCHEMES)

    @field_validator("registry_uri")
    @classmethod
    def _registry_scheme(cls, uri: str | None) -> str | None:
        return None if uri is None or not uri.strip() else _check_scheme(uri, REGISTRY_SCHEMES)

    @field_validator("artifact_root")
    @classmethod
    def _artifact_root(cls, root: str | None) -> str | None:
        return None if root is None or not root.strip() else root.strip()

    @model_validator(mode="after")
    def _predictor_is_no_draft_family(self) -> RegistryConfig:
        if self.predictor_model.startswith(f"{self.model_prefix}-"):
            raise ValueError(
                f"predictor_model {self.predictor_model!r} starts with the draft prefix "
                f"{self.model_prefix!r}-, so it would be listed as a draft family; name it "
                "outside that prefix (e.g. specops-predictor)"
            )
        return self

    # --- where things are ---------------------------------------------------------------
    def origin(self, key: str) -> str:
        """Where ``key``'s value came from: ``flag --tracking-uri``, ``environment variable
        MLFLOW_TRACKING_URI``, ``file registry.yaml``, ``given`` or ``default``."""
        if key in self._origins:
            return self._origins[key]
        return "given" if key in self.model_fields_set else "default"

    def resolved_tracking_uri(self) -> str:
        """The tracking URI; a relative SQLite path is taken from the project root."""
        return _resolved_sqlite(self.tracking_uri)

    def resolved_registry_uri(self) -> str:
        """The registry URI: ``registry_uri``, or the tracking URI when it is not set."""
        if self.registry_uri is None:
            return self.resolved_tracking_uri()
        return _resolved_sqlite(self.registry_uri)

    def resolved_artifact_root(self) -> str | None:
        """Where a new experiment keeps its artifacts, or None to leave it to the tracking
        server (its ``--default-artifact-root``, or proxied ``mlflow-artifacts:/`` under
        ``--serve-artifacts``). A relative path is taken from the project root."""
        root = self.artifact_root
        if root is None:
            kind = store_kind(self.tracking_uri)
            if kind == "server":
                return None
            if kind == "database":
                raise BadInputError(
                    f"artifact_root is not set and tracking_uri "
                    f"{mask_uri(self.tracking_uri)!r} is a database, which keeps no "
                    "artifacts: set artifact_root (SPECOPS_MLFLOW_ARTIFACTS) to storage every "
                    "host can read (s3://bucket/specops), or track through an MLflow server "
                    "started with --serve-artifacts"
                )
            root = LOCAL_ARTIFACT_ROOT
        if re.match(r"^[A-Za-z][A-Za-z0-9+.-]*:", root) and not re.match(r"^[A-Za-z]:[\\/]", root):
            return root  # a URI: s3://, gs://, mlflow-artifacts:/, file:///...
        return (PROJECT_ROOT / root).resolve().as_uri()


# --- flags (set once per process by the CLI) ----------------------------------------------
@dataclass(frozen=True)
class Overrides:
    """The top layer: what the ``specops`` command's flags set."""

    tracking_uri: str | None = None
    registry_uri: str | None = None
    config_file: Path | None = None


_overrides = Overrides()
_exported: dict[str, str | None] = {}  # what set_overrides replaced in os.environ


def set_overrides(
    *,
    tracking_uri: str | None = None,
    registry_uri: str | None = None,
    config_file: str | Path | None = None,
) -> None:
    """Make these the top layer of every :func:`load_registry_config` in this process, and
    pass them on to the processes it starts (Prefect flow runs, ...) through the environment:
    ``SPECOPS_MLFLOW_URI``, ``MLFLOW_REGISTRY_URI`` (the registry URI, or the tracking URI
    when only that is given: the pair moves together) and ``SPECOPS_REGISTRY_CONFIG``.
    Replaces what an earlier call set (and restores the variables it had replaced)."""
    global _overrides
    file = Path(config_file).resolve() if config_file is not None else None
    _overrides = Overrides(tracking_uri, registry_uri, file)
    for name, value in _exported.items():
        if value is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = value
    _exported.clear()
    exports = {
        "SPECOPS_MLFLOW_URI": tracking_uri,
        "MLFLOW_REGISTRY_URI": registry_uri or tracking_uri,
        CONFIG_FILE_ENV: str(file) if file is not None else None,
    }
    for name, value in exports.items():
        if value:
            _exported[name] = os.environ.get(name)
            os.environ[name] = value


# --- loading ------------------------------------------------------------------------------
def _config_file(path: str | Path | None) -> tuple[Path, str]:
    """The YAML file to read and what named it ("" for the default file)."""
    if path is not None:
        return Path(path), "the caller"
    if _overrides.config_file is not None:
        return _overrides.config_file, "flag --registry-config"
    if os.environ.get(CONFIG_FILE_ENV, "").strip():
        return Path(os.environ[CONFIG_FILE_ENV].strip()), f"environment variable {CONFIG_FILE_ENV}"
    return REGISTRY_CONFIG, ""


def _problem(error: ErrorDetails, origins: dict[str, str]) -> str:
    key = str(error["loc"][0]) if error["loc"] else ""
    where = origins.get(key, "default")
    message = str(error["msg"]).removeprefix("Value error, ")
    if error["type"] == "extra_forbidden":
        known = ", ".join(RegistryConfig.model_fields)
        return f"{key} (from {where}): unknown key; the keys are {known}"
    if not key:
        return message
    return f"{key} (from {where}): {message}"


def load_registry_config(path: str | Path | None = None) -> RegistryConfig:
    """The registry config: flags over the environment over the file over the defaults
    (the module's docstring). ``path`` names the file (else ``--registry-config``, else
    ``SPECOPS_REGISTRY_CONFIG``, else ``configs/registry.yaml``)."""
    file, named_by = _config_file(path)
    flags = _Flags.read(RegistryConfig, _overrides)
    layers: tuple[_Layer, ...] = (
        flags,
        _Environment.read(RegistryConfig, above=set(flags.values)),
        _File.read(RegistryConfig, file, named_by),
    )
    origins: dict[str, str] = {}
    ranks: dict[str, int] = {}
    for layer in reversed(layers):  # the highest layer last: it wins
        for key in layer.values:
            origins[key] = layer.origins.get(key, layer.kind)
            ranks[key] = _RANK[layer.kind]
    token = _LAYERS.set(layers[1:])
    try:
        config = RegistryConfig(**flags.values)
    except ValidationError as error:
        problems = "; ".join(_problem(e, origins) for e in error.errors())
        raise BadInputError(f"invalid registry config: {problems}") from None
    finally:
        _LAYERS.reset(token)
    if config.registry_uri is not None and ranks["registry_uri"] < ranks.get("tracking_uri", 0):
        log.info(
            "registry_uri %s (from %s) is not used: tracking_uri comes from %s, a higher "
            "layer, and the registry follows it; set the registry URI there too to keep a "
            "separate registry",
            mask_uri(config.registry_uri),
            origins["registry_uri"],
            origins["tracking_uri"],
        )
        config = config.model_copy(update={"registry_uri": None})
        origins["registry_uri"] = f"tracking_uri ({origins['tracking_uri']})"
    config._origins = origins
    return config
