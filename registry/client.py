"""The draft registry on MLflow: runs, draft versions, aliases per hardware target,
promotion with a record, rollback. This package is the only code that talks to MLflow.

:class:`Registry` is composed of one part per concern, each in its module:

- :mod:`registry.store`: the connection: where the store is, whether it answers, the
  experiments, one :class:`RegistryError` for any failure of the store;
- :mod:`registry.versions`: draft versions: registering a draft package, reading versions
  (by number, label, alias, tag), tags, exports and downloads;
- :mod:`registry.promotion`: the per-target aliases, promotion under a lock with
  compare-and-swap, and rollback, each with its audit run;
- :mod:`registry.evaluations`: evaluation and report runs, and a version's lineage.

The names other code imports from here (:class:`DraftVersion`, :func:`alias`,
:func:`check_store`, :func:`promotion_lock_path`, ...) are re-exported below.

The acceptance predictor is registered beside the drafts, as one model outside the draft
prefix with the same per-target aliases (:mod:`registry.predictor`, through this client).
"""

from __future__ import annotations

from registry.evaluations import LINEAGE_TAGS, Evaluations
from registry.promotion import (
    ANY_CHAMPION,
    CHALLENGER,
    CHAMPION,
    LOCK_TIMEOUT_S,
    ROLLED_BACK,
    ExpectedChampion,
    Promotions,
    alias,
    promotion_lock_path,
)
from registry.store import CONNECT_TIMEOUT_S, RegistryError, RegistryStore, check_store
from registry.versions import DraftVersion, DraftVersions

__all__ = [
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
]


class Registry(Promotions, Evaluations, DraftVersions, RegistryStore):
    """The draft registry in one MLflow store: ``Registry()`` connects to the store of
    ``configs/registry.yaml`` (flags and environment first, :mod:`registry.config`), or of
    ``config``, and fails with one :class:`RegistryError` if it does not answer.

    Its parts: the connection (:class:`~registry.store.RegistryStore`), draft versions
    (:class:`~registry.versions.DraftVersions`), aliases and promotion
    (:class:`~registry.promotion.Promotions`), evaluations and lineage
    (:class:`~registry.evaluations.Evaluations`)."""
