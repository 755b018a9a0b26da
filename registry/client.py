"""The draft registry on MLflow: runs, draft versions, aliases per hardware target,
promotion with a record, rollback. The only module (with its package) that talks to MLflow.

Model: one registered model per draft family (``<prefix>-ngram``, ``<prefix>-head``, ...);
a version is a draft package (:mod:`serving.engine.drafters.package`) logged as a run's artifact.
Aliases are per hardware target: ``challenger-<hw>`` marks the candidate under
evaluation, ``champion-<hw>`` what serves. A promotion may cross families (a head draft
displacing an n-gram drafter), so the alias is first set on the new version and then
removed from the old one; while both exist, the newer ``promoted_at.<hw>`` tag wins, so a
reader never sees a target without a champion, nor a stale one. Promotion refuses a
version that has not been evaluated on that hardware target, and every promotion and
rollback is an MLflow run (experiment ``<experiment>-promotions``) with its reason,
metrics and gate results: the audit trail that rollback reads.

Two flows may promote on the same target at once. Every alias move (promotion, rollback)
holds a file lock per registry store and hardware target (:func:`promotion_lock_path`), and
re-reads the champion inside it; a promotion given ``expected_champion`` (the champion its
evaluation compared against) is refused when the champion has moved since, so a draft is
never promoted over one it was not measured against. The lock serialises the processes
that share a file system (one machine, or a shared SQLite store); promotions from other
machines against a remote tracking server are checked (compare-and-swap) but not
serialised, and leave a window of a few requests between the check and the move.

A draft version carries its lineage: the tags given to :meth:`Registry.log_draft` (data
version, git commit, ...) go on both the run and the model version, and its training
curves are the run's metrics, one point per step. Evaluation and report runs take lineage
tags too (:meth:`Registry.log_evaluation`, :meth:`Registry.log_report`);
:meth:`Registry.lineage` gathers a version's (``specops registry show VERSION``).

Where the store is comes from :mod:`registry.config` (flags, environment, file). A store
that does not answer fails construction with one :class:`RegistryError` naming its URI
(password masked) and where it was set; one that fails later (the server died mid-way)
fails the operation the same way. A registration that fails after its run was created
deletes the run, so no half-logged version is left: a version is only created once all
its artifacts are logged.

The acceptance predictor is registered beside the drafts, as one model outside the draft
prefix with the same per-target aliases (:mod:`registry.predictor`, through this client).

Per-target artifacts: a version's draft exported to another backend's format
(:mod:`tasks.evaluate.export`) is logged beside its package, under ``exports/<backend>`` of the
same run, and the version is tagged ``export.<backend>``. Promotion on a target served by
another backend (``configs/hardware.yaml``) needs that export: what was evaluated there
is exactly what will serve there.
"""

from __future__ import annotations

import enum
import hashlib
import logging
import math
import re
import shutil
import tempfile
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Literal

from registry.config import RegistryConfig, load_registry_config, mask_uri, store_kind
from registry.labels import LABEL_PATTERN
from serving.atomic import replace_dir
from serving.backends.exports import read_export
from serving.engine.drafters.package import read_manifest
from serving.errors import BadInputError, SpecOpsError
from serving.hardware import hardware_target
from serving.models.real import cache_root

log = logging.getLogger(__name__)

CHAMPION = "champion"
CHALLENGER = "challenger"
LOCK_TIMEOUT_S = 120.0  # a promotion takes well under a second; longer means a stuck holder
CONNECT_TIMEOUT_S = 5.0  # the reachability check of a tracking server or database
_METRICS_PER_BATCH = 1000  # MLflow's limit per log_batch call


class _AnyChampion(enum.Enum):
    ANY = "any"


ROLLED_BACK = "rolled_back"  # version tag rolled_back.<hw>: held out of promotion there
ANY_CHAMPION = _AnyChampion.ANY
"""``promote(expected_champion=ANY_CHAMPION)``: promote whatever the champion is now."""
ExpectedChampion = str | None | Literal[_AnyChampion.ANY]


