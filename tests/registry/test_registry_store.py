"""A store that does not answer gives one error naming its URI (password masked), before or
during an operation; a registration that fails half-way leaves no run and no version; and
evaluation and report runs keep their lineage tags."""

from __future__ import annotations

import sys

import mlflow
import pytest
from mlflow.exceptions import MlflowException

from registry.client import Registry, RegistryError
from registry.config import RegistryConfig, load_registry_config
from serving.engine.drafters.package import DraftManifest, write_package

DEAD_POSTGRES = "postgresql://user:secret@127.0.0.1:1/db"  # nothing listens on port 1
LINEAGE = {"data_version": "dvc:abc parts:123", "git_commit": "0f1e2d"}


@pytest.fixture
def package(tmp_path):
    return write_package(tmp_path / "pkg", DraftManifest(drafter="pld:3"))


def _runs(registry, deleted: bool = False):
    from mlflow.entities import ViewType

    view = ViewType.DELETED_ONLY if deleted else ViewType.ACTIVE_ONLY
    return registry.client.search_runs([registry.experiment_id], run_view_type=view)


# --- unreachable stores --------------------------------------------------------------------
def test_an_unreachable_database_names_the_masked_uri():
    with pytest.raises(RegistryError) as error:
        Registry(RegistryConfig(tracking_uri=DEAD_POSTGRES, artifact_root="s3://b/x"))
    message = str(error.value)
    assert "postgresql://user:***@127.0.0.1:1/db" in message and "unreachable" in message
    assert "secret" not in message
    assert len(message.splitlines()) == 1


def test_a_missing_database_driver_says_what_to_install(monkeypatch):
    monkeypatch.setitem(sys.modules, "psycopg2", None)  # import psycopg2 fails
    monkeypatch.setenv("MLFLOW_TRACKING_URI", DEAD_POSTGRES)
    with pytest.raises(RegistryError) as error:
        Registry(load_registry_config())
    message = str(error.value)
    assert "driver for 'postgresql://user:***@127.0.0.1:1/db'" in message
    assert "install specops[postgres]" in message
    assert "from environment variable MLFLOW_TRACKING_URI" in message
    assert "secret" not in message


def test_an_unreachable_server_names_where_its_uri_was_set(monkeypatch):
    monkeypatch.setenv("SPECOPS_MLFLOW_URI", "http://u:secret@127.0.0.1:9")
    with pytest.raises(RegistryError) as error:
        Registry(load_registry_config())
    message = str(error.value)
    assert "'http://u:***@127.0.0.1:9' (tracking_uri, from environment variable " in message
    assert "unreachable" in message and "secret" not in message


def _dies(*args, **kwargs):
    raise MlflowException("API request to http://mlflow.internal:5000 failed: Connection refused")


def test_a_store_that_dies_mid_way_is_one_error_naming_it(registry, package, monkeypatch):
    draft = registry.log_draft(package, family="head")
    registry.log_evaluation(draft, "cpu", {"speedup": 1.5})
    for method in (
        "search_registered_models",
        "get_model_version_by_alias",
        "get_model_version",
        "set_model_version_tag",
    ):
        monkeypatch.setattr(registry.client, method, _dies)
    calls = {
        "champion": lambda: registry.champion("cpu"),
        "by_alias": lambda: registry.by_alias("head", "champion-cpu"),
        "get": lambda: registry.get("head", draft.version),
        "promote": lambda: registry.promote(draft, "cpu", reason="test"),
        "log_evaluation": lambda: registry.log_evaluation(draft, "cpu", {"speedup": 1.0}),
    }
    for name, call in calls.items():
        with pytest.raises(RegistryError) as error:
            call()
        message = str(error.value)
        assert f"the MLflow store at {registry.shown_uri!r} failed" in message, name
        assert "Connection refused" in message, name


def test_a_missing_alias_is_none_but_a_failing_store_is_not(registry, monkeypatch):
    assert registry.by_alias("nobody", "champion-cpu") is None
    monkeypatch.setattr(registry.client, "get_model_version_by_alias", _dies)
    with pytest.raises(RegistryError, match="failed"):
        registry.by_alias("nobody", "champion-cpu")


