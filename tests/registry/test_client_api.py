"""``registry.client`` stays the one import of the registry's API: its parts live in
``registry.store``, ``registry.versions``, ``registry.promotion`` and
``registry.evaluations``, and ``Registry`` is composed of them."""

import inspect
import re

import pytest

import registry.client as client
from registry.evaluations import Evaluations
from registry.promotion import Promotions
from registry.store import RegistryStore
from registry.versions import DraftVersions

# What the rest of the repository imports from registry.client, and the other public names.
NAMES = (
    "ANY_CHAMPION",
    "CHALLENGER",
    "CHAMPION",
    "CONNECT_TIMEOUT_S",
    "LINEAGE_TAGS",
    "LOCK_TIMEOUT_S",
    "ROLLED_BACK",
    "DraftVersion",
    "ExpectedChampion",
    "Registry",
    "RegistryError",
    "alias",
    "check_store",
    "promotion_lock_path",
)

# Every method of Registry: the public ones, and the private ones registry's other modules
# (predictor, history, shadow) and the tests call.
METHODS = [
    "by_alias",
    "challengers",
    "champion",
    "clear_rollback",
    "download",
    "download_export",
    "families",
    "find_version",
    "get",
    "lineage",
    "log_draft",
    "log_evaluation",
    "log_export",
    "log_report",
    "model_name",
    "previous_champion",
    "promote",
    "resolve",
    "rollback",
    "set_challenger",
    "tag_version",
    "_alias_lock",
    "_audit",
    "_by_alias",
    "_check_reachable",
    "_discard",
    "_ensure_model",
    "_experiment",
    "_family_of",
    "_fetch",
    "_get",
    "_last_promotion",
    "_log_version",
    "_point",
    "_run",
    "_store",
    "_version",
]


def test_the_public_names_are_importable_from_the_client():
    assert set(NAMES) <= set(dir(client))
    assert set(client.__all__) == set(NAMES)


def test_the_registry_is_its_four_parts_and_keeps_every_method():
    assert client.Registry.__mro__[1:] == (
        Promotions,
        Evaluations,
        DraftVersions,
        RegistryStore,
        object,
    )
    for name in METHODS:
        assert inspect.isfunction(getattr(client.Registry, name, None)), name


def test_alias_names_and_their_errors_are_unchanged():
    assert client.alias(client.CHAMPION, "cpu-int8") == "champion-cpu-int8"
    assert client.alias(client.CHALLENGER, "cpu") == "challenger-cpu"
    for role, hardware, message in (
        ("boss", "cpu", "unknown alias role 'boss'; use 'champion' or 'challenger'"),
        ("champion", "../x", "hardware target '../x' cannot name an alias"),
    ):
        with pytest.raises(client.RegistryError, match=f"^{re.escape(message)}$"):
            client.alias(role, hardware)
