"""Where the registry's settings come from (registry/config.py, docs/configuration.md):
flags > environment > file > defaults, each value's layer named in errors, and where new
experiments put their artifacts."""

from __future__ import annotations

import logging
import os
from types import SimpleNamespace

import pytest

from registry import config as registry_config
from registry.client import Registry
from registry.config import (
    RegistryConfig,
    load_registry_config,
    mask_uri,
    set_overrides,
)
from serving.errors import BadInputError
from serving.paths import PROJECT_ROOT

SERVER = "http://mlflow.internal:5000"


@pytest.fixture
def yaml_file(tmp_path):
    """``yaml_file(**keys)``: a registry YAML file holding ``keys``."""

    def write(**keys: str) -> os.PathLike:
        path = tmp_path / "registry.yaml"
        path.write_text("".join(f"{key}: {value}\n" for key, value in keys.items()))
        return path

    return write


# --- precedence ------------------------------------------------------------------------------
def test_defaults_then_file_then_environment_then_flags(yaml_file, monkeypatch):
    path = yaml_file()
    config = load_registry_config(path)
    assert config.tracking_uri == "sqlite:///.specops/mlflow/mlflow.db"
    assert config.origin("tracking_uri") == "default"
    assert config.registry_uri is None and config.artifact_root is None

    path = yaml_file(tracking_uri="sqlite:///from-file.db", experiment="team")
    config = load_registry_config(path)
    assert (config.tracking_uri, config.experiment) == ("sqlite:///from-file.db", "team")
    assert config.origin("tracking_uri") == f"file {path}"

    monkeypatch.setenv("MLFLOW_TRACKING_URI", SERVER)
    config = load_registry_config(path)
    assert config.tracking_uri == SERVER
    assert config.origin("tracking_uri") == "environment variable MLFLOW_TRACKING_URI"
    assert config.experiment == "team"  # the layers merge key by key

    set_overrides(tracking_uri="http://flagged:5000")
    config = load_registry_config(path)
    assert config.tracking_uri == "http://flagged:5000"
    assert config.origin("tracking_uri") == "flag --tracking-uri"


def test_the_specops_variable_wins_over_mlflows_and_says_so(monkeypatch, caplog):
    monkeypatch.setenv("MLFLOW_TRACKING_URI", SERVER)
    monkeypatch.setenv("SPECOPS_MLFLOW_URI", "sqlite:///specops.db")
    monkeypatch.setattr(registry_config, "_warned", set())
    with caplog.at_level(logging.WARNING, logger="registry.config"):
        config = load_registry_config()
    assert config.tracking_uri == "sqlite:///specops.db"
    assert config.origin("tracking_uri") == (
        "environment variable SPECOPS_MLFLOW_URI (which wins over MLFLOW_TRACKING_URI)"
    )
    assert "SPECOPS_MLFLOW_URI wins" in caplog.text and SERVER in caplog.text


def test_mlflow_registry_uri_is_honoured(monkeypatch, yaml_file):
    monkeypatch.setenv("MLFLOW_REGISTRY_URI", "http://registry.internal:5000")
    config = load_registry_config(yaml_file(tracking_uri=SERVER))
    assert config.resolved_tracking_uri() == SERVER
    assert config.resolved_registry_uri() == "http://registry.internal:5000"
    assert config.origin("registry_uri") == "environment variable MLFLOW_REGISTRY_URI"
    # Unset, the registry is the tracking store.
    monkeypatch.delenv("MLFLOW_REGISTRY_URI")
    assert load_registry_config(yaml_file(tracking_uri=SERVER)).resolved_registry_uri() == SERVER


def test_the_registry_follows_a_tracking_uri_set_above_it(monkeypatch, tmp_path):
    """``--tracking-uri`` to a scratch store must not leave the versions in the registry
    an environment variable names: the pair moves together."""
    monkeypatch.setenv("MLFLOW_REGISTRY_URI", SERVER)
    set_overrides(tracking_uri=f"sqlite:///{tmp_path}/scratch.db")
    config = load_registry_config()
    assert config.resolved_registry_uri() == f"sqlite:///{tmp_path}/scratch.db"
    set_overrides(tracking_uri=f"sqlite:///{tmp_path}/scratch.db", registry_uri=SERVER)
    assert load_registry_config().resolved_registry_uri() == SERVER


def test_the_file_is_named_by_flag_then_environment(monkeypatch, tmp_path):
    by_env, by_flag = tmp_path / "env.yaml", tmp_path / "flag.yaml"
    by_env.write_text("experiment: from-env\n")
    by_flag.write_text("experiment: from-flag\n")
    monkeypatch.setenv("SPECOPS_REGISTRY_CONFIG", str(by_env))
    assert load_registry_config().experiment == "from-env"
    set_overrides(config_file=by_flag)
    assert load_registry_config().experiment == "from-flag"
    set_overrides(config_file=tmp_path / "missing.yaml")
    with pytest.raises(BadInputError, match=r"missing\.yaml' \(named by flag --registry-config\)"):
        load_registry_config()


def test_flags_reach_the_processes_it_starts_and_are_undone(monkeypatch):
    monkeypatch.setenv("MLFLOW_REGISTRY_URI", "http://before:5000")
    set_overrides(tracking_uri=SERVER)
    # A child process (a Prefect flow run) reads the same pair from its environment.
    assert os.environ["SPECOPS_MLFLOW_URI"] == SERVER
    assert os.environ["MLFLOW_REGISTRY_URI"] == SERVER
    set_overrides()
    assert "SPECOPS_MLFLOW_URI" not in os.environ
    assert os.environ["MLFLOW_REGISTRY_URI"] == "http://before:5000"