# --- no partial registration -----------------------------------------------------------------
def test_a_failed_version_creation_leaves_no_run_and_no_version(registry, package, monkeypatch):
    monkeypatch.setattr(registry.client, "create_model_version", _dies)
    with pytest.raises(RegistryError, match="cannot register a new version of t-head") as error:
        registry.log_draft(package, family="head", tags=LINEAGE)
    assert registry.shown_uri in str(error.value)
    assert registry.client.search_model_versions("name = 't-head'") == []
    assert _runs(registry) == []
    assert len(_runs(registry, deleted=True)) == 1


def test_a_failed_artifact_upload_leaves_no_run_and_no_version(registry, package, monkeypatch):
    def upload_fails(*args, **kwargs):
        raise OSError("the artifact store went away")

    monkeypatch.setattr(mlflow, "log_artifacts", upload_fails)
    with pytest.raises(RegistryError, match="the artifact store went away"):
        registry.log_draft(package, family="head")
    assert "head" not in registry.families()
    assert _runs(registry) == [] and len(_runs(registry, deleted=True)) == 1


def test_a_version_created_too_late_is_removed_too(registry, package, monkeypatch):
    """The server made the version but its answer was lost: the version goes with the run."""
    create = registry.client.create_model_version

    def created_then_lost(*args, **kwargs):
        create(*args, **kwargs)
        raise MlflowException("read timed out")

    monkeypatch.setattr(registry.client, "create_model_version", created_then_lost)
    with pytest.raises(RegistryError, match="read timed out"):
        registry.log_draft(package, family="head")
    assert registry.client.search_model_versions("name = 't-head'") == []


def test_a_failing_cleanup_never_hides_the_original_error(registry, package, monkeypatch):
    monkeypatch.setattr(registry.client, "create_model_version", _dies)
    monkeypatch.setattr(registry.client, "delete_run", _dies)
    monkeypatch.setattr(registry.client, "search_model_versions", _dies)
    with pytest.raises(RegistryError, match="Connection refused"):
        registry.log_draft(package, family="head")


def test_a_failed_evaluation_leaves_the_version_unevaluated(registry, package, monkeypatch):
    draft = registry.log_draft(package, family="head")
    monkeypatch.setattr(registry.client, "set_model_version_tag", _dies)
    with pytest.raises(RegistryError):
        registry.log_evaluation(draft, "cpu", {"speedup": 1.5})
    monkeypatch.undo()
    assert not registry.get("head", draft.version).evaluated_on("cpu")
    kinds = [run.data.tags["kind"] for run in _runs(registry)]
    assert kinds == ["draft"]  # the evaluation run is gone


# --- lineage on evaluation and report runs -----------------------------------------------------
def test_evaluation_and_report_runs_keep_their_lineage(registry, package, tmp_path):
    draft = registry.log_draft(package, family="head", tags=LINEAGE)
    run_id = registry.log_evaluation(draft, "cpu", {"speedup": 1.5}, tags=LINEAGE)
    tags = registry.client.get_run(run_id).data.tags
    assert {k: tags[k] for k in LINEAGE} == LINEAGE and tags["kind"] == "evaluation"
    # Lineage never overrides what the run is.
    run_id = registry.log_evaluation(draft, "cpu", {"speedup": 1.5}, tags={"kind": "x"})
    assert registry.client.get_run(run_id).data.tags["kind"] == "evaluation"
    report = registry.log_report("report", [], tags=LINEAGE)
    assert registry.client.get_run(report).data.tags["git_commit"] == "0f1e2d"


def test_lineage_gathers_runs_evaluations_aliases_and_promotions(registry, package):
    draft = registry.log_draft(package, family="head", tags=LINEAGE)
    evaluation = registry.log_evaluation(draft, "cpu", {"speedup": 1.5}, tags=LINEAGE)
    registry.log_evaluation(draft, "cpu-stock", {"speedup": 1.2})  # no lineage given
    promotion = registry.promote(registry.get("head", draft.version), "cpu", reason="faster")
    shown = registry.lineage(registry.get("head", draft.version))
    assert shown["lineage"] == LINEAGE
    assert shown["run"]["run_id"] == draft.run_id and shown["run"]["lineage"] == LINEAGE
    assert shown["evaluations"]["cpu"]["run_id"] == evaluation
    assert shown["evaluations"]["cpu"]["lineage"] == LINEAGE
    assert shown["evaluations"]["cpu-stock"]["lineage"] == {}
    assert shown["aliases"] == ["champion-cpu"]
    assert [(p["run_id"], p["action"], p["reason"]) for p in shown["promotions"]] == [
        (promotion, "promote", "faster")
    ]