class RegistryError(SpecOpsError, RuntimeError):
    """The registry could not be reached, or refused an operation (the reason says why)."""


_ABSENT = ("RESOURCE_DOES_NOT_EXIST", "INVALID_PARAMETER_VALUE")


def _absent(error: Exception) -> bool:
    """An MLflow answer meaning "no such model, version or alias", as opposed to a store
    that failed (unreachable, broken): only the former may read as "none"."""
    return getattr(error, "error_code", None) in _ABSENT


def _brief(error: BaseException, secret: str | None = None) -> str:
    """The first line of ``error``'s message (of its DB-API cause for SQLAlchemy), without
    ``secret``."""
    cause = getattr(error, "orig", None) or error
    text = (str(cause).strip().splitlines() or [type(cause).__name__])[0]
    if len(text) > _BRIEF_CHARS:  # MLflow's REST errors quote the whole request
        reason = re.search(r"\[Errno -?\d+\][^\"')]*", text)
        text = f"{text[: _BRIEF_CHARS // 2]} ... {reason.group(0) if reason else text[-80:]}"
    return text.replace(secret, "***") if secret else text


_BRIEF_CHARS = 240


_DRIVER_HINT = {
    "postgresql": "install specops[postgres] (pip install 'specops[postgres]')",
    "mysql": "install mysqlclient, or pymysql with a mysql+pymysql:// URI",
    "mssql": "install pyodbc",
}


def check_store(uri: str, named: str) -> None:
    """Fail with one :class:`RegistryError` naming ``uri`` (its password masked) and
    ``named`` (which key, from which layer) unless the store answers: an http(s) server's
    ``/health``, a database's connection (its driver installed first); a SQLite store's
    folder is made."""
    shown = mask_uri(uri)
    if uri.startswith("sqlite:///"):
        Path(uri.removeprefix("sqlite:///")).parent.mkdir(parents=True, exist_ok=True)
        return
    if uri.startswith(("http://", "https://")):
        import httpx

        try:
            httpx.get(uri.rstrip("/") + "/health", timeout=CONNECT_TIMEOUT_S).raise_for_status()
        except httpx.HTTPError as error:
            raise RegistryError(
                f"the MLflow tracking server at {shown!r} ({named}) is unreachable "
                f"({_brief(error)}); start it, or point the registry elsewhere "
                "(docs/configuration.md: --tracking-uri, MLFLOW_TRACKING_URI, "
                "configs/registry.yaml)"
            ) from None
        return
    if store_kind(uri) == "database":
        _check_database(uri, named)


def _check_database(uri: str, named: str) -> None:
    from sqlalchemy import create_engine
    from sqlalchemy.engine import make_url
    from sqlalchemy.exc import ArgumentError, NoSuchModuleError, SQLAlchemyError
    from sqlalchemy.pool import NullPool

    shown = mask_uri(uri)
    try:
        url = make_url(uri)
        dialect = url.get_dialect()
    except (ArgumentError, NoSuchModuleError, ValueError) as error:
        raise RegistryError(
            f"{shown!r} ({named}) is no database URL SQLAlchemy knows ({_brief(error)})"
        ) from None
    backend = url.get_backend_name()
    try:
        dialect.import_dbapi()
    except ImportError as error:
        hint = _DRIVER_HINT.get(backend, f"install the {backend} driver")
        raise RegistryError(
            f"the database driver for {shown!r} ({named}) is not installed "
            f"({_brief(error)}); {hint}"
        ) from None
    timeout = (
        {"connect_timeout": int(CONNECT_TIMEOUT_S)} if backend in ("postgresql", "mysql") else {}
    )
    engine = create_engine(url, connect_args=timeout, poolclass=NullPool)
    try:
        with engine.connect():
            pass
    except SQLAlchemyError as error:
        raise RegistryError(
            f"the tracking database at {shown!r} ({named}) is unreachable "
            f"({_brief(error, url.password)}); start it, check the URI and its credentials, "
            "or point the registry elsewhere (docs/configuration.md)"
        ) from None
    finally:
        engine.dispose()