def test_a_directly_built_config_reads_no_environment(monkeypatch):
    monkeypatch.setenv("MLFLOW_REGISTRY_URI", SERVER)
    monkeypatch.setenv("SPECOPS_MLFLOW_ARTIFACTS", "s3://bucket/x")
    config = RegistryConfig(tracking_uri="sqlite:///a.db")
    assert config.registry_uri is None and config.artifact_root is None
    assert config.origin("tracking_uri") == "given" and config.origin("experiment") == "default"


# --- bad values fail at load time, naming the key and its layer -------------------------------
def test_an_unknown_key_in_the_file_names_key_and_file(yaml_file):
    path = yaml_file(tracking_uri="sqlite:///x.db", artifacts_root="/tmp/x")
    with pytest.raises(BadInputError) as error:
        load_registry_config(path)
    assert f"artifacts_root (from file {path}): unknown key" in str(error.value)


@pytest.mark.parametrize(
    ("variable", "value", "fragment"),
    [
        ("MLFLOW_TRACKING_URI", "htp://x", "tracking_uri (from environment variable "),
        ("MLFLOW_TRACKING_URI", "./mlruns", "has no scheme"),
        ("MLFLOW_REGISTRY_URI", "ftp://x", "registry_uri (from environment variable "),
    ],
)
def test_a_bad_uri_names_the_variable(monkeypatch, variable, value, fragment):
    monkeypatch.setenv(variable, value)
    with pytest.raises(BadInputError, match="invalid registry config") as error:
        load_registry_config()
    assert fragment in str(error.value) and variable in str(error.value)


def test_a_bad_uri_never_shows_its_password(monkeypatch):
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "postgres://user:secret@db/x")  # not a scheme
    with pytest.raises(BadInputError) as error:
        load_registry_config()
    assert "secret" not in str(error.value) and "user:***@db" in str(error.value)


def test_a_file_that_is_no_mapping(tmp_path):
    path = tmp_path / "list.yaml"
    path.write_text("- a\n- b\n")
    with pytest.raises(BadInputError, match="holds a list, not a mapping"):
        load_registry_config(path)


@pytest.mark.parametrize(
    ("uri", "shown"),
    [
        ("postgresql://user:secret@127.0.0.1:1/db", "postgresql://user:***@127.0.0.1:1/db"),
        ("https://u:secret@mlflow.internal", "https://u:***@mlflow.internal"),
        ("mysql+pymysql://u@h/db?password=secret", "mysql+pymysql://u@h/db?password=***"),
        ("sqlite:////tmp/a.db", "sqlite:////tmp/a.db"),
        (SERVER, SERVER),
    ],
)
def test_mask_uri(uri, shown):
    assert mask_uri(uri) == shown


# --- artifacts ---------------------------------------------------------------------------------
def test_artifact_root_by_store():
    local = RegistryConfig(tracking_uri="sqlite:///a.db")
    expected = (PROJECT_ROOT / ".specops/mlflow/artifacts").resolve().as_uri()
    assert local.resolved_artifact_root() == expected
    assert RegistryConfig(tracking_uri=SERVER).resolved_artifact_root() is None
    explicit = RegistryConfig(tracking_uri=SERVER, artifact_root="s3://bucket/specops")
    assert explicit.resolved_artifact_root() == "s3://bucket/specops"
    database = RegistryConfig(tracking_uri="postgresql://u:secret@db/mlflow")
    with pytest.raises(BadInputError, match="artifact_root is not set") as error:
        database.resolved_artifact_root()
    assert "secret" not in str(error.value)


class _Client:
    """Records the experiments an MLflow client is asked to create."""

    def __init__(self) -> None:
        self.created: list[tuple[str, str | None]] = []

    def get_experiment_by_name(self, name):
        return None

    def create_experiment(self, name, artifact_location=None):
        self.created.append((name, artifact_location))
        return "7"


def _experiment_with(config: RegistryConfig) -> tuple[str, str | None]:
    registry = Registry.__new__(Registry)  # no store: only _experiment runs
    registry.config, registry.client = config, _Client()
    assert registry._experiment("specops") == "7"
    return registry.client.created[0]


def test_a_servers_experiments_keep_the_servers_artifact_location(monkeypatch):
    """Against ``mlflow server --serve-artifacts`` no location is passed, so the server
    gives its proxied ``mlflow-artifacts:/`` one, which every host can read."""
    monkeypatch.setenv("MLFLOW_TRACKING_URI", SERVER)
    assert _experiment_with(load_registry_config()) == ("specops", None)
    monkeypatch.setenv("SPECOPS_MLFLOW_ARTIFACTS", "s3://bucket/specops")
    assert _experiment_with(load_registry_config()) == ("specops", "s3://bucket/specops/specops")


def test_a_local_stores_experiments_keep_artifacts_under_the_project(tmp_path):
    config = RegistryConfig(tracking_uri=f"sqlite:///{tmp_path}/m.db")
    assert (
        _experiment_with(config)[1]
        == (PROJECT_ROOT / ".specops/mlflow/artifacts").resolve().as_uri() + "/specops"
    )


def test_a_replica_creating_the_experiment_meanwhile_is_no_error():
    from mlflow.exceptions import MlflowException
    from mlflow.protos.databricks_pb2 import RESOURCE_ALREADY_EXISTS

    class Racing(_Client):
        made = False

        def get_experiment_by_name(self, name):
            return SimpleNamespace(experiment_id="3") if self.made else None

        def create_experiment(self, name, artifact_location=None):
            self.made = True  # by another replica, just before this one
            raise MlflowException("exists", error_code=RESOURCE_ALREADY_EXISTS)

    registry = Registry.__new__(Registry)
    registry.config, registry.client = RegistryConfig(tracking_uri=SERVER), Racing()
    assert registry._experiment("specops") == "3"
