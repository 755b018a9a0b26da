"""What the registry writes to MLflow (tests/fixtures/contracts/mlflow.json): registered
model names and tags, version tags and aliases, run names, tags, params, metric keys and
artifact paths, as registering drafts, logging an evaluation file, promoting and rolling
back wrote them on a SQLite store. Today's registry, driven the same way on a fresh store,
writes the same names."""

from __future__ import annotations

import pytest

from registry.client import CHALLENGER, CHAMPION, LINEAGE_TAGS, alias

pytestmark = pytest.mark.usefixtures("one_thread")  # tiny models: see tests/conftest.py


@pytest.fixture(scope="module")
def stored(gen, fixtures):
    return gen.read_json(fixtures / "mlflow.json")


def test_the_stored_names_are_the_registrys_own(stored):
    # The alias and tag names the registry's readers look for (registry/client.py).
    aliases = {a for m in stored["registered_models"].values() for a in m["aliases"]}
    assert aliases == {alias(CHAMPION, "cpu"), alias(CHALLENGER, "cpu")}
    head = stored["registered_models"]["specops-draft-head"]["versions"]["1"]["tags"]
    assert set(LINEAGE_TAGS) <= set(head) and "evaluated.cpu" in head


def test_todays_registry_writes_the_same(gen, world, built, fixtures, stored, new_mlflow_store):
    uri = new_mlflow_store(world.work / "mlflow-again" / "mlflow.db")
    again = gen.build_mlflow(world, built, fixtures / "evaluation.json", tracking_uri=uri)
    assert gen.name_paths(again) == gen.name_paths(stored)  # names what changed
    assert again == stored