def alias(role: str, hardware: str) -> str:
    """``<role>-<hw>``, the alias name; the hardware name is checked (it names a file too)."""
    if role not in (CHAMPION, CHALLENGER):
        raise RegistryError(f"unknown alias role {role!r}; use {CHAMPION!r} or {CHALLENGER!r}")
    if not hardware or not all(c.isalnum() or c in "-_" for c in hardware):
        raise RegistryError(f"hardware target {hardware!r} cannot name an alias")
    return f"{role}-{hardware}"


@dataclass(frozen=True)
class DraftVersion:
    family: str
    name: str  # the registered model
    version: str
    run_id: str
    source: str  # artifact URI of the draft package
    tags: dict[str, str] = field(default_factory=dict)

    @property
    def label(self) -> str:
        return f"{self.name}/{self.version}"

    def evaluated_on(self, hardware: str) -> bool:
        return bool(self.tags.get(f"evaluated.{hardware}"))


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


LINEAGE_TAGS = ("data_version", "git_commit")


def _lineage_tags(tags: dict[str, str]) -> dict[str, str]:
    """The lineage among ``tags`` (tasks.loop.lineage.lineage_tags): the data version and
    the git commit, those that are there."""
    return {key: tags[key] for key in LINEAGE_TAGS if tags.get(key)}


def _when(millis: int | None) -> str | None:
    """An MLflow timestamp (ms since the epoch) as ISO 8601 UTC."""
    if millis is None:
        return None
    moment = datetime.fromtimestamp(millis / 1000, tz=UTC)
    return moment.isoformat(timespec="seconds").replace("+00:00", "Z")


def _shown(label: str | None) -> str:
    return label if label is not None else "none (plain decoding)"


def _curve_metrics(curves: dict[str, Sequence[tuple[int, float]]]) -> list[Any]:
    """MLflow ``Metric`` entities for training curves, checked (a step is an int >= 0, a
    value a finite number) before anything is logged."""
    from mlflow.entities import Metric

    now = int(time.time() * 1000)
    entities = []
    for name, points in curves.items():
        for point in points:
            try:
                step, value = point
            except (TypeError, ValueError):
                raise RegistryError(
                    f"curve {name!r}: {point!r} is not a (step, value) pair"
                ) from None
            if isinstance(step, bool) or not isinstance(step, int) or step < 0:
                raise RegistryError(f"curve {name!r}: step {step!r} is not an integer >= 0")
            if isinstance(value, bool) or not isinstance(value, int | float):
                raise RegistryError(f"curve {name!r} at step {step}: {value!r} is not a number")
            if not math.isfinite(value):
                raise RegistryError(f"curve {name!r} at step {step}: {value} is not finite")
            entities.append(Metric(name, float(value), now, step))
    return entities


