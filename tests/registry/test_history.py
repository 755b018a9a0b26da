"""Retrain records and a family's newest evaluated version, on a real MLflow SQLite store."""

import time

import pytest

from registry.client import RegistryError
from registry.history import last_retrain, log_retrain, newest_evaluated
from serving.engine.drafters.package import DraftManifest, write_package


def test_the_last_retrain_is_remembered_per_hardware_target(registry):
    assert last_retrain(registry, "cpu") is None
    before = time.time()
    log_retrain(registry, "cpu", "20261123T0330", {"challengers": ["t-head/1"]})
    at = last_retrain(registry, "cpu")
    assert at is not None and before - 1 <= at <= time.time() + 1
    assert last_retrain(registry, "cpu-stock") is None
    with pytest.raises(RegistryError, match="cannot name"):
        log_retrain(registry, "bad target!", "slot", {})


def test_the_newest_version_evaluated_on_a_target_is_found(registry, tmp_path):
    assert newest_evaluated(registry, "head", "cpu") is None  # no such family yet
    package = write_package(tmp_path / "p", DraftManifest(drafter="pld:3", k=4))
    first = registry.log_draft(package, family="head")
    second = registry.log_draft(package, family="head")
    registry.log_draft(package, family="head")  # never evaluated
    for draft in (first, second):
        registry.log_evaluation(draft, "cpu", {"mean_accepted_length": 1.5})
    assert newest_evaluated(registry, "head", "cpu").version == second.version
    assert newest_evaluated(registry, "head", "cpu-stock") is None
    # A version the watched champion rolled back is not one to continue from.
    registry.tag_version(second, "rolled_back.cpu", "watch: collapsed")
    assert newest_evaluated(registry, "head", "cpu").version == first.version
    # One the pre-gate judged (and left untimed) is.
    third = registry.log_draft(package, family="head")
    registry.tag_version(third, "pregate.cpu", "predicted modelled speedup 0.9, ...")
    assert newest_evaluated(registry, "head", "cpu").version == third.version


def test_a_slot_is_marked_once_however_often_its_retrain_runs(registry):
    """A crashed retrain rescheduled in the same slot keeps the one mark (the cool-down
    reads it); another slot gets its own."""
    first = log_retrain(registry, "cpu", "20261124T0330", {"challengers": []})
    again = log_retrain(registry, "cpu", "20261124T0330", {"challengers": ["suffix/1"]})
    other = log_retrain(registry, "cpu", "20261125T0330", {"challengers": []})
    assert first == again != other
    with pytest.raises(RegistryError, match="quotes"):
        log_retrain(registry, "cpu", "x' or '1", {})
