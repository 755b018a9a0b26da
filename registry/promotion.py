"""Aliases per hardware target, promotion with a record, rollback.

Aliases are per hardware target: ``challenger-<hw>`` marks the candidate under
evaluation, ``champion-<hw>`` what serves. A promotion may cross families (a head draft
displacing an n-gram drafter), so the alias is first set on the new version and then
removed from the old one; while both exist, the newer ``promoted_at.<hw>`` tag wins, so a
reader never sees a target without a champion, nor a stale one. Promotion refuses a
version that has not been evaluated on that hardware target, and every promotion and
rollback is an MLflow run (experiment ``<experiment>-promotions``) with its reason,
metrics and gate results: the audit trail that rollback reads. Promotion on a target
served by another backend (``configs/hardware.yaml``) needs the version's export for that
backend (:mod:`registry.versions`): what was evaluated there is exactly what will serve
there.

Two flows may promote on the same target at once. Every alias move (promotion, rollback)
holds a file lock per registry store and hardware target (:func:`promotion_lock_path`), and
re-reads the champion inside it; a promotion given ``expected_champion`` (the champion its
evaluation compared against) is refused when the champion has moved since, so a draft is
never promoted over one it was not measured against. The lock serialises the processes
that share a file system (one machine, or a shared SQLite store); promotions from other
machines against a remote tracking server are checked (compare-and-swap) but not
serialised, and leave a window of a few requests between the check and the move.
"""

from __future__ import annotations

import enum
import hashlib
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Literal

from registry.store import RegistryError
from registry.versions import DraftVersion, DraftVersions
from serving.hardware import hardware_target
from serving.models.real import cache_root

CHAMPION = "champion"
CHALLENGER = "challenger"
LOCK_TIMEOUT_S = 120.0  # a promotion takes well under a second; longer means a stuck holder


class _AnyChampion(enum.Enum):
    ANY = "any"


ROLLED_BACK = "rolled_back"  # version tag rolled_back.<hw>: held out of promotion there
ANY_CHAMPION = _AnyChampion.ANY
"""``promote(expected_champion=ANY_CHAMPION)``: promote whatever the champion is now."""
ExpectedChampion = str | None | Literal[_AnyChampion.ANY]


def alias(role: str, hardware: str) -> str:
    """``<role>-<hw>``, the alias name; the hardware name is checked (it names a file too)."""
    if role not in (CHAMPION, CHALLENGER):
        raise RegistryError(f"unknown alias role {role!r}; use {CHAMPION!r} or {CHALLENGER!r}")
    if not hardware or not all(c.isalnum() or c in "-_" for c in hardware):
        raise RegistryError(f"hardware target {hardware!r} cannot name an alias")
    return f"{role}-{hardware}"


def promotion_lock_path(tracking_uri: str, hardware: str) -> Path:
    """The file lock that serialises alias moves on ``hardware`` in one tracking store:
    beside the database for SQLite, else under ``<specops cache>/locks/`` keyed by the
    store's URI."""
    alias(CHAMPION, hardware)  # a safe file name
    if tracking_uri.startswith("sqlite:///"):
        database = Path(tracking_uri.removeprefix("sqlite:///"))
        return database.with_name(f"{database.name}.promote-{hardware}.lock")
    store = hashlib.sha256(tracking_uri.encode()).hexdigest()[:16]
    return cache_root() / "locks" / f"{store}-promote-{hardware}.lock"


def _shown(label: str | None) -> str:
    return label if label is not None else "none (plain decoding)"