class Registry:
    def __init__(self, config: RegistryConfig | None = None) -> None:
        import mlflow
        from mlflow.tracking import MlflowClient

        self.config = config or load_registry_config()
        self.tracking_uri = self.config.resolved_tracking_uri()
        self.registry_uri = self.config.resolved_registry_uri()
        # What messages and printouts name: the store's URI, its password masked.
        self.shown_uri = mask_uri(self.tracking_uri)
        if self.registry_uri != self.tracking_uri:
            self.shown_uri += f" (registry {mask_uri(self.registry_uri)})"
        self._check_reachable()
        mlflow.set_tracking_uri(self.tracking_uri)
        self._mlflow = mlflow
        self.client = MlflowClient(tracking_uri=self.tracking_uri, registry_uri=self.registry_uri)
        try:
            self.experiment_id = self._experiment(self.config.experiment)
            self.promotions_id = self._experiment(f"{self.config.experiment}-promotions")
        except Exception as error:
            raise RegistryError(
                f"cannot use the MLflow tracking store at {self.shown_uri!r}: {_brief(error)}"
            ) from None

    # --- connection -------------------------------------------------------------------
    def _check_reachable(self) -> None:
        """One clear error, naming the URI and where it was set, if a store does not answer."""
        stores = {self.tracking_uri: "tracking_uri"}
        stores.setdefault(self.registry_uri, "registry_uri")  # once when they are the same
        for uri, key in stores.items():
            check_store(uri, f"{key}, from {self.config.origin(key)}")

    @contextmanager
    def _store(self, action: str) -> Iterator[None]:
        """Any failure of the store during ``action`` (the server died, the database went
        away) as one :class:`RegistryError` naming the store; specops' own errors pass."""
        try:
            yield
        except (SpecOpsError, TypeError, AttributeError, NameError, AssertionError):
            raise  # specops' own errors, and bugs (their traceback is wanted)
        except Exception as error:
            log.debug("%s failed against %s", action, self.shown_uri, exc_info=True)
            raise RegistryError(
                f"cannot {action}: the MLflow store at {self.shown_uri!r} failed ({_brief(error)})"
            ) from None

    def _experiment(self, name: str) -> str:
        """The experiment ``name``'s id, created if need be: in ``artifact_root`` when one is
        set (or the store is local), else where the tracking server puts artifacts."""
        from mlflow.exceptions import MlflowException

        found = self.client.get_experiment_by_name(name)
        if found is not None:
            return found.experiment_id
        root = self.config.resolved_artifact_root()
        location = None if root is None else f"{root.rstrip('/')}/{name}"
        try:
            return self.client.create_experiment(name, artifact_location=location)
        except MlflowException as error:
            if error.error_code != "RESOURCE_ALREADY_EXISTS":
                raise
            created = self.client.get_experiment_by_name(name)  # by another replica, meanwhile
            if created is None:
                raise
            return created.experiment_id

    # --- versions ---------------------------------------------------------------------
    def model_name(self, family: str) -> str:
        if not family or not all(c.isalnum() or c in "-_" for c in family):
            raise RegistryError(f"draft family {family!r} must be letters, digits, '-' or '_'")
        return f"{self.config.model_prefix}-{family}"

    def _version(self, family: str, mv) -> DraftVersion:
        return DraftVersion(
            family=family,
            name=mv.name,
            version=str(mv.version),
            run_id=mv.run_id or "",
            source=mv.source,
            tags=dict(mv.tags or {}),
        )

    def _family_of(self, name: str) -> str:
        return name.removeprefix(f"{self.config.model_prefix}-")

    def log_draft(
        self,
        package: str | Path,
        *,
        family: str,
        params: dict[str, Any] | None = None,
        metrics: dict[str, float] | None = None,
        tags: dict[str, str] | None = None,
        run_name: str | None = None,
        artifacts: dict[str, Path] | None = None,
        curves: dict[str, Sequence[tuple[int, float]]] | None = None,
    ) -> DraftVersion:
        """Log a draft package as a run's artifact and register it as a new version of its
        family. The package (and every curve) is checked first: a broken package never gets
        a version.

        ``tags`` (lineage: data version, git commit, ...) go on the run and on the model
        version. ``curves`` are training curves, ``name -> [(step, value), ...]``, logged
        as the run's metric histories (plotted by step in the MLflow UI)."""
        package = Path(package)
        manifest = read_manifest(package)
        return self._log_version(
            self.model_name(family),
            package,
            family=family,
            kind="draft",
            params={"family": family, "drafter": manifest.drafter, **(params or {})},
            metrics=metrics,
            tags=tags,
            run_name=run_name or f"draft-{family}",
            artifacts=artifacts,
            curves=curves,
            description=f"specops {family} drafts",
        )

    def _log_version(
        self,
        name: str,
        folder: Path,
        *,
        family: str,
        kind: str,
        params: dict[str, Any],
        metrics: dict[str, float] | None,
        tags: dict[str, str] | None,
        run_name: str,
        artifacts: dict[str, Path] | None,
        curves: dict[str, Sequence[tuple[int, float]]] | None,
        description: str,
    ) -> DraftVersion:
        """A run (experiment ``<experiment>``) holding ``folder`` under ``<kind>/`` with its
        params, metrics, curves and tags, registered as a new version of ``name`` (created
        if need be); ``tags`` go on the version too. The checked ``folder`` of a draft
        package (:meth:`log_draft`) or of an acceptance predictor (:mod:`registry.predictor`)."""
        points = _curve_metrics(curves or {})
        run_id: str | None = None
        with self._store(f"register a new version of {name}"):
            try:
                with self._run(experiment_id=self.experiment_id, run_name=run_name) as run:
                    run_id = run.info.run_id
                    self._mlflow.log_params(params)
                    if metrics:
                        self._mlflow.log_metrics(metrics)
                    self._mlflow.set_tags({"kind": kind, "family": family, **(tags or {})})
                    for start in range(0, len(points), _METRICS_PER_BATCH):
                        self.client.log_batch(
                            run_id, metrics=points[start : start + _METRICS_PER_BATCH]
                        )
                    self._mlflow.log_artifacts(str(folder), artifact_path=kind)
                    for artifact_name, path in (artifacts or {}).items():
                        self._mlflow.log_artifact(str(path), artifact_path=artifact_name)
                    source = f"{run.info.artifact_uri.rstrip('/')}/{kind}"
                # Only now, every artifact logged, does the version exist.
                self._ensure_model(name, family=family, description=description)
                mv = self.client.create_model_version(
                    name, source=source, run_id=run_id, tags={**(tags or {}), "family": family}
                )
            except BaseException:
                if run_id is not None:
                    self._discard(run_id, name)
                raise
        log.info("registered %s version %s", name, mv.version)
        return self._version(family, mv)

    def _ensure_model(self, name: str, *, family: str, description: str) -> None:
        from mlflow.exceptions import MlflowException

        try:
            self.client.get_registered_model(name)
            return
        except MlflowException as error:
            if not _absent(error):
                raise
        try:
            self.client.create_registered_model(
                name, tags={"family": family}, description=description
            )
        except MlflowException as error:
            if error.error_code != "RESOURCE_ALREADY_EXISTS":  # another replica made it
                raise

    def _discard(self, run_id: str, name: str | None = None) -> None:
        """Undo what failed half-way: delete any version of ``name`` made from run
        ``run_id`` (one whose creation answered too late) and the run. Best effort: a
        failure here is logged, never raised over the original error. A store that no
        longer answers is not asked (MLflow's client would retry for minutes): the run,
        which no version points at, is left for deleting by hand."""
        try:
            check_store(self.tracking_uri, "tracking_uri")
        except RegistryError:
            log.warning(
                "the store at %s does not answer; run %s (no version points at it) is left: "
                "delete it once the store is back (mlflow runs delete --run-id %s)",
                self.shown_uri, run_id, run_id,
            )  # fmt: skip
            return
        try:
            if name is not None:
                found = self.client.search_model_versions(
                    f"name = '{name}' and run_id = '{run_id}'"
                )
                for mv in found:
                    self.client.delete_model_version(name, mv.version)
        except Exception:
            log.warning(
                "could not look for versions of %s from run %s", name, run_id, exc_info=True
            )
        try:
            self.client.delete_run(run_id)
        except Exception:
            log.warning("could not delete the half-logged run %s", run_id, exc_info=True)

    def get(self, family: str, version: str | int) -> DraftVersion:
        return self._get(self.model_name(family), family, version)

    def _get(self, name: str, family: str, version: str | int) -> DraftVersion:
        from mlflow.exceptions import MlflowException

        with self._store(f"read {name} version {version}"):
            try:
                return self._version(family, self.client.get_model_version(name, str(version)))
            except MlflowException as error:
                if not _absent(error):
                    raise
        raise RegistryError(f"{name} has no version {str(version)!r}")

    def resolve(self, label: str) -> DraftVersion:
        """The version ``label`` names: ``<family>/<version>`` (``head/3``) or the full
        ``<registered model>/<version>`` (``specops-draft-head/3``)."""
        if not re.fullmatch(LABEL_PATTERN, label):
            raise BadInputError(
                f"{label!r} does not name a draft version; write FAMILY/VERSION (head/3) or "
                f"the full label ({self.config.model_prefix}-head/3)"
            )
        name, version = label.rsplit("/", 1)
        return self.get(name.removeprefix(f"{self.config.model_prefix}-"), version)

    def by_alias(self, family: str, alias_name: str) -> DraftVersion | None:
        return self._by_alias(self.model_name(family), family, alias_name)

    def _by_alias(self, name: str, family: str, alias_name: str) -> DraftVersion | None:
        from mlflow.exceptions import MlflowException

        with self._store(f"read alias {alias_name} of {name}"):
            try:
                mv = self.client.get_model_version_by_alias(name, alias_name)
            except MlflowException as error:
                if not _absent(error):
                    raise
                return None
        return self._version(family, mv)

    def find_version(self, name: str, family: str, **tags: str) -> DraftVersion | None:
        """The version of registered model ``name`` whose tags include ``tags`` (the
        oldest, if several), or None: how a re-run finds what its first run registered
        (``run_key``) instead of registering it twice."""
        for key, value in tags.items():
            if not re.fullmatch(r"[A-Za-z0-9_.]+", key) or "'" in value or "\\" in value:
                raise RegistryError(f"cannot search by tag {key}={value!r}")
        query = " and ".join([f"name = '{name}'", *(f"tags.{k} = '{v}'" for k, v in tags.items())])
        with self._store(f"search {name} by {tags}"):
            found = self.client.search_model_versions(query)
        if not found:
            return None
        return self._version(family, min(found, key=lambda mv: int(mv.version)))

    def families(self) -> list[str]:
        prefix = f"{self.config.model_prefix}-"
        with self._store("list the draft families"):
            models = self.client.search_registered_models(filter_string=f"name LIKE '{prefix}%'")
        return sorted(self._family_of(m.name) for m in models)

    # --- evaluation -------------------------------------------------------------------
    def log_evaluation(
        self,
        draft: DraftVersion,
        hardware: str,
        metrics: dict[str, float],
        *,
        report: dict[str, Any] | None = None,
        params: dict[str, Any] | None = None,
        artifacts: list[Path] | None = None,
        tags: dict[str, str] | None = None,
    ) -> str:
        """Record an evaluation of ``draft`` on ``hardware`` (metrics keyed by the target:
        ``<hw>/<metric>``) and mark the version as evaluated there. ``tags`` (lineage:
        ``data_version``, ``git_commit``) go on the evaluation run.

        The version is marked (``evaluated.<hw>``, pointing at the run) last; if anything
        before fails, the run is deleted and the version stays unmarked."""
        alias(CHAMPION, hardware)  # checks the name
        run_id: str | None = None
        with self._store(f"log the evaluation of {draft.label} on {hardware!r}"):
            try:
                with self._run(
                    experiment_id=self.experiment_id,
                    run_name=f"evaluate-{draft.family}-{hardware}",
                ) as run:
                    run_id = run.info.run_id
                    self._mlflow.set_tags(
                        {
                            **(tags or {}),
                            "kind": "evaluation",
                            "hardware": hardware,
                            "family": draft.family,
                            "draft": draft.label,
                        }
                    )
                    if params:
                        self._mlflow.log_params(params)
                    self._mlflow.log_metrics(
                        {f"{hardware}/{k}": float(v) for k, v in metrics.items()}
                    )
                    if report is not None:
                        self._mlflow.log_dict(report, f"evaluation-{hardware}.json")
                    for path in artifacts or []:
                        self._mlflow.log_artifact(str(path))
                for key, value in metrics.items():
                    self.client.set_model_version_tag(
                        draft.name, draft.version, f"{hardware}/{key}", repr(float(value))
                    )
                self.client.set_model_version_tag(
                    draft.name, draft.version, f"evaluated.{hardware}", run_id
                )
            except BaseException:
                if run_id is not None:
                    self._discard(run_id)
                raise
        return run_id

    def log_report(
        self,
        name: str,
        files: list[Path],
        *,
        metrics: dict[str, float] | None = None,
        tags: dict[str, str] | None = None,
    ) -> str:
        """A run holding a report's files (plots, JSON) and headline metrics; ``tags``
        (lineage: ``data_version``, ``git_commit``, ...) go on the run."""
        with (
            self._store(f"log the report {name!r}"),
            self._run(experiment_id=self.experiment_id, run_name=name) as run,
        ):
            self._mlflow.set_tags({"kind": "report", **(tags or {})})
            if metrics:
                self._mlflow.log_metrics(metrics)
            for path in files:
                self._mlflow.log_artifact(str(path))
        return run.info.run_id

    # --- lineage ----------------------------------------------------------------------
    def lineage(self, draft: DraftVersion) -> dict[str, Any]:
        """Where ``draft`` came from and where it went: its lineage (``data_version``,
        ``git_commit``: the version's tags, else its run's; empty when none was recorded),
        the run that produced it, its evaluation runs per hardware target (each with the
        lineage it was tagged with), the aliases it holds and its promotions (and
        rollbacks to it), oldest first."""
        from mlflow.exceptions import MlflowException

        def run_of(run_id: str) -> dict[str, Any]:
            try:
                run = self.client.get_run(run_id)
            except MlflowException as error:
                if not _absent(error):
                    raise
                return {"run_id": run_id, "found": False, "lineage": {}}
            return {
                "run_id": run_id,
                "found": True,
                "name": run.info.run_name,
                "status": run.info.status,
                "deleted": run.info.lifecycle_stage == "deleted",
                "started": _when(run.info.start_time),
                "lineage": _lineage_tags(run.data.tags),
            }

        with self._store(f"read the lineage of {draft.label}"):
            produced = run_of(draft.run_id) if draft.run_id else None
            evaluated = {
                key.removeprefix("evaluated."): run_of(run_id)
                for key, run_id in sorted(draft.tags.items())
                if key.startswith("evaluated.")
            }
            model = self.client.get_registered_model(draft.name)
            records = self.client.search_runs(
                [self.promotions_id],
                filter_string=(
                    f"tags.family = '{draft.family}' and tags.version = '{draft.version}'"
                ),
                order_by=["attributes.start_time ASC"],
            )
        held = [name for name, at in (model.aliases or {}).items() if str(at) == draft.version]
        promotions = [
            {
                "run_id": record.info.run_id,
                "at": _when(record.info.start_time),
                "action": record.data.tags.get("action", ""),
                "hardware": record.data.tags.get("hardware", ""),
                "previous": (
                    f"{record.data.tags['previous_family']}/{record.data.tags['previous_version']}"
                    if record.data.tags.get("previous_family")
                    else None
                ),
                "reason": record.data.tags.get("reason", ""),
                "rolled_back": record.data.tags.get("rolled_back") == "true",
            }
            for record in records
        ]
        return {
            "label": draft.label,
            "family": draft.family,
            "lineage": _lineage_tags(draft.tags) or (produced or {}).get("lineage", {}),
            "run": produced,
            "evaluations": evaluated,
            "aliases": sorted(held),
            "promotions": promotions,
        }

    # --- aliases, promotion, rollback -------------------------------------------------
    def set_challenger(self, draft: DraftVersion, hardware: str) -> None:
        name = alias(CHALLENGER, hardware)
        with self._store(f"point {name} at {draft.label}"):
            self.client.set_registered_model_alias(draft.name, name, draft.version)

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

    def challengers(self, hardware: str) -> list[DraftVersion]:
        """The versions holding ``challenger-<hw>`` (the last evaluated there, per family)."""
        name = alias(CHALLENGER, hardware)
        with self._store(f"read the challengers of {hardware!r}"):
            return [d for family in self.families() if (d := self.by_alias(family, name))]

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

    @contextmanager
    def _run(self, **kwargs: Any) -> Iterator[Any]:
        """``mlflow.start_run`` in this registry's store: the fluent API logs to the global
        tracking URI, which another :class:`Registry` (another store) may have moved."""
        self._mlflow.set_tracking_uri(self.tracking_uri)
        with self._mlflow.start_run(**kwargs) as run:
            yield run

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

    def tag_version(self, draft: DraftVersion, key: str, value: str) -> None:
        """Set tag ``key`` on ``draft``'s model version (a note the loop leaves on it, e.g.
        why the pre-gate did not time it: ``pregate.<target>``)."""
        with self._store(f"tag {draft.label} with {key!r}"):
            self.client.set_model_version_tag(draft.name, draft.version, key, value)

    # --- artifacts --------------------------------------------------------------------
    def log_export(self, draft: DraftVersion, backend: str, folder: str | Path) -> str:
        """Keep ``draft``'s export for ``backend`` in its run; return the artifact URI."""
        read_export(folder)  # a broken export is never logged
        path = f"exports/{backend}"
        uri = f"{draft.source.rsplit('/', 1)[0]}/{path}"
        with self._store(f"log the {backend} export of {draft.label}"):
            self.client.log_artifacts(draft.run_id, str(folder), artifact_path=path)
            self.client.set_model_version_tag(draft.name, draft.version, f"export.{backend}", uri)
        return uri

    def download_export(self, draft: DraftVersion, backend: str, cache: str | Path) -> Path:
        """The export of ``draft`` for ``backend`` in a local folder (reused once there)."""
        uri = self.get(draft.family, draft.version).tags.get(f"export.{backend}")
        if uri is None:
            raise RegistryError(f"{draft.label} has no export for backend {backend!r}")
        folder = Path(cache) / draft.name / f"{draft.version}-{draft.run_id}-{backend}"
        return self._fetch(draft, uri, folder, "export.json", read_export)

    def download(self, draft: DraftVersion, cache: str | Path) -> Path:
        """The draft package of ``draft`` in a local folder (a version never changes, so a
        downloaded copy is reused)."""
        # The run id makes the key unique across tracking stores: two stores can both
        # have a "specops-draft-suffix/1", with different contents.
        folder = Path(cache) / draft.name / f"{draft.version}-{draft.run_id}"
        return self._fetch(draft, draft.source, folder, "draft.json", read_manifest)

    def _fetch(self, draft: DraftVersion, uri: str, folder: Path, marker: str, check) -> Path:
        """Download ``uri`` into a temporary folder, check it, then rename it to ``folder``."""
        from mlflow.artifacts import download_artifacts

        if (folder / marker).is_file():
            return folder
        folder.parent.mkdir(parents=True, exist_ok=True)
        scratch = Path(tempfile.mkdtemp(dir=folder.parent, prefix=f".{draft.version}."))
        try:
            local = Path(
                download_artifacts(
                    artifact_uri=uri,
                    dst_path=str(scratch),
                    tracking_uri=self.tracking_uri,  # resolves mlflow-artifacts:/ URIs
                    registry_uri=self.registry_uri,
                )
            )
            check(local)
            replace_dir(local, folder)
        except Exception as error:
            if isinstance(error, SpecOpsError):
                raise
            raise RegistryError(f"cannot download {draft.label} from {uri}: {error}") from None
        finally:
            shutil.rmtree(scratch, ignore_errors=True)
        return folder