class Promotions(DraftVersions):
    """The ``challenger-<hw>`` and ``champion-<hw>`` aliases, and the audited moves of the
    champion: promotion, rollback."""

    def set_challenger(self, draft: DraftVersion, hardware: str) -> None:
        name = alias(CHALLENGER, hardware)
        with self._store(f"point {name} at {draft.label}"):
            self.client.set_registered_model_alias(draft.name, name, draft.version)

    def challengers(self, hardware: str) -> list[DraftVersion]:
        """The versions holding ``challenger-<hw>`` (the last evaluated there, per family)."""
        name = alias(CHALLENGER, hardware)
        with self._store(f"read the challengers of {hardware!r}"):
            return [d for family in self.families() if (d := self.by_alias(family, name))]

    def champion(self, hardware: str) -> DraftVersion | None:
        """What serves on ``hardware``: the newest promotion among the families that hold
        ``champion-<hw>`` (during a cross-family promotion two briefly do)."""
        name = alias(CHAMPION, hardware)
        with self._store(f"read the champion of {hardware!r}"):
            families = self.families()
            holders = [draft for family in families if (draft := self.by_alias(family, name))]
        if not holders:
            return None
        return max(holders, key=lambda d: float(d.tags.get(f"promoted_at.{hardware}", "0")))

    def previous_champion(self, hardware: str) -> DraftVersion | None:
        """The version the newest promotion on ``hardware`` displaced (what a rollback would
        restore), or None."""
        with self._store(f"read the previous champion of {hardware!r}"):
            last = self._last_promotion(hardware)
            if last is None:
                return None
            family = last.data.tags.get("previous_family")
            version = last.data.tags.get("previous_version")
            return self.get(family, version) if family and version else None

    def promote(
        self,
        draft: DraftVersion,
        hardware: str,
        *,
        reason: str,
        metrics: dict[str, float] | None = None,
        gates: dict[str, Any] | None = None,
        expected_champion: ExpectedChampion = ANY_CHAMPION,
    ) -> str:
        """Make ``draft`` the champion of ``hardware``; return the promotion run's id.

        ``expected_champion`` is the label of the champion the evaluation behind this
        promotion compared against (``None``: there was none); when the champion has moved
        since, the promotion is refused and ``draft`` must be re-evaluated. The default,
        :data:`ANY_CHAMPION`, promotes over whatever serves now. The checks, the audit run
        and the alias move happen under the target's lock (:func:`promotion_lock_path`)."""
        with self._store(f"promote {draft.label} on {hardware!r}"), self._alias_lock(hardware):
            current = self.get(draft.family, draft.version)  # exists, with fresh tags
            held = current.tags.get(f"{ROLLED_BACK}.{hardware}")
            if held is not None:
                raise RegistryError(
                    f"{draft.label} was rolled back on {hardware!r} ({held}); examine it, then "
                    f"clear it with `specops registry clear-rollback {draft.family} "
                    f"{draft.version} --hardware {hardware}` before promoting it again"
                )
            if not current.evaluated_on(hardware):
                raise RegistryError(
                    f"{draft.label} has not been evaluated on {hardware!r}; evaluate it there "
                    "before promoting it"
                )
            backend = hardware_target(hardware).backend
            if backend != "transformers" and f"export.{backend}" not in current.tags:
                raise RegistryError(
                    f"{draft.label} has no {backend} export; hardware target {hardware!r} "
                    "serves on that backend, so evaluate the exported draft there first"
                )
            previous = self.champion(hardware)
            found = previous.label if previous else None
            if expected_champion is not ANY_CHAMPION and found != expected_champion:
                raise RegistryError(
                    f"the champion of {hardware!r} moved from {_shown(expected_champion)} to "
                    f"{_shown(found)} since the evaluation that justified promoting "
                    f"{draft.label}; re-evaluate {draft.label} against the new champion"
                )
            run_id = self._audit(
                "promote",
                hardware,
                draft=current,
                previous=previous,
                reason=reason,
                metrics=metrics,
                gates=gates,
            )
            self._point(current, hardware, previous)
        return run_id

    def rollback(
        self,
        hardware: str,
        *,
        reason: str = "rollback",
        expected_champion: ExpectedChampion = ANY_CHAMPION,
        hold: bool = False,
    ) -> DraftVersion:
        """Give ``champion-<hw>`` back to the version the last promotion displaced.

        ``expected_champion``: the label of the champion the caller judged; when another
        serves now (a promotion or a rollback came first), nothing moves and a
        :class:`RegistryError` says so — two watchers racing on one collapse move the alias
        once. ``hold`` tags the displaced version ``rolled_back.<hw>`` with the reason, so
        that no promotion puts it back unexamined (:meth:`clear_rollback` lifts it)."""
        with self._store(f"roll back {hardware!r}"), self._alias_lock(hardware):
            serving = self.champion(hardware)
            found = serving.label if serving else None
            if expected_champion is not ANY_CHAMPION and found != expected_champion:
                raise RegistryError(
                    f"the champion of {hardware!r} is {_shown(found)}, not "
                    f"{_shown(expected_champion)}: it moved since it was judged; "
                    "nothing rolled back"
                )
            last = self._last_promotion(hardware)
            if last is None:
                raise RegistryError(f"no promotion on {hardware!r} to roll back")
            family, version = (
                last.data.tags.get("previous_family"),
                last.data.tags.get("previous_version"),
            )
            if not family or not version:
                raise RegistryError(
                    f"the last promotion on {hardware!r} had no previous champion to return to"
                )
            target = self.get(family, version)
            current = serving
            self._audit("rollback", hardware, draft=target, previous=current, reason=reason)
            if hold and current is not None:
                self.client.set_model_version_tag(
                    current.name, current.version, f"{ROLLED_BACK}.{hardware}", reason
                )
            self._point(target, hardware, current)
            self.client.set_tag(last.info.run_id, "rolled_back", "true")
        return target

    def clear_rollback(self, draft: DraftVersion, hardware: str) -> bool:
        """Lift the hold a rollback put on ``draft`` on ``hardware`` (an operator examined
        it); whether there was one."""
        key = f"{ROLLED_BACK}.{hardware}"
        with self._store(f"clear the rollback of {draft.label} on {hardware!r}"):
            current = self.get(draft.family, draft.version)
            if key not in current.tags:
                return False
            self.client.delete_model_version_tag(draft.name, draft.version, key)
        return True

    def _last_promotion(self, hardware: str):
        """The audit run of the newest promotion on ``hardware`` not rolled back, or None."""
        from mlflow.entities import ViewType

        runs = self.client.search_runs(
            [self.promotions_id],
            filter_string=(
                f"tags.hardware = '{hardware}' and tags.action = 'promote' "
                "and tags.rolled_back = 'false'"
            ),
            run_view_type=ViewType.ACTIVE_ONLY,
            order_by=["attributes.start_time DESC"],
            max_results=1,
        )
        return runs[0] if runs else None

    @contextmanager
    def _alias_lock(self, hardware: str) -> Iterator[None]:
        """Hold the lock of ``hardware``'s aliases in this tracking store."""
        from filelock import FileLock, Timeout

        path = promotion_lock_path(self.registry_uri, hardware)
        path.parent.mkdir(parents=True, exist_ok=True)
        lock = FileLock(path, timeout=LOCK_TIMEOUT_S)
        try:
            lock.acquire()
        except Timeout:
            raise RegistryError(
                f"another promotion on {hardware!r} has held {str(path)!r} for over "
                f"{LOCK_TIMEOUT_S:.0f} s; wait for it to finish, then promote again"
            ) from None
        try:
            yield
        finally:
            lock.release()

    def _point(self, draft: DraftVersion, hardware: str, previous: DraftVersion | None) -> None:
        name = alias(CHAMPION, hardware)
        self.client.set_model_version_tag(
            draft.name, draft.version, f"promoted_at.{hardware}", repr(time.time())
        )
        self.client.set_registered_model_alias(draft.name, name, draft.version)
        if previous is not None and previous.name != draft.name:
            self.client.delete_registered_model_alias(previous.name, name)

    def _audit(
        self,
        action: str,
        hardware: str,
        *,
        draft: DraftVersion,
        previous: DraftVersion | None,
        reason: str,
        metrics: dict[str, float] | None = None,
        gates: dict[str, Any] | None = None,
    ) -> str:
        record = {
            "action": action,
            "hardware": hardware,
            "family": draft.family,
            "version": draft.version,
            "previous_family": previous.family if previous else "",
            "previous_version": previous.version if previous else "",
            "reason": reason,
            "rolled_back": "false",
        }
        with self._run(
            experiment_id=self.promotions_id, run_name=f"{action}-{hardware}-{draft.label}"
        ) as run:
            self._mlflow.set_tags(record)
            if metrics:
                self._mlflow.log_metrics({f"{hardware}/{k}": float(v) for k, v in metrics.items()})
            self._mlflow.log_dict(
                {**record, "metrics": metrics or {}, "gates": gates or {}, "at": time.time()},
                "promotion.json",
            )
        return run.info.run_id
